"""Checkers of notebook 06: each accepts a worked answer and rejects a typical wrong one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from answers import failed
from torch import nn
from torch.nn.modules import module as module_hooks

from hooklab.audit import clear_global_hooks, clear_hooks
from hooklab.exercises import exercises, grade
from hooklab.exercises.nb06 import _FIRING_ORDER, ORDER_KINDS

IDS = sorted(id for id in exercises() if id.startswith("06."))


def test_notebook_06_has_five_exercises():
    assert IDS == ["06.1", "06.2", "06.3", "06.4", "06.5"]


# ----- 06.1 -----------------------------------------------------------------------------------
def upgrade(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for old, new in (("W", "weight"), ("b", "bias")):
        if prefix + old in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)


def upgrade_ignoring_prefix(module, state_dict, prefix, *rest):
    for old, new in (("W", "weight"), ("b", "bias")):
        if old in state_dict:
            state_dict[new] = state_dict.pop(old)


def upgrade_everything(module, state_dict, prefix, *rest):
    """Renames the right keys, but also throws away the keys a new checkpoint has."""
    for key in list(state_dict):
        if key.startswith(prefix):
            value = state_dict.pop(key)
            if key.endswith(".W"):
                state_dict[prefix + "weight"] = value
            elif key.endswith(".b"):
                state_dict[prefix + "bias"] = value


def test_06_1_rename():
    assert grade("06.1", upgrade).passed
    failed("06.1", upgrade_ignoring_prefix)
    failed("06.1", upgrade_everything, "leave every other key as it is")


def upgrade_layers_0_and_2(module, state_dict, prefix, *rest):
    """Works only while every Linear sits one level deep: the layer is read from the key, not from prefix."""
    for key in list(state_dict):
        layer, name = key.split(".", 1)
        if name in ("W", "b"):
            state_dict[f"{layer}.{'weight' if name == 'W' else 'bias'}"] = state_dict.pop(key)


def test_06_1_a_hook_that_ignores_prefix_fails_on_the_nested_linear():
    outcome = grade("06.1", upgrade_layers_0_and_2)
    assert not outcome.passed and "'2.0.W'" in outcome.detail and "prefix" in outcome.detail


def upgrade_by_replace(module, state_dict, prefix, *rest):
    """Renames W and b, but str.replace also renames every other key that starts with prefix + "b"."""
    for key in list(state_dict):
        new = key.replace(prefix + "W", prefix + "weight").replace(prefix + "b", prefix + "bias")
        state_dict[new] = state_dict.pop(key)


def upgrade_and_drop_the_rest(module, state_dict, prefix, *rest):
    """Keeps only the Linear's weight and bias."""
    kept = {prefix + new: state_dict[prefix + old] for old, new in (("W", "weight"), ("b", "bias"))}
    state_dict.clear()
    state_dict.update(kept)


def test_06_1_every_other_key_must_stay_as_it_is():
    replaced = grade("06.1", upgrade_by_replace)
    assert not replaced.passed and "'0.batches'" in replaced.detail and "every other key" in replaced.detail
    dropped = grade("06.1", upgrade_and_drop_the_rest)
    assert not dropped.passed and "removed '0.batches'" in dropped.detail


def upgrade_returning_a_new_dict(module, state_dict, prefix, *rest):
    return {key.replace(".W", ".weight").replace(".b", ".bias"): value for key, value in state_dict.items()}


def test_06_1_a_returned_dict_is_explained():
    outcome = grade("06.1", upgrade_returning_a_new_dict)
    assert not outcome.passed and "in place" in outcome.detail


# ----- 06.3 -----------------------------------------------------------------------------------
def clip(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                norm = p.grad.norm()
                if norm > 1:
                    p.grad.mul_(1 / norm)


def clip_everything_to_one(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad.div_(p.grad.norm())


def test_06_3_clip():
    assert grade("06.3", clip).passed
    unclipped = grade("06.3", lambda optimizer, args, kwargs: None)
    assert not unclipped.passed and "to [-3, -4], not [-0.6, -0.8]" in unclipped.detail
    failed("06.3", clip_everything_to_one, "skip such parameters")


def clip_the_first_group(optimizer, args, kwargs):
    for p in optimizer.param_groups[0]["params"]:
        norm = p.grad.norm()
        if norm > 1:
            p.grad.div_(norm)


def clip_without_checking_for_none(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            norm = p.grad.norm()
            if norm > 1:
                p.grad.div_(norm)


def test_06_3_every_group_and_a_missing_gradient():
    first = grade("06.3", clip_the_first_group)
    assert not first.passed and "second parameter group" in first.detail
    crashed = grade("06.3", clip_without_checking_for_none)
    assert not crashed.passed and ".grad is None" in crashed.detail


def clip_returning_a_list(optimizer, args, kwargs):
    clip(optimizer, args, kwargs)
    return []


def test_06_3_a_returned_value_is_explained_without_an_address():
    outcome = grade("06.3", clip_returning_a_list)
    assert not outcome.passed and "must return None (or (args, kwargs))" in outcome.detail
    assert " at 0x" not in outcome.detail
    assert grade("06.3", lambda optimizer, args, kwargs: clip(optimizer, args, kwargs) or (args, kwargs)).passed


def clip_the_total_norm(optimizer, args, kwargs):
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)


def test_06_3_clipping_the_total_norm_gets_a_hint():
    outcome = grade("06.3", clip_the_total_norm)
    assert not outcome.passed and "by its own norm, not the total norm" in outcome.detail


# ----- 06.2 -----------------------------------------------------------------------------------
def out_of_place(module, name, submodule):
    if getattr(submodule, "inplace", False):
        safe = copy.copy(submodule)
        safe.inplace = False
        return safe
    return None


def switch_off_in_place(module, name, submodule):  # changing the module itself and keeping it is right too
    if getattr(submodule, "inplace", False):
        submodule.inplace = False


def test_06_2_out_of_place():
    assert grade("06.2", out_of_place).passed
    assert grade("06.2", switch_off_in_place).passed


def test_06_2_the_checked_model_really_fails_with_its_in_place_modules():
    """The premise of the check's last step: unfixed, the model breaks under full backward hooks."""
    from hooklab.exercises.nb06 import _runs_with_a_global_backward_hook

    outcome = _runs_with_a_global_backward_hook(lambda module, name, submodule: None)
    assert not outcome.passed and "still has in-place modules at ['1', '2.1']" in outcome.detail
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    handles = [m.register_full_backward_hook(lambda module, grad_input, grad_output: None) for m in model.modules()]
    try:
        with pytest.raises(RuntimeError, match="modified inplace"):
            model(torch.randn(4, 3, requires_grad=True)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda m, n, s: None, "nn.ReLU(inplace=True) the module that gets registered is still in-place"),
        (lambda m, n, s: nn.ReLU() if getattr(s, "inplace", False) else None, "returned a ReLU: keep the module"),
        (lambda m, n, s: type(s)() if getattr(s, "inplace", False) else None, "negative_slope was 0.2"),
        (lambda m, n, s: nn.ReLU, "returned the class ReLU"),
        (lambda m, n, s: copy.copy(s), "for an nn.ReLU(inplace=True) the module that gets registered is still"),
        (lambda m, n, s: out_of_place(m, n, s) or copy.copy(s), "for an nn.ReLU that is not in-place"),
        (lambda m, n, s: "relu" if getattr(s, "inplace", False) else None, "returned a str"),
    ],
)
def test_06_2_wrong_answers_are_explained(answer, expected):
    outcome = grade("06.2", answer)
    assert not outcome.passed and expected in outcome.detail, outcome.detail


# ----- 06.4 -----------------------------------------------------------------------------------
# The expected order, as torch's Module._call_impl and BackwardHook give it (global hooks before
# the module's own; each prepend=True puts a hook in front of the module's own, so the last
# prepended runs first; backward pre-hooks when grad_output is ready, the inner output's tensor
# hook after them, full backward hooks when grad_input is ready). The first test measures it.
FIRING = list(_FIRING_ORDER)
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_hook_api_tour.ipynb"


def _exercise_code() -> str:
    """The registration code that the text of exercise 06.4 shows."""
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "### Exercise 06.4" in source:
            return source.split("```python\n", 1)[1].split("```", 1)[0]
    pytest.fail("notebook 06 has no exercise 06.4")


def test_06_4_the_expected_order_is_measured_from_the_code_the_exercise_shows():
    fired = []

    def hook_named(letter):
        (label,) = [kind for kind in ORDER_KINDS if kind.removesuffix(" (prepend)").endswith(f" {letter}")]
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
    assert sorted(ORDER_KINDS) == sorted(_FIRING_ORDER)


def test_06_4_the_notebook_lists_the_hooks_the_checker_knows():
    """The exercise cell spells the shuffled list out; it must be ORDER_KINDS, in the same order."""
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("hooks_shuffled = ["):
            namespace = {}
            exec(source.split("prediction = ", 1)[0], namespace)
            assert namespace["hooks_shuffled"] == list(ORDER_KINDS)
            return
    pytest.fail("notebook 06 has no hooks_shuffled cell")


def test_06_4_predict():
    assert grade("06.4", FIRING).passed
    swapped = list(FIRING)
    swapped[0], swapped[1] = swapped[1], swapped[0]  # the prepended pre-hooks in registration order
    outcome = grade("06.4", swapped)
    assert not outcome.passed and "8 of 10" in outcome.detail
    local_first = list(FIRING)
    local_first[3:6] = ["forward hook F (prepend)", "forward hook D", "global forward hook E"]
    failed("06.4", local_first, "7 of 10 hooks in the right place")
    failed("06.4", FIRING[:-1], "exactly once", "missing: 'backward hook G'")
    failed("06.4", list(ORDER_KINDS), "1 of 10 hooks in the right place")  # the shuffled stub itself


def test_06_4_a_wrong_order_gets_a_hint_not_the_answer():
    for wrong in (list(reversed(FIRING)), list(ORDER_KINDS), FIRING[1:] + FIRING[:1]):
        outcome = failed("06.4", wrong, "in the right place", "which of the two fires first")
        assert "position" not in outcome.detail and "fires there" not in outcome.detail, outcome.detail


def test_06_4_names_the_unknown_and_the_missing_hooks():
    typo = ["pre-hook C", *FIRING[1:]]
    outcome = grade("06.4", typo)
    assert not outcome.passed
    assert "not a hook of the list: 'pre-hook C'" in outcome.detail
    assert "missing: 'pre-hook C (prepend)'" in outcome.detail
    short = grade("06.4", FIRING[:-1])
    assert "missing: 'backward hook G'" in short.detail and "not a hook" not in short.detail
    doubled = grade("06.4", [*FIRING[:-1], "forward hook D"])
    assert "listed twice: 'forward hook D'" in doubled.detail
    assert "not a str" in grade("06.4", "pre-hook A").detail


def test_06_4_letters_or_another_case_are_told_to_use_the_full_strings():
    letters = [kind.removesuffix(" (prepend)")[-1] for kind in FIRING]
    assert "".join(letters) == "CBAEFDIHJG"
    for answer in (letters, [letter.lower() for letter in letters], [*FIRING[:3], *letters[3:]]):
        outcome = failed("06.4", answer, "full strings of ORDER_KINDS, e.g. 'pre-hook A'")
        assert "missing" not in outcome.detail and "not a hook of the list" not in outcome.detail, outcome.detail
    lower = failed("06.4", [kind.lower() for kind in FIRING], "exactly as they are written",
                   "'pre-hook C (prepend)', not 'pre-hook c (prepend)'")
    assert "missing" not in lower.detail, lower.detail
    failed("06.4", [*FIRING[:-1], "Backward hook  G"], "'backward hook G', not 'Backward hook  G'")


def test_06_4_does_not_depend_on_the_kernels_global_backward_hook_state(monkeypatch):
    """The legacy global backward hook, once registered, leaves this flag False for the whole process."""
    monkeypatch.setattr(module_hooks, "_global_is_full_backward_hook", False)
    assert grade("06.4", FIRING).passed


def test_checkers_leave_the_random_stream_alone():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    for id, answer in (("06.1", upgrade), ("06.3", clip), ("06.2", out_of_place), ("06.4", FIRING)):
        assert grade(id, answer).passed
    assert torch.equal(torch.random.get_rng_state(), state)


def test_06_1_reports_the_failed_load():
    outcome = grade("06.1", lambda module, state_dict, prefix, *rest: None)
    assert not outcome.passed and "Missing key(s)" in outcome.detail


# ----- 06.5 -----------------------------------------------------------------------------------
def nodes_by_layer(model, x, remove=True, leaves_only=True):
    names = {m: n for n, m in model.named_modules() if n and (not leaves_only or not list(m.children()))}
    running, found, handles = [], {n: [] for n in names.values()}, []

    def enter(module, args):
        running.append(names[module])

    def leave(module, args, output):
        running.pop()

    def created(node):
        if running:
            found[running[-1]].append(node.name())

    with torch.autograd.graph.node_creation_hook(created):
        for module in names:
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        model(x)
    for handle in handles if remove else ():
        handle.remove()
    return found


def test_06_5_nodes_by_layer():
    outcome = grade("06.5", nodes_by_layer)
    assert outcome.passed, outcome.detail
    # the frozen Linear and the ReLU after it see no tensor that requires grad: no node at all
    assert "'0': 0, '1': 0" in outcome.detail and "'2.1': 1" in outcome.detail


def test_06_5_hooks_left_behind_fail_and_are_removed():
    failed("06.5", lambda model, x: nodes_by_layer(model, x, remove=False), "your hooks stayed registered")


def test_06_5_containers_are_not_layers():
    failed("06.5", lambda model, x: nodes_by_layer(model, x, leaves_only=False), "expected every leaf module's name")


def test_06_5_a_node_seen_by_the_wrong_layer_is_named():
    def one_late(model, x):
        found = nodes_by_layer(model, x)
        first, second = list(found)[:2]
        found[second] = found[first] + found[second]
        found[first] = []
        return found

    failed("06.5", one_late, "layer '0': [], expected ['torch::autograd::AccumulateGrad', 'TBackward0'")


def test_06_5_no_dict_is_explained():
    failed("06.5", lambda model, x: [], "return a dict from layer name to a list of node names, not list")
