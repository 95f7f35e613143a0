"""Exercises of the field guide G1, tensor and graph hooks: the memory a saved tensor keeps alive
(G1.1, section 1) and a pre-hook on an autograd node (G1.2, section 4)."""

from __future__ import annotations

import torch

from ..audit import clear_global_hooks
from . import Outcome, compare_tensors, exercise, kind_of, not_a_handle


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
