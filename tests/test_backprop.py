"""hooklab.backprop (formulas and losses) against autograd, in float64, on random shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

from hooklab import backprop as bp
from hooklab.backprop import losses

FEW = settings(max_examples=12, deadline=None)
D = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def autograd(fn, inputs, dout):
    """Gradients of sum(fn(*inputs) * dout) with respect to every input that is not None."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    out = fn(*leaves)
    used = [t for t in leaves if t is not None]
    return torch.autograd.grad(out, used, dout)


def close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def manual_function(forward, backward):
    """An autograd.Function whose backward is the hand-written formula (for gradcheck)."""

    class Manual(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            ctx.save_for_backward(*args)
            return forward(*args)

        @staticmethod
        def backward(ctx, dout):
            return backward(*ctx.saved_tensors, dout)

    return Manual.apply


# ----- linear and elementwise ------------------------------------------------------------------
@FEW
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), n_in=st.integers(1, 5), n_out=st.integers(1, 5),
       bias=st.sampled_from(["full", "shared", None]), seed=st.integers(0, 99))
def test_linear_backward(lead, n_in, n_out, bias, seed):
    x, w = rand(*lead, n_in, seed=seed), rand(n_out, n_in, seed=seed + 1)
    b = {"full": rand(n_out, seed=seed + 2), "shared": rand(1, seed=seed + 2), None: None}[bias]
    dout = rand(*lead, n_out, seed=seed + 3)
    manual = [g for g in bp.linear_backward(x, w, dout, b) if g is not None]
    close(manual, autograd(F.linear, (x, w, b), dout))


def test_linear_backward_shared_bias_is_the_sum_of_dout():
    dout = torch.tensor([[0.25, 0.5]], dtype=D)
    _, _, db = bp.linear_backward(torch.ones(1, 2, dtype=D), torch.eye(2, dtype=D), dout, torch.zeros(1, dtype=D))
    assert db.shape == (1,) and db.item() == 0.75


@pytest.mark.parametrize(("forward", "backward"), [
    (torch.sigmoid, bp.sigmoid_backward),
    (torch.tanh, bp.tanh_backward),
    (F.relu, bp.relu_backward),
    (lambda x: F.leaky_relu(x, 0.2), lambda out, d: bp.leaky_relu_backward(out, d, 0.2)),
])
def test_elementwise_backward_from_the_output(forward, backward):
    x, dout = rand(3, 4, 5), rand(3, 4, 5, seed=1)
    out = forward(x)
    close([backward(out, dout)], autograd(forward, (x,), dout))


def test_relu_backward_works_from_an_in_place_result():
    x, dout = rand(6, 7), rand(6, 7, seed=1)
    overwritten = x.clone().relu_()  # an in-place ReLU leaves only its output
    close([bp.relu_backward(overwritten, dout)], autograd(F.relu, (x,), dout))


# ----- convolution and pooling -----------------------------------------------------------------
@FEW
@given(n=st.integers(1, 2), groups=st.integers(1, 2), cin=st.integers(1, 2), cout=st.integers(1, 2),
       k=st.integers(1, 3), stride=st.integers(1, 3), padding=st.integers(0, 2), dilation=st.integers(1, 2),
       h=st.integers(5, 7), w=st.integers(5, 7), bias=st.booleans(), seed=st.integers(0, 99))
def test_conv2d_backward(n, groups, cin, cout, k, stride, padding, dilation, h, w, bias, seed):
    x = rand(n, cin * groups, h, w, seed=seed)
    weight = rand(cout * groups, cin, k, k, seed=seed + 1)
    b = rand(cout * groups, seed=seed + 2) if bias else None
    out = F.conv2d(x, weight, b, stride, padding, dilation, groups)
    dout = rand(*out.shape, seed=seed + 3)
    manual = [g for g in bp.conv2d_backward(x, weight, dout, b, stride, padding, dilation, groups) if g is not None]
    reference = autograd(lambda *a: F.conv2d(*a, stride, padding, dilation, groups), (x, weight, b), dout)
    close(manual, reference)


@FEW
@given(k=st.integers(1, 3), stride=st.integers(1, 3), dilation=st.integers(1, 2), ceil_mode=st.booleans(),
       h=st.integers(5, 8), pad=st.integers(0, 1), seed=st.integers(0, 99))
def test_max_pool2d_backward(k, stride, dilation, ceil_mode, h, pad, seed):
    pad = min(pad, k // 2)
    x = rand(2, 3, h, h + 1, seed=seed)
    out = F.max_pool2d(x, k, stride, pad, dilation, ceil_mode)
    dout = rand(*out.shape, seed=seed + 1)
    manual = bp.max_pool2d_backward(x, dout, k, stride, pad, dilation, ceil_mode)
    close([manual], autograd(lambda t: F.max_pool2d(t, k, stride, pad, dilation, ceil_mode), (x,), dout))


def test_max_pool2d_backward_on_ties_picks_the_same_input_as_pytorch():
    x, dout = torch.ones(1, 1, 4, 4, dtype=D), rand(1, 1, 2, 2)
    close([bp.max_pool2d_backward(x, dout, 2)], autograd(lambda t: F.max_pool2d(t, 2), (x,), dout))


@FEW
@given(k=st.integers(1, 4), stride=st.integers(1, 3), pad=st.integers(0, 2), include=st.booleans(),
       divisor=st.sampled_from([None, 3]), h=st.integers(4, 8), seed=st.integers(0, 99))
def test_avg_pool2d_backward(k, stride, pad, include, divisor, h, seed):
    pad = min(pad, k // 2)
    x = rand(2, 2, h, h + 2, seed=seed)

    def pool(t):
        return F.avg_pool2d(t, k, stride, pad, False, include, divisor)

    dout = rand(*pool(x).shape, seed=seed + 1)
    manual = bp.avg_pool2d_backward(x.shape, dout, k, stride, pad, include, divisor)
    close([manual], autograd(pool, (x,), dout))


@FEW
@given(h=st.integers(1, 9), w=st.integers(1, 9), oh=st.integers(1, 5), ow=st.integers(1, 5), seed=st.integers(0, 99))
def test_adaptive_avg_pool2d_backward(h, w, oh, ow, seed):
    x = rand(2, 3, h, w, seed=seed)
    dout = rand(2, 3, oh, ow, seed=seed + 1)
    manual = bp.adaptive_avg_pool2d_backward(x.shape, dout)
    close([manual], autograd(lambda t: F.adaptive_avg_pool2d(t, (oh, ow)), (x,), dout))


# ----- normalisation, reshaping, dropout -------------------------------------------------------
@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5), (3, 2, 4, 4)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_train_mode(shape, affine):
    x, dout = rand(*shape) * 3 + 1, rand(*shape, seed=1)
    w, b = (rand(shape[1], seed=2), rand(shape[1], seed=3)) if affine else (None, None)
    manual = [g for g in bp.batch_norm_backward(x, w, dout, 1e-5) if g is not None]
    reference = autograd(lambda *a: F.batch_norm(a[0], None, None, *a[1:], training=True, eps=1e-5), (x, w, b), dout)
    close(manual, reference)


def test_batch_norm_backward_eval_mode_uses_running_statistics():
    x, dout = rand(4, 3, 2, 2), rand(4, 3, 2, 2, seed=1)
    mean, var, w, b = rand(3, seed=2), rand(3, seed=3).abs() + 0.5, rand(3, seed=4), rand(3, seed=5)
    manual = bp.batch_norm_backward(x, w, dout, 1e-5, mean, var)
    reference = autograd(lambda *a: F.batch_norm(a[0], mean, var, *a[1:], training=False), (x, w, b), dout)
    close(manual, reference)


@pytest.mark.parametrize("normalized", [(5,), (3, 5)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward(normalized, affine):
    x, dout = rand(2, 4, 3, 5) * 2, rand(2, 4, 3, 5, seed=1)
    w, b = (rand(*normalized, seed=2), rand(*normalized, seed=3)) if affine else (None, None)
    manual = [g for g in bp.layer_norm_backward(x, dout, normalized, w, b) if g is not None]
    close(manual, autograd(lambda *a: F.layer_norm(a[0], normalized, *a[1:]), (x, w, b), dout))


@pytest.mark.parametrize(("start", "end"), [(1, -1), (0, -1), (2, 3)])
def test_flatten_backward(start, end):
    x = rand(2, 3, 4, 5)
    out = x.flatten(start, end)
    dout = rand(*out.shape, seed=1)
    close([bp.flatten_backward(x.shape, dout)], autograd(lambda t: t.flatten(start, end), (x,), dout))


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_dropout_backward_with_the_mask_of_the_call(p):
    x, dout = rand(50, 20), rand(50, 20, seed=1)
    torch.manual_seed(3)
    noise = F.dropout(torch.ones_like(x), p)  # same seed, ones in: the scaled mask
    torch.manual_seed(3)
    reference = autograd(lambda t: F.dropout(t, p), (x,), dout)
    close([bp.dropout_backward(noise != 0, dout, p)], reference)


# ----- losses ----------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mse(reduction):
    pred, target = rand(4, 3), rand(4, 3, seed=1)
    torch.testing.assert_close(losses.mse_loss(pred, target, reduction), F.mse_loss(pred, target, reduction=reduction))
    reference = autograd(lambda p: F.mse_loss(p, target, reduction=reduction), (pred,), torch.tensor(1.0, dtype=D))
    close([losses.mse_backward(pred, target, reduction=reduction)], reference)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("kind", ["index", "probabilities"])
def test_softmax_cross_entropy(reduction, kind):
    logits = rand(5, 4) * 3
    target = torch.tensor([0, 3, 1, 1, 2]) if kind == "index" else rand(5, 4, seed=1).softmax(1)
    expected = F.cross_entropy(logits, target, reduction=reduction)
    torch.testing.assert_close(losses.softmax_cross_entropy(logits, target, reduction), expected)
    reference = autograd(lambda z: F.cross_entropy(z, target, reduction=reduction), (logits,),
                         torch.tensor(1.0, dtype=D))
    close([losses.softmax_cross_entropy_backward(logits, target, reduction=reduction)], reference)


def test_losses_reject_an_unknown_reduction():
    with pytest.raises(ValueError, match="reduction must be"):
        losses.mse_backward(rand(2), rand(2), reduction="none")


# ----- gradcheck: finite differences against the hand-written backward -------------------------
GRADCHECKED = {
    "linear": (F.linear, lambda x, w, b, d: bp.linear_backward(x, w, d, b), [(3, 4), (2, 4), (2,)]),
    "sigmoid": (torch.sigmoid, lambda x, d: bp.sigmoid_backward(torch.sigmoid(x), d), [(3, 4)]),
    "tanh": (torch.tanh, lambda x, d: bp.tanh_backward(torch.tanh(x), d), [(3, 4)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, 2, 1),
               lambda x, w, b, d: bp.conv2d_backward(x, w, d, b, 2, 1), [(1, 2, 5, 5), (3, 2, 3, 3), (3,)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1),
                   lambda x, d: bp.avg_pool2d_backward(x.shape, d, 3, 2, 1), [(1, 2, 5, 6)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
                            lambda x, d: bp.adaptive_avg_pool2d_backward(x.shape, d), [(1, 2, 5, 7)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   lambda x, w, b, d: bp.batch_norm_backward(x, w, d), [(4, 3, 2, 2), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b),
                   lambda x, w, b, d: bp.layer_norm_backward(x, d, (4,), w, b), [(3, 4), (4,), (4,)]),
    "softmax_cross_entropy": (lambda z: losses.softmax_cross_entropy(z, torch.tensor([1, 0, 2])),
                              lambda z, d: losses.softmax_cross_entropy_backward(z, torch.tensor([1, 0, 2]), d),
                              [(3, 3)]),
}


def _as_tuple(grads):
    return grads if isinstance(grads, tuple) else (grads,)


@pytest.mark.parametrize("name", list(GRADCHECKED))
def test_gradcheck(name):
    forward, backward, shapes = GRADCHECKED[name]
    inputs = [rand(*s, seed=i).requires_grad_(True) for i, s in enumerate(shapes)]
    fn = manual_function(forward, lambda *a: _as_tuple(backward(*a)))
    assert torch.autograd.gradcheck(fn, inputs)


def test_gradcheck_catches_a_wrong_formula():
    wrong = manual_function(torch.sigmoid, lambda x, d: d * torch.sigmoid(x) * (1 + torch.sigmoid(x)))
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        torch.autograd.gradcheck(wrong, [rand(2, 3).requires_grad_(True)])


# ----- the 2-2-2 network's picture ----------------------------------------------------------------------
def test_draw_222_draws_the_network_with_the_weights_it_has():
    import matplotlib.pyplot as plt

    from hooklab.models import TinySigmoidNet

    net = TinySigmoidNet()
    with torch.no_grad():
        net.fc2.weight[1, 0] = -1.25
    fig = bp.draw_222(net)
    try:
        texts = {t.get_text() for t in fig.axes[0].texts}
        assert {"0.15", "0.25", "0.20", "0.30", "0.40", "0.45", "-1.25", "0.55"} <= texts
        assert {"fc1 (+ 0.35)", "fc2 (+ 0.60)", "x₁", "s2₂"} <= texts and "0.50" not in texts
        _, ax = plt.subplots()
        assert bp.draw_222(net, ax=ax) is ax.figure  # on the axes given
    finally:
        plt.close("all")
