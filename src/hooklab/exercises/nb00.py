"""Exercises of notebook 00: a first forward hook, owning its handle, reading a recording."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from ..pytorch_internals import module_hooks
from ..recording import open_recordings
from . import Outcome, exercise, is_handle, kind_of


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
        return Outcome(False, f"after handle.remove() a hook was still on the layer ({left[0]}): "
                              "register only the counting hook, or remove every hook you add")
    total = len(counts)
    if total != 3:
        return Outcome(False, f"counted {total} calls for 3 calls before remove() (and 1 after)")
    return Outcome(True, "3 calls counted, output unchanged, no hook left after remove()")


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


class _Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class _Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class _OutOfOrder(nn.Module):
    """Runs ``linear``, ``log``, ``scale``, ``sqrt``; defines them in another order, whose reverse
    is not the execution order either: the first layer with a NaN is ``sqrt`` in definition order,
    ``scale`` in reversed definition order, and ``log`` in execution order."""

    def __init__(self) -> None:
        super().__init__()
        self.sqrt = _Sqrt()
        self.linear = nn.Linear(2, 2)
        self.log = _Log()
        self.scale = _Scale()
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sqrt(self.scale(self.log(self.linear(x))))  # log of a negative number is NaN


def _left_behind(model: nn.Module) -> Outcome | None:
    """Exit every record block the answer left open, drop every other hook; say what was left."""
    unexited = open_recordings(model)
    for recording in reversed(unexited):
        recording.__exit__(None, None, None)
    left = clear_hooks(model)
    if unexited:
        return Outcome(False, "a hooklab.record block was not exited, so its hooks stayed on the model: "
                              "use it in a with block")
    if left:
        return Outcome(False, f"hooks were left registered: {left[0]} (use hooklab.record in a with block)")
    return None


@exercise("00.3", "find the first layer whose output has a NaN")
def _first_nan(first_nan_layer) -> Outcome:
    """``first_nan_layer(model, x)`` returns the name of the first layer, in execution order,
    whose output contains a NaN, or ``None`` when no output does."""
    model = _OutOfOrder()
    cases = [  # input, the right answer, what a wrong answer means
        (torch.tensor([[2.0, 3.0]]), "log", "'log' ran first (log of a negative number)"),
        (torch.tensor([[0.0, -3.0]]), "sqrt", "here 'log' outputs -inf (log of 0), which is not a NaN: "
                                              "test for NaN with torch.isnan"),
        (torch.tensor([[2.0, -3.0]]), None, "no output has a NaN, so the answer is None"),
    ]
    for x, expected, why in cases:
        try:
            got = first_nan_layer(model, x)
        finally:
            left = _left_behind(model)
        if left:
            return left
        if got == expected:
            continue
        if expected == "log" and got in ("sqrt", "scale"):
            return Outcome(False, f"{got!r} has a NaN, but 'log' ran before it: go through the records in "
                                  "execution order")
        return Outcome(False, f"for the input {x.tolist()} got {got!r}, expected {expected!r}: {why}")
    return Outcome(True, "'log' found (it ran first), NaN told from inf, and None when there is no NaN")
