"""How ``hooklab.record`` keeps the tensors of its records (notebook 00 introduces ``record``).

A recorder has to keep every activation it records alive anyway, so a ``Keeper`` holds
*references* (detached aliases, no copies) and notes the memory each one lives in. Just before
something writes into that memory, the copy-on-write guard (``hooklab.cow``) calls
``before_write``, which puts a copy in every record holding the tensor: one copy per view,
shared by all of them. Each record also notes the version number of every tensor it holds, so
that a write nobody saw (after the block, or from C++ code) makes the record raise
``StaleRecordError`` instead of returning other numbers.

Three kinds of tensor are copied at once instead: every tensor when ``copy_at_once=True``
(``record(..., clone=True)``), sparse tensors (no storage to watch), and tensors made under
``torch.inference_mode()``, which have no version number to check.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .cow import storage_key
from .records import Record

__all__ = ["Keeper", "view_of"]


class Keeper:
    """The tensors of one recording's records: watched references, or copies."""

    def __init__(self, copy_at_once: bool):
        self.copy_at_once = copy_at_once
        self._watched: dict[int, list[tuple[Record, torch.Tensor]]] = {}  # memory -> who holds what
        self._copies: dict[int, tuple] = {}  # id(original) -> (weak ref, version, copy)

    def clear(self) -> None:
        self._watched.clear()
        self._copies.clear()

    def keep(self, record: Record, value: Any) -> Any:
        """Every tensor in ``value`` detached, and watched or copied."""
        # Fast paths for what modules almost always pass: one tensor, or a tuple of tensors.
        if isinstance(value, torch.Tensor):
            return self.keep_tensor(record, value)
        if type(value) is tuple:
            if len(value) == 1 and isinstance(value[0], torch.Tensor):
                return (self.keep_tensor(record, value[0]),)
            if all(isinstance(v, torch.Tensor) for v in value):
                return tuple([self.keep_tensor(record, v) for v in value])
        return tree_map(lambda v: self.keep_tensor(record, v) if isinstance(v, torch.Tensor) else v, value)

    def keep_tensor(self, record: Record, t: torch.Tensor) -> torch.Tensor:
        if t.requires_grad:
            t = t.detach()
        if t.is_inference():  # no version counter: neither the guard nor the check can work
            t = t.clone()
            record._private.add(id(t))
            return t
        if t.layout != torch.strided:  # sparse: no storage for the guard to watch
            t = t.clone()
            record._private.add(id(t))
        elif self.copy_at_once:
            t = self._copy_of(t)
            record._private.add(id(t))
        else:
            key = storage_key(t)
            if key is not None:
                self._watched.setdefault(key, []).append((record, t))
        record._versions[id(t)] = t._version
        return t

    def _copy_of(self, t: torch.Tensor) -> torch.Tensor:
        """A detached copy of ``t``, the same copy again while ``t`` is unchanged."""
        seen = self._copies.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return seen[2]
        copy = t.detach().clone()
        self._copies[id(t)] = (weakref.ref(t), t._version, copy)
        return copy

    def before_write(self, tensor: torch.Tensor) -> None:
        """Called just before ``tensor`` is written into: every kept tensor sharing its memory is
        replaced by a copy, one copy per view (``view_of``) shared by every record holding it (a
        ReLU's input record and the record of the layer before it, say)."""
        key = storage_key(tensor)
        watched = self._watched.pop(key, None) if key is not None else None
        copies: dict = {}
        for rec, kept in watched or ():
            view = view_of(kept)
            copy = copies.get(view)
            if copy is None:
                copy = copies[view] = kept.clone()
            _replace(rec, kept, copy)


def view_of(t: torch.Tensor) -> tuple:
    """Which part of its memory a tensor shows: tensors alive at the same time in the same memory
    with equal views hold the same numbers."""
    return (t.storage_offset(), t.shape, t.stride(), t.dtype)


def _replace(rec: Record, old: torch.Tensor, new: torch.Tensor) -> None:
    """Put ``new`` where ``rec`` holds ``old`` (its inputs, keyword inputs or output: gradients are
    always copies)."""
    rec._versions.pop(id(old), None)
    rec._versions[id(new)] = new._version
    rec._private.add(id(new))
    for attr in ("_inputs", "_kwargs", "_output"):
        value = getattr(rec, attr)
        if value is old:
            setattr(rec, attr, new)
            rec._output_written = rec._output_written or attr == "_output"
        elif type(value) is tuple and all(v is None or isinstance(v, torch.Tensor) for v in value):
            if any(v is old for v in value):
                setattr(rec, attr, tuple(new if v is old else v for v in value))
        elif value is not None and not isinstance(value, torch.Tensor) and (value or attr != "_kwargs"):
            setattr(rec, attr, tree_map(lambda v: new if v is old else v, value))
            rec._output_written = rec._output_written or attr == "_output"
