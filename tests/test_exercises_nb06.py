"""Checkers of notebook 06: each accepts a worked answer and rejects a typical wrong one."""

from __future__ import annotations

import torch
from torch import nn

from hooklab.exercises import exercises, grade
from hooklab.exercises.nb06 import ORDER_KINDS

IDS = sorted(id for id in exercises() if id.startswith("06."))


def test_notebook_06_has_four_exercises():
    assert IDS == ["06.1", "06.2", "06.3", "06.4"]


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
    assert not grade("06.1", upgrade_ignoring_prefix).passed
    assert not grade("06.1", upgrade_everything).passed


def upgrade_returning_a_new_dict(module, state_dict, prefix, *rest):
    return {key.replace(".W", ".weight").replace(".b", ".bias"): value for key, value in state_dict.items()}


def test_06_1_a_returned_dict_is_explained():
    outcome = grade("06.1", upgrade_returning_a_new_dict)
    assert not outcome.passed and "in place" in outcome.detail


# ----- 06.2 -----------------------------------------------------------------------------------
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


def test_06_2_clip():
    assert grade("06.2", clip).passed
    unclipped = grade("06.2", lambda optimizer, args, kwargs: None)
    assert not unclipped.passed and "to [-3, -4], not [-0.6, -0.8]" in unclipped.detail
    assert not grade("06.2", clip_everything_to_one).passed


# ----- 06.3 -----------------------------------------------------------------------------------
def swap(module, name, submodule):
    return nn.GELU() if isinstance(submodule, nn.ReLU) else None


def swap_everything(module, name, submodule):
    return nn.GELU()


def test_06_3_swap():
    assert grade("06.3", swap).passed
    assert not grade("06.3", lambda module, name, submodule: None).passed
    assert not grade("06.3", swap_everything).passed
    the_class = grade("06.3", lambda module, name, submodule: nn.GELU if isinstance(submodule, nn.ReLU) else None)
    assert not the_class.passed and "GELU()" in the_class.detail


# ----- 06.4 -----------------------------------------------------------------------------------
# The order read from torch's Module._call_impl (global hooks before the module's own, prepended
# pre-hook first) and from BackwardHook (pre-hooks when grad_output is ready, the output's own
# tensor hook and grad_fn after them, full backward hooks when grad_input is ready).
READ_FROM_SOURCE = [
    "global forward pre-hook",
    "forward pre-hook (prepend)",
    "forward pre-hook",
    "global forward hook",
    "forward hook",
    "global backward pre-hook",
    "backward pre-hook",
    "tensor hook on output",
    "Node pre-hook",
    "Node hook",
    "global backward hook",
    "backward hook",
]


def test_06_4_predict():
    assert sorted(READ_FROM_SOURCE) == sorted(ORDER_KINDS)
    assert grade("06.4", READ_FROM_SOURCE).passed
    swapped = list(READ_FROM_SOURCE)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    outcome = grade("06.4", swapped)
    assert not outcome.passed and "position 2" in outcome.detail
    assert not grade("06.4", READ_FROM_SOURCE[:-1]).passed
    assert not grade("06.4", list(ORDER_KINDS)).passed  # the shuffled stub itself


def test_checkers_leave_the_random_stream_alone():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    for id, answer in (("06.1", upgrade), ("06.2", clip), ("06.3", swap), ("06.4", READ_FROM_SOURCE)):
        assert grade(id, answer).passed
    assert torch.equal(torch.random.get_rng_state(), state)


def test_06_1_reports_the_failed_load():
    outcome = grade("06.1", lambda module, state_dict, prefix, *rest: None)
    assert not outcome.passed and "Missing key(s)" in outcome.detail
