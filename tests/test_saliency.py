"""Guided backprop and Grad-CAM (hooklab.saliency) against independent references."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab.audit import leftover_hooks
from hooklab.layers import UnknownLayerError
from hooklab.models import DigitsCNN, TinyConvNet
from hooklab.saliency import GradCAM, GuidedBackprop, grad_cam, guided_grad_cam, upsample


class _GuidedReLU(torch.autograd.Function):
    """Reference: guided backprop written as its own autograd function, no hooks."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad.clamp(min=0) * (x > 0)


def _reference_guided(model: DigitsCNN, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    h = x
    for layer in model.features:
        h = _GuidedReLU.apply(h) if isinstance(layer, nn.ReLU) else layer(h)
    scores = model.head(h)
    (grad,) = torch.autograd.grad(scores.gather(1, target[:, None]).sum(), x)
    return grad


@pytest.fixture
def model():
    return DigitsCNN(seed=3).eval()


@pytest.fixture
def images():
    return torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_guided_backprop_matches_a_guided_relu_function(model, images):
    target = torch.tensor([0, 3, 5, 9])
    with GuidedBackprop(model) as gb:
        got = gb.saliency(images, target)
    expected = _reference_guided(model, images, target)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not leftover_hooks(model)


def test_guided_differs_from_plain_gradient(model, images):
    x = images.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(model(x)[:, 3].sum(), x)
    with GuidedBackprop(model) as gb:
        guided = gb.saliency(images, 3)
    assert guided.shape == plain.shape
    assert not torch.allclose(guided, plain)


def test_in_place_relus_work_and_are_restored():
    net = TinyConvNet(seed=1, inplace=True)
    x = torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(0))
    # a full backward hook on an in-place ReLU raises; GuidedBackprop switches in-place off meanwhile
    handle = net.relu1.register_full_backward_hook(GuidedBackprop.hook)
    try:
        with pytest.raises(RuntimeError, match="modified inplace"):
            net(x.clone().requires_grad_()).sum().backward()
    finally:
        handle.remove()
    with GuidedBackprop(net) as gb:
        assert not net.relu1.inplace and not net.relu2.inplace
        got = gb.saliency(x, 0)
    assert net.relu1.inplace and net.relu2.inplace
    reference = TinyConvNet(seed=1, inplace=False)
    xr = x.clone().requires_grad_(True)
    h = _GuidedReLU.apply(reference.conv1(xr))
    out = _GuidedReLU.apply(reference.conv2(h))
    (expected,) = torch.autograd.grad(out.sum(), xr)
    assert torch.allclose(got, expected)


def test_hooks_and_inplace_flags_restored_when_the_body_raises():
    net = TinyConvNet(inplace=True)
    with pytest.raises(ZeroDivisionError), GuidedBackprop(net):
        assert net.relu1._backward_hooks
        _ = 1 / 0
    assert not leftover_hooks(net)
    assert net.relu1.inplace and net.relu2.inplace


def test_saliency_outside_the_block_is_an_error(model, images):
    gb = GuidedBackprop(model)
    with pytest.raises(RuntimeError, match="inside"):
        gb.saliency(images)


def test_model_without_relu_is_rejected():
    with pytest.raises(ValueError, match=r"no nn\.ReLU"):
        GuidedBackprop(nn.Sequential(nn.Linear(2, 2), nn.Sigmoid()))


def test_grad_cam_on_a_gap_head_is_class_activation_mapping(model, images):
    # score_c = sum_k w_ck mean_ij A_kij + b_c, so alpha_k = w_ck / (h w) and the map sums to score_c - b_c
    result = grad_cam(model, images, "features.6", target=4)
    linear = model.head[2]
    h, w = result.raw.shape[1:]
    assert torch.allclose(result.weights, linear.weight[4].detach().expand(4, -1) / (h * w), atol=1e-7)
    assert torch.allclose(result.raw.sum(dim=(1, 2)), result.scores - linear.bias[4].detach(), atol=1e-5)
    assert torch.equal(result.maps, result.raw.clamp(min=0))
    assert result.targets.tolist() == [4, 4, 4, 4]


def test_grad_cam_against_hand_computation(model, images):
    x = images.clone().requires_grad_(True)
    a = model.features[:4](x)
    scores = model.head(model.features[4:](a))
    targets = scores.argmax(1)
    (g,) = torch.autograd.grad(scores.gather(1, targets[:, None]).sum(), a)
    expected = (g.mean(dim=(2, 3), keepdim=True) * a).sum(1).clamp(min=0)
    result = grad_cam(model, images, "features.3")
    assert torch.equal(result.targets, targets)
    assert torch.allclose(result.maps, expected.detach(), atol=1e-6)
    assert all(p.grad is None for p in model.parameters()), "Grad-CAM must not fill parameters' .grad"


def test_flatten_head_weights_do_not_depend_on_the_image(images):
    model = DigitsCNN(head="flatten", seed=3).eval()
    result = grad_cam(model, images, "features.6", target=2)
    assert torch.allclose(result.weights, result.weights[:1].expand_as(result.weights))
    expected = model.head[1].weight[2].detach().view(64, 4, 4).mean(dim=(1, 2))
    assert torch.allclose(result.weights[0], expected, atol=1e-7)


def test_grad_cam_errors(model, images):
    with pytest.raises(UnknownLayerError, match="close matches"):
        GradCAM(model, "features.7")
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        grad_cam(model, images, "head.2")
    cam = GradCAM(model, "features.3")
    with pytest.raises(RuntimeError, match="inside"):
        cam(images)
    with pytest.raises(KeyError), cam:
        raise KeyError("boom")
    assert not leftover_hooks(model)
    with cam, pytest.raises(RuntimeError, match="already inside"), cam:
        pass
    assert not leftover_hooks(model)


def test_grad_cam_repeated_calls_keep_no_stale_hooks(model, images):
    with GradCAM(model, "features.3") as cam:
        first = cam(images).maps
        for _ in range(3):
            again = cam(images).maps
            assert not leftover_hooks(model), "each call removes its hooks when it returns"
    assert torch.equal(first, again)
    assert not leftover_hooks(model)


class _ReusedReLU(nn.Module):
    """One ReLU called twice per forward, as in torchvision's BasicBlock."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(4)
            self.conv1 = nn.Conv2d(1, 3, 3, padding=1)
            self.conv2 = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(3, 4)
        self.relu = nn.ReLU()

    def forward(self, x):
        h = self.relu(self.conv1(x))
        return self.fc(self.relu(2 * self.conv2(h) - 0.1).mean(dim=(2, 3)))


def test_grad_cam_of_a_module_called_twice_pairs_the_last_call_with_its_own_gradient(images):
    model = _ReusedReLU()
    x = images.clone().requires_grad_(True)
    first = model.relu(model.conv1(x))
    last = model.relu(2 * model.conv2(first) - 0.1)
    scores = model.fc(last.mean(dim=(2, 3)))
    targets = scores.argmax(1)
    g_first, g_last = torch.autograd.grad(scores.gather(1, targets[:, None]).sum(), [first, last])
    assert not torch.allclose(g_first.mean(dim=(2, 3)), g_last.mean(dim=(2, 3)))  # the test can tell them apart
    result = grad_cam(model, images, "relu")
    assert torch.allclose(result.weights, g_last.mean(dim=(2, 3)), atol=1e-7)
    assert torch.allclose(result.raw, (g_last.mean(dim=(2, 3), keepdim=True) * last).sum(1).detach(), atol=1e-6)


def test_guided_grad_cam_is_saliency_times_upsampled_map(model, images):
    got = guided_grad_cam(model, images, "features.6")
    result = grad_cam(model, images, "features.6")
    with GuidedBackprop(model) as gb:
        saliency = gb.saliency(images, result.targets)
    assert torch.allclose(got, saliency[:, 0] * upsample(result.maps, (8, 8)))
    assert upsample(result.maps, (8, 8)).shape == (4, 8, 8)


# ----- the sanity checks' helpers ----------------------------------------------------------------------
def test_input_gradient_is_the_plain_gradient_and_touches_no_grad(model, images):
    from hooklab.saliency import input_gradient

    target = torch.tensor([1, 2, 3, 4])
    x = images.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(model(x).gather(1, target[:, None]).sum(), x)
    assert torch.allclose(input_gradient(model, images, target), expected)
    assert all(p.grad is None for p in model.parameters()) and not images.requires_grad


def test_rank_correlation_matches_spearman_with_ties():
    from scipy.stats import spearmanr

    from hooklab.saliency import rank_correlation

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, 4, generator=generator), torch.randn(5, 3, 4, generator=generator)
    a[:, 0], b[:, :, 1] = 0.0, 0.0  # ties: whole rows of zeros
    got = rank_correlation(a, b)
    expected = [spearmanr(a[i].flatten(), b[i].flatten()).statistic for i in range(5)]
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    assert torch.allclose(rank_correlation(a, -a), torch.full((5,), -1.0))
    assert torch.isnan(rank_correlation(torch.zeros(1, 4), torch.ones(1, 4))).all()
    with pytest.raises(ValueError, match="two batches of maps of one shape"):
        rank_correlation(a, b[:, :2])


def test_randomised_cascade_re_draws_from_the_top_and_leaves_the_model_and_the_random_stream(model):
    from hooklab.saliency import randomised_cascade

    names = ["head.2", "features.5"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    expected_draw = torch.rand(1)
    torch.manual_seed(5)
    first, second = randomised_cascade(model, names)
    assert torch.equal(torch.rand(1), expected_draw)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not torch.equal(first.head[2].weight, model.head[2].weight)
    assert torch.equal(first.features[5].weight, model.features[5].weight)
    assert torch.equal(second.head[2].weight, first.head[2].weight)
    assert not torch.equal(second.features[5].weight, model.features[5].weight)
    again = randomised_cascade(model, names)
    assert torch.equal(again[1].features[5].weight, second.features[5].weight)
    with pytest.raises(ValueError, match="reset_parameters"):
        randomised_cascade(model, ["features.1"])
