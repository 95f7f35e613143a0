"""Exercise of notebook 00: a first forward hook."""

from __future__ import annotations

import torch
from torch import nn

from . import Outcome, exercise


@exercise("00.1", "a forward hook that counts calls")
def _count_calls(make_counter) -> Outcome:
    """``make_counter(module)`` registers a hook and returns ``(calls, handle)``.

    ``calls`` is a list that gets one item per call of the module.
    """
    layer = nn.Linear(2, 2)
    counts, handle = make_counter(layer)
    try:
        for _ in range(3):
            layer(torch.zeros(1, 2))
    finally:
        handle.remove()
    layer(torch.zeros(1, 2))  # after remove(): must not be counted
    total = len(counts)
    if total != 3:
        return Outcome(False, f"counted {total} calls for 3 calls before remove() (and 1 after)")
    return Outcome(True, "3 calls counted, none after remove()")
