"""Exercises of notebook 03: module backward hooks."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from ..models import SeedConvNet
from . import Outcome, compare_tensors, exercise


def _first_failure(*outcomes: tuple[str, Outcome]) -> Outcome | None:
    for what, outcome in outcomes:
        if not outcome.passed:
            return Outcome(False, f"{what}: {outcome.detail}")
    return None


@exercise("03.1", "grad_input and grad_output of a full backward hook")
def _capture(capture) -> Outcome:
    """``capture(module, x)`` runs ``module(x).sum().backward()`` with a full backward hook on
    ``module`` and returns ``(grad_input, grad_output)``, the two tuples the hook received."""
    torch.manual_seed(3)
    conv = nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    grad_input, grad_output = capture(conv, x)
    if clear_hooks(conv):
        return Outcome(False, "a hook is still registered on the module: remove it before returning")
    if not (isinstance(grad_input, tuple) and isinstance(grad_output, tuple)):
        return Outcome(False, "return the two tuples the hook received: (grad_input, grad_output)")
    if len(grad_input) != 1 or len(grad_output) != 1:
        return Outcome(False, f"expected one gradient in each tuple, got {len(grad_input)} and {len(grad_output)}")
    (expected,) = torch.autograd.grad(conv(x).sum(), x)
    failed = _first_failure(
        ("grad_output[0]", compare_tensors(grad_output[0], torch.ones(1, 3, 5, 5))),
        ("grad_input[0]", compare_tensors(grad_input[0], expected)),
    )
    return failed or Outcome(True, "grad_output is d(sum)/d(output) = ones, grad_input is d(sum)/d(input)")


@exercise("03.2", "a backward pre-hook that clips grad_output")
def _clip(clip_grad_output) -> Outcome:
    """``clip_grad_output(module, limit)`` registers a full backward pre-hook that clamps every
    element of ``grad_output`` to ``[-limit, limit]`` and returns its handle."""
    torch.manual_seed(4)
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    upstream = torch.tensor([[5.0, -0.1], [-3.0, 0.2], [0.4, 9.0], [-0.3, -7.0]])
    handle = clip_grad_output(layer, 0.5)
    try:
        layer(x).backward(upstream)
    finally:
        if handle is not None:
            handle.remove()
    if clear_hooks(layer):
        return Outcome(False, "removing the returned handle left a hook behind: return the hook's handle")
    clipped = upstream.clamp(-0.5, 0.5)
    weight_ok = compare_tensors(layer.weight.grad, clipped.T @ x.detach())
    if not weight_ok.passed and compare_tensors(layer.weight.grad, upstream.T @ x.detach()).passed:
        return Outcome(False, f"weight.grad: {weight_ok.detail}; it is the unclipped weight gradient: "
                              "the hook ran after the module's own backward")
    input_ok = compare_tensors(x.grad, clipped @ layer.weight.detach())
    failed = _first_failure(("weight.grad", weight_ok), ("input gradient", input_ok))
    return failed or Outcome(True, "both the weight gradient and the input gradient used the clipped grad_output")


@exercise("03.3", "grad_output of every conv in a network with in-place ReLUs")
def _in_place(conv_grad_outputs) -> Outcome:
    """``conv_grad_outputs(model, x)`` runs ``model(x).sum().backward()`` on a ``SeedConvNet``
    (in-place ReLUs) and returns ``{name: gradient w.r.t. that Conv2d's output}``."""
    model = SeedConvNet(seed=0, inplace=True)
    x = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    got = conv_grad_outputs(model, x)
    if clear_hooks(model):
        return Outcome(False, "hooks are still registered on the model: remove them before returning")
    if not isinstance(got, dict) or sorted(got) != ["conv1", "conv2"]:
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return Outcome(False, f"expected a dict with keys ['conv1', 'conv2'], got {keys}")
    reference = SeedConvNet(seed=0, inplace=False)
    h1 = reference.conv1(x)
    h2 = reference.conv2(reference.relu1(h1))
    g1, g2 = torch.autograd.grad(reference.relu2(h2).sum(), [h1, h2])
    failed = _first_failure(("conv1", compare_tensors(got["conv1"], g1)), ("conv2", compare_tensors(got["conv2"], g2)))
    if failed is not None:
        return Outcome(False, f"{failed.detail} (expected dL/d(conv output), before the ReLU changes it in place)")
    return Outcome(True, "both gradients match autograd on the same network without in-place ReLUs")
