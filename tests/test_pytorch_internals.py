"""What hooklab.pytorch_internals relies on in PyTorch's private API: if an upgrade moves any of it,
this file says which piece."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

from hooklab import pytorch_internals as internals
from hooklab.hooks import Hooks

REGISTER = {
    "_forward_pre_hooks": lambda m: m.register_forward_pre_hook(lambda *a: None),
    "_forward_hooks": lambda m: m.register_forward_hook(lambda *a: None),
    "_backward_pre_hooks": lambda m: m.register_full_backward_pre_hook(lambda *a: None),
    "_backward_hooks": lambda m: m.register_full_backward_hook(lambda *a: None),
    "_state_dict_pre_hooks": lambda m: m.register_state_dict_pre_hook(lambda *a: None),
    "_state_dict_hooks": lambda m: m.register_state_dict_post_hook(lambda *a: None),
    "_load_state_dict_pre_hooks": lambda m: m.register_load_state_dict_pre_hook(lambda *a: None),
    "_load_state_dict_post_hooks": lambda m: m.register_load_state_dict_post_hook(lambda *a: None),
}


def test_every_module_hook_dictionary_holds_the_hook_under_its_handle_id():
    assert set(REGISTER) == set(internals.MODULE_HOOK_DICTS)
    for kind, register in REGISTER.items():
        module = nn.Linear(2, 2)
        with Hooks() as hooks:
            handle = hooks.add(register(module))
            assert list(internals.module_hooks(module, kind)) == [handle.id], kind
        assert internals.module_hooks(module, kind) == {}, kind


def test_the_side_dictionaries_note_kwargs_hooks():
    module = nn.Linear(2, 2)
    with Hooks() as hooks:
        handle = hooks.add(module.register_forward_pre_hook(lambda *a: None, with_kwargs=True))
        assert handle.id in internals.module_hooks(module, "_forward_pre_hooks_with_kwargs")
    assert all(hasattr(module, kind) for kind in internals.SIDE_DICTS)


def test_parameter_hooks_are_counted():
    p = nn.Parameter(torch.ones(2))
    with Hooks() as hooks:
        hooks.add(p.register_hook(lambda g: None))
        hooks.add(p.register_post_accumulate_grad_hook(lambda t: None))
        assert internals.parameter_hook_count(p) == 2
    assert internals.parameter_hook_count(p) == 0


def test_global_registries_are_found():
    registries = {register: hooks for _, register, hooks in internals.global_registries()}
    assert len(registries) == 9
    with Hooks() as hooks:
        hooks.add(module_globals.register_module_forward_hook(lambda *a: None))
        assert len(registries["torch.nn.modules.module.register_module_forward_hook"]) == 1
    for register in registries:  # each names a public function that exists
        owner, name = register.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(owner), name)), register


def test_saved_tensors_hooks_and_torch_function_modes_are_seen_and_left():
    assert not internals.saved_tensors_hooks_active() and internals.torch_function_modes() == 0
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert internals.saved_tensors_hooks_active()
    try:  # entered by hand and left open: what the pop functions are for
        torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()
        internals.pop_saved_tensors_hooks()
        assert not internals.saved_tensors_hooks_active()
        torch.overrides.TorchFunctionMode().__enter__()
        assert internals.torch_function_modes() == 1
        assert internals.pop_torch_function_modes() == 1 and internals.torch_function_modes() == 0
    finally:  # a failed assert above must not leave a hook or mode on for every later test
        while internals.saved_tensors_hooks_active():
            internals.pop_saved_tensors_hooks()
        internals.pop_torch_function_modes()


def test_the_version_counter_counts_in_place_writes_only():
    t = torch.zeros(3)
    before = internals.version(t)
    t + 1
    assert internals.version(t) == before
    t.add_(1)
    t[0] = 5
    assert internals.version(t) == before + 2
    with torch.inference_mode():
        assert internals.version(torch.zeros(1)) is None


@pytest.mark.parametrize(("transform", "expected"), [
    (lambda f, x: torch.func.grad(f)(x), "torch.func (grad transform)"),
    (lambda f, x: torch.func.jvp(f, (x,), (torch.ones(()),)), "forward-mode autograd (torch.autograd.forward_ad)"),
    (lambda f, x: torch.func.vmap(f)(x[None]), None),
])
def test_differentiating_transforms_are_named(transform, expected):
    seen = []

    def f(x):
        seen.append(internals.differentiating())
        return x.sin().sum()

    transform(f, torch.tensor(1.0))
    assert seen == [expected]
    assert internals.differentiating() is None
    with torch.autograd.forward_ad.dual_level():
        assert internals.differentiating() == "forward-mode autograd (torch.autograd.forward_ad)"


def test_a_tensor_hook_handle_outlives_its_dictionary():
    """Hooks.drop_gone relies on it: once the tensor is freed, its handle's dictionary is gone."""
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    handle = y.register_hook(lambda g: g)
    assert internals.hook_dict_alive(handle)
    del y
    assert not internals.hook_dict_alive(handle)
    handle.remove()  # still safe
