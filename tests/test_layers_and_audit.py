from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab import get_layer, leaf_names, select_layers
from hooklab.audit import global_hooks, leftover_hooks


def test_leaf_names_and_selection():
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 1))
    assert leaf_names(model) == ["0.0", "0.1", "1"]
    assert list(select_layers(model, types=nn.Linear)) == ["0.0", "1"]
    assert get_layer(model, "0.1").__class__ is nn.ReLU


def test_leftover_hooks_sees_module_parameter_and_global_hooks():
    model = nn.Linear(2, 2)
    h1 = model.register_forward_hook(lambda *a: None)
    h2 = model.weight.register_hook(lambda g: g)
    h3 = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        found = leftover_hooks(model)
        assert "a forward hook is still registered on the Linear" in found
        assert "a tensor hook is still registered on parameter 'weight' of the Linear" in found
        assert any("a global forward hook is still registered (torch.nn.modules.module.register_module_forward_hook)"
                   == f for f in found)
    finally:
        for h in (h1, h2, h3):
            h.remove()
    assert leftover_hooks(model) == [] and global_hooks() == []


def test_a_parameter_hook_is_reported_once_however_many_modules_hold_the_parameter():
    inner = nn.Linear(2, 2)
    outer = nn.Sequential(nn.Sequential(inner))
    handle = inner.weight.register_hook(lambda g: g)
    try:
        found = [f for f in leftover_hooks(outer, outer[0], inner) if "tensor hook" in f]
    finally:
        handle.remove()
    assert found == ["a tensor hook is still registered on parameter '0.0.weight' of the Sequential"]


def test_fixture_would_catch_a_leak():
    """The per-test check sees a hook on any module or parameter hooked through the API, and the
    per-file walk (leftover_hooks) sees every live module."""
    from conftest import hooks_left_on_noted_objects

    model = nn.Linear(1, 1)
    handle = model.register_forward_pre_hook(lambda *a: None)
    tensor_handle = model.weight.register_post_accumulate_grad_hook(lambda p: None)
    assert any("Linear" in f for f in leftover_hooks())
    assert "a forward pre-hook is still registered on the Linear" in hooks_left_on_noted_objects()
    assert any("parameter of shape (1, 1)" in f for f in hooks_left_on_noted_objects())
    handle.remove()
    tensor_handle.remove()
    assert leftover_hooks() == [] and hooks_left_on_noted_objects() == []


@pytest.mark.parametrize("bad", ["fc3", "features.9"])
def test_get_layer_error_is_a_lookup_error(bad):
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(1, 1))
    model.add_module("fc2", nn.Linear(1, 1))
    with pytest.raises(LookupError):
        get_layer(model, bad)
