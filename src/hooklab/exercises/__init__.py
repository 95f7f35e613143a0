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
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["check", "checked", "exercise", "exercises", "grade", "passed", "prediction"]


@dataclass(frozen=True)
class Outcome:
    passed: bool
    detail: str


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    checker: Callable[[object], Outcome]
    kind: str = "exercise"  # or "prediction"


_REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str):
    """Register ``checker(answer) -> Outcome`` as exercise ``id`` (e.g. ``"01.2"``)."""

    def register(checker: Callable[[object], Outcome]) -> Callable[[object], Outcome]:
        if id in _REGISTRY:
            raise ValueError(f"exercise {id} is registered twice")
        _REGISTRY[id] = Exercise(id, title, _guarded(checker))
        return checker

    return register


def prediction(id: str, title: str, why: str, wrong: Iterable[tuple[object, str]] = (), rel: float = 0.01):
    """Register a prediction ``id`` (a lesson number and a letter: ``"01.a"``): the decorated
    function takes no argument and **computes** the truth with torch (the same experiment the
    lesson's next cell shows), so a wrong expectation fails the tests instead of misleading a student.

    ``check(id, guess)`` then prints ``right`` or ``not quite``, then ``why`` (the rule, one or two
    sentences). ``wrong`` pairs a plausible wrong guess with its own hint, shown instead of ``why``.
    Guesses are compared loosely: strings without case, quotes or surrounding spaces; numbers within
    ``rel`` (1 %) of their size; lists and tuples (and tensors, ``torch.Size``) item by item. Only
    ``...`` (the lesson's stub) is "no guess yet": ``None`` is a guess like any other. A number
    written as a string (``"0.25"``) where the truth is a number is told to drop the quotes.
    """

    def register(truth: Callable[[], object]) -> Callable[[], object]:
        if not _PREDICTION_ID.fullmatch(id):
            raise ValueError(f"prediction ids are a number and a letter, like '01.a', not {id!r}")

        def checker(guess: object) -> Outcome:
            expected = truth()
            if same(guess, expected, rel):
                return Outcome(True, why)
            hint = next((text for value, text in wrong if same(guess, value, rel)), None)
            if hint is None and _is_number(expected) and isinstance(guess, str) and _as_number(guess) is not None:
                hint = f"write a number, not a string: {_unquoted(guess)}, without quotes"
            return Outcome(False, hint or why)

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


def _exercise(id: str) -> Exercise:
    known = exercises()
    if id not in known:
        raise KeyError(f"no exercise {id!r}; known: {', '.join(known)}")
    return known[id]


def grade(id: str, answer: object) -> Outcome:
    """Run exercise ``id``'s checker on ``answer`` and return the ``Outcome`` (``check`` prints it).

    For grading scripts and tests: an exception raised by the answer propagates unchanged.
    """
    return _exercise(id).checker(answer)


_CHECKED: dict[str, tuple[str, str]] = {}  # id -> (verdict, detail) of the last check() in this process


def check(id: str, answer: object) -> None:
    """Check ``answer`` for exercise ``id`` and print one line: not solved yet, passed or failed.
    For a prediction (``"01.a"``): no guess yet, right or not quite, and why."""
    ex = _exercise(id)
    verdict, detail = _verdict(ex, answer)
    if ex.kind == "prediction":
        verdict = {"not solved yet": "no guess yet", "passed": "right", "failed": "not quite"}[verdict]
        if verdict == "no guess yet":
            detail = "replace the ... with your guess, run this cell, then the next one"
        _CHECKED[id] = (verdict, detail)
        print(f"Prediction {id} ({ex.title}): {verdict} — {detail}")
        return
    _CHECKED[id] = (verdict, detail)
    print(f"Exercise {id} ({ex.title}): {verdict}" + ("" if verdict == "not solved yet" else f" — {detail}"))


def _verdict(ex: Exercise, answer: object) -> tuple[str, str]:
    # a prediction's stub is `guess = ...`: None is a guess like any other ("which entry is None?")
    if answer is Ellipsis or (answer is None and ex.kind != "prediction"):
        return "not solved yet", ""
    try:
        outcome = ex.checker(answer)
    except NotImplementedError:
        return "not solved yet", ""
    except Exception as exc:  # a student's bug: say what it was, don't drown them in a traceback
        return "failed", f"your code raised {type(exc).__name__}: {exc}"
    return ("passed" if outcome.passed else "failed"), outcome.detail


def checked() -> dict[str, tuple[str, str]]:
    """The verdict and detail of the last ``check`` of each exercise in this process, by id: what
    ``make grade`` collects from a student's notebook."""
    return dict(sorted(_CHECKED.items()))


def passed(id: str) -> bool:
    """Whether the last ``check`` of exercise ``id`` in this process passed: a lesson goes on with a
    worked answer while the student's has not."""
    return _CHECKED.get(id, ("not checked",))[0] == "passed"


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
