"""Exercises of notebook 04: write the backward pass of five layers by hand.

Each checker calls the student's function on fixed random float64 tensors and compares every
returned gradient with autograd's; the detail names the worst tensor and its largest difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Outcome, compare_tensors, exercise

D = torch.float64


def _rand(*shape, seed):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def _reference(fn, inputs, dout):
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, dout)


def _judge(got, expected, names) -> Outcome:
    got = got if isinstance(got, tuple | list) else (got,)
    if len(got) != len(expected):
        return Outcome(False, f"returned {len(got)} tensor(s), expected {len(expected)}: ({', '.join(names)})")
    worst, worst_name = 0.0, names[0]
    for name, g, e in zip(names, got, expected, strict=True):
        outcome = compare_tensors(g, e, atol=1e-10, rtol=1e-8)
        if not outcome.passed:
            return Outcome(False, f"{name}: {outcome.detail}")
        diff = (g.detach().double() - e).abs().max().item()
        if diff >= worst:
            worst, worst_name = diff, name
    verb = "matches" if len(names) == 1 else "match"
    return Outcome(True, f"{', '.join(names)} {verb} autograd; max |difference| {worst:.1e} (in {worst_name})")


@exercise("04.1", "sigmoid backward")
def _sigmoid(sigmoid_backward) -> Outcome:
    """``sigmoid_backward(out, dout) -> dx`` where ``out = sigmoid(x)``."""
    x, dout = _rand(4, 5, seed=1), _rand(4, 5, seed=2)
    return _judge(sigmoid_backward(torch.sigmoid(x), dout), _reference(torch.sigmoid, (x,), dout), ["dx"])


@exercise("04.2", "linear backward")
def _linear(linear_backward) -> Outcome:
    """``linear_backward(x, w, dout) -> (dx, dw, db)`` for ``y = x @ w.T + b`` (bias shape ``[out]``)."""
    x, w, b, dout = _rand(6, 4, seed=3), _rand(3, 4, seed=4), _rand(3, seed=5), _rand(6, 3, seed=6)
    return _judge(linear_backward(x, w, dout), _reference(F.linear, (x, w, b), dout), ["dx", "dw", "db"])


@exercise("04.3", "ReLU backward from the output")
def _relu(relu_backward) -> Outcome:
    """``relu_backward(out, dout) -> dx``: only the output is given, as after an in-place ReLU."""
    x, dout = _rand(5, 6, seed=7), _rand(5, 6, seed=8)
    return _judge(relu_backward(F.relu(x), dout), _reference(F.relu, (x,), dout), ["dx"])


@exercise("04.4", "conv2d backward, stride 1, no padding")
def _conv(conv2d_backward) -> Outcome:
    """``conv2d_backward(x, w, dout) -> (dx, dw)`` for ``y = F.conv2d(x, w)`` (no bias)."""
    x, w = _rand(2, 3, 6, 5, seed=9), _rand(4, 3, 3, 2, seed=10)
    dout = _rand(2, 4, 4, 4, seed=11)
    return _judge(conv2d_backward(x, w, dout), _reference(F.conv2d, (x, w), dout), ["dx", "dw"])


@exercise("04.5", "softmax + cross-entropy backward")
def _softmax_ce(ce_backward) -> Outcome:
    """``ce_backward(logits, target) -> dlogits`` for ``F.cross_entropy(logits, target)`` (mean over the batch)."""
    logits, target = _rand(5, 4, seed=12) * 2, torch.tensor([3, 0, 1, 1, 2])
    expected = _reference(lambda z: F.cross_entropy(z, target), (logits,), torch.tensor(1.0, dtype=D))
    return _judge(ce_backward(logits, target), expected, ["dlogits"])
