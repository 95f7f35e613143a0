"""Exercises of notebook 01: tensor hooks, node hooks, post-accumulate hooks, saved-tensor hooks."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ..audit import clear_hooks
from . import Outcome, compare_tensors, exercise, is_handle, kind_of, not_a_handle


def _rounded(t: object) -> list | None:
    return [round(v, 4) for v in t.tolist()] if isinstance(t, torch.Tensor) else None


def _clamp_model() -> nn.Module:
    torch.manual_seed(3)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _clamp_loss(model: nn.Module) -> torch.Tensor:
    x = torch.linspace(-2, 2, 12).reshape(4, 3)
    return (model(x) * torch.tensor([3.0, -2.0])).sum()


def _clamp_handles(answer: object, n: int) -> tuple[list, object] | Outcome:
    """The answer to 01.1 as (handles, clamped), or the Outcome saying what is wrong with it."""
    if not (isinstance(answer, tuple | list) and len(answer) == 2):
        return Outcome(False, f"return the pair (handles, clamped), got {kind_of(answer)}")
    if all(is_handle(h) for h in answer):
        return Outcome(False, "return the pair (handles, clamped), got only handles")
    handles, clamped = answer
    if is_handle(handles) or not isinstance(handles, Iterable) or isinstance(handles, str | torch.Tensor):
        return Outcome(False, f"the first item must be a list of handles, one per matching parameter, got "
                              f"{kind_of(handles)}")
    handles = list(handles)
    bad = next((h for h in handles if not is_handle(h)), None)
    if bad is not None or None in handles:
        return Outcome(False, f"the first item must be a list of handles, found {kind_of(bad)} in it")
    if len(handles) != n:
        return Outcome(False, f"{len(handles)} handles for {n} matching parameters: one hook per parameter whose "
                              "name matches the pattern")
    return handles, clamped


@exercise("01.1", "clamp the gradients of the parameters a pattern names")
def _clamp(clamp_matching) -> Outcome:
    """``clamp_matching(model, pattern, limit)`` registers, on each parameter whose name matches the
    shell-style ``pattern``, a hook clamping its gradient to ``[-limit, limit]`` and counting the
    entries it clamped; returns ``(handles, clamped)`` with ``clamped[name]`` the running count.
    The hook must return a new tensor, not change ``grad`` in place."""
    for pattern, limit in (("*.weight", 0.5), ("2.*", 1.5)):
        model = _clamp_model()
        _clamp_loss(model).backward()
        plain = {n: q.grad.clone() for n, q in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        matching = [n for n in plain if fnmatch.fnmatchcase(n, pattern)]
        outside = {n: int((plain[n].abs() > limit).sum()) for n in matching}

        watched = []  # registered before the answer's hooks: each incoming gradient and a copy of it
        watchers = [q.register_hook(lambda g, into=watched: into.append((g, g.clone()))) for q in model.parameters()]
        handles = _clamp_handles(clamp_matching(model, pattern, limit), len(matching))
        if isinstance(handles, Outcome):
            for h in watchers:
                h.remove()
            return handles
        handles, clamped = handles
        try:
            _clamp_loss(model).backward()
            once = {n: q.grad.clone() for n, q in model.named_parameters()}
            counts_once = dict(clamped) if isinstance(clamped, dict) else clamped
            _clamp_loss(model).backward()  # .grad not zeroed: the second gradient is added
        except KeyError as error:
            return Outcome(False, f"a hook raised KeyError: {error}: each hook must count under its own parameter's "
                                  "name (a hook made in a loop sees the loop variable's last value unless you bind "
                                  "it with name=name)")
        finally:
            for h in watchers:
                h.remove()
            for h in handles:
                h.remove()
        twice = {n: q.grad.clone() for n, q in model.named_parameters()}
        if any(not torch.equal(g, copy) for g, copy in watched):
            return Outcome(False, "the gradient your hook received was changed: the hook changed grad in place; "
                                  "return a new tensor (grad.clamp(...), not grad.clamp_(...))")
        for name in plain:
            expected = plain[name].clamp(-limit, limit) if name in matching else plain[name]
            if not compare_tensors(once[name], expected).passed:
                if name not in matching:
                    return Outcome(False, f"with pattern {pattern!r}, {name}'s gradient was changed, but the name "
                                          "does not match: hook only the parameters fnmatch matches")
                return Outcome(False, f"with pattern {pattern!r} and limit {limit:g}, {name}.grad is "
                                      f"{_rounded(once[name].flatten()[:4])}... instead of the clamped gradient")
            if not compare_tensors(twice[name], 2 * expected).passed:
                return Outcome(False, f"after a second backward without zeroing, {name}.grad is not the sum of two "
                                      "clamped gradients: clamp each gradient as it arrives (register_hook), not "
                                      "the .grad it is added to")
        if not isinstance(counts_once, dict):
            return Outcome(False, f"the second item must be a dict from parameter name to a count, got "
                                  f"{kind_of(counts_once)}")
        if sorted(counts_once) != sorted(matching):
            return Outcome(False, f"with pattern {pattern!r}, clamped has the keys {sorted(counts_once)}, expected "
                                  f"the matching names {sorted(matching)} (each one starting at 0)")
        if counts_once != outside:
            late = len(matching) > 1 and counts_once[matching[-1]] == sum(outside.values())
            hint = " (every hook counted under the loop's last name? bind it with name=name)" if late else ""
            return Outcome(False, f"with pattern {pattern!r} and limit {limit:g}, after one backward clamped is "
                                  f"{counts_once}, but {outside} entries were outside the limits{hint}")
        if clamped != {n: 2 * k for n, k in outside.items()}:
            return Outcome(False, "after a second backward the counts did not add up: add each backward's count "
                                  "to clamped[name]")
        model.zero_grad(set_to_none=True)
        _clamp_loss(model).backward()
        if any(not torch.equal(q.grad, plain[n]) for n, q in model.named_parameters()):
            return Outcome(False, "after removing your handles a gradient is still changed: return the handle of "
                                  "every hook you registered")
    return Outcome(True, "only the matching parameters clamped, for two patterns and limits, clamped entries "
                         "counted per name, untouched after remove()")


@exercise("01.2", "double the gradient entering a graph node")
def _node_prehook(double_into) -> Outcome:
    """``double_into(node)`` registers a pre-hook on an autograd ``Node`` that doubles the
    gradient flowing into it, and returns the handle."""
    w = torch.tensor([1.0, 2.0, 3.0])
    a = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    d = a.sin()  # made before b, so backward runs sin's node after exp's: both get the same gradient tensor
    b = a.exp()
    loss = ((b + d) * w).sum()
    arrived = []  # what exp's node itself received: a post-hook's grad_outputs
    watcher = b.grad_fn.register_hook(lambda grad_inputs, grad_outputs: arrived.append(grad_outputs[0].clone()))
    try:
        handle = double_into(b.grad_fn)
        bad = not_a_handle(handle, "double_into")
        if bad:
            return bad
        loss.backward(retain_graph=True)
        doubled = a.grad.clone()
        handle.remove()
        a.grad = None
        loss.backward()
        after = a.grad
    finally:
        watcher.remove()
    through_exp, through_sin = a.detach().exp() * w, a.detach().cos() * w
    expected = 2 * through_exp + through_sin
    into_node = bool(arrived) and torch.equal(arrived[0], 2 * w)
    outcome = compare_tensors(doubled, expected)
    if not outcome.passed:
        if into_node and compare_tensors(doubled, 2 * (through_exp + through_sin)).passed:
            return Outcome(False, "the gradient through sin(a), the other branch, was doubled too: the hook changed "
                                  "the gradients it received in place; return new tensors instead")
        where = "" if into_node else "; the gradient arriving at exp's node was not doubled (hooked another node?)"
        return Outcome(False, f"a.grad is {_rounded(doubled)}, expected the gradient through exp(a) doubled and the "
                              f"one through sin(a) unchanged ({outcome.detail}){where}")
    if not into_node:
        return Outcome(
            False,
            "a.grad is right, but the gradient arriving at the node was not doubled: you doubled what it computed "
            "(a post-hook) or hooked another node; double what enters this node with node.register_prehook",
        )
    if not compare_tensors(after, through_exp + through_sin).passed:
        return Outcome(False, "after handle.remove() the gradient is still doubled: return the handle of the "
                              "pre-hook you registered")
    return Outcome(True, f"the gradient into exp's node doubled, the other branch untouched ({outcome.detail})")


def _small_model() -> nn.Module:
    torch.manual_seed(1)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _handles_of(handles) -> list | Outcome:
    """The answer to 01.3 as a list of handles, or the Outcome saying what is wrong with it."""
    if is_handle(handles):
        return Outcome(False, "fuse_sgd returned one handle: return a list of handles, one per parameter")
    if not isinstance(handles, Iterable) or isinstance(handles, str | torch.Tensor):
        return Outcome(False, f"fuse_sgd must return a list of handles, one per parameter, got {kind_of(handles)}")
    handles = list(handles)
    bad = next((h for h in handles if not is_handle(h)), None)
    if bad is not None or None in handles:
        nested = " (a nested list? return one flat list)" if isinstance(bad, list | tuple) else ""
        return Outcome(False, f"fuse_sgd must return a list of handles, found {kind_of(bad)} in it{nested}")
    return handles


@exercise("01.3", "an SGD step fused into backward")
def _fused_sgd(fuse_sgd) -> Outcome:
    """``fuse_sgd(model, lr)`` registers post-accumulate-grad hooks that update each parameter
    with ``p -= lr * p.grad`` and then free ``p.grad``; returns the list of handles. The second
    case runs ``backward(create_graph=True)``, whose hooks run with gradient recording on."""
    x = torch.linspace(-1, 1, 15).reshape(5, 3)
    for lr, create_graph in ((0.1, False), (0.05, True)):
        reference, model = _small_model(), _small_model()
        optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
        reference(x).pow(2).sum().backward()
        optimizer.step()
        handles = _handles_of(fuse_sgd(model, lr))
        if isinstance(handles, Outcome):
            return handles
        n = len(list(model.parameters()))
        if len(handles) != n:
            return Outcome(False, f"{len(handles)} handles for {n} parameters")
        try:
            with warnings.catch_warnings():  # create_graph=True warns about the graph kept by .grad
                warnings.filterwarnings("ignore", message="Using backward.. with create_graph=True")
                model(x).pow(2).sum().backward(create_graph=create_graph)
        except TypeError as error:
            if "NoneType" not in str(error):
                raise
            return Outcome(False, "a hook read a .grad that is None: use the parameter the hook receives (a hook "
                                  "made in a loop that uses the loop variable sees only its last value)")
        except RuntimeError as error:
            if "leaf Variable that requires grad" not in str(error):
                raise
            return Outcome(False, "with backward(create_graph=True), updating p in place raised 'a leaf Variable "
                                  "that requires grad is being used in an in-place operation': do the update "
                                  "under torch.no_grad()")
        finally:
            for h in handles:
                h.remove()
        left = clear_hooks(model)
        if left:
            return Outcome(False, f"after removing your handles, hooks were still there ({left[0]}): register "
                                  "only the update hooks, and return every handle")
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            outcome = compare_tensors(p.detach(), q.detach())
            if not outcome.passed:
                return Outcome(False, f"with lr={lr}, parameter {name} differs from torch.optim.SGD's step "
                                      f"({outcome.detail})")
            if p.grad is not None:
                return Outcome(False, f"{name}.grad is still kept: set p.grad = None after the step to free it")
    return Outcome(True, "same parameters as torch.optim.SGD for two learning rates, and no .grad kept")


def _same(t):
    return t


def _shapes_of(got, label: str) -> list | Outcome:
    """The answer to 01.4 as a list of tuples, or the Outcome saying what is wrong with it."""
    advice = "return a list of shapes, tuple(t.shape) for each saved t"
    if got is None or not isinstance(got, Iterable) or isinstance(got, str | torch.Tensor):
        return Outcome(False, f"for {label}: got {kind_of(got)}; {advice}")
    got = list(got)
    if any(isinstance(s, torch.Tensor) for s in got):
        return Outcome(False, f"for {label}: got tensors; {advice}")
    bad = next((s for s in got if not (isinstance(s, tuple | list) and all(isinstance(n, int) for n in s))), None)
    if bad is not None:
        return Outcome(False, f"for {label}: got a list holding {kind_of(bad)}; {advice}")
    return [tuple(s) for s in got]


@exercise("01.4", "list what autograd saves for backward")
def _saved(saved_shapes) -> Outcome:
    """``saved_shapes(fn, x)`` runs ``fn(x)`` and returns the shapes (tuples) of the tensors
    autograd saved for backward, in the order they were saved. Backward through what the answer's
    hooks saved must give the same gradient as without them."""
    cases = {
        "x.exp().sin().sum()": lambda x: x.exp().sin().sum(),
        "x @ x.T": lambda x: x @ x.T,
        "relu(x).mean()": lambda x: torch.relu(x).mean(),
    }
    for label, fn in cases.items():
        x = torch.linspace(-1, 1, 6).reshape(2, 3).requires_grad_()
        expected: list[tuple] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, into=expected: into.append(tuple(t.shape)) or t, _same):
            out = fn(x)
        (plain,) = torch.autograd.grad(out, x, torch.ones_like(out))
        runs = []

        def watched(inp, fn=fn, runs=runs):
            out = fn(inp)
            runs.append((inp, out))
            return out

        got = _shapes_of(saved_shapes(watched, x.detach().clone().requires_grad_()), label)
        if isinstance(got, Outcome):
            return got
        if got != expected:
            return Outcome(False, f"for {label}: got {got}, autograd saved {expected}")
        for inp, out in runs:
            if not (isinstance(out, torch.Tensor) and out.requires_grad and inp.requires_grad):
                continue
            try:
                (grad,) = torch.autograd.grad(out, inp, torch.ones_like(out))
            except (RuntimeError, TypeError) as error:
                return Outcome(False, f"for {label}: backward through what your hooks saved raised "
                                      f"{type(error).__name__}: unpack must give back the very tensor pack received")
            if not compare_tensors(grad, plain).passed:
                return Outcome(False, f"for {label}: backward through what your hooks saved gives another gradient: "
                                      "unpack must give back the very tensor pack received")
    return Outcome(True, f"right shapes for {len(cases)} functions, and backward still works")
