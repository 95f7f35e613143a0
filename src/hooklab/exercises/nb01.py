"""Exercises of notebook 01: tensor hooks, node hooks, post-accumulate hooks, saved-tensor hooks."""

from __future__ import annotations

import torch
from torch import nn

from . import Outcome, compare_tensors, exercise


def _removable(handle, what: str) -> Outcome | None:
    if not callable(getattr(handle, "remove", None)):
        return Outcome(False, f"{what} must return the handle (something with .remove()), got {type(handle).__name__}")
    return None


@exercise("01.1", "clamp a gradient with a tensor hook")
def _clamp(clamp_grad) -> Outcome:
    """``clamp_grad(t, limit)`` registers a hook on ``t`` clamping its gradient to ``[-limit, limit]``
    and returns the handle. The hook must return a new tensor, not change ``grad`` in place."""
    t = torch.zeros(4, requires_grad=True)
    u = torch.zeros(4, requires_grad=True)  # t + u hands the very same gradient tensor to t and u
    weights = torch.tensor([-3.0, 0.5, 2.0, -0.25])
    handle = clamp_grad(t, 1.0)
    bad = _removable(handle, "clamp_grad")
    if bad:
        return bad
    try:
        ((t + u) * weights).sum().backward()
    finally:
        handle.remove()
    clamped = t.grad.clone()
    if not torch.equal(u.grad, weights):
        return Outcome(
            False,
            f"u, which shares t's gradient, got {u.grad.tolist()} instead of {weights.tolist()}: "
            "the hook changed grad in place; return a new tensor (grad.clamp(...), not grad.clamp_(...))",
        )
    t.grad = None
    (t * weights).sum().backward()
    if not torch.equal(t.grad, weights):
        return Outcome(False, "after handle.remove() the gradient is still changed: remove the hook with its handle")
    outcome = compare_tensors(clamped, weights.clamp(-1.0, 1.0))
    if not outcome.passed:
        return Outcome(False, f"t.grad is {clamped.tolist()} for the gradient {weights.tolist()} and limit 1")
    return Outcome(True, "gradient clamped while the hook was registered, untouched after remove()")


@exercise("01.2", "double the gradient entering a graph node")
def _node_prehook(double_into) -> Outcome:
    """``double_into(node)`` registers a pre-hook on an autograd ``Node`` that doubles the
    gradient flowing into it, and returns the handle."""
    a = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    b = a.exp()
    arrived = []  # what the node itself received: a post-hook's grad_outputs
    watcher = b.grad_fn.register_hook(lambda grad_inputs, grad_outputs: arrived.append(grad_outputs[0].clone()))
    handle = double_into(b.grad_fn)
    bad = _removable(handle, "double_into")
    try:
        if bad:
            return bad
        try:
            (b * torch.tensor([1.0, 2.0, 3.0])).sum().backward(retain_graph=True)
        finally:
            handle.remove()
    finally:
        watcher.remove()
    expected = 2 * a.detach().exp() * torch.tensor([1.0, 2.0, 3.0])
    outcome = compare_tensors(a.grad, expected)
    if not outcome.passed:
        return Outcome(False, f"a.grad is {a.grad.tolist()}, expected twice exp(a) * [1, 2, 3] ({outcome.detail})")
    if not torch.equal(arrived[0], torch.tensor([2.0, 4.0, 6.0])):
        return Outcome(
            False,
            "a.grad is doubled, but the node received the gradient unchanged: you doubled what it computed "
            "(a post-hook); double what enters it with node.register_prehook",
        )
    return Outcome(True, f"a.grad doubled by the node pre-hook ({outcome.detail})")


def _small_model() -> nn.Module:
    torch.manual_seed(1)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


@exercise("01.3", "an SGD step fused into backward")
def _fused_sgd(fuse_sgd) -> Outcome:
    """``fuse_sgd(model, lr)`` registers post-accumulate-grad hooks that update each parameter
    with ``p -= lr * p.grad`` and then free ``p.grad``; returns the list of handles."""
    x = torch.linspace(-1, 1, 15).reshape(5, 3)
    reference, model = _small_model(), _small_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).pow(2).sum().backward()
    optimizer.step()
    handles = fuse_sgd(model, 0.1)
    try:
        handles = list(handles)
        bad = next((_removable(h, "fuse_sgd") for h in handles if _removable(h, "fuse_sgd")), None)
        if bad:
            return bad
        if len(handles) != len(list(model.parameters())):
            return Outcome(False, f"{len(handles)} handles for {len(list(model.parameters()))} parameters")
        model(x).pow(2).sum().backward()
    finally:
        for h in handles:
            if callable(getattr(h, "remove", None)):
                h.remove()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        outcome = compare_tensors(p.detach(), q.detach())
        if not outcome.passed:
            return Outcome(False, f"parameter {name} differs from torch.optim.SGD's step ({outcome.detail})")
        if p.grad is not None:
            return Outcome(False, f"{name}.grad is still kept: set p.grad = None after the step to free it")
    return Outcome(True, "same parameters as torch.optim.SGD, and no .grad kept")


def _same(t):
    return t


@exercise("01.4", "list what autograd saves for backward")
def _saved(saved_shapes) -> Outcome:
    """``saved_shapes(fn, x)`` runs ``fn(x)`` and returns the shapes (tuples) of the tensors
    autograd saved for backward, in the order they were saved."""
    cases = {
        "x.exp().sin().sum()": lambda x: x.exp().sin().sum(),
        "x @ x.T": lambda x: x @ x.T,
        "relu(x).mean()": lambda x: torch.relu(x).mean(),
    }
    for label, fn in cases.items():
        x = torch.linspace(-1, 1, 6).reshape(2, 3).requires_grad_()
        expected: list[tuple] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, into=expected: into.append(tuple(t.shape)) or t, _same):
            fn(x)
        got = saved_shapes(fn, x.detach().clone().requires_grad_())
        if got is None or any(isinstance(s, torch.Tensor) for s in got):
            kind = "None" if got is None else "tensors"
            return Outcome(False, f"for {label}: got {kind}; return a list of shapes, tuple(t.shape) for each saved t")
        got = [tuple(s) for s in got]
        if got != expected:
            return Outcome(False, f"for {label}: got {got}, autograd saved {expected}")
    return Outcome(True, f"right shapes for {len(cases)} functions")
