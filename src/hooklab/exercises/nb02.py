"""Exercises of notebook 02: module forward hooks."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from ..layers import layer_names
from ..models import SeedConvNet
from ..record import record
from . import Outcome, compare_tensors, exercise


class _Block(nn.Module):
    """A small residual block that calls its ReLU twice, like torchvision's BasicBlock."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        self.extra = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.fc(x))
        return self.relu(self.extra(out) + x)


def _order_model() -> nn.Module:
    torch.manual_seed(2)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), _Block(), nn.Sequential(nn.Linear(4, 2)))


@exercise("02.1", "every module call, in execution order")
def _execution_order(execution_order) -> Outcome:
    """``execution_order(model, x)`` returns the name of every submodule (not the root), once per call."""
    model = _order_model()
    x = torch.ones(2, 3)
    try:
        got = execution_order(model, x)
    finally:
        left = clear_hooks(model)  # never leave a student's hook behind on the checker's model
    if left:
        return Outcome(False, f"hooks were left registered: {left[0]} (remove them in a finally block)")
    with record(model, layers=layer_names(model)[1:]) as rec:
        model(x)
    expected = [r.name for r in rec]
    got = list(got) if got is not None else []
    if got == expected:
        return Outcome(True, f"{len(expected)} calls in the right order, no hook left behind")
    if sorted(got) == sorted(expected):
        return Outcome(False, "the right calls in the wrong order: a container's forward hook fires after its children")
    if len(got) == len(expected) and len(set(got)) < len(set(expected)):
        return Outcome(
            False,
            f"{len(got)} calls but only the names {sorted(set(got))}: each hook must keep its own name "
            "(a lambda in a loop sees the loop variable's last value; pin it with name=name)",
        )
    return Outcome(
        False, f"{len(got)} calls, expected {len(expected)} (containers count; a module called twice counts twice)"
    )


@exercise("02.2", "clip a layer's output with a forward hook")
def _clip_output(clip_output) -> Outcome:
    """``clip_output(module, limit)`` registers a forward hook clamping the output to [-limit, limit]."""
    layer = nn.Linear(3, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 0, 0], [-3.0, 0, 0], [0.1, 0, 0], [0, 2.0, -2.0]]))
        layer.bias.zero_()
    x = torch.tensor([[1.0, 1.0, -1.0]])
    plain = layer(x).detach()
    handle = clip_output(layer, 1.5)
    try:
        clipped = layer(x)
    finally:
        if handle is not None:
            handle.remove()
    if handle is None:
        return Outcome(False, "return the handle that register_forward_hook gave you")
    outcome = compare_tensors(clipped, plain.clamp(-1.5, 1.5))
    if not outcome.passed:
        return Outcome(False, f"the clipped output is wrong: {outcome.detail}")
    if not torch.equal(layer(x).detach(), plain):
        return Outcome(False, "after handle.remove() the layer must give its plain output again")
    if not clipped.requires_grad:
        return Outcome(False, "the clipped output lost its gradient: clamp the tensor itself, not .detach() of it")
    return Outcome(True, "output clipped to [-1.5, 1.5], plain again after remove()")


@exercise("02.3", "keep a layer's output, safe from in-place ops")
def _keep_output(keep_output) -> Outcome:
    """``keep_output(module)`` returns ``(kept, handle)``; ``kept`` gets one tensor per call."""
    model = SeedConvNet(seed=0, inplace=True)
    x = torch.linspace(-1, 1, 36).reshape(1, 1, 6, 6).requires_grad_()
    with torch.no_grad():
        expected = model.conv1(x)
    kept, handle = keep_output(model.conv1)
    try:
        model(x).sum().backward()
        model(x * 2)
    finally:
        handle.remove()
    model(x)  # after remove(): must not be kept
    if len(kept) != 2:
        return Outcome(False, f"kept {len(kept)} tensors for 2 calls before remove() (and 1 after)")
    first = kept[0]
    if not isinstance(first, torch.Tensor):
        return Outcome(False, f"kept a {type(first).__name__}, expected a tensor")
    if first.requires_grad or first.grad_fn is not None:
        return Outcome(False, "the kept tensor is still in the autograd graph: detach it")
    if (first >= 0).all() and (expected < 0).any():
        return Outcome(False, "the kept output has no negative values: the in-place ReLU overwrote it (clone it)")
    outcome = compare_tensors(first, expected)
    if not outcome.passed:
        return Outcome(False, f"the kept output differs from conv1(x): {outcome.detail}")
    return Outcome(True, "2 detached copies holding the conv output before the in-place ReLU")


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor, *, factor: float = 1.0) -> torch.Tensor:
        return x * factor


@exercise("02.4", "force a keyword argument with a with_kwargs pre-hook")
def _force_keyword(force_keyword) -> Outcome:
    """``force_keyword(module, name, value)`` makes every call run with ``name=value``; returns the handle."""
    module = _Scale()
    x = torch.tensor([1.0, -2.0])
    handle = force_keyword(module, "factor", 0.5)
    try:
        given = module(x, factor=3.0)
        default = module(x)
    finally:
        if handle is not None:
            handle.remove()
    if handle is None:
        return Outcome(False, "return the handle that register_forward_pre_hook gave you")
    for what, got in (("a call with factor=3.0", given), ("a call without factor", default)):
        outcome = compare_tensors(got, x * 0.5)
        if not outcome.passed:
            return Outcome(False, f"{what} did not run with factor=0.5: {outcome.detail}")
    if not torch.equal(module(x, factor=3.0), x * 3.0):
        return Outcome(False, "after handle.remove() the module must use the given factor again")
    return Outcome(True, "factor=0.5 forced whether or not the caller passed it")
