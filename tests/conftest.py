"""Shared test set-up: no plotting window, one thread, and no hook left behind by any test.

The leak check after each test runs ``hooklab.audit.leftover_hooks`` on every module that has
ever had a hook registered (the registration methods are wrapped to note them; their submodules,
their parameters' tensor hooks and torch's global registries are checked with them) and looks
for tensor hooks on every parameter that ever had one: that is cheap. ``leftover_hooks`` over
every live module, which also finds hooks put into a module's dictionaries by hand, runs once at
the end of each test file.
"""

from __future__ import annotations

import functools
import os
import weakref

import matplotlib
import pytest
import torch
from install_kernel import KERNEL_ENV  # tools/, on pytest's path (pyproject.toml)
from torch import nn

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# This process runs with the course kernel's environment (one thread, fixed hash seed), like the
# kernels that tests start from the Hook Lab kernelspec.
os.environ.update(KERNEL_ENV)
os.environ.pop("PYTHONWARNINGS", None)
torch.set_num_threads(1)

from hooklab.audit import global_hooks, leftover_hooks  # noqa: E402

# by id, values held weakly (a WeakSet would compare tensors with ==)
_HOOKED_MODULES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_HOOKED_TENSORS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _noting(method, seen: weakref.WeakValueDictionary):
    @functools.wraps(method)
    def register(self, *args, **kwargs):
        seen[id(self)] = self
        return method(self, *args, **kwargs)

    return register


_MODULE_REGISTRATIONS = [
    name for name in dir(nn.Module) if "register" in name and "hook" in name and callable(getattr(nn.Module, name))
]
for _name in _MODULE_REGISTRATIONS:
    setattr(nn.Module, _name, _noting(getattr(nn.Module, _name), _HOOKED_MODULES))
for _name in ("register_hook", "register_post_accumulate_grad_hook"):
    setattr(torch.Tensor, _name, _noting(getattr(torch.Tensor, _name), _HOOKED_TENSORS))


def hooks_left_on_noted_objects() -> list[str]:
    """The cheap check: hooks on every module or parameter that ever had one registered, and globals."""
    modules = list(_HOOKED_MODULES.values())
    # leftover_hooks() without arguments would walk every live module: with none noted, globals only
    found = leftover_hooks(*modules) if modules else global_hooks()
    for tensor in list(_HOOKED_TENSORS.values()):  # also parameters of modules that were never noted
        if isinstance(tensor, nn.Parameter) and (tensor._backward_hooks or tensor._post_accumulate_grad_hooks):
            found.append(f"a parameter of shape {tuple(tensor.shape)} has tensor hooks")
    return found


@pytest.fixture(autouse=True, scope="session")
def no_hooks_at_the_start():
    assert leftover_hooks() == [], "hooks were registered before the first test"


@pytest.fixture(autouse=True, scope="module")
def no_hooks_left_in_the_file(no_hooks_at_the_start):
    """The full walk over every live module, once per test file."""
    yield
    assert leftover_hooks() == [], "a test of this file left hooks behind"


@pytest.fixture(autouse=True)
def no_hooks_left_behind(no_hooks_left_in_the_file):
    """Every test must remove every hook it (or the code it calls) registered, and leave no torch
    function mode or saved-tensor hooks active: ``global_hooks`` reports those."""
    yield
    left = hooks_left_on_noted_objects()
    assert left == [], f"hooks left behind: {left}"


@pytest.fixture(autouse=True)
def no_open_figures():
    """Every test starts and ends with no pyplot figure open."""
    plt.close("all")
    yield
    plt.close("all")


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
    yield
