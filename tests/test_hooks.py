"""hooklab.hooks.Hooks: the one owner of hook handles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hooklab import Hooks
from hooklab.audit import leftover_hooks


def test_every_hook_is_removed_when_the_block_ends_and_when_it_raises():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    seen = []
    with Hooks() as hooks:
        for name, m in model.named_children():
            hooks.add(m.register_forward_hook(lambda *args, name=name: seen.append(name)))
        assert len(hooks) == 2 and leftover_hooks(model)
        model(torch.ones(1, 2))
    assert seen == ["0", "1"] and not leftover_hooks(model) and len(hooks) == 0
    with pytest.raises(ValueError, match="boom"), Hooks() as hooks:  # the error is not swallowed
        hooks.add(model[0].register_forward_pre_hook(lambda *args: None))
        raise ValueError("boom")
    assert not leftover_hooks(model)


def test_remove_goes_last_first_and_is_safe_twice():
    removed = []

    class Handle:
        def __init__(self, name):
            self.name = name

        def remove(self):
            removed.append(self.name)

    hooks = Hooks()
    first = hooks.add(Handle("first"))
    hooks.add(Handle("second"))
    assert first.name == "first", "add returns the handle it keeps"
    hooks.remove()
    hooks.remove()
    assert removed == ["second", "first"]


def test_drop_gone_forgets_the_handles_of_freed_tensors_only():
    model = nn.Linear(2, 2)
    with Hooks() as hooks:
        hooks.add(model.register_forward_hook(lambda *args: None))
        y = model(torch.ones(1, 2))
        hooks.add(y.register_hook(lambda g: g))
        hooks.drop_gone()
        assert len(hooks) == 2
        del y
        hooks.drop_gone()
        assert len(hooks) == 1
