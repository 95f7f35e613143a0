"""Exercises of notebook 06: state-dict, optimizer, registration hooks and the firing order."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from ..order import trace_firing_order
from . import Outcome, compare_tensors, exercise

#: the kinds exercise 06.4 asks to put in order (one layer; parameter hooks left out)
ORDER_KINDS = (
    "backward hook",
    "Node pre-hook",
    "forward hook",
    "global backward pre-hook",
    "forward pre-hook",
    "tensor hook on output",
    "global forward hook",
    "backward pre-hook",
    "Node hook",
    "global forward pre-hook",
    "forward pre-hook (prepend)",
    "global backward hook",
)


@exercise("06.1", "rename old checkpoint keys in a load_state_dict pre-hook")
def _rename_keys(upgrade) -> Outcome:
    """``upgrade`` is a load_state_dict pre-hook for one ``nn.Linear``.

    Old checkpoints stored a Linear's tensors as ``W`` and ``b``; it renames them to ``weight``
    and ``bias`` in place, using ``prefix`` (the Linear's place in the model), and leaves every
    other key alone.
    """
    torch.manual_seed(6)  # on the checker's own random stream (see ``exercise``)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    source = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    fresh = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).state_dict()
    old = {}
    for key, value in source.state_dict().items():
        layer, name = key.split(".")
        old[f"{layer}.{'W' if name == 'weight' else 'b'}"] = value.clone()
    returned = []

    def watched(*args):
        returned.append(upgrade(*args))

    handles = [model[0].register_load_state_dict_pre_hook(watched), model[2].register_load_state_dict_pre_hook(watched)]
    try:
        try:
            model.load_state_dict(old)
        except NotImplementedError:  # a subclass of RuntimeError: the stub, not a failed load
            raise
        except RuntimeError as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            hint = ""
            if any(r is not None for r in returned):
                hint = " (the hook's return value is ignored: rename the keys of state_dict in place)"
            return Outcome(False, f"loading the old checkpoint failed: {' '.join(lines[1:]) or error}{hint}")
        for key, value in source.state_dict().items():
            if not torch.equal(model.state_dict()[key], value):
                return Outcome(False, f"{key} was loaded with the wrong values")
        try:
            model.load_state_dict(fresh)
        except RuntimeError:
            return Outcome(False, "a checkpoint with today's key names no longer loads")
    finally:
        for handle in handles:
            handle.remove()
    return Outcome(True, "old and new checkpoints both load, into both Linear layers")


@exercise("06.2", "clip each gradient in an optimizer step pre-hook")
def _clip_in_pre_hook(clip) -> Outcome:
    """``clip(optimizer, args, kwargs)`` scales each parameter's gradient so its norm is at most 1."""
    big = nn.Parameter(torch.zeros(2))
    small = nn.Parameter(torch.ones(3))
    big.grad = torch.tensor([3.0, 4.0])  # norm 5: must be scaled to norm 1
    small.grad = torch.tensor([0.2, -0.2, 0.1])  # norm 0.3: must stay as it is
    optimizer = torch.optim.SGD([big, small], lr=1.0)
    handle = optimizer.register_step_pre_hook(clip)
    try:
        optimizer.step()
    finally:
        handle.remove()
    expected_big = torch.tensor([-0.6, -0.8])
    expected_small = torch.ones(3) - torch.tensor([0.2, -0.2, 0.1])
    if not torch.allclose(big.detach(), expected_big, atol=1e-6):
        return Outcome(
            False, f"the large gradient (norm 5) was not clipped to norm 1: the step moved the weight from "
            f"[0, 0] to [{big[0]:.4g}, {big[1]:.4g}], not [-0.6, -0.8]"
        )
    outcome = compare_tensors(small.detach(), expected_small)
    if not outcome.passed:
        return Outcome(False, f"a gradient already below norm 1 was changed ({outcome.detail})")
    return Outcome(True, "gradient of norm 5 clipped to 1, gradient of norm 0.3 left alone")


@exercise("06.3", "swap every new ReLU for a GELU with a registration hook")
def _swap_relu(swap) -> Outcome:
    """``swap(module, name, submodule)`` returns an ``nn.GELU()`` for an ``nn.ReLU`` and None otherwise."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.act = nn.ReLU()

    answer = swap(nn.Sequential(), "0", nn.ReLU())
    if isinstance(answer, type):
        return Outcome(False, f"return a module, {answer.__name__}(), not the class {answer.__name__}")
    handle = module_hooks.register_module_module_registration_hook(swap)
    try:
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), Block(), nn.Sequential(nn.ReLU()))
    finally:
        handle.remove()
    after = nn.Sequential(nn.ReLU())  # built after remove(): must stay a ReLU
    types = [type(m).__name__ for _, m in model.named_modules()]
    if types.count("ReLU"):
        return Outcome(False, f"{types.count('ReLU')} ReLU(s) were not swapped: {types}")
    if types.count("GELU") != 3:
        return Outcome(False, f"expected 3 GELU, found {types.count('GELU')}: {types}")
    if types.count("Linear") != 2:
        return Outcome(False, f"other modules must stay as they are: {types}")
    if not isinstance(after[0], nn.ReLU):
        return Outcome(False, "a ReLU built after the hook was removed was swapped too")
    return Outcome(True, "all 3 ReLUs (direct, as an attribute, nested) became GELU; nothing else changed")


@exercise("06.4", "predict the firing order for one layer")
def _predict_order(prediction) -> Outcome:
    """``prediction`` lists the kinds of ``ORDER_KINDS`` in the order they first fire for one Linear."""
    prediction = list(prediction)
    if sorted(prediction) != sorted(ORDER_KINDS):
        return Outcome(False, "list each kind of ORDER_KINDS exactly once")
    torch.manual_seed(6)
    layer = nn.Linear(2, 1)
    firings = trace_firing_order(layer, torch.ones(1, 2, requires_grad=True))
    measured = list(dict.fromkeys(f.kind for f in firings if f.kind in ORDER_KINDS))
    for i, (got, real) in enumerate(zip(prediction, measured, strict=True)):
        if got != real:
            return Outcome(False, f"position {i + 1}: you said {got!r}, but {real!r} fires there")
    return Outcome(True, "all 12 kinds in the measured order")
