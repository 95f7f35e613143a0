"""The field guide G7's checker accepts a worked answer and names the slip in wrong ones."""

from __future__ import annotations

import torch
from answers import failed

from hooklab.exercises import grade


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


def test_g7_1_clip():
    assert grade("G7.1", clip).passed
    unclipped = grade("G7.1", lambda optimizer, args, kwargs: None)
    assert not unclipped.passed and "to [-3, -4], not [-0.6, -0.8]" in unclipped.detail
    failed("G7.1", clip_everything_to_one, "skip such parameters")


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


def test_g7_1_every_group_and_a_missing_gradient():
    first = grade("G7.1", clip_the_first_group)
    assert not first.passed and "second parameter group" in first.detail
    crashed = grade("G7.1", clip_without_checking_for_none)
    assert not crashed.passed and ".grad is None" in crashed.detail


def clip_returning_a_list(optimizer, args, kwargs):
    clip(optimizer, args, kwargs)
    return []


def test_g7_1_a_returned_value_is_explained_without_an_address():
    outcome = grade("G7.1", clip_returning_a_list)
    assert not outcome.passed and "must return None (or (args, kwargs))" in outcome.detail
    assert " at 0x" not in outcome.detail
    assert grade("G7.1", lambda optimizer, args, kwargs: clip(optimizer, args, kwargs) or (args, kwargs)).passed


def clip_the_total_norm(optimizer, args, kwargs):
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)


def test_g7_1_clipping_the_total_norm_gets_a_hint():
    outcome = grade("G7.1", clip_the_total_norm)
    assert not outcome.passed and "by its own norm, not the total norm" in outcome.detail


def test_g7_1_leaves_the_random_stream_alone():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    assert grade("G7.1", clip).passed
    assert torch.equal(torch.random.get_rng_state(), state)
