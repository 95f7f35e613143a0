"""Exercises of the field guide G7: hooks around training in depth.

G7.1 clips each parameter's gradient in an optimizer step pre-hook (section 5). The lesson's own
exercises on these hooks are in ``nb06.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from . import Outcome, compare_tensors, exercise, hint_for


def _is_args_kwargs(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict)


def _unclipped_outcome(big: torch.Tensor, small: torch.Tensor) -> Outcome:
    """The step did not clip the gradient of norm 5: say where it moved the weight, and whether the
    answer clipped by the total norm."""
    scale_big = big.detach().norm().item() / 5
    scale_small = (torch.ones(3) - small.detach()).norm().item() / 0.3
    hint = ""
    if scale_big < 0.999 and abs(scale_big - scale_small) < 1e-4:
        hint = ": clip each parameter by its own norm, not the total norm"
    return Outcome(
        False, f"the large gradient (norm 5) was not clipped to norm 1: the step moved the weight from "
        f"[0, 0] to [{big[0]:.4g}, {big[1]:.4g}], not [-0.6, -0.8]{hint}"
    )


@exercise("G7.1", "clip each gradient in an optimizer step pre-hook")
def _clip_in_pre_hook(clip) -> Outcome:
    """``clip(optimizer, args, kwargs)`` scales each parameter's gradient so its norm is at most 1."""
    big = nn.Parameter(torch.zeros(2))
    small = nn.Parameter(torch.ones(3))
    idle = nn.Parameter(torch.ones(2))  # no gradient: .grad is None
    wide = nn.Parameter(torch.zeros(4))
    big.grad = torch.tensor([3.0, 4.0])  # norm 5: must be scaled to norm 1
    small.grad = torch.tensor([0.2, -0.2, 0.1])  # norm 0.3: must stay as it is
    wide.grad = torch.tensor([0.0, 2.0, 0.0, 0.0])  # norm 2, in the second group: must be scaled to norm 1
    optimizer = torch.optim.SGD([{"params": [big, small]}, {"params": [idle, wide]}], lr=1.0)
    returned = []

    def watched(optimizer, args, kwargs):
        result = clip(optimizer, args, kwargs)
        if result is None or _is_args_kwargs(result):
            return result
        returned.append(type(result).__name__)
        return None

    handle = optimizer.register_step_pre_hook(watched)
    try:
        optimizer.step()
    except (AttributeError, TypeError) as error:
        return hint_for(error, {"NoneType": "the hook failed on a parameter without a gradient (its .grad is None): "
                                            "skip such parameters"})
    finally:
        handle.remove()
    if returned:
        return Outcome(False, f"the hook returned a {returned[0]}: a step pre-hook must return None (or (args, "
                              "kwargs))")
    expected_big = torch.tensor([-0.6, -0.8])
    expected_small = torch.ones(3) - torch.tensor([0.2, -0.2, 0.1])
    if not torch.allclose(big.detach(), expected_big, atol=1e-6):
        return _unclipped_outcome(big, small)
    if not torch.allclose(wide.detach(), torch.tensor([0.0, -1.0, 0.0, 0.0]), atol=1e-6):
        return Outcome(False, f"the large gradient (norm 2) in the second parameter group was not clipped to norm 1 "
                              f"(the step moved that weight by {wide.detach().norm():.4g}): clip the parameters of "
                              "every group in optimizer.param_groups")
    outcome = compare_tensors(small.detach(), expected_small)
    if not outcome.passed:
        return Outcome(False, f"a gradient already below norm 1 was changed ({outcome.detail})")
    if not torch.equal(idle.detach(), torch.ones(2)):
        return Outcome(False, "a parameter without a gradient was moved by the step: leave it alone")
    return Outcome(True, "gradients of norm 5 and 2 (in two parameter groups) clipped to 1; a gradient of norm 0.3 "
                         "and a missing one left alone")
