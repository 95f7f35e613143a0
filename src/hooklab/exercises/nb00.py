"""Exercises and predictions of notebook 00: a first forward hook and what ``module(x)`` does with
it, owning its handle, a recorder of one's own that finds the first layer making a NaN."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import torch
from torch import nn

from ..audit import clear_hooks
from ..hooks import Hooks
from ..pytorch_internals import global_registries, module_hooks
from . import Outcome, exercise, hint_for, kind_of, prediction, same


class _OtherForm:
    """A ``wrong=`` entry that matches every guess ``fits`` rejects: its hint says what to write, and not
    the answer (``why`` states it)."""

    __hash__ = None

    def __init__(self, fits) -> None:
        self.fits = fits

    def __eq__(self, guess: object) -> bool:
        return not self.fits(guess)


def _number(value: object, spelled: bool = False) -> bool:
    """Whether ``value`` is a number (with ``spelled``, also a string that spells one: its own hint)."""
    if isinstance(value, str) and spelled:
        try:
            float(value.strip().strip("'\""))
        except ValueError:
            return False
        return True
    return isinstance(value, int | float) and not isinstance(value, bool)


def _list_of(*fits) -> _OtherForm:
    """Guesses other than a list (or tuple) whose items pass ``fits``, one test per item."""
    return _OtherForm(lambda guess: isinstance(guess, list | tuple) and len(guess) == len(fits)
                      and all(fit(item) for fit, item in zip(fits, guess, strict=True)))


class _Parts(_OtherForm):
    """A ``wrong=`` entry for a guess of two parts in the form asked (``form(guess)`` is None): it matches when
    the first part is right or not (``first_right``) and the second part is right or not (``second_right``),
    against ``truth()``."""

    def __init__(self, truth, first_right: bool, second_right: bool, form) -> None:
        def fits(guess) -> bool:  # True: this entry does not match
            if form(guess) is not None:  # not in the form asked: form= says what to write
                return True
            expected = truth()
            return not (same(guess[0], expected[0]) == first_right and same(guess[1], expected[1]) == second_right)

        super().__init__(fits)


def _form(hint: str, *fits):
    """A ``form=`` for ``prediction``: None for a list (or tuple) whose items pass ``fits``, one test per item,
    else ``hint``, which says what to write."""
    return lambda guess: None if _list_of(*fits).fits(guess) else hint


_TWO_NUMBERS = _form("write a list of two numbers, such as [5.0, 5.0]: what identity(x) returns, then "
                     "identity.forward(x)", _number, _number)
_NAME_AND_NUMBER_HINT = 'write a list of a class name and a number, such as ["Linear", 1]'


def _name_and_number(guess: object) -> str | None:
    """The ``form=`` of 00.e: None for a class name and a number; a count written as a string is told so."""
    if _list_of(lambda item: isinstance(item, str), _number).fits(guess):
        return None
    if _list_of(lambda item: isinstance(item, str), lambda item: _number(item, spelled=True)).fits(guess):
        return 'write the count as a number, not a string: 1, not "1"'
    return _NAME_AND_NUMBER_HINT


_NAME_AND_NUMBER = _name_and_number


class _Name:
    """A class name as truth: a guess matches it in any case, quoted or not, with or without ``nn.`` or
    ``torch.nn.`` before it (``"nn.RMSNorm"`` names the same kind of layer as ``"RMSNorm"``). The name of a
    layer of the lesson's opening model matches its class (``"blocks.3.norm"`` names an ``RMSNorm``)."""

    __hash__ = None

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, guess: object) -> bool:
        if isinstance(guess, _Name):
            guess = guess.name
        if not isinstance(guess, str):
            return False
        bare = guess.strip().strip("'\"").strip()
        bare = _opening_kinds().get(bare, bare).lower().removeprefix("torch.").removeprefix("nn.")
        return bare == self.name.lower()

    def __repr__(self) -> str:
        return repr(self.name)

    __str__ = __repr__


# ----- 1. A first hook ---------------------------------------------------------------------------
@prediction(
    "00.a",
    "two hooks that return a value, and module.forward",
    why="module(x) runs forward, then each hook in the order registered, and a value a hook returns replaces the "
        "output at once: times_ten makes 1 into 10, plus_one receives 10 and returns 11. identity.forward(x) is "
        "the plain method: no hook runs, and it returns 1.",
    wrong=[
        ([11.0, 11.0], "the first is right; identity.forward(x) is the plain method, and the hooks run only through "
                       "module(x): forward returns its input, 1"),
        ([1.0, 1.0], "a hook that returns a value replaces the module's output, and both hooks return one: what "
                     "does identity(x) return? (the second number is right)"),
        ([10.0, 1.0], "plus_one ran too, after times_ten, and received its result (the second number is right)"),
        ([2.0, 1.0], "plus_one received times_ten's result, not the layer's own output (the second number is right)"),
        ([20.0, 1.0], "that is plus_one first: the hooks fire in the order they were registered, times_ten first, "
                      "and plus_one receives its result (the second number is right)"),
        (_Parts(lambda: _two_hooks(), True, False, _TWO_NUMBERS), "identity(x) is right; identity.forward(x) is "
                                                                  "the plain method: does any hook run?"),
        (_Parts(lambda: _two_hooks(), False, True, _TWO_NUMBERS), "identity.forward(x) is right; for identity(x), "
                                                                  "follow the value through times_ten, then plus_one"),
    ],
    form=_TWO_NUMBERS,
)
def _two_hooks() -> list[float]:
    layer = nn.Identity()
    first = layer.register_forward_hook(lambda module, args, output: output * 10)
    second = layer.register_forward_hook(lambda module, args, output: output + 1)
    try:
        return [layer(torch.tensor([1.0])).item(), layer.forward(torch.tensor([1.0])).item()]
    finally:
        first.remove()
        second.remove()


class _Watched(nn.Linear):
    """A ``Linear(3, 2)`` with fixed weights that counts the calls ``module(x)`` makes of it."""

    def __init__(self) -> None:
        super().__init__(3, 2)
        self.calls = 0
        with torch.no_grad():
            self.weight.copy_(torch.tensor([[1.0, -1.0, 0.5], [0.0, 2.0, -1.0]]))
            self.bias.copy_(torch.tensor([0.5, -0.5]))

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return super().__call__(*args, **kwargs)


_MODULE_PY = "torch/nn/modules/module.py"


def _called_by_pytorch() -> bool:
    """Whether the hook that calls this was called by PyTorch's own module call (not by an answer):
    the first frame outside this file is in ``torch/nn/modules/module.py``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame is not None and Path(frame.f_code.co_filename).as_posix().endswith(_MODULE_PY)


def _logging_hooks(log: list) -> list:
    """Four forward hooks, in the order they are registered: two look (return None), two return a
    value. Each logs its name, its arguments, a copy of the output it received, and who called it."""

    def entry(name, module, args, output):
        received = output.detach().clone() if isinstance(output, torch.Tensor) else output
        log.append((name, module, args, received, _called_by_pytorch()))

    def look(module, args, output):
        entry("look", module, args, output)

    def times_ten(module, args, output):
        entry("times_ten", module, args, output)
        return output * 10

    def look_again(module, args, output):
        entry("look_again", module, args, output)

    def plus_one(module, args, output):
        entry("plus_one", module, args, output)
        return output + 1

    return [look, times_ten, look_again, plus_one]


_CALL_HINTS = {
    "Boolean value of Tensor": "test whether a hook returned a value with `result is not None`: `if result:` asks a "
                               "tensor of several numbers for one truth value",
    "positional argument": "call each hook with three arguments, hook(module, args, output), as PyTorch does",
    "'NoneType'": "a hook received None as its output: a hook that returns None leaves the output as it was, so "
                  "replace the output only with a result that is not None",
}


def _call_answer(call_like_pytorch, layer: nn.Module, x: torch.Tensor):
    try:
        return call_like_pytorch(layer, x)
    except (TypeError, RuntimeError) as error:  # NotImplementedError (the stub) is raised again
        return hint_for(error, _CALL_HINTS)


def _order_outcome(log: list, expected: list) -> Outcome | None:
    """What is wrong with who called the hooks, which ran and in which order, if anything."""
    if any(by_pytorch for *_, by_pytorch in log):
        return Outcome(False, "PyTorch called the hooks, not your function: module(x) runs them itself. Write what it "
                              "does: output = module.forward(x), then each hook in turn")
    ran = [name for name, *_ in log]
    if not ran:
        return Outcome(False, "no hook ran: call each hook of module._forward_hooks.values()")
    if ran == expected[::-1]:
        return Outcome(False, f"the hooks ran as {ran}, the reverse of the order they were registered in: "
                              "module._forward_hooks.values() gives them in that order")
    if ran != expected:
        return Outcome(False, f"the hooks ran as {ran}, not {expected}: call each hook once, in the order "
                              "module._forward_hooks.values() gives")
    return None


def _arguments_outcome(log: list, layer: nn.Module, x: torch.Tensor, real: list) -> Outcome | None:
    """What is wrong with the arguments each hook received, if anything."""
    for (name, module, args, received, _), (_, _, _, expected, _) in zip(log, real, strict=True):
        if module is not layer:
            return Outcome(False, f"{name} received {kind_of(module)} as its first argument: a hook's first argument "
                                  "is the module")
        if not (isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], torch.Tensor)
                and torch.equal(args[0], x)):  # fmt: skip
            return Outcome(False, f"{name} received {kind_of(args)} as args: pass the inputs as a tuple, (x,), as "
                                  "PyTorch does")
        if not (isinstance(received, torch.Tensor) and torch.allclose(received, expected)):
            return Outcome(False, f"{name} received another output than with layer(x): hand each hook the output as "
                                  "the hooks before it left it (a returned value replaces it at once)")
    return None


@exercise("00.1", "what module(x) does with its forward hooks")
def _call_like_pytorch(call_like_pytorch) -> Outcome:
    """``call_like_pytorch(module, x)`` runs ``module.forward(x)``, then each forward hook in the order
    it was registered with ``(module, (x,), output)``; a value a hook returns replaces the output."""
    x = torch.tensor([[1.0, 2.0, -1.0]])
    layer = _Watched()
    plain = layer.forward(x).detach()
    log: list = []
    hooks = _logging_hooks(log)
    expected = [hook.__name__ for hook in hooks]
    try:
        for hook in hooks:
            layer.register_forward_hook(hook)
        real = layer(x).detach()
        real_log, log[:] = list(log), []
        layer.calls = 0
        got = _call_answer(call_like_pytorch, layer, x)
        calls = layer.calls
    finally:
        clear_hooks(layer)
    if isinstance(got, Outcome):  # a known slip raised an error
        return got
    if calls:
        return Outcome(False, "your function called module(x), which runs the hooks itself: write what it does, "
                              "output = module.forward(x), then each hook in turn")
    wrong = _order_outcome(log, expected)
    if wrong:
        return wrong
    if not isinstance(got, torch.Tensor):
        return Outcome(False, f"return the output, got {kind_of(got)}")
    if torch.allclose(got.detach(), plain):
        return Outcome(False, "your function returned forward's own output, though two hooks returned a value: a "
                              "value a hook returns (anything but None) replaces the output")
    wrong = _arguments_outcome(log, layer, x, real_log)
    if wrong:
        return wrong
    if not torch.allclose(got.detach(), real):
        return Outcome(False, f"your function returned {got.detach().tolist()}, layer(x) returns {real.tolist()}: "
                              "return the output as the last hook left it")
    bare = _Watched()
    alone = _call_answer(call_like_pytorch, bare, x)
    if isinstance(alone, Outcome):
        return alone
    if not (isinstance(alone, torch.Tensor) and torch.allclose(alone.detach(), plain)):
        got = "other values" if isinstance(alone, torch.Tensor) else kind_of(alone)
        return Outcome(False, f"on a module without hooks your function returned {got}, not module.forward(x)")
    return Outcome(True, "4 hooks called in order with (module, (x,), output), each returned value passed on: the "
                         "same output as layer(x), and forward's own output without hooks")


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
        (_list_of(_number, _number, _number), "write a list of three numbers, one per run, such as [0, 1, 0]"),
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


def _global_kind(hook) -> str | None:
    """``"global forward hook (register_module_forward_hook)"`` while ``hook`` is registered process-wide."""
    for what, register, hooks in global_registries():
        if any(h is hook for h in hooks.values()):
            return f"{what} ({register.rsplit('.', 1)[-1]})"
    return None


def _hook_calls_outcome(seen: list, gone: bool, layer) -> Outcome | None:
    """What is wrong with how the hook was registered and called, if anything."""
    registered = next((kind for *_, kind in seen if kind), None)
    if registered:
        return Outcome(False, f"the hook was registered as a {registered}, which runs for every module of the "
                              "process: register it on the module, module.register_forward_hook(hook)")
    wrong = next((n for n, *_ in seen if n), None)
    if wrong is not None:
        kind = "a pre-hook" if wrong == 2 else "a pre-hook, or with with_kwargs=True"
        return Outcome(False, f"the hook was called with {wrong} arguments, not (module, args, output): "
                              f"registered as {kind}? register it with register_forward_hook(hook)")
    if gone:
        return Outcome(False, "a hook your code did not register was removed from the module: remove only "
                              "your own hook, with its handle")
    if any(not running for _, running, _ in seen):
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
    if not answer.requires_grad:
        return Outcome(False, "your function returned the output cut from the autograd graph (.detach(), or "
                              "torch.no_grad()?): the caller could not call backward through it. Return module(x) "
                              "as it is")
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
    seen: list[tuple[int, bool, str | None]] = []  # per hook call: wrong argument count, module running, global kind

    def hook(*args):
        fits = len(args) == 3 and isinstance(args[2], torch.Tensor)
        seen.append((len(args) if not fits else 0, layer.running, _global_kind(hook)))
        return 10 * args[2] if fits else None

    foreign = _foreign_hooks(layer, forward=others)
    try:
        answer = run_with_hook(layer, hook, x)
    finally:
        gone = _foreign_gone(layer, foreign)
        left = clear_hooks(layer)  # never leave a student's hook on the checker's model
    return _hook_calls_outcome(seen, gone, layer) or _answer_outcome(answer, plain, seen, left)


def _shared_function_run(run_with_hook, x: torch.Tensor) -> Outcome | None:
    """Other code registered the same function as a forward hook first: the answer removes only its own
    registration (by its handle), not every entry that holds the function."""
    layer = _Counted()

    def hook(module, args, output):
        return None

    theirs = layer.register_forward_hook(hook)
    try:
        run_with_hook(layer, hook, x)
    finally:
        kept = theirs.id in module_hooks(layer, "_forward_hooks")
        clear_hooks(layer)
    if not kept:
        return Outcome(False, "other code had registered the same function as a forward hook first, and your code "
                              "removed that registration too: remove only your own, with the handle that "
                              "register_forward_hook returned")
    return None


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
        stop = (" KeyboardInterrupt is not an Exception, so `except Exception` lets it through."
                if issubclass(error, KeyboardInterrupt) else "")
        return Outcome(False, f"after forward raised {what}, the hook was left on the module.{stop} Remove it in a "
                              "finally: block (try: ... finally: handle.remove()), which runs whatever was raised")
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
    wrong = _shared_function_run(run_with_hook, x)
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


# ----- 3. and 4.: the lesson's model, a recorder of your own, the NaN -----------------------------
class _RMSNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(2).mean(dim=1, keepdim=True).sqrt()


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear, self.act, self.norm = nn.Linear(width, width), nn.ReLU(), _RMSNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(self.act(self.linear(x)))


class _OpeningNet(nn.Module):
    """The model of the lesson's opening problem: it defines ``head``, ``blocks``, ``embed`` and runs
    ``embed``, the blocks, ``head`` (``tests/test_exercises_nb00.py`` compares it with the lesson's)."""

    def __init__(self, width: int = 6, depth: int = 6) -> None:
        super().__init__()
        self.head = nn.Linear(width, 3)
        self.blocks = nn.Sequential(*[_Block(width) for _ in range(depth)])
        self.embed = nn.Linear(4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


for _cls, _name in [(_RMSNorm, "RMSNorm"), (_Block, "Block"), (_OpeningNet, "Net")]:
    _cls.__name__ = _cls.__qualname__ = _name  # what a message about one of them says


def _opening() -> tuple[nn.Module, torch.Tensor]:
    """The lesson's ``model`` and ``x``, drawn as its problem cell draws them."""
    torch.manual_seed(16)
    model = _OpeningNet()
    return model, torch.randn(4, 4)


@cache
def _opening_kinds() -> dict[str, str]:
    """The class name of each layer of the lesson's opening model, by its dotted name."""
    return {name: type(m).__name__ for name, m in _opening()[0].named_modules() if name}


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if next(m.children(), None) is None]


def _run_order(model: nn.Module, x: torch.Tensor) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """Each leaf module's name, the module and a copy of its output, in the order they ran."""
    ran: list = []
    with Hooks() as hooks, torch.no_grad():
        for name, m in _leaves(model):
            hooks.add(m.register_forward_hook(
                lambda m, args, out, name=name: ran.append((name, m, out.detach().clone()))))
        model(x)
    return ran


def _first_nan(ran: list) -> tuple[str, nn.Module] | tuple[None, None]:
    return next(((name, m) for name, m, out in ran if torch.isnan(out).any()), (None, None))


# ----- 3. Keep every layer's output --------------------------------------------------------------
_LATE_ALL = _OtherForm(lambda guess: not (isinstance(guess, list | tuple) and len(guess) > 1))


def _late_keys() -> list[str]:
    """The keys a loop of ``keep`` hooks without ``name=name`` leaves in its dict, on the lesson's model."""
    model, x = _opening()
    kept: dict = {}
    with Hooks() as hooks, torch.no_grad():
        for name, module in _leaves(model):

            def keep(module, args, output):
                kept[name] = output.detach().clone()  # noqa: B023  (the slip the prediction is about)

            hooks.add(module.register_forward_hook(keep))
        model(x)
    return list(kept)


@prediction(
    "00.c",
    "hooks made in a loop, without name=name",
    why="keep looks `name` up when it runs, not when it is defined; every hook runs during model(x), after the "
        "loop has ended, when `name` holds the loop's last value, 'embed' (named_modules() lists embed last). "
        "All 20 hooks write under that one key, and the last to run, head, leaves its output there.",
    wrong=[
        (_LATE_ALL, "one key per leaf is what you want, but keep looks `name` up when it runs, and every hook "
                    "runs after the loop has ended: what does `name` hold then?"),
        (["head"], "head runs last, so its output is what stays; but the key is `name` as keep finds it when it "
                   "runs, after the loop: the loop's last name (named_modules() lists the leaves in the order Net "
                   "defines them)"),
        (["blocks.5.norm"], "the key is `name` as keep finds it when it runs, after the loop has ended: the "
                            "loop's last name (named_modules() lists the leaves in the order Net defines them)"),
        (_OtherForm(lambda guess: isinstance(guess, list | tuple) and all(isinstance(i, str) for i in guess)),
         'write a list of names, such as ["blocks.0.act", "blocks.0.norm"]'),
    ],
)
def _late_binding() -> list[str]:
    return _late_keys()


@prediction(
    "00.d",
    "the first and the last name of a recording",
    why="a forward hook runs right after its own layer returns, and a dict keeps its keys in the order they were "
        "first written: rec.outputs follows the order forward calls the layers (embed first, head last), not the "
        "order they are defined in.",
    wrong=[
        (["head", "embed"], "that is the order the model defines its layers in (and the order the hooks were "
                            "registered): each hook writes its name when its layer runs, and forward calls embed "
                            "first and head last"),
        (["head", "blocks.5.norm"], "head is defined first but runs last: each hook writes its name when its layer "
                                    "runs"),
        (["embed", "blocks.5.norm"], "the blocks run before head, which is called last in forward"),
        (["blocks.0.linear", "head"], "embed runs first: forward calls it before the blocks"),
        (_list_of(*[lambda item: isinstance(item, str)] * 2), 'write a list of two names, such as ["blocks.0.act", '
                                                              '"blocks.5.linear"]'),
    ],
)
def _recording_order() -> list[str]:
    names = [name for name, _, _ in _run_order(*_opening())]
    return [names[0], names[-1]]


@prediction(
    "00.e",
    "the layer that makes the first NaN, and the row it gets",
    why="Linear multiplies and adds, ReLU takes max(v, 0): from finite numbers neither makes a NaN (Linear could "
        "only by overflowing float32, past 3e38, into inf - inf: far from these values). RMSNorm divides a row by "
        "its root mean square, which is 0 only when all six values are 0: 0 / 0 = NaN.",
    wrong=[
        ([_Name("RMSNorm"), 1], "RMSNorm is right; but one 0 among six values leaves the root mean square above 0, "
                                "and the division finite: which row makes the root mean square 0?"),
        ([_Name("ReLU"), 6], "6 is right; but ReLU gives max(v, 0), finite for any finite v: it makes the row of "
                             "zeros, and the layer after it divides by that row's root mean square"),
        ([_Name("Linear"), 0], "a Linear layer multiplies and adds finite numbers far below float32's limit, which "
                               "gives finite numbers: it passes a NaN on, but does not make one"),
        (_Parts(lambda: _nan_maker(), True, False, _NAME_AND_NUMBER), "the layer is right; the number is not: "
                                                                      "RMSNorm divides by the row's root mean "
                                                                      "square, and for which row is that 0?"),
        (_Parts(lambda: _nan_maker(), False, True, _NAME_AND_NUMBER), "the number is right; the layer is not: "
                                                                      "Linear and ReLU give finite numbers for "
                                                                      "finite inputs; which kind divides?"),
    ],
    form=_NAME_AND_NUMBER,
)
def _nan_maker() -> list:
    """The kind of the first leaf whose output holds a NaN, and how many values of its first NaN row's
    input are 0."""
    model, x = _opening()
    _, module = _first_nan(_run_order(model, x))
    seen = []
    with module.register_forward_hook(lambda m, args, out: seen.append((args[0], out))), torch.no_grad():
        model(x)
    given, out = seen[0]
    row = torch.isnan(out).any(dim=1).nonzero()[0].item()
    return [_Name(type(module).__name__), int((given[row] == 0).sum())]


class _LogBetween(nn.Sequential):
    """Two leaves, '0' and '1', with ``torch.log`` between them in the parent's own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[1](torch.log(self[0](x)))


_LogBetween.__name__ = "LogBetween"


@prediction(
    "00.f",
    "the leaf first_nan blames for a NaN made between two leaves",
    why="a forward hook sees only what its leaf returns. torch.log(-1) runs in LogBetween.forward, between the "
        "leaves: leaf '0' returned -1, finite, and leaf '1' returned the NaN it was handed, so '1' is the first "
        "leaf whose output holds a NaN.",
    wrong=[
        ("0", "leaf '0' returned -1, a finite number: torch.log ran after it returned, in the parent's forward, "
              "where no hook watches"),
        (None, "the NaN made by torch.log goes into leaf '1', which returns it: its hook sees a NaN"),
        (1, "the right leaf, but its name is a string, '1', as named_modules() gives it"),
        (_OtherForm(lambda guess: guess is None or isinstance(guess, str | int)), "write one name, such as '0', "
                                                                                  "or None"),
    ],
)
def _blamed_leaf() -> str | None:
    logged, x = _LogBetween(nn.Identity(), nn.Identity()), torch.tensor([-1.0])
    name, _ = _first_nan(_run_order(logged, x))
    return name


class _Body(nn.Module):
    """``early`` then an in-place ReLU, ``act``: it overwrites ``early``'s output, so a kept copy that
    shares its memory changes with it."""

    def __init__(self) -> None:
        super().__init__()
        self.early = nn.Linear(2, 3)
        self.act = nn.ReLU(inplace=True)
        with torch.no_grad():
            self.early.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]]))
            self.early.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.early(x))


class _RecorderCase(nn.Module):
    """Defines ``late``, ``norm`` (an RMSNorm: a leaf of the model's own class, without parameters),
    then ``body`` (``body.early``, ``body.act``), and runs ``body.early``, ``body.act``, ``norm``, ``late``,
    then ``norm`` again. A recorder that picks layers by type (Linear, ReLU) or by parameters misses
    ``norm``; one that moves ``norm`` to its last call lists it after ``late``."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(3, 2)
        self.norm = _RMSNorm()
        self.body = _Body()
        with torch.no_grad():  # fixed: no row of late's output is ever near 0
            self.late.weight.copy_(torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, -1.0]]))
            self.late.bias.copy_(torch.tensor([0.5, -2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.late(self.norm(self.body(x))))  # norm runs twice, before and after late


_RecorderCase.__name__ = "model"  # what a message about a hook left on it says: "... on layer 'late' of the model"
_DEFINED, _RAN = ["late", "norm", "body.early", "body.act"], ["body.early", "body.act", "norm", "late"]
_MOVED = ["body.early", "body.act", "late", "norm"]  # norm moved to the place of its second call
_SHORT = {"early": "body.early", "act": "body.act"}  # a leaf's own name, without its parent's


class _BodyError(Exception):
    """Raised inside the answer's with block: no answer may expect it by name."""


def _expected(model: _RecorderCase, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each leaf's output, computed without hooks (the ReLU on a copy)."""
    with torch.no_grad():
        early = model.body.early(x)
        act = torch.relu(early)
        first = act / act.pow(2).mean(dim=1, keepdim=True).sqrt()
        late = model.late(first)
        norm = late / late.pow(2).mean(dim=1, keepdim=True).sqrt()
        return {"body.early": early, "body.act": act, "norm": norm, "late": late, "first norm": first}


def _container_name(name: str) -> str:
    return "the model itself ('')" if name == "" else f"{name!r}, a module with children"


def _names_outcome(outputs: object) -> Outcome | None:
    """What is wrong with the names kept in ``rec.outputs`` and their order, if anything."""
    if not isinstance(outputs, dict):
        return Outcome(False, f"rec.outputs must be a dict from layer name to the kept output, got {kind_of(outputs)}")
    kept = list(outputs)
    if kept == [_DEFINED[-1]]:
        return Outcome(False, f"every output was kept under one name, {_DEFINED[-1]!r}, the loop's last: a hook made "
                              "in a loop looks `name` up when it runs, after the loop ended; pin it with a default "
                              "argument, name=name")
    short = next((name for name in kept if name in _SHORT), None)
    if short:
        return Outcome(False, f"an output was kept under {short!r}: keep each one under its dotted name from "
                              f"model.named_modules(), {_SHORT[short]!r}, which says where the layer sits")
    odd = next((name for name in kept if name not in [*_RAN, "", "body"]), None)
    if odd is not None:
        what = repr(odd) if isinstance(odd, str) else f"a {kind_of(odd)}"
        return Outcome(False, f"rec.outputs has the key {what}, which is not the name of a module of the model: "
                              "keep each output under its dotted name, as model.named_modules() gives it, such as "
                              "'body.early'")
    missing = [name for name in _RAN if name not in kept]
    if missing == ["norm"]:
        return Outcome(False, "nothing was kept for layer 'norm', an RMSNorm: a layer of the model's own class, "
                              "without parameters. Pick the leaves by having no children (the entries of "
                              "model.named_modules() without children), not by their type or their parameters")
    if missing:
        only = " (model.named_children() gives only the top level)" if "body" in kept else ""
        return Outcome(False, f"nothing was kept for layer {missing[0]!r}: register a forward hook on every leaf "
                              f"module, the entries of model.named_modules() without children{only}")
    extra = next((name for name in kept if name not in _RAN), None)
    if extra is not None:
        return Outcome(False, f"rec.outputs also has {_container_name(extra)}: record the leaf modules only, the "
                              "entries of model.named_modules() without children")
    if kept == _MOVED:
        return Outcome(False, "rec.outputs lists 'norm' after 'late', at the place of its second call; the model "
                              "calls norm before late, and again after it. A dict keeps a key at the place it was "
                              "first written, so write rec.outputs[name] = ... and do not pop the name first: moved "
                              "to its last call, a layer that made a NaN would come after the layers it passed the "
                              "NaN to, and first_nan would blame one of them")
    if kept != _RAN:
        order = "the order they were defined in" if kept == _DEFINED else "another order"
        return Outcome(False, f"rec.outputs lists the layers as {kept}, {order}, not the order they ran "
                              f"({_RAN}): add each name when its hook runs (do not fill the dict in advance)")
    return None


_IN_PLACE = ("the copy kept for layer 'body.early' changed after the layer ran: the in-place ReLU that runs right "
             "after it wrote its result into the memory of that output, and a .detach() copy shares that memory. "
             "Keep output.detach().clone(): .clone() gives the copy memory of its own (lesson 02, "
             "02_forward_hooks.ipynb, shows this in its section on the in-place trap)")


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
        if name == "body.early" and not torch.equal(kept, expected[name]) and torch.equal(kept, expected["body.act"]):
            return Outcome(False, _IN_PLACE)
        first = expected["first norm"]
        if name == "norm" and kept.shape == first.shape and torch.allclose(kept, first):
            return Outcome(False, "the copy kept for layer 'norm' is the output of its first call, and the model "
                                  "calls norm twice (before and after late): keep the output of the last call, "
                                  "which a plain rec.outputs[name] = ... does by writing over the one before "
                                  "(setdefault keeps the first)")
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
    early = clear_hooks(model)
    if early:
        return Outcome(False, f"right after Recorder(model), before any with block, {early[0]}: a recorder made "
                              "and never used in a with block would leave its hooks on the model. Register them "
                              "in __enter__, which the with block calls")
    foreign = _foreign_hooks(model.late)  # someone else's hooks, there before the recorder
    try:
        with recorder as entered:
            out = model(x)
    finally:
        foreign_gone = _foreign_gone(model.late, foreign)
        left = clear_hooks(model)
    if foreign_gone:
        return Outcome(False, "your __exit__ also removed hooks that were on layer 'late' before the with block: "
                              "someone else's hooks are theirs to remove; remove only the handles you kept")
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
        return Outcome(False, f"the with block raised {what}, and `__exit__` returned a true value (self?), which "
                              "swallows the error: return None")
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
    if "solo" in getattr(a, "outputs", {}) or "body.early" in getattr(b, "outputs", {}):
        return Outcome(False, "two recorders share one outputs dict: create it in __init__ (self.outputs = {}), not "
                              "in the class body, where every recorder gets the same one")
    return None


def _reused(Recorder) -> Outcome | None:
    """One recorder in two with blocks: the second records only what ran in it."""
    model = _RecorderCase()
    recorder = Recorder(model)
    try:
        with recorder:
            model(torch.ones(1, 2))
        with recorder:
            model.body(torch.ones(1, 2))  # only body.early and body.act run
    finally:
        left = clear_hooks(model)
    if left:
        return Outcome(False, f"after a second with block on the same recorder, {left[0]}: remove every handle "
                              "in __exit__")
    stale = [name for name in getattr(recorder, "outputs", {}) if not name.startswith("body.")]
    if stale:
        return Outcome(False, f"the same recorder used in a second with block, where only body.early and body.act "
                              f"ran, still held {stale[0]!r} from the first block: start each recording with an "
                              "empty dict and an empty list of handles in __enter__")
    return None


@exercise("00.3", "a recorder class that keeps every layer's output")
def _recorder(Recorder) -> Outcome:
    """``with Recorder(model) as rec: model(x)`` keeps, in the dict ``rec.outputs``, a detached copy
    of each leaf module's output under its dotted name, in the order the leaves ran; no hook is left
    after the block, also when it raises; an error raised in the block reaches the caller."""
    if not callable(Recorder):  # a recorder made with Recorder(...), instead of the class
        return Outcome(False, f"pass the class itself, check(\"00.3\", Recorder), not an object of it "
                              f"({kind_of(Recorder)})")
    wrong = _first_run(Recorder)
    for error, what in [(_BodyError, "an error"), (_Stopped, "KeyboardInterrupt (as pressing stop does)")]:
        wrong = wrong or _raising_run(Recorder, error, what)
    wrong = wrong or _shared_state(Recorder) or _reused(Recorder)
    if wrong:
        return wrong
    return Outcome(True, "a detached copy of every leaf's output under its dotted name, in the order they ran, safe "
                         "from the in-place ReLU; no hook left, also when the block raised, and the error passed on; "
                         "a second with block records afresh")


class _NanBlock(nn.Module):
    """``linear`` (the identity times ``sign``), ``act``, ``norm``: a row that ``act`` turns into zeros
    becomes NaN in ``norm``."""

    def __init__(self, sign: float) -> None:
        super().__init__()
        self.linear, self.act, self.norm = nn.Linear(3, 3), nn.ReLU(), _RMSNorm()
        with torch.no_grad():
            self.linear.weight.copy_(sign * torch.eye(3))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.linear(x)))


class _NanCase(nn.Module):
    """Defines ``head`` (first, or last with ``head_last``), ``blocks.back``, then ``blocks.front``, and
    runs ``blocks.front``, ``blocks.back``, ``head``. With ``head`` first, the first layer with a NaN in
    the order they are defined is ``head``, also the last to run; with ``head`` last, they differ. Sorted
    by name (``back`` before ``front``, ``act`` before ``linear``), the leaves are in a third order."""

    def __init__(self, back_sign: float, head_last: bool = False) -> None:
        super().__init__()
        if not head_last:
            self.head = nn.Linear(3, 2)
        self.blocks = nn.ModuleDict({"back": _NanBlock(back_sign), "front": _NanBlock(1.0)})
        if head_last:
            self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks["back"](self.blocks["front"](x)))


_NanCase.__name__ = "model"
_NanBlock.__name__ = "Block"
#: (sign of the back block's weights, input, head defined last): one row dies in blocks.front (first with
#: ``head`` defined last, where the first NaN by definition, by name, the last NaN and the right answer all
#: differ); no row dies; every row dies in blocks.back
_NAN_CASES = [
    (1.0, [[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]], True),
    (1.0, [[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]], False),
    (1.0, [[1.0, 2.0, 3.0], [3.0, -1.0, 2.0]], False),
    (-1.0, [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], False),
]


def _nan_outcome(got: object, model: nn.Module, ran: list) -> Outcome | None:
    """What is wrong with the name ``first_nan`` returned, if anything."""
    expected, _ = _first_nan(ran)
    if got == expected:
        return None
    leaves = [name for name, _, _ in ran]
    if expected is None:
        return Outcome(False, f"no layer's output holds a NaN here, and first_nan returned {got!r}: return None when "
                              "there is none")
    if got is None:
        return Outcome(False, f"{expected!r} makes a NaN (in one row of its output) and first_nan returned None: "
                              "a NaN anywhere in an output counts, torch.isnan(output).any()")
    if not isinstance(got, str):
        return Outcome(False, f"return the layer's name, a str like 'blocks.0.linear', got {kind_of(got)}")
    if got not in leaves:
        return Outcome(False, f"first_nan returned {got!r}, which is not a leaf module of the model: name the leaf, "
                              "as your Recorder does (dotted names of the modules without children)")
    with_nan = [name for name, _, out in ran if torch.isnan(out).any()]
    if got not in with_nan:
        return Outcome(False, f"first_nan returned {got!r}, whose output holds no NaN")
    by_definition = next(name for name, _ in _leaves(model) if name in with_nan)
    if got == by_definition:
        return Outcome(False, f"{got!r} is the first layer with a NaN in the order the layers are defined "
                              "(named_modules()), and it only passed the NaN on. Search in the order they ran, which "
                              f"rec.outputs keeps, among all the leaves ({expected!r} here)")
    by_name = next(name for name in sorted(leaves) if name in with_nan)
    if got == by_name:
        return Outcome(False, f"{got!r} is the first layer with a NaN in alphabetical order (sorted names?), and it "
                              "only passed the NaN on: a name says nothing about when its layer ran. Search "
                              f"rec.outputs in its own order, the order the layers ran ({expected!r} here)")
    if got == with_nan[-1]:
        return Outcome(False, f"{got!r} is the last layer whose output holds a NaN, in the order they ran: it only "
                              "passed the NaN on. Record every leaf and take the first entry of rec.outputs that "
                              f"holds a NaN ({expected!r} here)")
    return Outcome(False, f"{got!r} only passed the NaN on: the first layer, in the order they ran, whose output "
                          f"holds a NaN is {expected!r}")


@exercise("00.4", "the first layer whose output holds a NaN")
def _find_first_nan(first_nan) -> Outcome:
    """``first_nan(model, x)`` returns the dotted name of the first leaf module, in the order the leaves
    ran, whose output holds a NaN, or None; it leaves no hook on the model."""
    for back_sign, rows, head_last in _NAN_CASES:
        model, x = _NanCase(back_sign, head_last), torch.tensor(rows)
        ran = _run_order(model, x)
        try:
            got = first_nan(model, x)
        finally:
            left = clear_hooks(model)
        if left:
            return Outcome(False, f"after first_nan, {left[0]}: record inside a with block (your Recorder), which "
                                  "removes its hooks")
        wrong = _nan_outcome(got, model, ran)
        if wrong:
            return wrong
    return Outcome(True, "the first layer to make a NaN, in the order the layers ran, on a model that defines them "
                         "in another order; None when there is none; no hook left")


# ----- worked answers the lesson falls back on ---------------------------------------------------
class Recorder:
    """A worked answer to 00.3: ``with Recorder(model) as rec: model(x)`` keeps a detached copy of each
    leaf's output in ``rec.outputs``, under its dotted name, and removes every hook it registered."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.outputs, self.handles = model, {}, []

    def __enter__(self) -> Recorder:
        self.outputs, self.handles = {}, []  # a fresh recording each with block: the recorder can be used again
        for name, module in self.model.named_modules():
            if not list(module.children()):  # a leaf
                def keep(module, args, output, name=name):  # name=name: this hook's own name, bound now
                    self.outputs[name] = output.detach().clone()
                self.handles.append(module.register_forward_hook(keep))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for handle in self.handles:
            handle.remove()


def first_nan(model: nn.Module, x: torch.Tensor) -> str | None:
    """A worked answer to 00.4: the name of the first leaf, in the order they ran, whose output holds a NaN."""
    with Recorder(model) as rec:
        model(x)
    return next((name for name, output in rec.outputs.items() if torch.isnan(output).any()), None)


def yours_or_worked(names: dict, *wanted: str):
    """``hooklab.exercises.yours_or_worked`` for this lesson: ``"Recorder"`` (00.3) and ``"first_nan"``
    (00.4), the student's once passed, else the worked answers above."""
    from . import yours_or_worked as pick

    return pick(names, {"Recorder": ("00.3", Recorder), "first_nan": ("00.4", first_nan)}, *wanted)
