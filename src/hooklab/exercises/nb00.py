"""Exercises of notebook 00: a first forward hook, owning its handle, reading a recording."""

from __future__ import annotations

import torch
from torch import nn

from ..audit import clear_hooks
from . import Outcome, exercise


@exercise("00.1", "a forward hook that counts calls")
def _count_calls(make_counter) -> Outcome:
    """``make_counter(module)`` registers a hook and returns ``(calls, handle)``.

    ``calls`` is a list that gets one item per call of the module.
    """
    layer = nn.Linear(2, 2)
    answer = make_counter(layer)
    if not (isinstance(answer, tuple) and len(answer) == 2):
        clear_hooks(layer)
        return Outcome(False, f"return the pair (calls, handle), got {type(answer).__name__}")
    counts, handle = answer
    if not callable(getattr(handle, "remove", None)):
        clear_hooks(layer)
        kind = type(handle).__name__
        return Outcome(False, f"the second item must be the handle (something with .remove()), got {kind}")
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


class _Fails(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("forward failed on purpose")


@exercise("00.2", "a hook that is removed even when forward raises")
def _run_with_hook(run_with_hook) -> Outcome:
    """``run_with_hook(module, hook, x)`` registers ``hook`` as a forward hook, returns
    ``module(x)`` and removes the hook afterwards, also when ``module(x)`` raises."""
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    plain = layer(x).detach()
    try:
        got = run_with_hook(layer, lambda m, args, output: 10 * output, x)
    finally:
        left = clear_hooks(layer)  # never leave a student's hook on the checker's model
    if not isinstance(got, torch.Tensor) or not torch.allclose(got.detach(), 10 * plain):
        return Outcome(False, "return module(x) as the hook made it (here, 10 times the plain output)")
    if left:
        return Outcome(False, "the hook is still registered after the call: remove it with its handle")

    failing = _Fails()
    reached = False
    try:
        run_with_hook(failing, lambda m, args, output: None, x)
    except ValueError:
        reached = True
    except Exception as error:  # the student's code may raise something else
        return Outcome(False, f"the module's ValueError should reach the caller, got {type(error).__name__}")
    finally:
        left = clear_hooks(failing)
    if left:
        return Outcome(False, "after forward raised, the hook was left on the module: remove it in finally (or with)")
    if not reached:
        return Outcome(False, "the module's error was swallowed: let it reach the caller (try/finally, no except)")
    return Outcome(True, "hook used, removed after the call and after an error, error passed on")


class _Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class _Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class _OutOfOrder(nn.Module):
    """Defines ``sqrt`` first but runs it last: registration order is not execution order."""

    def __init__(self) -> None:
        super().__init__()
        self.sqrt = _Sqrt()
        self.linear = nn.Linear(2, 2)
        self.log = _Log()
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sqrt(self.log(self.linear(x)))  # log of a negative number is NaN


@exercise("00.3", "find the first layer whose output has a NaN")
def _first_nan(first_nan_layer) -> Outcome:
    """``first_nan_layer(model, x)`` returns the name of the first layer, in execution order,
    whose output contains a NaN, or ``None`` when no output does."""
    model = _OutOfOrder()
    got = first_nan_layer(model, torch.tensor([[2.0, 3.0]]))
    left = clear_hooks(model)
    if left:
        return Outcome(False, f"hooks were left registered: {left[0]} (use hooklab.record in a with block)")
    if got == "sqrt":
        return Outcome(False, "'sqrt' has a NaN, but 'log' ran before it: go through the records in execution order")
    if got != "log":
        return Outcome(False, f"got {got!r}; the first layer to output a NaN is 'log' (log of a negative number)")
    healthy = first_nan_layer(model, torch.tensor([[2.0, -3.0]]))
    if healthy is not None:
        return Outcome(False, f"for an input without any NaN the answer must be None, got {healthy!r}")
    return Outcome(True, "'log' found (it ran before 'sqrt'), and None when there is no NaN")
