"""One ``Record`` per module call, and the errors a record raises instead of lying.

``hooklab.record`` (notebook 00) fills these in; see its docstring for how tensors are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = [
    "GRAD_MODE_OFF",
    "NOT_ASKED",
    "NoGradientError",
    "Record",
    "StaleRecordError",
    "hidden_inputs_note",
    "shape_of",
    "why_no_grad_output",
]


class StaleRecordError(RuntimeError):
    """A record's own tensor was changed in place after the record returned it."""


class NoGradientError(RuntimeError):
    """A backward record was asked for but no gradient reached that module."""


def shape_of(value: Any) -> str:
    """The shape of the tensor in ``value`` as text, or a list of shapes if there are several."""
    leaves, _ = tree_flatten(value)
    shapes = [tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor)]
    if len(shapes) == 1:
        return str(shapes[0])
    return str(shapes)


@dataclass(repr=False, slots=True)
class Record:
    """What one call of one module saw. Tensors are detached; how they are kept: ``hooklab.record``."""

    name: str
    module_type: str
    call: int
    index: int
    _inputs: tuple = ()
    _output: Any = None
    _grad_input: tuple | None = None
    _grad_output: tuple | None = None
    _kwargs: dict = field(default_factory=dict)
    _no_grad_reason: str | None = None
    _grad_input_note: str | None = None  # why grad_input cannot be trusted (set while recording)
    _got_grad: bool = False
    _versions: dict = field(default_factory=dict)  # id of each kept tensor -> its version when kept
    _input_views: list = field(default_factory=list)  # (view given to the module, its version)
    _output_view: tuple | None = None  # (the module's output, its version) while the block runs, if a view
    _output_written: bool = False  # that view was written into in place before the block ended

    def _checked(self, value: Any, what: str) -> Any:
        for leaf in tree_flatten(value)[0]:
            expected = self._versions.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None
            if expected is not None and leaf._version != expected:
                verb = "received" if what in ("input", "kwargs") else "produced"
                raise StaleRecordError(
                    f"the {what} recorded for {self.name!r} was changed in place after the record returned it, "
                    f"so it no longer holds what the module {verb}; clone it before changing it "
                    f"(rec[{self.name!r}].{what}.clone())"
                )
        return value

    @property
    def inputs(self) -> tuple:
        return self._checked(self._inputs, "input")

    @property
    def kwargs(self) -> dict:
        """The keyword arguments of the call (tensors kept like ``inputs``); ``{}`` for none."""
        return self._checked(self._kwargs, "kwargs")

    @property
    def output(self) -> Any:
        return self._checked(self._output, "output")

    @property
    def grad_output(self) -> tuple:
        if not self._got_grad:
            raise NoGradientError(f"no gradient reached {self.name!r}: {self._why_no_grad()}")
        return self._checked(self._grad_output, "grad_output")

    @property
    def grad_input(self) -> tuple:
        if not self._got_grad:
            raise NoGradientError(f"no gradient reached {self.name!r}: {self._why_no_grad()}")
        if self._grad_input_note:
            raise NoGradientError(self._grad_input_note)
        return self._checked(self._grad_input, "grad_input")

    def _why_no_grad(self) -> str:
        if self._no_grad_reason:
            return self._no_grad_reason
        if self._output_written:
            return (
                f"its output is a view of its input, and a later operation modified that view in place "
                f"(an in-place layer after {self.name!r}?); PyTorch never calls hooks on such a view: "
                "make the next layer work out of place (inplace=False)"
            )
        return (
            "call backward() inside the `with record(..., backward=True)` block, after the forward pass "
            "(if you did, this module's output does not contribute to what backward() started from)"
        )

    def __repr__(self) -> str:
        call = f", call={self.call}" if self.call else ""
        return f"Record({self.name!r}{call}, {self.module_type}, output {shape_of(self._output)})"


# ----- why a record has no (trustworthy) gradient: set by hooklab.record while recording --------
NOT_ASKED = "this recording was made without backward=True: use record(..., backward=True) to record gradients"


def hidden_inputs_note(name: str, args: tuple, kwargs: dict) -> str | None:
    """Why ``grad_input`` cannot hold every input gradient: tensors that need grad came inside a
    list or dict, or as keyword arguments (``grad_input`` has one entry per positional tensor)."""
    nested = [a for a in args if not isinstance(a, torch.Tensor) and isinstance(a, list | tuple | dict)]
    for where, values in (("inside a list or dict", nested), ("as keyword arguments", [kwargs] if kwargs else [])):
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(values)[0]):
            return (
                f"{name!r} received tensors that need grad {where}; grad_input holds gradients only for "
                "positional tensor arguments (record the layer that produces those tensors instead)"
            )
    return None


GRAD_MODE_OFF = "the forward pass ran with gradients disabled (torch.no_grad / inference_mode)"


def why_no_grad_output(output: Any, tensors: list[torch.Tensor]) -> str:
    """Why no gradient can reach a module whose output (its tensors: ``tensors``) needs no grad."""
    if not torch.is_grad_enabled():
        return GRAD_MODE_OFF
    if not tensors:
        return f"its output ({type(output).__name__}) holds no tensor, so no gradient can reach it"
    if not any(t.is_floating_point() or t.is_complex() for t in tensors):
        return f"its output ({tensors[0].dtype} tensor) carries no gradient: only floating-point tensors do"
    return (
        "its output does not require grad: no parameter or input before it requires grad "
        "(call requires_grad_() on the input, or unfreeze a parameter)"
    )
