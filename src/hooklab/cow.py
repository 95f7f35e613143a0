"""Copy-on-write for recorded tensors: keep references, copy only what is about to be overwritten.

``hooklab.record`` stores detached *references* to activations (cheap) and enters a
``CopyOnWrite`` guard while its ``with`` block runs. The guard sees every ATen operation;
for operations whose schema says they write into an argument (``relu_``, ``add_`` from
``out += identity``, ``out=`` variants, ...), it asks the owner to copy any recorded tensor
sharing that argument's storage *before* the write happens. Operations that write nothing
cost one dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CopyOnWrite", "storage_key"]


def storage_key(tensor: torch.Tensor) -> int | None:
    """An id for the memory a tensor lives in (views share it); None for storage-less tensors."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...
        return None


class CopyOnWrite(TorchDispatchMode):
    """Call ``before_write(tensor)`` for every tensor an operation is about to write into."""

    def __init__(self, before_write: Callable[[torch.Tensor], None]):
        super().__init__()
        self.before_write = before_write
        self._written: dict = {}  # op -> positions and names of the arguments it writes

    def _written_args(self, func) -> tuple:
        written = self._written.get(func)
        if written is None:
            written = tuple(
                (i, a.name)
                for i, a in enumerate(func._schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write
            )
            self._written[func] = written
        return written

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for position, name in self._written_args(func):
            value = args[position] if position < len(args) else kwargs.get(name)
            for tensor in tree_flatten(value)[0]:
                if isinstance(tensor, torch.Tensor):
                    self.before_write(tensor)
        return func(*args, **kwargs)
