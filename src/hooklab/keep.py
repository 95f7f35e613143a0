"""How ``hooklab.record`` keeps the tensors of its records (notebook 00 introduces ``record``).

A record must hold what a module really produced, even when a later in-place operation
(``ReLU(inplace=True)``, ``out += identity``, an optimizer step, your own ``x[0] = 1``) writes
into that memory. Copying every tensor at once is safe but costs a copy of every activation, and
most activations are never written again. So a ``Keeper`` gives each record a **lazy copy**
(PyTorch's copy-on-write ``torch._lazy_clone``): a new tensor that shares the original's memory
until either of them is written into. The first write through PyTorch (a torch function, an
optimizer, C++ code, ``tensor.data``, a NumPy view made after the recording) first gives the
writer memory of its own with the numbers copied over, and the record keeps the old memory. Only
what is written is copied, once, and records of the same memory (a ReLU's input record and the
record of the layer before it) keep sharing it.

What PyTorch cannot see: a NumPy array or DLPack capsule made from a tensor *before* it was
recorded points at the old memory itself. Its writes change the record too, and once the tensor
is written through PyTorch (and so moves to new memory) the array no longer follows it. Record
such tensors with ``clone=True``.

Each record notes the version number of every tensor it holds, so that changing a record's own
tensor in place (``rec.output.relu_()``) makes it raise ``StaleRecordError`` instead of returning
other numbers (tensors made under ``torch.inference_mode()`` have no version number, so there it
cannot). Tensors are copied at once instead

* with ``copy_at_once=True`` (``record(..., clone=True)``);
* inside code ``torch.compile`` traces (Dynamo cannot trace a lazy copy);
* when they are a small view of a much larger block of memory (a lazy copy would keep the whole
  block alive: a ViT's class token, ``x[:, 0]``, is 1/197 of its input);
* when they are sparse, or their memory is not PyTorch's own (``torch.from_numpy``, DLPack): no
  lazy copy can be made of it;
* when this PyTorch has no ``torch._lazy_clone`` (a private function: ``tests/test_keep.py``
  checks it still copies on write).
"""

from __future__ import annotations

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
        if t.requires_grad:  # only then: a detached alias is one more tensor object to make
            t = t.detach()
        if self.copy_at_once or t.layout != torch.strided or torch.compiler.is_compiling() or _small_view(t):
            t = t.clone()
        else:
            try:
                t = torch._lazy_clone(t)
            except RuntimeError:  # memory PyTorch does not own (torch.from_numpy, DLPack): no lazy copy
                t = t.clone()
        if not t.is_inference():  # made under torch.inference_mode(): no version number to note
            record._versions[id(t)] = t._version
        return t


def _small_view(t: torch.Tensor) -> bool:
    """Whether ``t`` shows less than half of the memory block it lives in (and that block is more
    than 64 KiB): a lazy copy would keep the whole block alive."""
    if t.device.type == "meta":
        return False
    block = t.untyped_storage().nbytes()
    return block > 65536 and 2 * t.numel() * t.element_size() < block
