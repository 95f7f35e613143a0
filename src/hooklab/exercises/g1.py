"""Exercises of the field guide G1, tensor and graph hooks: the memory a saved tensor keeps alive
(G1.1, section 1), a pre-hook on an autograd node (G1.2, section 4), the .grad tensors alive with an
SGD step fused into backward (prediction G1.a, section 21), the bytes autograd saves (prediction G1.b,
section 22) and the gradients of the parameters a shell-style pattern names, clamped and counted
(G1.3, section 23). Lesson 07 builds the fused step and the bfloat16 saved tensors (07.6, 07.5)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ..audit import clear_global_hooks
from ..hooks import Hooks
from ..pytorch_internals import parameter_hook_count
from . import Outcome, compare_tensors, exercise, is_handle, kind_of, not_a_handle, prediction


def _rounded(t: object) -> list | None:
    return [round(v, 4) for v in t.tolist()] if isinstance(t, torch.Tensor) else None


# ----- G1.1 (section 1): storages ----------------------------------------------------------------
def _saved_storages(fn, x: torch.Tensor) -> tuple[int, set[int]]:
    """What the tensors autograd saves while running ``fn(x)`` keep alive beyond ``x`` (the size of
    each storage they use, counted once, ``x``'s own storage left out), and the totals an answer
    gets when it counts each saved view's own size instead of its storage's."""
    saved: list[tuple[int, int, int, int]] = []  # storage address and size, data address, own size

    def note(t):
        storage = t.untyped_storage()
        saved.append((storage.data_ptr(), storage.nbytes(), t.data_ptr(), t.numel() * t.element_size()))
        return t.detach()

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

#: the functions G1.1 tries, each with the trap it sets
_SAVED_CASES = {
    "x.exp().sin().sum()": (
        lambda x: x.exp().sin().sum(),
        "exp saves its result and sin saves that same tensor as its input: count each "
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
                                  f"{type(error).__name__}: pack must return the tensor it receives, "
                                  "detached (t.detach()), and unpack give it back for backward")
        if not compare_tensors(grad, plain).passed:
            return Outcome(False, f"for {label}: backward through what your hooks saved gives another "
                                  "gradient: unpack must give back the very tensor pack received")
    return None


@exercise("G1.1", "count the memory autograd keeps for backward")
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


# ----- G1.2 (section 4): node hooks --------------------------------------------------------------
@exercise("G1.2", "double the gradient entering a graph node")
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


# ----- G1.a (section 21): an optimizer step inside backward --------------------------------------
def _mlp() -> nn.Module:
    """Section 21's MLP: six parameters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 100), nn.Tanh(), nn.Linear(100, 100), nn.Tanh(), nn.Linear(100, 10))


def gradients_alive(model: nn.Module, fuse: object = None) -> tuple[int, int]:
    """One backward of ``model`` on a fixed batch, with ``fuse(model, 0.1)``'s hooks if given: the most
    .grad tensors alive at once, and the most bytes they took, counted each time a gradient is accumulated
    and once more after backward."""
    alive, peak = [], []

    def count(q):  # runs after the fused step (registered last): q's gradient existed until then
        grads = [r.grad for r in model.parameters() if r.grad is not None and r is not q]
        alive.append(1 + len(grads))
        peak.append(q.nbytes + sum(g.nbytes for g in grads))

    with Hooks() as hooks:
        for handle in (fuse(model, 0.1) if fuse else []):
            hooks.add(handle)
        for q in model.parameters():
            hooks.add(q.register_post_accumulate_grad_hook(count))
        torch.manual_seed(1)
        x, y = torch.randn(64, 100), torch.randint(0, 10, (64,))
        nn.functional.cross_entropy(model(x), y).backward()
    grads = [r.grad for r in model.parameters() if r.grad is not None]
    return max([*alive, len(grads)]), max([*peak, sum(g.nbytes for g in grads)])


@prediction(
    "G1.a",
    "the most .grad tensors alive at once, with the fused step and with a plain backward",
    why="a plain backward leaves all six .grad tensors alive for optimizer.step(). With the step fused in, "
        "each parameter's hook frees its .grad as soon as it has been added, before the next one arrives: "
        "one .grad tensor at a time (autograd meanwhile holds the next gradient on its way back, not in a .grad).",
    wrong=[
        ([6, 6], "the fused step sets each p.grad to None right after using it, before the next parameter's "
                 "gradient is accumulated: one at a time"),
        ([0, 6], "the count includes the .grad just added, before the step frees it: it exists for a moment, "
                 "so one is alive at a time"),
        ([1, 1], "a plain backward frees none: all six .grad tensors are alive when it returns"),
        ([1, 3], "a bias has a .grad too: six parameters, six gradients after a plain backward"),
    ],
)
def _alive_at_once() -> list[int]:
    return [gradients_alive(_mlp(), fuse_sgd)[0], gradients_alive(_mlp())[0]]


# ----- G1.b (section 22): what autograd keeps for backward --------------------------------------
@prediction(
    "G1.b",
    "the bytes saved by z.exp().exp().exp().sum()",
    why="an operation saves what its derivative needs. exp's derivative is its own result, so each exp saves "
        "its result (4,000 bytes each), not its input; sum's derivative is 1 everywhere, so it keeps only a "
        "shape, no tensor. Three results: 12,000 bytes.",
    wrong=[
        (16000, "four tensors is one too many: sum's derivative is 1 for every entry, so sum saves no tensor "
                "(only its input's shape), and exp needs its result, not its input z; three exp results make "
                "12,000 bytes"),
        (4000, "each of the three exp calls saves its own result, 4,000 bytes each"),
        (8000, "all three exp calls save their result, the last one included: its backward needs it"),
        (0, "operations save what their derivative needs: each exp keeps its result alive"),
        (24000, "exp's derivative is its own result, so it saves only that, not its input as well; and sum "
                "saves no tensor"),
    ],
)
def _saved_by_exp() -> int:
    sizes = []

    def note(t):
        sizes.append(t.untyped_storage().nbytes())
        return t.detach()

    z = torch.rand(1000, requires_grad=True)
    with saved_tensors_hooks(note, lambda t: t):
        z.exp().exp().exp().sum()
    return sum(sizes)


# ----- G1.3 (section 23): clamping the gradients of the parameters a pattern names --------------
def _clamp_model() -> nn.Module:
    """Eleven layers, so that names go up to '10.bias': a pattern such as '?.bias' must name '0.bias' to
    '8.bias' and not '10.bias'."""
    torch.manual_seed(3)  # on the checker's own random stream (see ``exercise``)
    layers = []
    for _ in range(5):
        layers += [nn.Linear(3, 3), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(3, 2))


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


def _tensor_counts(clamped: object) -> Outcome | None:
    """A failed Outcome when a count is kept as a tensor (``clamped[name] += (...).sum()``): a count is a
    Python int."""
    if not isinstance(clamped, dict):
        return None
    name, value = next(((k, v) for k, v in clamped.items() if isinstance(v, torch.Tensor)), (None, None))
    if name is None:
        return None
    return Outcome(False, f"after one backward clamped[{name!r}] holds a tensor (of "
                          f"{str(value.dtype).removeprefix('torch.')}), not a number: keep each count a Python int, "
                          "int((...).sum()) or .item(); a tensor kept from "
                          "a hook can keep memory, or a graph, alive")


def _clamp_handles(answer: object) -> tuple[list, object] | Outcome:
    """The answer to G1.3 as (handles, clamped), or the Outcome saying what is wrong with it."""
    if isinstance(answer, tuple | list) and answer and all(is_handle(h) for h in answer):
        return Outcome(False, "return the pair (handles, clamped), got only handles")
    if not (isinstance(answer, tuple | list) and len(answer) == 2):
        return Outcome(False, f"return the pair (handles, clamped), got {kind_of(answer)}")
    handles, clamped = answer
    if is_handle(handles) or not isinstance(handles, Iterable) or isinstance(handles, str | torch.Tensor):
        return Outcome(False, f"the first item must be a list of handles, one per matching parameter, got "
                              f"{kind_of(handles)}")
    handles = list(handles)
    bad = next((h for h in handles if not is_handle(h)), None)
    if bad is not None or None in handles:
        return Outcome(False, f"the first item must be a list of handles, found {kind_of(bad)} in it")
    return handles, clamped


def _searched(pattern: str, name: str) -> bool:
    """Whether a glob turned into a regular expression and searched anywhere in ``name`` (no ``^``
    and ``$``), a common way to get shell patterns wrong, finds ``pattern`` in ``name``."""
    translated = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.search(translated, name) is not None


def _hooked_outcome(hooked: list[str], matching: list[str], n_handles: int, pattern: str) -> Outcome | None:
    """What is wrong with the parameters the answer hooked, and with its number of handles, if anything."""
    extra = [n for n in hooked if n not in matching]
    missing = [n for n in matching if n not in hooked]
    if extra and all(_searched(pattern, n) for n in extra):
        return Outcome(False, f"with pattern {pattern!r} your hooks also went on {extra}, which the pattern does "
                              f"not name: {pattern!r} must match the whole name ('?' is exactly one character), "
                              "but a regular expression searched anywhere in the name, without ^ and $, also "
                              f"finds it in {extra[0]!r}; test names with fnmatch.fnmatch(name, pattern)")
    if extra:
        return Outcome(False, f"with pattern {pattern!r} your hooks also went on {extra}, which "
                              "fnmatch.fnmatch(name, pattern) does not match: hook only the parameters whose "
                              "whole name matches the shell-style pattern")
    if missing:
        return Outcome(False, f"with pattern {pattern!r} no hook went on {missing}, which the pattern matches: "
                              "test every name with fnmatch.fnmatch(name, pattern), a shell-style match ('?' is "
                              "any one character, '*' any run of characters), not a substring test")
    if n_handles != len(matching):
        return Outcome(False, f"{n_handles} handles for {len(matching)} matching parameters with pattern "
                              f"{pattern!r}: return one handle per hook you registered")
    return None


def _start_outcome(counts: object, matching: list[str], pattern: str) -> Outcome | None:
    """What is wrong with the counts before any backward: every matching name at 0."""
    zeros = {n: 0 for n in matching}
    if isinstance(counts, dict) and counts != zeros:
        return Outcome(False, f"with pattern {pattern!r}, before the first backward clamped is {counts}, expected "
                              f"{zeros}: set clamped[name] = 0 when you register each name's hook, so that the "
                              "counts can be read at any time, and a parameter nothing was clamped for shows 0")
    return None


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


def _clamp_counts_outcome(counts_once, counts_twice, matching, outside, pattern, limit,
                          at_or_above=None) -> Outcome | None:
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
        if not late and counts_once == at_or_above:
            hint = (": an entry exactly at the limit is not changed by the clamp, so it is not counted; count "
                    "|value| > limit, not >=")
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
    at_or_above = {n: int((plain[n].abs() >= limit).sum()) for n in matching}
    watched = []  # registered before the answer's hooks: each incoming gradient and a copy of it
    with Hooks() as watchers:
        for q in model.parameters():
            watchers.add(q.register_hook(lambda g, into=watched: into.append((g, g.clone()))))
        before = {n: parameter_hook_count(q) for n, q in model.named_parameters()}
        handles = _clamp_handles(clamp_matching(model, pattern, limit))
        if isinstance(handles, Outcome):
            return handles
        handles, clamped = handles
        hooked = [n for n, q in model.named_parameters() if parameter_hook_count(q) > before[n]]
        wrong = _hooked_outcome(hooked, matching, len(handles), pattern) or _start_outcome(
            _counts(clamped), matching, pattern)
        if wrong:
            return wrong
        try:
            _clamp_loss(model).backward()
            once = {n: q.grad.clone() for n, q in model.named_parameters()}
            counts_once = _counts(clamped)
            as_tensors = _tensor_counts(clamped)
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
    wrong = (_clamp_grads_outcome(plain, once, twice, matching, pattern, limit) or as_tensors
             or _clamp_counts_outcome(counts_once, _counts(clamped), matching, outside, pattern, limit,
                                   at_or_above))
    if wrong:
        return wrong
    model.zero_grad(set_to_none=True)
    _clamp_loss(model).backward()
    if any(not torch.equal(q.grad, plain[n]) for n, q in model.named_parameters()):
        return Outcome(False, "after removing your handles a gradient is still changed: return the handle of "
                              "every hook you registered")
    return None


@exercise("G1.3", "clamp the gradients of the parameters a pattern names")
def _clamp(clamp_matching) -> Outcome:
    """``clamp_matching(model, pattern, limit)`` registers, on each parameter whose name matches the
    shell-style ``pattern``, a hook clamping its gradient to ``[-limit, limit]`` and counting the
    entries it clamped; returns ``(handles, clamped)`` with ``clamped[name]`` the running count.
    The hook must return a new tensor, not change ``grad`` in place."""
    model = _clamp_model()
    _clamp_loss(model).backward()
    at_limit = model[0].weight.grad.abs().flatten()[0].item()  # a limit that one gradient entry equals exactly
    for pattern, limit in (("*.weight", 0.5), ("2.*", 0.2), ("?.bias", 2.0), ("0.*", at_limit)):
        wrong = _clamp_case(clamp_matching, pattern, limit)
        if wrong:
            return wrong
    return Outcome(True, "only the matching parameters clamped, for four patterns and limits (one equal to a "
                         "gradient entry), clamped entries counted per name from 0, untouched after remove()")


# ----- worked answers the guide falls back on ----------------------------------------------------

def fuse_sgd(model: nn.Module, lr: float) -> list:
    """A worked answer to lesson 07's exercise 07.6, for section 21's count of the .grad tensors alive."""

    def step(p: torch.Tensor) -> None:
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]
