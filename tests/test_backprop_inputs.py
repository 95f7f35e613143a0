"""hooklab.backprop with bad input: a dout of the wrong shape is refused, naming both shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hooklab import backprop as bp


def r(*shape):
    return torch.rand(*shape)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: bp.relu_backward(r(1, 5), r(4, 5)), r"relu_backward: dout has shape \(4, 5\) but the forward output "
                                                  r"has shape \(1, 5\)"),
    (lambda: bp.leaky_relu_backward(r(1, 5), r(4, 5)), r"leaky_relu_backward: dout has shape \(4, 5\)"),
    (lambda: bp.sigmoid_backward(r(1, 5), r(4, 5)), r"sigmoid_backward: dout has shape \(4, 5\)"),
    (lambda: bp.tanh_backward(r(4, 5), r(5)), r"tanh_backward: dout has shape \(5,\)"),
    (lambda: bp.linear_backward(r(2, 4), r(3, 4), r(1, 3)), r"linear_backward: dout has shape \(1, 3\) but the "
                                                            r"forward output has shape \(2, 3\)"),
    (lambda: bp.linear_backward(r(2, 5), r(3, 4), r(2, 3)), r"linear_backward: x has 5 features but w \(3, 4\)"),
    (lambda: bp.conv2d_backward(r(1, 1, 5, 5), r(2, 1, 3, 3), r(1, 2, 4, 4)),
     r"conv2d_backward: dout has shape \(1, 2, 4, 4\) but the forward output has shape \(1, 2, 3, 3\)"),
    (lambda: bp.conv2d_backward(r(1, 2, 5, 5), r(2, 1, 3, 3), r(1, 2, 3, 3)), r"C = w.shape\[1\] \* groups"),
    (lambda: bp.conv2d_backward(r(1, 1, 5, 5), r(1, 1, 2, 2), r(1, 1, 5, 5), padding="same"), "pads unevenly"),
    (lambda: bp.max_pool2d_backward(r(1, 1, 4, 4), r(1, 1, 3, 3), 2),
     r"max_pool2d_backward: dout has shape \(1, 1, 3, 3\) but the forward output has shape \(1, 1, 2, 2\)"),
    (lambda: bp.avg_pool2d_backward((1, 1, 4, 4), r(1, 1, 3, 3), 2), r"avg_pool2d_backward: dout has shape"),
    (lambda: bp.adaptive_avg_pool2d_backward((2, 3, 6, 6), r(1, 3, 2, 2)),
     r"adaptive_avg_pool2d_backward: dout has shape \(1, 3, 2, 2\) but the forward output has shape \(2, 3, 2, 2\)"),
    (lambda: bp.batch_norm_backward(r(2, 4), None, r(1, 4)), r"batch_norm_backward: dout has shape \(1, 4\)"),
    (lambda: bp.layer_norm_backward(r(2, 4), r(2, 4), (3,)), r"normalized_shape \(3,\) is not the last dims of x"),
    (lambda: bp.layer_norm_backward(r(2, 4), r(1, 4), (4,)), r"layer_norm_backward: dout has shape \(1, 4\)"),
    (lambda: bp.flatten_backward((2, 4), r(1, 4)), r"flatten_backward: dout has shape \(1, 4\) \(4 elements\)"),
    (lambda: bp.dropout_backward(torch.ones(1, 2), r(3, 2), 0.5), r"mask has shape \(1, 2\) but dout \(3, 2\)"),
    (lambda: bp.dropout_backward(torch.ones(2, 2), r(2, 2), 1.5), r"p is the probability .* in \[0, 1\], not 1.5"),
    (lambda: bp.dropout_backward(torch.ones(2, 2), r(2, 2), -0.5), r"in \[0, 1\], not -0.5"),
])
def test_mismatched_shapes_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_conv2d_backward_accepts_padding_names():
    x, w = torch.randn(1, 1, 5, 5, dtype=torch.float64), torch.randn(2, 1, 3, 3, dtype=torch.float64)
    for name, number in (("same", 1), ("valid", 0)):
        dout = torch.randn_like(F.conv2d(x, w, padding=number))
        for got, expected in zip(bp.conv2d_backward(x, w, dout, padding=name)[:2],
                                 bp.conv2d_backward(x, w, dout, padding=number)[:2], strict=True):
            torch.testing.assert_close(got, expected)


def test_dropout_with_p_one_drops_everything():
    assert torch.equal(bp.dropout_backward(torch.zeros(2, 2, dtype=torch.bool), torch.ones(2, 2), 1), torch.zeros(2, 2))
