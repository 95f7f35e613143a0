"""Shared test set-up: no plotting window, one thread, and no hook left behind by any test."""

from __future__ import annotations

import os

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hooklab.audit import leftover_hooks  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def no_hooks_at_the_start():
    assert leftover_hooks() == [], "hooks were registered before the first test"


@pytest.fixture(autouse=True)
def no_hooks_left_behind(no_hooks_at_the_start):
    """Every test must remove every hook it (or the code it calls) registered, and leave no torch
    function mode (``record``'s copy-on-write guard is one) active. (Checked after each test only:
    the check walks every live object, and the test before has already been checked.)"""
    yield
    left = leftover_hooks()
    assert left == [], f"hooks left behind: {left}"
    assert torch._C._len_torch_function_stack() == 0, "a torch function mode was left active"


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
    yield
