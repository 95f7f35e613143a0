"""Exercises of the field guide G3: module backward hooks in depth.

G3.1 returns a new ``grad_input`` entry by entry (section 1); G3.2 catches the gradient w.r.t. the
input of an in-place ReLU, where a full backward hook cannot go (section 3). The lesson's own
exercises are in ``nb03.py``, whose helpers these share.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..audit import clear_hooks
from ..models import TinyConvNet
from . import Outcome, compare_tensors, exercise, hint_for, hooks_left_when_raising, is_handle, kind_of
from .nb03 import _DEPRECATED, _RETURNED_A_VALUE, _used_legacy_hook

_LEGACY_INPUT = f"{_DEPRECATED}; on in-place ReLUs use a forward pre-hook that registers a tensor hook on the input"


# ----- G3.1: the grad_input tuple, entry by entry --------------------------------------------------
class _ScaleAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

    def forward(self, a: torch.Tensor, scale: float, b: torch.Tensor) -> torch.Tensor:
        return a * self.w * scale + b


def _halved_grads(halve_grad_input, grad_a: bool, grad_b: bool, hooked: bool):
    """(a.grad, b.grad, w.grad) of ``_ScaleAdd`` with the answer's hook (or none); raises what the answer raises."""
    module = _ScaleAdd()
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(3, generator=g).requires_grad_(grad_a), torch.randn(3, generator=g).requires_grad_(grad_b)
    handle = halve_grad_input(module) if hooked else None
    if hooked and not is_handle(handle):
        clear_hooks(module)
        raise _NotAHandle(kind_of(handle))
    try:
        with warnings.catch_warnings():  # no input requiring grad: PyTorch warns, the exercise says so already
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
            (module(a, 3.0, b) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    finally:
        if handle is not None:
            handle.remove()
    return a.grad, b.grad, module.w.grad


class _NotAHandle(Exception):
    pass


def _halved_outcome(halve_grad_input, grad_a: bool, grad_b: bool) -> Outcome | None:
    """What is wrong on one case (which of a, b require grad), if anything."""
    case = f"with {'a' if grad_a else 'no a'} and {'b' if grad_b else 'no b'} requiring grad"
    try:
        got = _halved_grads(halve_grad_input, grad_a, grad_b, hooked=True)
    except _NotAHandle as error:
        return Outcome(False, f"halve_grad_input must return the handle of the hook it registers, got {error}")
    except (TypeError, RuntimeError) as error:
        return hint_for(error, {
            "NoneType": f"{case}: grad_input holds None for an argument that is not a tensor (the number scale), "
                        "and for every entry when no input requires grad: keep those entries None instead of "
                        "multiplying them",
            "no input requires gradient": f"{case}: when no input requires grad, the hook must return None or a "
                                          "tuple of Nones",
            **dict.fromkeys(_RETURNED_A_VALUE, f"{case}: return a tuple with one entry per entry of grad_input "
                                                "(None where grad_input has None), not a bare tensor"),
        })  # fmt: skip
    want = _halved_grads(halve_grad_input, grad_a, grad_b, hooked=False)
    for what, got_grad, plain, factor in zip(("a.grad", "b.grad", "the weight's gradient"), got, want,
                                             (0.5, 0.5, 1.0), strict=True):
        if plain is None or (got_grad is not None and torch.allclose(got_grad, factor * plain)):
            continue
        if factor == 1.0:
            return Outcome(False, f"{case}: {what} changed too: halve grad_input in a full backward hook (which "
                                  "runs after the module's own gradients), not grad_output in a pre-hook")
        return Outcome(False, f"{case}: {what} is not half of what it is without the hook: halve every tensor "
                              "of grad_input")
    return None


@exercise("G3.1", "halve every gradient in grad_input, keeping the Nones")
def _halve(halve_grad_input) -> Outcome:
    """``halve_grad_input(module)`` registers a full backward hook returning grad_input with every tensor
    halved and every None kept, and returns its handle."""
    for grad_a, grad_b in ((True, True), (True, False), (False, True), (False, False)):
        wrong = _halved_outcome(halve_grad_input, grad_a, grad_b)
        if wrong:
            return wrong
    return Outcome(True, "a.grad and b.grad halved, the weight's gradient untouched, the Nones kept (also when "
                         "no input required grad), the zeros of an input that needs no grad halved to zeros")


# ----- G3.2: the gradient at the input of an in-place ReLU ------------------------------------------
def _relu_grads(seed: int, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(dL/d(ReLU input), dL/d(ReLU output)) of each ReLU of a TinyConvNet run without in-place ops."""
    net = TinyConvNet(seed=seed, inplace=False)
    h1 = net.conv1(x)
    a1 = net.relu1(h1)
    h2 = net.conv2(a1)
    a2 = net.relu2(h2)
    g_h1, g_a1, g_h2, g_a2 = torch.autograd.grad(a2.sum(), [h1, a1, h2, a2])
    return {"relu1": (g_h1, g_a1), "relu2": (g_h2, g_a2)}


@exercise("G3.2", "dL/d(input) of in-place ReLUs, without full backward hooks")
def _in_place(relu_grad_inputs) -> Outcome:
    """``relu_grad_inputs(model, x)`` runs ``model(x).sum().backward()`` on a ``TinyConvNet``
    (in-place ReLUs) and returns ``{name: gradient w.r.t. that ReLU's input}``."""
    model = TinyConvNet(seed=0, inplace=True)
    x = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    try:
        got = relu_grad_inputs(model, x)
    except (TypeError, RuntimeError) as error:
        return hint_for(error, {
            "RemovableHandle": "a forward pre-hook that returns something replaces the module's input, and yours "
                               "returned the tensor hook's handle; make the pre-hook return None",
            "BackwardHookFunction is a view": "a full backward hook cannot be used on a module whose input or output "
                "is changed in place (section 3 of this guide); use a forward pre-hook that registers a tensor hook",
        })  # fmt: skip
    if _used_legacy_hook(model.relu1, model.relu2):
        return Outcome(False, _LEGACY_INPUT)
    if clear_hooks(model):
        return Outcome(False, "hooks are still registered on the model: remove them before returning")
    if not isinstance(got, dict) or sorted(got) != ["relu1", "relu2"]:
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return Outcome(False, f"expected a dict with keys ['relu1', 'relu2'], got {keys}")
    reference = _relu_grads(0, x)
    for name, (grad_in, grad_out) in reference.items():
        outcome = compare_tensors(got[name], grad_in)
        if outcome.passed:
            continue
        if compare_tensors(got[name], grad_out).passed:
            return Outcome(False, f"{name}: this is dL/d(ReLU output): what caught the gradient followed the tensor "
                                  "past the in-place ReLU (a tensor hook added after the ReLU ran, retain_grad, or "
                                  "autograd.grad on the kept tensor); register a tensor hook in a forward "
                                  "pre-hook, before the ReLU runs")
        return Outcome(False, f"{name}: {outcome.detail}")
    failed = hooks_left_when_raising(lambda: relu_grad_inputs(model, torch.randn(2, 3, 6, 6)), model)
    if failed is not None:
        return failed
    return Outcome(True, "both gradients match autograd on the same network without in-place ReLUs")
