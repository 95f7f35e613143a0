"""The field guide G6's checker accepts the right firing order and names the slip in a wrong one,
with the name of the list the student was given (hooks_shuffled)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from answers import failed
from torch import nn
from torch.nn.modules import module as module_hooks

from hooklab.audit import clear_global_hooks, clear_hooks
from hooklab.exercises import grade
from hooklab.exercises.g6 import _FIRING_ORDER, HOOKS_SHUFFLED

# The expected order, as torch's Module._call_impl and BackwardHook give it (global hooks before
# the module's own; each prepend=True puts a hook in front of the module's own, so the last
# prepended runs first; backward pre-hooks when grad_output is ready, the inner output's tensor
# hook after them, full backward hooks when grad_input is ready). The first test measures it.
FIRING = list(_FIRING_ORDER)
GUIDE = Path(__file__).resolve().parents[1] / "notebooks" / "guide" / "G6_firing_order_and_reference.ipynb"


def _exercise_code() -> str:
    """The registration code that the text of exercise G6.1 shows."""
    for cell in json.loads(GUIDE.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "### Exercise G6.1" in source:
            return source.split("```python\n", 1)[1].split("```", 1)[0]
    pytest.fail("guide G6 has no exercise G6.1")


def test_g6_1_the_expected_order_is_measured_from_the_code_the_exercise_shows():
    fired = []

    def hook_named(letter):
        (label,) = [kind for kind in HOOKS_SHUFFLED if kind.removesuffix(" (prepend)").endswith(f" {letter}")]
        return lambda *args: fired.append(label)

    names = {letter: hook_named(letter) for letter in "ABCEFGHIJ"}

    def d(module, args, output):
        fired.append("forward hook D")
        output.register_hook(names["J"])

    layer = nn.Linear(2, 1)
    namespace = {**names, "D": d, "layer": layer, "module_hooks": module_hooks, "torch": torch}
    try:
        exec(_exercise_code(), namespace)
    finally:
        clear_hooks(layer)
        clear_global_hooks()
    assert fired == FIRING
    assert sorted(HOOKS_SHUFFLED) == sorted(_FIRING_ORDER)


def test_g6_1_the_guide_lists_the_hooks_the_checker_knows():
    """The exercise cell spells the shuffled list out; it must be HOOKS_SHUFFLED, in the same order."""
    for cell in json.loads(GUIDE.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("hooks_shuffled = ["):
            namespace = {}
            exec(source.split("prediction = ", 1)[0], namespace)
            assert namespace["hooks_shuffled"] == list(HOOKS_SHUFFLED)
            return
    pytest.fail("guide G6 has no hooks_shuffled cell")


def test_g6_1_predict():
    assert grade("G6.1", FIRING).passed
    swapped = list(FIRING)
    swapped[0], swapped[1] = swapped[1], swapped[0]  # the prepended pre-hooks in registration order
    outcome = grade("G6.1", swapped)
    assert not outcome.passed and "8 of 10" in outcome.detail
    local_first = list(FIRING)
    local_first[3:6] = ["forward hook F (prepend)", "forward hook D", "global forward hook E"]
    failed("G6.1", local_first, "7 of 10 hooks in the right place")
    failed("G6.1", FIRING[:-1], "exactly once", "missing: 'backward hook G'")
    failed("G6.1", list(HOOKS_SHUFFLED), "1 of 10 hooks in the right place")  # the shuffled stub itself


def test_g6_1_a_wrong_order_gets_a_hint_not_the_answer():
    for wrong in (list(reversed(FIRING)), list(HOOKS_SHUFFLED), FIRING[1:] + FIRING[:1]):
        outcome = failed("G6.1", wrong, "in the right place", "which of the two fires first")
        assert "position" not in outcome.detail and "fires there" not in outcome.detail, outcome.detail


def test_g6_1_names_the_unknown_and_the_missing_hooks_with_the_students_list_name():
    typo = ["pre-hook C", *FIRING[1:]]
    outcome = grade("G6.1", typo)
    assert not outcome.passed
    assert "not in hooks_shuffled: 'pre-hook C'" in outcome.detail
    assert "missing: 'pre-hook C (prepend)'" in outcome.detail
    short = grade("G6.1", FIRING[:-1])
    assert "missing: 'backward hook G'" in short.detail and "not in" not in short.detail
    doubled = grade("G6.1", [*FIRING[:-1], "forward hook D"])
    assert "listed twice: 'forward hook D'" in doubled.detail
    assert "strings of hooks_shuffled, not a str" in grade("G6.1", "pre-hook A").detail


def test_g6_1_messages_never_name_a_private_constant():
    answers = [FIRING[:-1], "pre-hook A", ["A"] * 10, [k.lower() for k in FIRING], list(reversed(FIRING))]
    for answer in answers:
        detail = grade("G6.1", answer).detail
        assert "HOOKS_SHUFFLED" not in detail and "ORDER_KINDS" not in detail and "_FIRING" not in detail, detail


def test_g6_1_letters_or_another_case_are_told_to_use_the_full_strings():
    letters = [kind.removesuffix(" (prepend)")[-1] for kind in FIRING]
    assert "".join(letters) == "CBAEFDIHJG"
    for answer in (letters, [letter.lower() for letter in letters], [*FIRING[:3], *letters[3:]]):
        outcome = failed("G6.1", answer, "full strings of hooks_shuffled, e.g. 'pre-hook A'")
        assert "missing" not in outcome.detail and "not in" not in outcome.detail, outcome.detail
    lower = failed("G6.1", [kind.lower() for kind in FIRING], "exactly as they are written",
                   "'pre-hook C (prepend)', not 'pre-hook c (prepend)'")
    assert "missing" not in lower.detail, lower.detail
    failed("G6.1", [*FIRING[:-1], "Backward hook  G"], "'backward hook G', not 'Backward hook  G'")


def test_g6_1_does_not_depend_on_the_kernels_global_backward_hook_state(monkeypatch):
    """The legacy global backward hook, once registered, leaves this flag False for the whole process."""
    monkeypatch.setattr(module_hooks, "_global_is_full_backward_hook", False)
    assert grade("G6.1", FIRING).passed
