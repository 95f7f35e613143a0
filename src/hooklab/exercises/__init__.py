"""Exercises with instant checks.

A notebook's exercise cell ends with ``check("01.1", your_answer)``. The checker prints one
stable line: ``not solved yet`` while the answer still raises ``NotImplementedError`` (or is
``None`` / ``...``), then ``passed`` or ``failed`` with the reason and, for tensors, the largest
difference from the expected value.

A **prediction** (``check("01.a", guess)``, ids with a letter) asks what a cell is about to show
before it runs: the checker says ``right`` or ``not quite`` and why, and the next cell shows it.
Its truth is computed by torch when the prediction is checked (``@prediction``), never typed in.

Each notebook's checkers live in ``nbNN.py`` beside this file (the guide's in ``gK.py``) and
register themselves with ``@exercise`` / ``@prediction``; solutions notebooks in
``notebooks/solutions/`` run the same checks on worked answers.

A checker may seed torch's random generator to build its own models: ``@exercise`` runs it on a
copy of the generator's state, so the student's random stream is the same after a check as
before it. A global hook (or saved-tensor hooks, or a torch function mode) left active by earlier
code fails every check with a message naming it, instead of running inside the checker's models;
one the answer itself leaves active is removed and fails that answer.

``check`` stops an answer still running after ``TIME_LIMIT`` seconds (in the main thread, with
``SIGALRM``, as in a Jupyter kernel), says when it was given the result of a function instead of
the function, or its arguments swapped, and shortens long error messages (no tensor dumps).

In a kernel started by ``make grade`` (``tools/grade_kernel.py`` calls ``_start_grading`` before
any cell runs), each ``check`` also appends its verdict to the grader's log, signed with a key
that only the grader and this module hold, together with what was found changed in the checking
machinery at that moment (hooklab's functions, the exercises' checkers, ``sys.modules``, torch's
and the builtins' functions): the grader reports such a verdict as "suspect", with the reason.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib
import json
import math
import os
import pkgutil
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["check", "checked", "exercise", "exercises", "grade", "passed", "prediction", "yours_or_worked"]


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str
    form: bool = False  # a prediction written in another form than the question asks: the hint names the form


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    checker: Callable[[object], Outcome]
    kind: str = "exercise"  # or "prediction"
    time_limit: float | None = None  # seconds a check may run, if not TIME_LIMIT


_REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str, time_limit: float | None = None):
    """Register ``checker(answer) -> Outcome`` as exercise ``id`` (e.g. ``"01.2"``). ``time_limit``: the
    seconds its check may run, for a checker that trains (default ``TIME_LIMIT``)."""

    def register(checker: Callable[[object], Outcome]) -> Callable[[object], Outcome]:
        if id in _REGISTRY:
            raise ValueError(f"exercise {id} is registered twice")
        _REGISTRY[id] = Exercise(id, title, _guarded(checker), time_limit=time_limit)
        return checker

    return register


def prediction(id: str, title: str, why: str, wrong: Iterable[tuple[object, str]] = (), rel: float = 0.01,
               form: Callable[[object], str | None] | None = None):
    """Register a prediction ``id`` (a lesson number and a letter: ``"01.a"``): the decorated
    function takes no argument and **computes** the truth with torch (the same experiment the
    lesson's next cell shows), so a wrong expectation fails the tests instead of misleading a student.

    ``check(id, guess)`` then prints ``right`` or ``not quite``, then ``why`` (the rule, one or two
    sentences). ``wrong`` pairs a plausible wrong guess with its own hint, shown instead of ``why``.
    Guesses are compared loosely: strings without case, quotes or surrounding spaces; a truth that is a set
    of names matches those names in any order and container (one name may be a bare string); numbers within
    ``rel`` (1 %) of their size; lists and tuples (and tensors, ``torch.Size``) item by item. Only
    ``...`` (the lesson's stub) is "no guess yet": ``None`` is a guess like any other. A number
    written as a string (``"0.25"``) where the truth is a number is told to drop the quotes; anything but
    a bool where the truth is a bool (``0``, ``"no"``) is asked for True or False, without the answer.
    ``form(guess)``, if given, returns a hint naming the form the question wants for a guess that
    matches neither the truth nor a ``wrong`` entry, and None for a guess in the form asked: a wrong
    number where a number is asked is "not quite", not a slip of form. A slip of form prints ``not in
    the form asked`` instead of ``not quite``, and its hint never gives the answer away.
    """

    def register(truth: Callable[[], object]) -> Callable[[], object]:
        if not _PREDICTION_ID.fullmatch(id):
            raise ValueError(f"prediction ids are a number and a letter, like '01.a', not {id!r}")

        def checker(guess: object) -> Outcome:
            expected = truth()
            if same(guess, expected, rel):
                return Outcome(True, why)
            hint = next((text for value, text in wrong if same(guess, value, rel)), None)
            if hint is not None:
                return Outcome(False, hint)
            if _is_number(expected) and isinstance(guess, str) and _as_number(guess) is not None:
                return Outcome(False, f"write a number, not a string: {_unquoted(guess)}, without quotes", form=True)
            if isinstance(expected, bool) and not isinstance(guess, bool):
                return Outcome(False, f"write True or False, without quotes: the question wants a bool, not "
                                      f"{kind_of(guess)}", form=True)  # fmt: skip
            slip = form(guess) if form is not None else None
            return Outcome(False, slip, form=True) if slip else Outcome(False, why)

        checker.truth = truth  # for the tests: the value a right guess must match
        if id in _REGISTRY:
            raise ValueError(f"exercise {id} is registered twice")
        _REGISTRY[id] = Exercise(id, title, _guarded(checker), kind="prediction")
        return truth

    return register


_PREDICTION_ID = re.compile(r"(\d\d|G\d+)\.[a-z]")


def same(guess: object, truth: object, rel: float = 0.01) -> bool:
    """Whether a guess matches the truth, compared the way a person would write it (see ``prediction``)."""
    import torch

    if isinstance(guess, torch.Tensor):
        guess = guess.tolist()
    if isinstance(truth, torch.Tensor):
        truth = truth.tolist()
    if isinstance(truth, bool) or isinstance(guess, bool):
        return isinstance(guess, bool) and isinstance(truth, bool) and guess == truth
    if isinstance(truth, str):
        return isinstance(guess, str) and _words(guess) == _words(truth)
    if isinstance(truth, int | float) and isinstance(guess, int | float):
        if isinstance(truth, int) and isinstance(guess, int):
            return guess == truth
        if guess != guess or truth != truth:  # NaN: a guess of NaN matches a NaN
            return guess != guess and truth != truth
        if math.isinf(guess) or math.isinf(truth):
            return guess == truth
        return abs(guess - truth) <= rel * abs(truth) + 1e-12
    if isinstance(truth, set | frozenset):  # a set: any order, any container; names loosely, one name bare
        items = [guess] if isinstance(guess, str) else guess
        if not isinstance(items, set | frozenset | list | tuple):
            return False
        if all(isinstance(t, str) for t in truth) and all(isinstance(i, str) for i in items):
            return {_words(i) for i in items} == {_words(t) for t in truth}
        try:
            return len(set(items)) == len(items) and set(items) == set(truth)
        except TypeError:  # an unhashable item (a list in the guess) is no name
            return False
    if isinstance(truth, list | tuple) and isinstance(guess, list | tuple):
        return len(guess) == len(truth) and all(same(g, t, rel) for g, t in zip(guess, truth, strict=True))
    if truth is None:
        return guess is None or (isinstance(guess, str) and _words(guess) == "none")
    return guess == truth


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_number(text: str) -> float | None:
    """The number a string spells (``"0.25"``, ``" 1e-3 "``), or None."""
    try:
        return float(_unquoted(text))
    except ValueError:
        return None


def _unquoted(text: str) -> str:
    return text.strip().strip("'\"`")


def _words(text: str) -> str:
    return " ".join(_unquoted(text).lower().split())


def _guarded(checker: Callable[[object], Outcome]) -> Callable[[object], Outcome]:
    """The checker run on its own copy of the random stream, and only when nothing global is left
    active by earlier code (it would run inside the checker's models and spoil the verdict).
    Whatever global the answer itself leaves active is removed again and fails the answer."""

    @functools.wraps(checker)
    def run(answer: object) -> Outcome:
        import torch

        from ..audit import clear_global_hooks, global_hooks

        left = global_hooks()
        if left:
            return Outcome(False, f"something global from earlier code is still active ({'; '.join(left)}): "
                                  "remove it with its handle's .remove() (or exit its with block); if the handle "
                                  "is lost, hooklab.audit.clear_global_hooks() removes it, then check again")
        try:
            with torch.random.fork_rng():
                outcome = checker(answer)
        finally:
            removed = clear_global_hooks()  # nothing was active before: all of it is the answer's
        if removed:
            return Outcome(False, f"your answer left something global active ({'; '.join(removed)}); the check "
                                  "removed it: remove global hooks (and exit with blocks) in a finally block")
        return outcome

    return run


def exercises() -> dict[str, Exercise]:
    """Every registered exercise, by id (imports all ``nbNN`` modules first)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


def _exercise(id: str, answer: object = None) -> Exercise:
    known = exercises()
    if not isinstance(id, str):
        if isinstance(answer, str) and answer in known:
            raise TypeError(f"the arguments are swapped: write check({answer!r}, your_answer), the exercise's id "
                            "first, then your answer")
        raise TypeError(f"check's first argument is the exercise's id, like check('00.1', your_answer), not "
                        f"{_short(kind_of(id))}")
    if id not in known:
        raise KeyError(f"no exercise {id!r}; known: {', '.join(known)}")
    return known[id]


def grade(id: str, answer: object) -> Outcome:
    """Run exercise ``id``'s checker on ``answer`` and return the ``Outcome`` (``check`` prints it).

    For grading scripts and tests: an exception raised by the answer propagates unchanged.
    """
    return _exercise(id, answer).checker(answer)


_CHECKED: dict[str, tuple[str, str]] = {}  # id -> (verdict, detail) of the last check() in this process


def check(id: str, answer: object) -> None:
    """Check ``answer`` for exercise ``id`` and print one line: not solved yet, passed or failed.
    For a prediction (``"01.a"``): no guess yet, right or not quite, and why."""
    ex = _exercise(id, answer)
    changed = _GRADING.get("tampered", list)()  # [] outside a grading kernel
    verdict, detail = _verdict(ex, answer)
    if ex.kind == "prediction":
        verdict = {"not solved yet": "no guess yet", "passed": "right", "failed": "not quite",
                   "form": "not in the form asked"}[verdict]  # fmt: skip
        if verdict == "no guess yet":
            detail = "replace the ... with your guess, run this cell, then the next one"
        _CHECKED[id] = (verdict, detail)
        _record(id, verdict, detail, changed)
        print(f"Prediction {id} ({ex.title}): {verdict} — {detail}")
        return
    _CHECKED[id] = (verdict, detail)
    _record(id, verdict, detail, changed)
    print(f"Exercise {id} ({ex.title}): {verdict}" + ("" if verdict == "not solved yet" else f" — {detail}"))


def _verdict(ex: Exercise, answer: object) -> tuple[str, str]:
    # a prediction's stub is `guess = ...`: None is a guess like any other ("which entry is None?")
    if answer is Ellipsis or (answer is None and ex.kind != "prediction"):
        return "not solved yet", ""
    limit = _scaled(ex.time_limit or TIME_LIMIT)
    try:
        with _time_limit(limit):
            outcome = ex.checker(answer)
    except NotImplementedError:
        return "not solved yet", ""
    except _TooLong:
        torch = sys.modules.get("torch")  # already imported by any answer that could run this long
        threads = torch.get_num_threads() if torch else 1
        setup = (f"; this kernel runs torch on {threads} threads, which on a busy machine can make a right answer "
                 "this slow: run the lesson's setup cell (hooklab.setup() sets one thread)") if threads > 1 else ""
        return "failed", (f"stopped after {limit:g} s: your answer was still running (an endless loop? a hook "
                          f"that calls its own module?{setup}); make it finish, then check again")
    except Exception as exc:  # a student's bug: say what it was, don't drown them in a traceback
        if isinstance(exc, TypeError) and "not callable" in str(exc) and not callable(answer):
            return "failed", _not_a_function(ex.id, answer)  # the check called it: not the student's bug
        return "failed", f"your code raised {type(exc).__name__}: {_short(str(exc))}"
    return ("passed" if outcome.passed else "form" if outcome.form else "failed"), outcome.detail


#: Seconds a check may run before it is stopped (only in the main thread, as in a notebook).
TIME_LIMIT = 60


def _scaled(seconds: float) -> float:
    """``seconds`` times ``HOOKLAB_CHECK_TIME_SCALE`` (default 1): ``make variants`` runs the notebooks on
    an emulated CPU without SIMD, about 15 times slower, and scales the limits with it."""
    try:
        return seconds * max(1.0, float(os.environ.get("HOOKLAB_CHECK_TIME_SCALE", "1")))
    except ValueError:
        return seconds


class _TooLong(BaseException):
    """Raised by the alarm in the answer's code: a BaseException, so no `except Exception` keeps it."""


class _time_limit:
    """Raise ``_TooLong`` in the main thread after ``seconds`` (SIGALRM); nothing where that is not
    possible (another thread, no SIGALRM, an alarm already in use)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.armed = seconds, False

    def __enter__(self):
        if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
            return self
        if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None) or \
                signal.getitimer(signal.ITIMER_REAL)[0]:  # fmt: skip
            return self  # someone else's alarm: leave it alone

        def stop(signum, frame):
            raise _TooLong

        self.previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self.armed = True
        return self

    def __exit__(self, *exc) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def _short(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters: no tensor dumps in a message."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + f"… ({len(text) - limit + 1} characters cut)"


def _not_a_function(id: str, answer: object) -> str:
    """What to write when ``check`` got a value where the exercise wants a function: the name of the
    function that was called in the ``check`` line, when that line shows it."""
    called = None
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    if frame is not None:
        import ast
        import linecache

        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        try:
            calls = [node for node in ast.walk(ast.parse(line)) if isinstance(node, ast.Call)
                     and len(node.args) >= 2 and isinstance(node.args[1], ast.Call)]  # fmt: skip
            called = ast.unparse(calls[0].args[1].func) if calls else None
        except SyntaxError:  # a check(...) spread over several lines
            pass
    if called:
        return f"pass the function itself, not `{called}(...)`: check({id!r}, {called}); the check calls it"
    return (f"pass the function itself, not a {_short(kind_of(answer), 60)}: check({id!r}, your_function), the name "
            "without parentheses; the check calls it")


# --- the verdict log of a grading kernel (make grade) ------------------------------------------

_GRADING: dict = {}  # set once by _start_grading: "write" (to the signed log) and "tampered"


def package_hash(folder) -> str:
    """A hash of every file of a package folder (names and contents, ``__pycache__`` left out): the
    grader and its kernel compare theirs for ``hooklab``."""
    from pathlib import Path

    folder, digest = Path(folder), hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sign(key: bytes, payload: str) -> str:
    """A log line: the JSON payload, a tab, its HMAC with the run's key."""
    return payload + "\t" + hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def _start_grading(folder: str) -> None:
    """In a kernel started by ``make grade``, before any cell runs: read and delete the run's key
    (``folder/key``), note what the checks depend on, and write the log's first line (where
    ``hooklab`` was imported from, and the hash of its files) to ``folder/verdicts.log``.

    The key, the snapshot and the log are held in closures, not in names a cell can rebind; a line
    that reaches the log other than through ``check`` says so."""
    import hooklab

    key_file = os.path.join(folder, "key")
    with open(key_file, "rb") as f:
        key = f.read()
    os.unlink(key_file)
    fd = os.open(os.path.join(folder, "verdicts.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    count = iter(range(sys.maxsize))
    exercises()  # every course exercise registered, so that its checker is in the snapshot
    snapshot, record_code, check_code = _snapshot(), _record.__code__, check.__code__

    def tampered() -> list[str]:
        found = _tampered(snapshot)
        found += [f"hooklab.exercises._GRADING[{k!r}] was replaced" for k, v in mine.items()
                  if _GRADING.get(k) is not v]  # fmt: skip
        return found[:5]

    def write(record: dict) -> None:
        if record["kind"] == "check":
            caller = sys._getframe(1)
            through_check = caller.f_code is record_code and getattr(caller.f_back, "f_code", None) is check_code
            suspect = list(dict.fromkeys(record["suspect"] + tampered()))
            if not through_check:
                suspect.append("this verdict was written by something other than hooklab's check")
            record = {**record, "suspect": suspect}
        line = sign(key, json.dumps({"seq": next(count), **record}, ensure_ascii=False))
        os.write(fd, (line + "\n").encode())  # one write: a kernel killed later keeps the line

    _GRADING.update(write=write, tampered=tampered)
    mine = dict(_GRADING)
    package = os.path.dirname(hooklab.__file__)
    write({"kind": "start", "hooklab": package, "files": package_hash(package)})


def _record(id: str, verdict: str, detail: str, changed: list[str]) -> None:
    write = _GRADING.get("write")
    if write is not None:
        write({"kind": "check", "id": id, "verdict": verdict, "detail": detail, "suspect": changed})


_WATCHED_MODULES = ("builtins", "torch", "torch.nn", "torch.nn.functional", "torch.nn.modules.module",
                    "torch.utils.hooks", "torch.autograd", "torch.autograd.graph", "torch.overrides")  # fmt: skip
#: the builtins a check relies on (a kernel replaces others, such as ``input``, while a cell runs)
_WATCHED_BUILTINS = {"abs", "all", "any", "bool", "callable", "dict", "float", "getattr", "hasattr", "id",
                     "int", "isinstance", "issubclass", "iter", "len", "list", "max", "min", "next", "object",
                     "range", "repr", "round", "set", "sorted", "str", "sum", "tuple", "type", "zip"}  # fmt: skip


def _snapshot() -> dict:
    """What the checks depend on, as it is now: the modules in ``sys.modules``; every name of
    hooklab's modules and classes; the functions and classes of torch's main modules, of
    ``torch.Tensor`` and ``torch.nn.Module``, and the builtins; the code, defaults and closures of
    hooklab's functions and of every exercise's checker."""
    import types

    import torch

    modules = {n: m for n, m in sys.modules.items() if n == "hooklab" or n.startswith("hooklab.")}
    ours = set(modules)
    modules.update({n: sys.modules[n] for n in _WATCHED_MODULES if n in sys.modules})
    names, functions = {}, {}
    routine = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
               types.WrapperDescriptorType, types.BuiltinMethodType, type, staticmethod, classmethod, property)
    for name, module in modules.items():
        names[name] = {k: v for k, v in vars(module).items() if name in ours or (isinstance(v, routine)
                       and (name != "builtins" or k in _WATCHED_BUILTINS))}  # fmt: skip
        for k, v in vars(module).items():
            if name in ours and isinstance(v, type) and v.__module__.startswith("hooklab"):
                names[f"{name}.{k}"] = dict(vars(v))
    for cls in (torch.Tensor, torch.nn.Module, torch.utils.hooks.RemovableHandle):
        names[f"{cls.__module__}.{cls.__qualname__}"] = {k: v for k, v in vars(cls).items() if isinstance(v, routine)}
    for where, values in names.items():
        if where.split(".")[0] == "hooklab":
            functions.update({f"{where}.{k}": v for k, v in values.items() if isinstance(v, types.FunctionType)})
    for id, ex in _REGISTRY.items():
        functions[f"the checker of {id}"] = ex.checker
        for cell in ex.checker.__closure__ or ():
            if isinstance(cell.cell_contents, types.FunctionType):
                functions[f"the checker of {id}"
                          f" ({cell.cell_contents.__qualname__})"] = cell.cell_contents  # fmt: skip
    return {"modules": modules, "names": names, "registry": dict(_REGISTRY),
            "functions": {k: (f, _state(f)) for k, f in functions.items()}}


def _state(function) -> list:
    return [function.__code__, function.__defaults__, function.__kwdefaults__,
            *(c.cell_contents if _filled(c) else None for c in function.__closure__ or ())]  # fmt: skip


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def _tampered(snap: dict) -> list[str]:
    """What differs from the snapshot, in a student's words."""
    found = [f"sys.modules[{n!r}] was replaced or removed" for n, m in snap["modules"].items()
             if sys.modules.get(n) is not m]  # fmt: skip
    for where, values in snap["names"].items():
        space = snap["modules"].get(where)
        now = vars(space) if space is not None else _class_vars(snap, where)
        found += [f"{where}.{k} was replaced" for k, v in values.items()
                  if now is not None and now.get(k) is not v and not _torch_wrapper(now.get(k), v)]  # fmt: skip
    for id, ex in snap["registry"].items():
        if _REGISTRY.get(id) is not ex:
            found.append(f"exercise {id} was registered again (its checker replaced)")
    for name, (function, state) in snap["functions"].items():
        now = _state(function)
        if len(now) != len(state) or any(a is not b for a, b in zip(now, state, strict=True)):
            found.append(f"the code of {name} was changed")
    return found


def _torch_wrapper(new: object, old: object) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old`` (importing ``torch._dynamo`` wraps
    ``torch.manual_seed``, for one): it wraps ``old`` and its code is torch's."""
    import torch

    code = getattr(new, "__code__", None)
    return getattr(new, "__wrapped__", None) is old and code is not None and \
        code.co_filename.startswith(os.path.dirname(torch.__file__) + os.sep)  # fmt: skip


def _class_vars(snap: dict, where: str) -> dict | None:
    """The current ``vars`` of the class named ``where`` (``hooklab.x.Class`` or ``torch.Tensor``)."""
    module, _, name = where.rpartition(".")
    space = snap["modules"].get(module) or sys.modules.get(module)
    cls = getattr(space, name, None) if space is not None else None
    return vars(cls) if isinstance(cls, type) else None


def checked() -> dict[str, tuple[str, str]]:
    """The verdict and detail of the last ``check`` of each exercise in this process, by id: what
    ``make grade`` collects from a student's notebook."""
    return dict(sorted(_CHECKED.items()))


def passed(id: str) -> bool:
    """Whether the last ``check`` of exercise ``id`` in this process passed: a lesson goes on with a
    worked answer while the student's has not."""
    return _CHECKED.get(id, ("not checked",))[0] == "passed"


def yours_or_worked(names: dict, worked: dict[str, tuple[str, object]], *wanted: str):
    """A lesson's fallback for its later cells: each name in ``wanted`` taken from ``names`` (the notebook's
    ``globals()``) once its exercise has passed in this kernel, else the worked answer. ``worked`` maps a
    name to (its exercise id, its worked answer). It returns and never assigns: the student's names stay
    theirs. One name gives one object, several a tuple."""
    found = [names[name] if passed(worked[name][0]) and name in names else worked[name][1] for name in wanted]
    return found[0] if len(found) == 1 else tuple(found)


def hint_for(error: Exception, hints: dict[str, str]) -> Outcome:
    """A failed Outcome with the hint for a known error: the first of ``hints`` whose key is part
    of the error's message. Any other error is raised again (``check`` then reports it as the
    answer's own). Call it in an ``except`` block."""
    for part, hint in hints.items():
        if part in str(error):
            return Outcome(False, hint)
    raise error


def is_handle(value: object) -> bool:
    """Whether ``value`` is the handle a ``register_*`` call returns (a list has ``.remove`` too)."""
    from torch.utils.hooks import RemovableHandle

    return isinstance(value, RemovableHandle)


def kind_of(value: object) -> str:
    """What an answer returned, for a failure message: the type's name, a tuple's item types spelt
    out, like ``(int, str)``, and None with a hint at a missing return."""
    if value is None:
        return "None (missing return?)"
    if isinstance(value, tuple):
        return "(" + ", ".join(type(item).__name__ for item in value) + ")"
    return type(value).__name__


def not_a_handle(value: object, what: str, *modules) -> Outcome | None:
    """A failed Outcome when ``what`` returned something other than a hook handle (whatever it
    registered on ``modules`` is dropped), else None."""
    if is_handle(value):
        return None
    if modules:
        from ..audit import clear_hooks

        clear_hooks(*modules)
    return Outcome(False, f"{what} must return the handle whose remove() takes your hook out, got {kind_of(value)}")


def hooks_left_when_raising(call: Callable[[], object], *modules) -> Outcome | None:
    """Run ``call()``, which makes the answer run a forward pass that raises, and fail if a hook was
    then left on ``modules`` (it is dropped): hooks belong in a ``finally`` block."""
    from ..audit import clear_hooks

    try:
        call()
    except Exception:  # expected: the point is what the answer leaves behind
        pass
    left = clear_hooks(*modules)
    if left:
        return Outcome(False, f"when the forward pass raised, your hook stayed registered ({left[0]}): remove "
                              "hooks in a `finally:` block")
    return None


def compare_tensors(got, expected, atol: float = 1e-6, rtol: float = 1e-5) -> Outcome:
    """Shape and value comparison used by most checkers."""
    import torch

    if not isinstance(got, torch.Tensor):
        return Outcome(False, f"expected a tensor, got {type(got).__name__}")
    if got.shape != expected.shape:
        return Outcome(False, f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    diff = (got.detach().double() - expected.detach().double()).abs().max().item() if got.numel() else 0.0
    ok = torch.allclose(got.detach().double(), expected.detach().double(), atol=atol, rtol=rtol)
    return Outcome(ok, f"max |difference| {diff:.1e}")
