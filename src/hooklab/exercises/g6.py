"""Exercises of the field guide G6: the firing order of every kind of hook, and the hook-API reference.

G6.1 asks for the order in which ten hooks on one ``nn.Linear`` fire (section 2). Its feedback names
the list the student was given, ``hooks_shuffled``, and never which hook belongs at a position.
"""

from __future__ import annotations

import itertools

from . import Outcome, exercise

#: the hooks of exercise G6.1, shuffled as the guide's ``hooks_shuffled`` lists them: one nn.Linear
#: carries them, registered as the exercise's text shows
HOOKS_SHUFFLED = (
    "backward hook G",
    "pre-hook B (prepend)",
    "forward hook D",
    "tensor hook J",
    "global forward hook E",
    "backward pre-hook I (prepend)",
    "pre-hook A",
    "forward hook F (prepend)",
    "backward pre-hook H",
    "pre-hook C (prepend)",
)

#: the order in which they fire. A constant, so that the check registers no hook and works in any
#: kernel; a test runs the registration code of the guide's exercise text and measures it again
_FIRING_ORDER = (
    "pre-hook C (prepend)",
    "pre-hook B (prepend)",
    "pre-hook A",
    "global forward hook E",
    "forward hook F (prepend)",
    "forward hook D",
    "backward pre-hook I (prepend)",
    "backward pre-hook H",
    "tensor hook J",
    "backward hook G",
)

_LIST = "hooks_shuffled"


def _describe(value) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _quoted(items) -> str:
    return ", ".join(repr(item) if isinstance(item, str) else f"a {type(item).__name__}" for item in items)


def _key(text: str) -> str:
    return " ".join(text.casefold().split())


@exercise("G6.1", "predict the firing order for one layer")
def _predict_order(prediction) -> Outcome:
    """``prediction`` lists the strings of ``hooks_shuffled`` in the order the hooks fire.

    A wrong order is told how many hooks are in the right place and one neighbouring pair that is
    the wrong way round, never which hook belongs at a position.
    """
    n = len(HOOKS_SHUFFLED)
    if not isinstance(prediction, (list, tuple)):
        return Outcome(False, f"give a list of the {n} strings of {_LIST}, not {_describe(prediction)}")
    prediction = list(prediction)
    unknown = [item for item in prediction if not isinstance(item, str) or item not in HOOKS_SHUFFLED]
    letters = {kind.removesuffix(" (prepend)")[-1] for kind in HOOKS_SHUFFLED}
    if any(isinstance(item, str) and item.strip().upper() in letters for item in unknown):
        return Outcome(False, f"use the full strings of {_LIST}, e.g. 'pre-hook A', not letters alone")
    by_case = {_key(kind): kind for kind in HOOKS_SHUFFLED}
    near = [(item, by_case[_key(item)]) for item in unknown if isinstance(item, str) and _key(item) in by_case]
    if near:
        return Outcome(False, f"use the strings of {_LIST} exactly as they are written (case and spaces count), "
                              f"e.g. {near[0][1]!r}, not {near[0][0]!r}")
    missing = [kind for kind in HOOKS_SHUFFLED if kind not in prediction]
    twice = [kind for kind in HOOKS_SHUFFLED if prediction.count(kind) > 1]
    if unknown or missing or twice:
        problems = [
            f"{label}: {_quoted(items)}"
            for label, items in ((f"not in {_LIST}", unknown), ("missing", missing), ("listed twice", twice))
            if items
        ]
        return Outcome(False, f"list each hook of {_LIST} exactly once ({'; '.join(problems)})")
    if prediction == list(_FIRING_ORDER):
        return Outcome(True, f"all {n} hooks in the order they fire")
    right = sum(got == real for got, real in zip(prediction, _FIRING_ORDER, strict=True))
    rank = {kind: i for i, kind in enumerate(_FIRING_ORDER)}
    first, second = next((a, b) for a, b in itertools.pairwise(prediction) if rank[a] > rank[b])
    return Outcome(False, f"{right} of {n} hooks in the right place; for example, you put {first!r} right before "
                          f"{second!r}: which of the two fires first?")
