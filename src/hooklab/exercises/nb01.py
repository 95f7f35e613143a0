"""Exercises of notebook 01: tensor hooks, node hooks, post-accumulate hooks, saved-tensor hooks."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ..audit import clear_global_hooks, clear_hooks
from ..hooks import Hooks
from . import Outcome, compare_tensors, exercise, hint_for, is_handle, kind_of, not_a_handle


def _rounded(t: object) -> list | None:
    return [round(v, 4) for v in t.tolist()] if isinstance(t, torch.Tensor) else None


def _scale_case(scale_grad, factor: float, leaf: bool) -> Outcome | None:
    """The answer on a leaf or on an intermediate tensor: one backward with the hook, one without."""
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = torch.tensor([0.5, 2.0, -4.0])
    t = x if leaf else x * 2
    through = 1.0 if leaf else 2.0  # d t / d x
    seen = []  # registered before the answer's hook: what arrives at t, and a copy of it
    with Hooks() as watcher:
        watcher.add(t.register_hook(lambda g: seen.append((g, g.clone()))))
        handle = scale_grad(t, factor)
        bad = not_a_handle(handle, "scale_grad")
        if bad:
            return bad
        try:
            (t * w).sum().backward(retain_graph=True)
        finally:
            handle.remove()
        with_hook = x.grad.clone()
        x.grad = None
        (t * w).sum().backward()
    where = "a parameter-like leaf" if leaf else "an intermediate tensor (x * 2)"
    if any(not torch.equal(g, copy) for g, copy in seen):
        return Outcome(False, "the hook changed the gradient it received in place: return a new tensor "
                              "(grad * factor), do not write into grad")
    if torch.equal(with_hook, through * w):
        return Outcome(False, f"on {where}, the gradient was not scaled: the hook must return the new gradient "
                              "(a hook that returns None leaves it as it was)")
    if not compare_tensors(with_hook, factor * through * w).passed:
        return Outcome(False, f"on {where} with factor {factor:g}, x.grad is {_rounded(with_hook)}, expected "
                              f"{_rounded(factor * through * w)}: return grad * factor")
    if not torch.equal(x.grad, through * w):
        return Outcome(False, "after handle.remove() the gradient is still scaled: return the handle of the hook")
    return None


@exercise("01.1", "scale the gradient arriving at a tensor")
def _scale(scale_grad) -> Outcome:
    """``scale_grad(t, factor)`` registers a hook on tensor ``t`` that returns its gradient times
    ``factor``, and returns the handle."""
    for factor, leaf in ((3.0, True), (-0.5, False)):
        wrong = _scale_case(scale_grad, factor, leaf)
        if wrong:
            return wrong
    return Outcome(True, "gradient scaled on a leaf and on an intermediate tensor, and back to normal after "
                         "remove()")


def _norms_graph() -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """A leaf, three named tensors made from it (``unused`` never reaches the loss), and the loss."""
    x = torch.linspace(-1, 1, 6, requires_grad=True)
    named = {"h": x * 3, "a": (x * 3).tanh(), "unused": x.exp()}
    loss = (named["a"] * torch.arange(6.0)).sum() + named["h"].pow(2).sum()
    return x, named, loss


def _norms_handles(answer: object, n: int) -> tuple[dict, list] | Outcome:
    """The answer to 01.2 as (norms, handles), or the Outcome saying what is wrong with it."""
    if not (isinstance(answer, tuple | list) and len(answer) == 2):
        return Outcome(False, f"return the pair (norms, handles), got {kind_of(answer)}")
    norms, handles = answer
    if not isinstance(norms, dict):
        return Outcome(False, f"the first item must be the dict from name to a list of norms, got {kind_of(norms)}")
    if isinstance(handles, str | torch.Tensor) or not isinstance(handles, Iterable) or is_handle(handles):
        return Outcome(False, f"the second item must be a list of handles, got {kind_of(handles)}")
    handles = list(handles)
    if len(handles) != n or not all(is_handle(h) for h in handles):
        return Outcome(False, f"the second item must hold the {n} handles, one per tensor, got "
                              f"{[kind_of(h) for h in handles]}")
    return norms, handles


def _norms_outcome(norms: dict, expected: dict[str, list[float]]) -> Outcome | None:
    """What is wrong with the norms after two backward passes, if anything."""
    if sorted(norms) != sorted(expected):
        return Outcome(False, f"norms has the keys {sorted(norms)}, expected every name {sorted(expected)}, each "
                              "with a list (empty until a gradient arrives)")
    bad = next((v for vs in norms.values() if isinstance(vs, list) for v in vs if not isinstance(v, float)), None)
    if bad is not None or not all(isinstance(v, list) for v in norms.values()):
        return Outcome(False, f"each value must be a list of Python floats (grad.norm().item()), found "
                              f"{kind_of(bad)}: a kept tensor keeps memory alive")
    for name, want in expected.items():
        got = norms[name]
        if len(got) == len(want) and all(abs(g - e) <= 1e-5 * max(1.0, e) for g, e in zip(got, want, strict=True)):
            continue
        late = name != "unused" and len(norms[list(expected)[-1]]) > 0
        hint = (" (every hook appended under the loop's last name? bind it with name=name)" if late else
                ": append the norm of each gradient the tensor receives, one per backward")
        return Outcome(False, f"norms[{name!r}] is {[round(v, 4) for v in got]}, expected "
                              f"{[round(v, 4) for v in want]}{hint}")
    return None


@exercise("01.2", "the gradient norm of each named tensor")
def _named_norms(grad_norms) -> Outcome:
    """``grad_norms(named)`` registers a hook on each tensor of the dict ``named`` that appends the
    norm of every gradient it receives, as a float, to ``norms[name]``; returns ``(norms, handles)``.
    The hooks must leave the gradients unchanged."""
    x, named, loss = _norms_graph()
    grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True, retain_graph=True)
    plain = dict(zip(named, grads, strict=True))
    expected = {n: [] if g is None else 2 * [g.norm().item()] for n, g in plain.items()}
    (x_plain,) = torch.autograd.grad(loss, x, retain_graph=True)
    answer = _norms_handles(grad_norms(named), len(named))
    if isinstance(answer, Outcome):
        return answer
    norms, handles = answer
    try:
        loss.backward(retain_graph=True)
        x_once = x.grad.clone()
        loss.backward(retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    x.grad = None
    loss.backward()
    if not compare_tensors(x_once, x_plain).passed:
        return Outcome(False, "with your hooks x.grad changed: a hook that only measures must return None")
    if not compare_tensors(x.grad, x_plain).passed:
        return Outcome(False, "after removing your handles the gradient is still changed")
    return _norms_outcome(norms, expected) or Outcome(
        True, "one norm per backward under each tensor's own name, gradients unchanged, none for the unused tensor")


def _clamp_model() -> nn.Module:
    torch.manual_seed(3)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _clamp_loss(model: nn.Module) -> torch.Tensor:
    x = torch.linspace(-2, 2, 12).reshape(4, 3)
    return (model(x) * torch.tensor([3.0, -2.0])).sum()


def _counts(clamped: object) -> object:
    """A snapshot of the answer's counts: a count kept as a tensor is read now, since a later
    ``clamped[name] += ...`` may change that tensor in place."""
    if not isinstance(clamped, dict):
        return clamped
    return {k: (v.item() if v.numel() == 1 else v.tolist()) if isinstance(v, torch.Tensor) else v
            for k, v in clamped.items()}


def _clamp_handles(answer: object, n: int, pattern: str) -> tuple[list, object] | Outcome:
    """The answer to 01.3 as (handles, clamped), or the Outcome saying what is wrong with it."""
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
        return Outcome(False, f"{len(handles)} handles for {n} matching parameters with pattern {pattern!r}: one "
                              "hook per parameter whose name matches it; test names with fnmatch.fnmatch(name, "
                              "pattern), a shell-style match ('?' is any one character), not a substring test")
    return handles, clamped


def _clamp_grads_outcome(plain, once, twice, matching, pattern, limit) -> Outcome | None:
    """What is wrong with the gradients after one and after two backward passes, if anything."""
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
    return None


def _clamp_counts_outcome(counts_once, counts_twice, matching, outside, pattern, limit) -> Outcome | None:
    """What is wrong with the counts of clamped entries after one and two backward passes, if anything."""
    if not isinstance(counts_once, dict):
        return Outcome(False, f"the second item must be a dict from parameter name to a count, got "
                              f"{kind_of(counts_once)}")
    if sorted(counts_once) != sorted(matching):
        return Outcome(False, f"with pattern {pattern!r}, clamped has the keys {sorted(counts_once)}, expected "
                              f"the matching names {sorted(matching)} (each one starting at 0)")
    if counts_once != outside:
        late = (len(matching) > 1 and counts_once[matching[-1]] == sum(outside.values())
                and all(counts_once[n] == 0 for n in matching[:-1]))
        hint = " (every hook counted under the loop's last name? bind it with name=name)" if late else ""
        return Outcome(False, f"with pattern {pattern!r} and limit {limit:g}, after one backward clamped is "
                              f"{counts_once}, but {outside} entries were outside the limits{hint}")
    if counts_twice != {n: 2 * k for n, k in outside.items()}:
        return Outcome(False, "after a second backward the counts did not add up: add each backward's count "
                              "to clamped[name]")
    return None


def _clamp_case(clamp_matching, pattern: str, limit: float) -> Outcome | None:
    """The answer for one pattern and limit: two backward passes, then one after its hooks are removed."""
    model = _clamp_model()
    _clamp_loss(model).backward()
    plain = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    matching = [n for n in plain if fnmatch.fnmatchcase(n, pattern)]
    outside = {n: int((plain[n].abs() > limit).sum()) for n in matching}
    watched = []  # registered before the answer's hooks: each incoming gradient and a copy of it
    with Hooks() as watchers:
        for q in model.parameters():
            watchers.add(q.register_hook(lambda g, into=watched: into.append((g, g.clone()))))
        handles = _clamp_handles(clamp_matching(model, pattern, limit), len(matching), pattern)
        if isinstance(handles, Outcome):
            return handles
        handles, clamped = handles
        try:
            _clamp_loss(model).backward()
            once = {n: q.grad.clone() for n, q in model.named_parameters()}
            counts_once = _counts(clamped)
            _clamp_loss(model).backward()  # .grad not zeroed: the second gradient is added
        except KeyError as error:
            return Outcome(False, f"a hook raised KeyError: {error}: each hook must count under its own parameter's "
                                  "name (a hook made in a loop sees the loop variable's last value unless you bind "
                                  "it with name=name)")
        finally:
            for h in handles:
                h.remove()
    twice = {n: q.grad.clone() for n, q in model.named_parameters()}
    if any(not torch.equal(g, copy) for g, copy in watched):
        return Outcome(False, "the gradient your hook received was changed: the hook changed grad in place; "
                              "return a new tensor (grad.clamp(...), not grad.clamp_(...))")
    wrong = (_clamp_grads_outcome(plain, once, twice, matching, pattern, limit)
             or _clamp_counts_outcome(counts_once, _counts(clamped), matching, outside, pattern, limit))
    if wrong:
        return wrong
    model.zero_grad(set_to_none=True)
    _clamp_loss(model).backward()
    if any(not torch.equal(q.grad, plain[n]) for n, q in model.named_parameters()):
        return Outcome(False, "after removing your handles a gradient is still changed: return the handle of "
                              "every hook you registered")
    return None


@exercise("01.3", "clamp the gradients of the parameters a pattern names")
def _clamp(clamp_matching) -> Outcome:
    """``clamp_matching(model, pattern, limit)`` registers, on each parameter whose name matches the
    shell-style ``pattern``, a hook clamping its gradient to ``[-limit, limit]`` and counting the
    entries it clamped; returns ``(handles, clamped)`` with ``clamped[name]`` the running count.
    The hook must return a new tensor, not change ``grad`` in place."""
    for pattern, limit in (("*.weight", 0.5), ("2.*", 1.5), ("?.bias", 2.0)):
        wrong = _clamp_case(clamp_matching, pattern, limit)
        if wrong:
            return wrong
    return Outcome(True, "only the matching parameters clamped, for three patterns and limits, clamped entries "
                         "counted per name, untouched after remove()")


def _small_model() -> nn.Module:
    torch.manual_seed(1)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _handles_of(handles) -> list | Outcome:
    """The answer to 01.4 as a list of handles, or the Outcome saying what is wrong with it."""
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


@exercise("01.4", "an SGD step fused into backward")
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
        except (TypeError, RuntimeError) as error:
            return hint_for(error, {
                "NoneType": "a hook read a .grad that is None: use the parameter the hook receives (a hook made in a "
                            "loop that uses the loop variable sees only its last value)",
                "leaf Variable that requires grad": "with backward(create_graph=True), updating p in place raised 'a "
                    "leaf Variable that requires grad is being used in an in-place operation': do the update under "
                    "torch.no_grad()",
            })  # fmt: skip
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


@exercise("01.5", "double the gradient entering a graph node")
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


def _saved_storages(fn, x: torch.Tensor) -> tuple[int, set[int]]:
    """What the tensors autograd saves while running ``fn(x)`` keep alive beyond ``x`` (the size of
    each storage they use, counted once, ``x``'s own storage left out), and the totals an answer
    gets when it counts each saved view's own size instead of its storage's."""
    saved: list[tuple[int, int, int, int]] = []  # storage address and size, data address, own size

    def note(t):
        storage = t.untyped_storage()
        saved.append((storage.data_ptr(), storage.nbytes(), t.data_ptr(), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(note, lambda t: t):
        out = fn(x)
    del out
    base = x.untyped_storage().data_ptr()
    kept = [s for s in saved if s[0] != base]
    right = sum({where: size for where, size, _, _ in kept}.values())
    first, last = {}, {}
    for where, _, _, own_size in kept:
        first.setdefault(where, own_size)
        last[where] = own_size
    by_data = {data: own_size for _, _, data, own_size in saved if data != x.data_ptr()}
    own = {sum(first.values()), sum(last.values()), sum(by_data.values())} - {right}
    return right, own


_WHOLE_STORAGE = ("a saved view keeps all of the storage it lives in alive, not only the elements it shows: "
                  "count the storage's size (t.untyped_storage().nbytes()), not t.numel() * t.element_size()")

#: the functions 01.6 tries, each with the trap it sets
_SAVED_CASES = {
    "x.exp().sin().sum()": (
        lambda x: x.exp().sin().sum(),
        "exp saves its result and sin saves that same tensor as its input (section 6): count each "
        "block (storage) once, however many times it is saved",
    ),
    "x @ x.T": (
        lambda x: x @ x.T,
        "matmul saves x and x.T, both in x's own storage, which the caller keeps anyway: leave x's storage out",
    ),
    "x[:, 1:].sin().sum()": (
        lambda x: x[:, 1:].sin().sum(),
        "sin saves x[:, 1:], a view of x whose first element lies one element into x's memory, so its "
        "t.data_ptr() is not x.data_ptr(), yet its storage is x's: compare storages "
        "(t.untyped_storage().data_ptr()), not t.data_ptr()",
    ),
    "x.exp()[:, 1:].pow(2).sum()": (
        lambda x: x.exp()[:, 1:].pow(2).sum(),
        "pow saves y[:, 1:], a view into exp's saved result y: it starts at another t.data_ptr() but lives in "
        "the same storage, so count storages (t.untyped_storage().data_ptr()), not data pointers",
    ),
    "(2 * x)[:, 1:].cos().sum()": (
        lambda x: (2 * x)[:, 1:].cos().sum(),
        f"cos saves a view of 2 * x; {_WHOLE_STORAGE}",
    ),
}


def _fails_then_raises(x):
    x.exp().sin()  # something is saved before the error
    raise ValueError("a forward pass that fails on purpose")


def _saved_backward_outcome(runs: list, plain: torch.Tensor, label: str) -> Outcome | None:
    """Backward through what the answer's hooks saved, for each ``(input, output)`` of ``fn``."""
    for inp, out in runs:
        if not (isinstance(out, torch.Tensor) and out.requires_grad and inp.requires_grad):
            continue
        try:
            (grad,) = torch.autograd.grad(out, inp, torch.ones_like(out))
        except (RuntimeError, TypeError) as error:
            return Outcome(False, f"for {label}: backward through what your hooks saved raised "
                                  f"{type(error).__name__}: pack must return the tensor it receives "
                                  "(unpack gets it back for backward)")
        if not compare_tensors(grad, plain).passed:
            return Outcome(False, f"for {label}: backward through what your hooks saved gives another "
                                  "gradient: unpack must give back the very tensor pack received")
    return None


@exercise("01.6", "count the memory autograd keeps for backward")
def _saved(saved_bytes) -> Outcome:
    """``saved_bytes(fn, x)`` runs ``fn(x)`` under saved-tensor hooks and returns how many bytes the
    saved tensors keep alive beyond ``x``: each storage once (views share their base's), its whole
    size, ``x``'s own storage not counted. Backward through what the answer's hooks saved must
    give the same gradient as without them, and no hooks may stay active when ``fn`` raises."""
    for shape in ((2, 3), (4, 5)):
        for label, (fn, trap) in _SAVED_CASES.items():
            x = torch.linspace(-1, 1, shape[0] * shape[1]).reshape(shape).requires_grad_()
            expected, own_sizes = _saved_storages(fn, x)
            out = fn(x)
            (plain,) = torch.autograd.grad(out, x, torch.ones_like(out))
            runs = []

            def watched(inp, fn=fn, runs=runs):
                out = fn(inp)
                runs.append((inp, out))
                return out

            got = saved_bytes(watched, x.detach().clone().requires_grad_())
            if isinstance(got, bool) or not isinstance(got, int):
                return Outcome(False, f"for {label}: got {kind_of(got)}; return the number of bytes as an int")
            if not runs:
                return Outcome(False, f"for {label}: fn was never called; run fn(x) under your hooks")
            if got != expected:
                if got in own_sizes:
                    trap = _WHOLE_STORAGE
                elif got < expected:
                    trap = ("that is fewer bytes than the saved tensors keep alive: note every tensor pack "
                            "receives, and add up the size of each storage once")
                return Outcome(False, f"for {label} with x of shape {shape}: got {got} bytes; {trap}")
            wrong = _saved_backward_outcome(runs, plain, label)
            if wrong:
                return wrong
    try:
        saved_bytes(_fails_then_raises, torch.ones(2, 3, requires_grad=True))
    except ValueError:
        pass  # the error should come through: the point is what is left active
    left = clear_global_hooks()
    if left:
        return Outcome(False, f"when fn raised, your saved-tensor hooks stayed active ({'; '.join(left)}): every "
                              "later operation would go through them; use them as a `with` block, which exits "
                              "also when fn raises")
    return Outcome(True, f"right byte counts for {len(_SAVED_CASES)} functions on two shapes of x, backward still "
                         "works, and no hooks left when fn raises")
