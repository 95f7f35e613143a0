"""How ``hooklab.record`` keeps the tensors of its records (notebook 00 introduces ``record``).

A record must hold what a module really produced, even when a later in-place operation
(``ReLU(inplace=True)``, ``out += identity``, an optimizer step, your own ``x[0] = 1``) writes
into that memory. Copying every tensor at once is safe but costs a copy of every activation, and
most activations are never written again. So a ``Keeper`` gives each record a **lazy copy**
(PyTorch's copy-on-write ``torch._lazy_clone``): a new tensor that shares the original's memory
until either of them is written into. The first write, however it happens (a PyTorch function,
C++ code, ``tensor.data``, a NumPy view), first gives the writer memory of its own with the
numbers copied over, and the record keeps the old memory. Only what is written is copied, once,
and records of the same memory (a ReLU's input record and the record of the layer before it)
keep sharing it.

Each record notes the version number of every tensor it holds, so that changing a record's own
tensor in place (``rec.output.relu_()``) makes it raise ``StaleRecordError`` instead of returning
other numbers (tensors made under ``torch.inference_mode()`` have no version number, so there it
cannot). Tensors are copied at once instead when ``copy_at_once=True``
(``record(..., clone=True)``), inside code ``torch.compile`` traces (Dynamo cannot trace a lazy
copy), when they are sparse, when their memory is
not PyTorch's own (``torch.from_numpy``, DLPack: no lazy copy can be made of it), or when this
PyTorch has no ``torch._lazy_clone`` (a private function: ``tests/test_keep.py`` checks it still
copies on write).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .records import Record

__all__ = ["LAZY_COPIES", "Keeper"]

#: whether this PyTorch can make copy-on-write copies (otherwise every record is copied at once)
LAZY_COPIES = hasattr(torch, "_lazy_clone")


class Keeper:
    """The tensors of one recording's records: lazy copies, or copies made at once."""

    def __init__(self, copy_at_once: bool):
        self.copy_at_once = copy_at_once or not LAZY_COPIES
        self._copies: dict[int, tuple] = {}  # id(original) -> (weak ref, version, copy)

    def clear(self) -> None:
        self._copies.clear()

    def keep(self, record: Record, value: Any) -> Any:
        """``value`` with every tensor in it replaced by a detached copy that ``record`` owns."""
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
        if self.copy_at_once or t.layout != torch.strided or torch.compiler.is_compiling():
            t = self._copy_of(t)  # sparse: no plain memory to share; Dynamo cannot trace a lazy copy
        else:
            try:
                t = torch._lazy_clone(t.detach())
            except RuntimeError:  # memory PyTorch does not own (torch.from_numpy, DLPack): no lazy copy
                t = self._copy_of(t)
        if not t.is_inference():  # made under torch.inference_mode(): no version number to note
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
