"""Exercises of the field guide G5 (saliency and statistics): a deconvnet ReLU hook (G5.1), the third
of the three ReLU backward rules of its section 4."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..models import DigitsCNN
from . import Outcome, compare_tensors, exercise
from .nb05 import _Applied, _DeconvReLUFunction


def _images(seed: int, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _input_gradient(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg)[:, target].sum(), xg)
    return grad


def _deconvnet_saliency(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """The deconvnet's input gradient without hooks: a copy of ``model`` whose ReLUs use ``_DeconvReLUFunction``."""
    deconv = copy.deepcopy(model)
    for name, module in list(deconv.named_modules()):
        if isinstance(module, nn.ReLU):
            parent, _, child = name.rpartition(".")
            setattr(deconv.get_submodule(parent), child, _Applied(_DeconvReLUFunction))
    return _input_gradient(deconv, x, target)


def _hook_result_problem(returned, like: torch.Tensor) -> str | None:
    """What is wrong with ``returned`` as the new ``grad_input`` of a one-input module, or None."""
    what = "return a tuple with one tensor, like grad_input"
    if returned is None:
        return f"your hook returned None, which leaves grad_input as it is: {what}, holding the new gradient"
    if isinstance(returned, torch.Tensor):
        return f"{what}, (new_grad_input,), not a bare tensor"
    if not isinstance(returned, tuple | list):
        return f"{what} (got {type(returned).__name__})"
    if len(returned) != 1:
        return f"{what} (nn.ReLU has one input), not {len(returned)} entries"
    new = returned[0]
    if not isinstance(new, torch.Tensor):
        kind = "None" if new is None else f"a {type(new).__name__}"
        return f"{what}: its entry is {kind}, not a tensor"
    if new.shape != like.shape:
        return (f"the new gradient has shape {tuple(new.shape)}, expected {tuple(like.shape)}, the shape of "
                "grad_output[0]")
    if new.dtype != like.dtype:
        dtypes = [str(d).removeprefix("torch.") for d in (new.dtype, like.dtype)]
        return f"the new gradient is {dtypes[0]}, expected {dtypes[1]}: keep the dtype of the gradients you receive"
    return None


@exercise("G5.1", "a deconvnet ReLU hook")
def _deconvnet_hook(hook) -> Outcome:
    """``hook(module, grad_input, grad_output)`` is a full backward hook for ``nn.ReLU`` that returns
    the new ``grad_input`` of the deconvnet rule: the positive part of ``grad_output``, wherever the
    ReLU's input was; its arguments stay unchanged."""
    relu_input = torch.tensor([[1.5, -0.5, 2.0, -1.0], [-2.0, 0.5, -0.3, 1.0]])
    grad_output = torch.tensor([[0.7, 1.2, -0.4, -0.9], [0.3, -1.1, 0.8, 0.6]])
    grad_input = grad_output * (relu_input > 0)  # what autograd's ReLU passes back
    gi, go = grad_input.clone(), grad_output.clone()
    returned = hook(nn.ReLU(), (gi,), (go,))
    if not torch.equal(gi, grad_input) or not torch.equal(go, grad_output):
        changed = "grad_input" if not torch.equal(gi, grad_input) else "grad_output"
        return Outcome(False, f"your hook changed {changed} in place, which backward hooks must not do: "
                              "compute a new tensor and return it in a tuple")
    problem = _hook_result_problem(returned, grad_output)
    if problem:
        return Outcome(False, problem)
    new = returned[0].detach()
    expected = grad_output.clamp(min=0)
    if not torch.allclose(new, expected):
        if torch.allclose(new, grad_input.clamp(min=0)):
            return Outcome(False, "that is guided backprop's rule (it keeps the positive part of grad_input, which "
                                  "is zero where the ReLU was off); the deconvnet rule starts from grad_output")
        if torch.allclose(new, grad_input):
            return Outcome(False, "your hook returned grad_input unchanged: the gradient is the plain one")
        if torch.allclose(new, grad_output):
            return Outcome(False, "negative gradient still passes: keep only the positive part of grad_output")
        diff = (new.double() - expected.double()).abs().max().item()
        return Outcome(False, f"on a sample call the new gradient is off by up to {diff:.1e}: keep the positive "
                              "part of grad_output and zero elsewhere")
    model = DigitsCNN(seed=5).eval()
    x = _images(7)
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    handles = [relu.register_full_backward_hook(hook) for relu in relus]
    try:
        got = _input_gradient(model, x, 6)
    finally:
        for handle in handles:
            handle.remove()
    expected = _deconvnet_saliency(model, x, 6)
    plain = _input_gradient(model, x, 6)
    if torch.allclose(got, plain) and not torch.allclose(plain, expected):
        return Outcome(False, "registered on the ReLUs of a model, your hook did not change the gradient")
    outcome = compare_tensors(got, expected)
    if outcome.passed:
        return Outcome(True, f"deconvnet gradients of 3 digits match ({outcome.detail})")
    return Outcome(False, f"registered on the ReLUs of a model, deconvnet gradients differ: {outcome.detail}")
