"""Exercises of notebook 05: a guided ReLU hook, a Grad-CAM map, dead channels found with a hook."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from ..cam import GuidedBackprop
from ..models import DigitsCNN
from . import Outcome, compare_tensors, exercise


def _images(seed: int, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


@exercise("05.1", "a guided-backprop ReLU hook")
def _guided_hook(hook) -> Outcome:
    """``hook(module, grad_input, grad_output)`` is a full backward hook for ``nn.ReLU`` that
    returns the new ``grad_input``: only the positive part of what the ReLU passes back."""
    model = DigitsCNN(seed=5).eval()
    x = _images(7)
    sample = torch.randn(2, 4)
    returned = hook(nn.ReLU(), (sample,), (sample,))
    if isinstance(returned, torch.Tensor):
        return Outcome(False, "return a tuple with one tensor, (new_grad_input,), not a bare tensor")
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    handles = [relu.register_full_backward_hook(hook) for relu in relus]
    try:
        xg = x.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(model(xg)[:, 6].sum(), xg)
    finally:
        for handle in handles:
            handle.remove()
    with GuidedBackprop(model) as gb:
        expected = gb.saliency(x, 6)
    xg = x.clone().requires_grad_(True)
    (plain,) = torch.autograd.grad(model(xg)[:, 6].sum(), xg)
    if torch.allclose(got, plain) and not torch.allclose(plain, expected):
        return Outcome(False, "the gradient did not change: return a tuple holding the clamped grad_input[0]")
    outcome = compare_tensors(got, expected)
    if outcome.passed:
        return Outcome(True, f"guided gradients of 3 digits match ({outcome.detail})")
    return Outcome(False, f"guided gradients differ: {outcome.detail} (clamp grad_input[0] at 0, not grad_output)")


@exercise("05.2", "a Grad-CAM map from an activation and its gradient")
def _cam_map(cam_map) -> Outcome:
    """``cam_map(activation, gradient)``: both ``(C, H, W)``; returns the ``(H, W)`` Grad-CAM map."""
    generator = torch.Generator().manual_seed(11)
    activation = torch.rand(6, 5, 4, generator=generator)
    gradient = torch.randn(6, 5, 4, generator=generator)
    weights = gradient.mean(dim=(1, 2))
    expected = (weights[:, None, None] * activation).sum(dim=0).clamp(min=0)
    got = cam_map(activation, gradient)
    outcome = compare_tensors(got, expected)
    if outcome.passed:
        return Outcome(True, f"the (5, 4) map matches ({outcome.detail})")
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        unclipped = (weights[:, None, None] * activation).sum(dim=0)
        if torch.allclose(got, unclipped, atol=1e-6):
            return Outcome(False, "almost: Grad-CAM keeps only the positive part (ReLU of the weighted sum)")
    return Outcome(False, f"{outcome.detail}; weight channel k by the spatial mean of its gradient")


@exercise("05.3", "dead channels found with a forward hook")
def _dead_channels(dead_channels) -> Outcome:
    """``dead_channels(model, layer, x)`` returns the sorted channel indices of layer ``layer`` whose
    output is zero for every image of ``x`` and every position; no hook may be left behind."""
    model = DigitsCNN(seed=1).eval()
    with torch.no_grad():
        model.features[0].bias[[2, 9, 13]] = -50.0  # these channels never get past the ReLU
    x = torch.cat([_images(3, n=4), torch.zeros(1, 1, 8, 8)])  # on the blank image more channels are zero
    try:
        got = dead_channels(model, "features.1", x)
    finally:
        left = clear_hooks(model)
    if left:
        return Outcome(False, f"a hook was left registered ({left[0]}): remove it in a finally block")
    got = sorted(int(c) for c in got)
    with torch.no_grad():
        out = model.features[:2](x)  # the output of features.1, computed without hooks
    expected = (out == 0).flatten(2).all(dim=2).all(dim=0).nonzero().flatten().tolist()
    if got == expected:
        return Outcome(True, f"channels {expected} of features.1 are dead; no hook left behind")
    if got == (out == 0).flatten(2).all(dim=2).any(dim=0).nonzero().flatten().tolist():
        return Outcome(False, "these channels are zero for at least one image; dead means zero for every image")
    return Outcome(False, f"got channels {got}; a dead channel is zero for every image and every position")
