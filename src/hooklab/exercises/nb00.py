"""Exercises and predictions of notebook 00: a first forward hook, owning its handle, a recorder
of one's own."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from ..pytorch_internals import module_hooks
from . import Outcome, exercise, is_handle, kind_of, prediction


# ----- 1. A first hook ---------------------------------------------------------------------------
@prediction(
    "00.a",
    "two hooks that return a value",
    why="PyTorch calls a module's forward hooks in the order they were registered, and each one receives the "
        "output as the hooks before it left it: 1 × 10 = 10, then 10 + 1 = 11.",
    wrong=[
        (1.0, "a hook that returns a value replaces the module's output, and both hooks return one"),
        (10.0, "plus_one ran too, after times_ten, and received its result: 10 + 1 = 11"),
        (2.0, "plus_one received times_ten's result (10), not the layer's own output (1): 10 + 1 = 11"),
        (20.0, "the hooks run in the order they were registered, times_ten first: 1 × 10 + 1 = 11"),
    ],
)
def _two_hooks() -> float:
    layer = nn.Identity()
    first = layer.register_forward_hook(lambda module, args, output: output * 10)
    second = layer.register_forward_hook(lambda module, args, output: output + 1)
    try:
        return layer(torch.tensor([1.0])).item()
    finally:
        first.remove()
        second.remove()


@exercise("00.1", "a forward hook that counts calls")
def _count_calls(make_counter) -> Outcome:
    """``make_counter(module)`` registers a hook and returns ``(calls, handle)``.

    ``calls`` is a list that gets one item per call of the module; the module's output stays as it was.
    """
    layer = nn.Linear(2, 2)
    x = torch.tensor([[1.0, -2.0]])
    plain = layer(x).detach()
    try:
        answer = make_counter(layer)
        if not (isinstance(answer, tuple | list) and len(answer) == 2):
            return Outcome(False, f"return the pair (calls, handle), got {kind_of(answer)}")
        counts, handle = answer
        if is_handle(counts) and not is_handle(handle):
            return Outcome(False, "the pair is the wrong way round: return (calls, handle), the list first")
        if not is_handle(handle):
            kind = kind_of(handle)
            return Outcome(False, f"the second item must be the handle whose remove() takes your hook out, got {kind}")
        if not isinstance(counts, list):
            return Outcome(False, f"the first item must be the list the hook appends to, got {kind_of(counts)}")
        try:
            outputs = [layer(x) for _ in range(3)]
        finally:
            handle.remove()
        layer(x)  # after remove(): must not be counted
    finally:
        left = clear_hooks(layer)  # never leave a student's hook on the checker's model
    changed = [out for out in outputs if not (isinstance(out, torch.Tensor) and torch.equal(out, plain))]
    if changed:
        kind = kind_of(changed[0])
        article = "an" if kind[0] in "aeiouAEIOU" else "a"
        got = "other values" if isinstance(changed[0], torch.Tensor) else f"{article} {kind}"
        return Outcome(False, f"with your hook the layer returned {got} instead of its own output: a hook that "
                              "only counts must return None (a value it returns replaces the output)")
    if left:
        return Outcome(False, f"after handle.remove(), {left[0]}: register only the counting hook, or remove "
                              "every hook you add")
    total = len(counts)
    if total != 3:
        return Outcome(False, f"counted {total} calls for 3 calls before remove() (and 1 after)")
    return Outcome(True, "3 calls counted, output unchanged, no hook left after remove()")


# ----- 2. Own the handle -------------------------------------------------------------------------
@prediction(
    "00.b",
    "a cell that registers its hook, run three times",
    why="each register_forward_hook call adds the function to the module's hooks once more, even the same "
        "function, and every entry runs: one call in the first run, two in the second, three in the third.",
    wrong=[
        ([1, 1, 1], "registering the same function again does not replace it: each register_forward_hook call "
                    "adds one more entry, and each entry runs"),
        ([1, 0, 0], "nothing removed the first hook: a hook stays until its handle's remove() takes it out"),
    ],
)
def _registered_again() -> list[int]:
    layer, calls, per_run = nn.Identity(), [], []

    def count(module, args, output):
        calls.append(1)

    for _ in range(3):  # what running the same cell three times does
        layer.register_forward_hook(count)
        calls.clear()
        layer(torch.ones(1))
        per_run.append(len(calls))
    clear_hooks(layer)
    return per_run


class _Counted(nn.Linear):
    """A ``Linear(2, 2)`` that counts its calls and knows when one is running (its hooks included)."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.calls = 0
        self.running = False

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.running = True
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.running = False


class _ForwardError(Exception):
    """An error raised by ``forward`` that no answer may expect by name."""


class _Stopped(KeyboardInterrupt):
    """What pressing stop raises, here from inside ``forward``."""


class _Fails(nn.Module):
    def __init__(self, error: type[BaseException]) -> None:
        super().__init__()
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.error("forward failed on purpose")


def _foreign_hooks(module: nn.Module, forward: int = 1) -> list:
    """Hooks the checker registers before the answer runs (two pre-hooks, ``forward`` forward hooks):
    the answer must leave them alone."""
    pre = [module.register_forward_pre_hook(lambda m, args: None) for _ in range(2)]
    return pre + [module.register_forward_hook(lambda m, args, output: None) for _ in range(forward)]


def _foreign_gone(module: nn.Module, handles: list) -> bool:
    pre_hooks, hooks = module_hooks(module, "_forward_pre_hooks"), module_hooks(module, "_forward_hooks")
    gone = any(h.id not in pre_hooks and h.id not in hooks for h in handles)
    for h in handles:
        h.remove()
    return gone


def _hook_calls_outcome(seen: list, gone: bool, layer) -> Outcome | None:
    """What is wrong with how the hook was registered and called, if anything."""
    wrong = next((n for n, _ in seen if n), None)
    if wrong is not None:
        kind = "a pre-hook" if wrong == 2 else "a pre-hook, or with with_kwargs=True"
        return Outcome(False, f"the hook was called with {wrong} arguments, not (module, args, output): "
                              f"registered as {kind}? register it with register_forward_hook(hook)")
    if gone:
        return Outcome(False, "a hook your code did not register was removed from the module: remove only "
                              "your own hook, with its handle")
    if any(not running for _, running in seen):
        return Outcome(False, "your code called the hook itself: register it on the module and let module(x) "
                              "call it")
    if layer.calls != 1:
        return Outcome(False, f"the module ran {layer.calls} times for one call of run_with_hook: run "
                              "module(x) once, with the hook registered")
    return None


def _answer_outcome(answer, plain: torch.Tensor, seen: list, left: list) -> Outcome | None:
    """What is wrong with the returned output and the hooks left, if anything."""
    if isinstance(answer, tuple | list) and answer and isinstance(answer[0], torch.Tensor):
        return Outcome(False, f"return only the output of module(x), got {kind_of(answer)}")
    if not isinstance(answer, torch.Tensor):
        return Outcome(False, f"return the output of module(x), got {kind_of(answer)}")
    if not torch.allclose(answer.detach(), 10 * plain):
        return Outcome(False, "return module(x) as the hook made it (here, 10 times the plain output): run the "
                              "module while your hook is registered")
    if len(seen) != 1:
        return Outcome(False, f"the hook ran {len(seen)} times for one module call: register it once")
    if left:
        return Outcome(False, "the hook is still registered after the call: remove it with its handle")
    return None


def _one_run(run_with_hook, x: torch.Tensor, others: int) -> Outcome | None:
    """The answer on a fresh module that already has ``others`` forward hooks of other code."""
    layer = _Counted()
    plain = layer(x).detach()
    layer.calls = 0
    seen: list[tuple[int, bool]] = []  # per hook call: its arguments fit a forward hook, the module called it

    def hook(*args):
        fits = len(args) == 3 and isinstance(args[2], torch.Tensor)
        seen.append((len(args) if not fits else 0, layer.running))
        return 10 * args[2] if fits else None

    foreign = _foreign_hooks(layer, forward=others)
    try:
        answer = run_with_hook(layer, hook, x)
    finally:
        gone = _foreign_gone(layer, foreign)
        left = clear_hooks(layer)  # never leave a student's hook on the checker's model
    return _hook_calls_outcome(seen, gone, layer) or _answer_outcome(answer, plain, seen, left)


def _one_failing_run(run_with_hook, x: torch.Tensor, error: type, what: str) -> Outcome | None:
    """The answer on a module whose forward raises ``error``: the error and no hook may be left."""
    failing = _Fails(error)
    foreign = _foreign_hooks(failing)
    reached = False
    try:
        run_with_hook(failing, lambda m, args, output: None, x)
    except error:
        reached = True
    except Exception as other:  # the student's code may raise something else
        return Outcome(False, f"the module raised {what}, which should reach the caller unchanged, "
                              f"got {type(other).__name__}")
    finally:
        gone = _foreign_gone(failing, foreign)
        left = clear_hooks(failing)
    if gone:
        return Outcome(False, f"after forward raised {what}, a hook your code did not register was removed "
                              "from the module: remove only your own hook, with its handle")
    if left:
        return Outcome(False, f"after forward raised {what}, the hook was left on the module: remove it in "
                              "finally (or with), which runs whatever was raised")
    if not reached:
        return Outcome(False, f"the module raised {what} and your code swallowed it: let it reach the caller "
                              "(try/finally, no except)")
    return None


@exercise("00.2", "a hook that is removed even when forward raises")
def _run_with_hook(run_with_hook) -> Outcome:
    """``run_with_hook(module, hook, x)`` registers ``hook`` as a forward hook, runs ``module(x)``,
    removes the hook, also when ``module(x)`` raises, and returns the output. Hooks other code put
    on the module stay; an error of ``forward`` reaches the caller unchanged."""
    x = torch.ones(1, 2)
    for others in (1, 2):  # forward hooks other code registered on the module before the answer runs
        wrong = _one_run(run_with_hook, x, others)
        if wrong:
            return wrong
    for error, what in [
        (ValueError, "a ValueError"),
        (_ForwardError, "an error of another type"),
        (_Stopped, "KeyboardInterrupt (as pressing stop does)"),
    ]:
        wrong = _one_failing_run(run_with_hook, x, error, what)
        if wrong:
            return wrong
    return Outcome(True, "hook called by the module once and removed, other hooks left alone, errors passed "
                         "on with the hook removed")


# ----- 3. Your own recorder finds the NaN --------------------------------------------------------
class _RMSNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(dim=1, keepdim=True).sqrt()


class _OpeningNet(nn.Module):
    """The model of the lesson's opening problem: it defines head, norm, embed, act, and its forward
    calls embed, act, norm, head (``tests/test_exercises_nb00.py`` compares it with the lesson's)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.norm = _RMSNorm()
        self.embed = nn.Linear(4, 8, bias=False)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.act(self.embed(x))))


@prediction(
    "00.c",
    "the order of the names in a recording",
    why="a forward hook runs right after its own layer returns, and a dict keeps its keys in the order they were "
        "first written: rec.outputs follows the order forward calls the layers, not the order they are defined in.",
    wrong=[
        (["head", "norm", "embed", "act"], "that is the order the model defines its layers in (and the order the "
                                           "hooks were registered): each hook writes its name when its layer runs, "
                                           "and forward calls embed first"),
        (["head", "norm", "act", "embed"], "each forward hook runs as soon as its own layer returns, not when the "
                                           "whole forward ends: embed returns first, so its name comes first"),
    ],
)
def _recording_order() -> list[str]:
    model, order = _OpeningNet(), []
    x = torch.ones(3, 4)
    x[2] = 0.0
    handles = [child.register_forward_hook(lambda module, args, output, name=name: order.append(name))
               for name, child in model.named_children()]  # fmt: skip
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return order


class _RecorderCase(nn.Module):
    """Defines ``late`` before ``early`` and runs ``early``, ``act``, ``late``. ``act`` is an in-place
    ReLU: it overwrites ``early``'s output, so a kept copy that shares its memory changes with it."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(3, 2)
        self.early = nn.Linear(2, 3)
        self.act = nn.ReLU(inplace=True)
        with torch.no_grad():
            self.early.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]))
            self.early.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(self.act(self.early(x)))


_RecorderCase.__name__ = "model"  # what a message about a hook left on it says: "... on layer 'early' of the model"
_DEFINED, _RAN = ["late", "early", "act"], ["early", "act", "late"]


class _BodyError(Exception):
    """Raised inside the answer's with block: no answer may expect it by name."""


def _expected(model: _RecorderCase, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each layer's output, computed without hooks (the ReLU on a copy)."""
    with torch.no_grad():
        early = model.early(x)
        act = torch.relu(early)
        return {"early": early, "act": act, "late": model.late(act)}


def _names_outcome(outputs: object) -> Outcome | None:
    """What is wrong with the names kept in ``rec.outputs`` and their order, if anything."""
    if not isinstance(outputs, dict):
        return Outcome(False, f"rec.outputs must be a dict from layer name to the kept output, got {kind_of(outputs)}")
    kept = [name for name in outputs if name in _DEFINED]
    if kept == [_DEFINED[-1]]:
        return Outcome(False, f"every output was kept under one name, {_DEFINED[-1]!r}, the loop's last: a hook made "
                              "in a loop looks `name` up when it runs, after the loop ended; pin it with a default "
                              "argument, name=name")
    missing = [name for name in _RAN if name not in kept]
    if missing:
        return Outcome(False, f"nothing was kept for layer {missing[0]!r}: register a forward hook on every child "
                              "of the model (model.named_children()) that keeps its output under the child's name")
    if kept != _RAN:
        order = "the order they were defined in" if kept == _DEFINED else "another order"
        return Outcome(False, f"rec.outputs lists the layers as {kept}, {order}, not the order they ran "
                              f"({_RAN}): add each name when its hook runs (do not fill the dict in advance)")
    return None


def _values_outcome(outputs: dict, expected: dict[str, torch.Tensor]) -> Outcome | None:
    """What is wrong with the kept copies, if anything."""
    for name in _RAN:
        kept = outputs[name]
        if not isinstance(kept, torch.Tensor):
            return Outcome(False, f"what was kept for layer {name!r} is {kind_of(kept)}, not a tensor: keep "
                                  "output.detach().clone()")
        if kept.requires_grad:
            return Outcome(False, f"the copy kept for layer {name!r} is still part of the autograd graph (it "
                                  "requires grad): keep output.detach().clone()")
        if name == "early" and not torch.equal(kept, expected[name]) and torch.equal(kept, expected["act"]):
            return Outcome(False, "the copy kept for layer 'early' changed after the layer ran: the in-place ReLU "
                                  "that runs next overwrote it, because the copy shares the output's memory; keep "
                                  "output.detach().clone(), a copy with memory of its own")
        if kept.shape != expected[name].shape or not torch.allclose(kept, expected[name]):
            return Outcome(False, f"the copy kept for layer {name!r} is not what the layer returned: keep the "
                                  "hook's output argument, output.detach().clone()")
    return None


def _first_run(Recorder) -> Outcome | None:
    """The answer recording one forward pass: what is wrong with the block, the output, the hooks
    left and the records, if anything."""
    model, x = _RecorderCase(), torch.tensor([[1.0, 2.0]])
    plain, expected = model(x).detach(), _expected(model, x)
    recorder = Recorder(model)
    try:
        with recorder as entered:
            out = model(x)
    finally:
        left = clear_hooks(model)
    if entered is not recorder:
        return Outcome(False, f"__enter__ returned {kind_of(entered)}, not the recorder: end it with `return self`, "
                              "so that `with Recorder(model) as rec` gives rec.outputs")
    if not (isinstance(out, torch.Tensor) and torch.equal(out.detach(), plain) and out.requires_grad):
        return Outcome(False, "with your recorder the model returned something else than its own output: the hook "
                              "must return None (a value it returns replaces the layer's output)")
    if left:
        return Outcome(False, f"after the with block, {left[0]}: remove every handle in __exit__")
    outputs = getattr(recorder, "outputs", None)
    return _names_outcome(outputs) or _values_outcome(outputs, expected)


def _raising_run(Recorder, error: type[BaseException], what: str) -> Outcome | None:
    """The answer's with block raising ``error``: it must reach the caller, with no hook left."""
    model, reached = _RecorderCase(), False
    try:
        with Recorder(model):
            model(torch.ones(1, 2))
            raise error("raised inside the with block on purpose")
    except error:
        reached = True
    except Exception as other:  # the student's __exit__ may raise something else
        return Outcome(False, f"the with block raised {what}, which should reach the caller unchanged, got "
                              f"{type(other).__name__}")
    finally:
        left = clear_hooks(model)
    if left:
        return Outcome(False, f"when the with block raised {what}, {left[0]}: Python calls __exit__ whatever was "
                              "raised; remove every handle there, without looking at the exception")
    if not reached:
        return Outcome(False, f"the with block raised {what} and your recorder swallowed it: __exit__ must not "
                              "return True")
    return None


def _shared_state(Recorder) -> Outcome | None:
    """Two recorders on two models: each must keep only its own model's outputs."""
    first, second = _RecorderCase(), nn.Sequential()
    second.add_module("solo", nn.Tanh())
    a, b = Recorder(first), Recorder(second)
    try:
        with a:
            first(torch.ones(1, 2))
        with b:
            second(torch.ones(1, 2))
    finally:
        clear_hooks(first, second)
    if "solo" in getattr(a, "outputs", {}) or "early" in getattr(b, "outputs", {}):
        return Outcome(False, "two recorders share one outputs dict: create it in __init__ (self.outputs = {}), not "
                              "in the class body, where every recorder gets the same one")
    return None


@exercise("00.3", "a recorder class that keeps every layer's output")
def _recorder(Recorder) -> Outcome:
    """``with Recorder(model) as rec: model(x)`` keeps, in the dict ``rec.outputs``, a detached copy
    of each child's output under the child's name, in the order the children ran; no hook is left
    after the block, also when it raises; an error raised in the block reaches the caller."""
    if not callable(Recorder):  # a recorder made with Recorder(...), instead of the class
        return Outcome(False, f"pass the class itself, check(\"00.3\", Recorder), not an object of it "
                              f"({kind_of(Recorder)})")
    wrong = _first_run(Recorder)
    for error, what in [(_BodyError, "an error"), (_Stopped, "KeyboardInterrupt (as pressing stop does)")]:
        wrong = wrong or _raising_run(Recorder, error, what)
    wrong = wrong or _shared_state(Recorder)
    if wrong:
        return wrong
    return Outcome(True, "a detached copy of every layer's output, in the order they ran, safe from the in-place "
                         "ReLU; no hook left, also when the block raised, and the error passed on")
