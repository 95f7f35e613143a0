"""Exercises of the field guide G1, tensor and graph hooks: the memory a saved tensor keeps alive
(G1.1, section 1), a pre-hook on an autograd node (G1.2, section 4), an SGD step fused into backward
(G1.3 and prediction G1.a, section 21), saved tensors kept in bfloat16 (G1.4 and G1.b, section 22)
and the gradients of the parameters a shell-style pattern names, clamped and counted (G1.5,
section 23)."""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Iterable

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from ..audit import clear_global_hooks, clear_hooks
from ..hooks import Hooks
from ..pytorch_internals import parameter_hook_count
from . import Outcome, compare_tensors, exercise, hint_for, is_handle, kind_of, not_a_handle, prediction


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


# ----- G1.3, G1.a (section 21): an optimizer step inside backward ------------------------------
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


# ----- G1.4, G1.b (section 22): what autograd keeps for backward -------------------------------
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


def _small_model() -> nn.Module:
    torch.manual_seed(1)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _handles_of(handles) -> list | Outcome:
    """The answer to G1.3 as a list of handles, or the Outcome saying what is wrong with it."""
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


@exercise("G1.3", "an SGD step fused into backward")
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
        alive = []  # how many .grad tensors exist each time one is accumulated (run after the answer's hooks)

        def count(q, model=model, alive=alive):
            alive.append(1 + sum(r.grad is not None for r in model.parameters() if r is not q))

        handles += [q.register_post_accumulate_grad_hook(count) for q in model.parameters()]
        # autograd counts the in-place changes of every tensor, to refuse a backward through a saved tensor
        # that was changed since; a change made through .data escapes the count
        start = {name: (q.detach().clone(), q._version) for name, q in model.named_parameters()}
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
        hidden = [name for name, q in model.named_parameters()
                  if q._version == start[name][1] and not torch.equal(q.detach(), start[name][0])]
        if hidden:
            return Outcome(False, f"parameter {hidden[0]} changed without autograd seeing it: a change made through "
                                  "p.data escapes autograd's check that the tensors backward saved are unchanged, "
                                  "and can give wrong gradients silently; update p itself under torch.no_grad(): "
                                  "with torch.no_grad(): p -= lr * p.grad")
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            outcome = compare_tensors(p.detach(), q.detach())
            if not outcome.passed:
                return Outcome(False, f"with lr={lr}, parameter {name} differs from torch.optim.SGD's step "
                                      f"({outcome.detail})")
            if p.grad is not None:
                return Outcome(False, f"{name}.grad is still kept: set p.grad = None after the step to free it")
    most = max(alive, default=0)
    return Outcome(True, f"same parameters as torch.optim.SGD for two learning rates, and at most {most} of the "
                         f"{n} .grad tensors alive at once during backward (a plain backward keeps all {n})")


# ----- G1.4 --------------------------------------------------------------------------------------
#: the cases G1.4 tries: a name, the model's dtype, and a scale for the inputs (1e5: saved values beyond
#: float16's largest number, 65504, which bfloat16 keeps)
_HALF_CASES = (("the float32 case", torch.float32, 1.0), ("the float64 case", torch.float64, 1.0),
               ("the case with inputs up to 2e5", torch.float32, 1e5))


def _half_model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(5)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)).to(dtype)


def _half_loss(model: nn.Module, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """A classification loss: cross-entropy saves its integer targets too."""
    x = torch.linspace(-2, 2, 16 * 20, dtype=dtype).reshape(16, 20) * scale
    targets = torch.arange(16) % 5
    return nn.functional.cross_entropy(model(x), targets)


def _tensors_in(packed: object) -> list[torch.Tensor]:
    """The tensors a pack hook's result holds: itself, the items of a tuple, list or dict, or the
    attributes of an object."""
    if isinstance(packed, torch.Tensor):
        return [packed]
    if isinstance(packed, dict):
        items = packed.values()
    elif isinstance(packed, tuple | list):
        items = packed
    else:
        items = getattr(packed, "__dict__", {}).values()
    return [item for item in items if isinstance(item, torch.Tensor)]


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _packed_outcome(saved: list) -> Outcome | None:
    """What is wrong with what pack kept for each saved tensor ``(t, packed, inside)``, if anything:
    ``inside`` holds the tensors ``packed`` held when pack returned it (unpack may have changed it since)."""
    for t, packed, inside in saved:
        what = f"the {_dtype(t)} tensor of shape {tuple(t.shape)}"
        if any(item is t for item in inside):
            return Outcome(False, f"pack returned the tensor it received itself (for {what}): return t.detach() "
                                  "(or a converted copy); a saved tensor that holds itself keeps its graph alive "
                                  "after you drop it, the reference cycle saved_tensors_hooks' docstring warns of")
        if not inside:
            return Outcome(False, f"pack returned {kind_of(packed)} for {what}: return a tuple (kept, dtype), "
                                  "kept the tensor (as bfloat16 if it is floating-point), so the check can see "
                                  "what pack keeps")
        if not t.is_floating_point() and any(item.dtype != t.dtype for item in inside):
            return Outcome(False, f"pack converted {what} (cross-entropy's targets) to "
                                  f"{[_dtype(i) for i in inside]}: convert only floating-point tensors "
                                  "(t.is_floating_point()), keep any other as t.detach()")
        if t.is_floating_point():
            big = [item for item in inside if item.is_floating_point() and item.element_size() > 2]
            if big or not any(item.element_size() == 2 and item.numel() == t.numel() for item in inside):
                return Outcome(False, f"for {what}, pack kept {[_dtype(i) for i in inside]}: keep a floating-point "
                                      "tensor only as bfloat16, t.to(torch.bfloat16), 2 bytes an entry")
    return None


def _overflow_outcome(saved: list, label: str) -> Outcome | None:
    """A failed Outcome when pack turned finite values into inf (float16 beyond 65504), else None."""
    for t, _, inside in saved:
        if t.is_floating_point() and any(item.is_floating_point() and item.isinf().sum() > t.isinf().sum()
                                         for item in inside):
            kept = next(_dtype(i) for i in inside if i.is_floating_point())
            return Outcome(False, f"in {label}, pack kept a {_dtype(t)} tensor as {kept}: its entries "
                                  f"beyond {torch.finfo(torch.float16).max:g}, float16's largest number, became inf, "
                                  "and so did the gradients; keep it as bfloat16 (t.to(torch.bfloat16)), which has "
                                  "float32's range")
    return None


def _changed_outcome(saved: list) -> Outcome | None:
    """A failed Outcome when unpack replaced a tensor inside what pack returned (a list it wrote into)."""
    for t, packed, inside in saved:
        now = _tensors_in(packed)
        if len(now) != len(inside) or any(a is not b for a, b in zip(now, inside, strict=False)):
            return Outcome(False, f"for the {_dtype(t)} tensor of shape {tuple(t.shape)}, pack returned "
                                  f"{[_dtype(i) for i in inside]} and after backward it holds "
                                  f"{[_dtype(i) for i in now]}: "
                                  "unpack must leave what pack returned as it was (it runs once per use of the saved "
                                  "tensor); give back a new tensor, kept.to(dtype), without writing it into what "
                                  "pack returned")
    return None


def _unpacked_outcome(unpacked: list) -> Outcome | None:
    """What is wrong with what unpack gave back for each saved tensor ``(t, out)``, if anything."""
    for t, out in unpacked:
        if not isinstance(out, torch.Tensor):
            return Outcome(False, f"unpack returned {kind_of(out)}: it must give back a tensor")
        if out.dtype != t.dtype and out.dtype == torch.float32 and t.is_floating_point():
            return Outcome(False, f"unpack gave back a float32 tensor for a saved {_dtype(t)} tensor: give back "
                                  "the dtype pack remembered (kept.to(dtype)), not always float32 (.float())")
        if out.dtype != t.dtype or out.shape != t.shape:
            return Outcome(False, f"unpack gave back a {_dtype(out)} tensor of shape {tuple(out.shape)} for a saved "
                                  f"{_dtype(t)} tensor of shape {tuple(t.shape)}: give back the original dtype "
                                  "(remember it in what pack returns) and shape")
    return None


def _half_case(hooks, dtype: torch.dtype, scale: float, label: str) -> tuple[int, int] | Outcome:
    """One training step's gradients with the answer's hooks against those without: the bytes pack kept
    and the bytes saved, or the Outcome saying what is wrong."""
    reference = _half_model(dtype)
    _half_loss(reference, dtype, scale).backward()
    plain = {n: p.grad for n, p in reference.named_parameters()}
    saved, unpacked, original = [], [], {}  # (t, packed, its tensors then), (t, unpacked), id(packed) -> t

    def pack(t):
        packed = hooks.pack_hook(t)
        saved.append((t, packed, list(_tensors_in(packed))))
        original[id(packed)] = t
        return packed

    def unpack(packed):
        out = hooks.unpack_hook(packed)
        unpacked.append((original.get(id(packed), out), out))
        return out

    model = _half_model(dtype)
    try:
        with saved_tensors_hooks(pack, unpack):
            loss = _half_loss(model, dtype, scale)
        loss.backward(retain_graph=True)
        once = {n: p.grad.clone() for n, p in model.named_parameters()}
        loss.backward()  # through the same saved tensors: each is unpacked a second time
    except NotImplementedError:
        raise  # the stub: not solved yet
    except Exception as error:  # what the answer kept explains it best, else a known error, else its own
        wrong = _changed_outcome(saved) or _packed_outcome(saved) or _unpacked_outcome(unpacked)
        if wrong or not isinstance(error, RuntimeError):
            return wrong or hint_for(error, {})
        return hint_for(error, {
            "expected scalar type Long": "backward got cross-entropy's integer targets as floats: convert only "
                                         "floating-point tensors (t.is_floating_point()), keep others as t.detach()",
            "dtype": "backward got a tensor of another dtype than it computes in: unpack must give back the "
                     "original dtype",
        })  # fmt: skip
    wrong = (_changed_outcome(saved) or _packed_outcome(saved) or _unpacked_outcome(unpacked)
             or _overflow_outcome(saved, label))
    if wrong:
        return wrong
    for name, p in model.named_parameters():
        size = plain[name].abs().max().item()
        if not torch.allclose(once[name], plain[name], rtol=0.02, atol=0.02 * size):
            return Outcome(False, f"in {label}, {name}.grad differs from the one computed without your "
                                  "hooks by more than 2 % of its size: pack and unpack must keep the values "
                                  "(bfloat16 rounds them in the 3rd digit)")
        if not torch.allclose(p.grad, 2 * once[name], rtol=1e-5, atol=1e-6 * size):
            return Outcome(False, f"a second backward through the same graph gave {name} another gradient: unpack "
                                  "runs once per use, so it must leave what pack returned as it was")
    full = sum(t.numel() * t.element_size() for t, _, _ in saved)
    kept = sum(i.numel() * i.element_size() for _, _, inside in saved for i in inside)
    return kept, full


@exercise("G1.4", "keep saved tensors in bfloat16")
def _half(save_in_half) -> Outcome:
    """``save_in_half()`` returns ``saved_tensors_hooks(pack, unpack)`` whose pack keeps a
    floating-point tensor as bfloat16 (2 bytes) and any other tensor as ``t.detach()``, and whose
    unpack gives back a tensor of the original dtype. Checked on one training step of an MLP with
    cross-entropy (integer targets are saved too), in float32, in float64, and with inputs beyond
    float16's range; backward runs twice through the kept graph (unpack runs twice)."""
    hooks = save_in_half()
    if not isinstance(hooks, saved_tensors_hooks):
        return Outcome(False, f"save_in_half() must return saved_tensors_hooks(pack, unpack), got {kind_of(hooks)}")
    sizes = []
    for label, dtype, scale in _HALF_CASES:
        result = _half_case(hooks, dtype, scale, label)
        if isinstance(result, Outcome):
            return result
        sizes.append(result)
    kept, full = sizes[0]
    return Outcome(True, f"saved tensors kept in {kept:,} bytes instead of {full:,} (float32), gradients within "
                         "2 % of those without your hooks, float64 given back as float64, values beyond 65504 "
                         "kept finite, and unpack works twice")


# ----- G1.5 (section 23): clamping the gradients of the parameters a pattern names --------------
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
    """The answer to G1.5 as (handles, clamped), or the Outcome saying what is wrong with it."""
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


@exercise("G1.5", "clamp the gradients of the parameters a pattern names")
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
    """A worked answer to G1.3, for the guide's next cells while the reader's own has not passed."""

    def step(p: torch.Tensor) -> None:
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


def save_in_half() -> saved_tensors_hooks:
    """A worked answer to G1.4 (see ``fuse_sgd``)."""

    def pack(t: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        return (t.to(torch.bfloat16) if t.is_floating_point() else t.detach()), t.dtype

    def unpack(packed: tuple[torch.Tensor, torch.dtype]) -> torch.Tensor:
        return packed[0].to(packed[1])

    return saved_tensors_hooks(pack, unpack)
