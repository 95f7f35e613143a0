"""Copy-on-write for recorded tensors: keep references, copy only what is about to be overwritten.

``hooklab.record`` stores detached *references* to activations (cheap) and enters a
``CopyOnWrite`` guard while its ``with`` block runs. The guard is a ``TorchFunctionMode``: it
sees every call of a torch function or tensor method made from Python and, for the calls that
write into a tensor, asks the owner to copy any recorded tensor sharing that memory *before*
the write happens. A call writes into a tensor when it is

* an in-place method or function, named with a trailing underscore (``relu_``, ``add_``, ``zero_``),
* an augmented assignment or item assignment (``out += identity``, ``x[0] = 1``),
* called with ``inplace=True`` (``F.relu(x, inplace=True)``, what ``nn.ReLU(inplace=True)`` does),
* called with ``out=``,
* a ``_foreach_*_`` function writing into a list of tensors (what optimizers use).

Writes the guard cannot see (inside C++ code, or by a custom autograd function) are still
caught afterwards: a record checks the tensor's version counter when it is read and raises
``StaleRecordError`` instead of returning overwritten values. Writes that bypass the version
counter as well, through ``tensor.data`` or a NumPy view (``t.numpy()[:] = 0``), are seen by
neither: a record then returns the changed values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CopyOnWrite", "storage_key", "writes_into"]

_AUGMENTED = frozenset(
    f"__i{op}__"
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
        "matmul",
    )
) | {"__setitem__"}


def storage_key(tensor: torch.Tensor) -> int | None:
    """An id for the memory a tensor lives in (views share it); None for storage-less tensors."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse, meta, ...
        return None


@functools.cache
def _writes_by_name(func) -> bool:
    """Whether the function's name alone says it writes into its first argument."""
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in _AUGMENTED


def writes_into(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a torch function call will write into (see the module docstring)."""
    written = []
    if kwargs:
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            written.append(out)
        elif isinstance(out, (tuple, list)):
            written.extend(t for t in out if isinstance(t, torch.Tensor))
        if kwargs.get("inplace") and args and isinstance(args[0], torch.Tensor):
            written.append(args[0])
    if args and _writes_by_name(func):
        if isinstance(args[0], torch.Tensor):
            written.append(args[0])
        elif isinstance(args[0], list | tuple):  # torch._foreach_mul_([a, b], 2.0), what optimizers use
            written.extend(t for t in args[0] if isinstance(t, torch.Tensor))
    return written


class CopyOnWrite(TorchFunctionMode):
    """Call ``before_write(tensor)`` for every tensor a torch call is about to write into."""

    def __init__(self, before_write: Callable[[torch.Tensor], None]):
        super().__init__()
        self.before_write = before_write

    def __torch_function__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True  # IPython and pytest leave this frame out of tracebacks: the error is the model's
        kwargs = kwargs or {}
        if kwargs or _writes_by_name(func):  # the common case, a pure function without keywords, skips this
            for tensor in writes_into(func, args, kwargs):
                self.before_write(tensor)
        return func(*args, **kwargs)

    def remove(self) -> None:
        """End the guard: take it off the mode stack wherever it is (what ``__exit__`` does when it
        is innermost); modes entered after it and still active stay on."""
        above = []
        while torch._C._len_torch_function_stack():
            top = torch._C._pop_torch_function_stack()
            if top is self:
                break
            above.append(top)
        for other in reversed(above):
            torch._C._push_on_torch_function_stack(other)
