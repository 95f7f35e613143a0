"""Record what chosen modules receive and return, forward and (optionally) backward.

``record`` is the course's recorder (built by hand in notebook 00, used from 02 on):

    with record(model, backward=True) as rec:
        model(x).sum().backward()
    rec["fc1"].output, rec["fc1"].grad_output[0]

* One ``Record`` per module call, in execution order: a module called twice in one forward
  (torchvision's ResNet reuses each block's ReLU) has two records, ``call=0`` and ``call=1``.
* A record holds detached copies (``.detach().clone()``), so a later in-place operation
  (``ReLU(inplace=True)``, ``out += identity``, your own code) cannot change it. The output is
  copied when the module returns; the inputs before it runs when the module may write into them
  (``inplace=True``, or any module not from ``torch.nn``), else when it returns. One layer's output
  is usually the next layer's input: while PyTorch's version counter says that no in-place
  operation wrote into it in between, their records share one copy (so clone a record's tensor
  before changing it in place). A write PyTorch does not count (through ``.data``, or a NumPy
  array made from the tensor) in between is not seen by the second record.
* ``backward=True`` records ``grad_output`` (gradient w.r.t. each output tensor) and
  ``grad_input`` (w.r.t. each positional input, ``None`` where the input needs no grad), the
  tuples a full backward hook receives. ``grad_output`` comes from a tensor hook on each output,
  so it is exactly what a tensor hook you register on that output receives. ``grad_input`` comes
  from a tensor hook on a view of each input, made before the module runs (so it sees only the
  gradient flowing back through this module); a module returning its input unchanged (an
  ``Identity``, ``StochasticDepth`` in eval mode) gets its input back and ``grad_input`` equal to
  ``grad_output``. Run ``backward()`` inside the ``with`` block; with several, each record keeps
  the gradients of the last one.
* Every hook is removed when the block ends, also when it raises. A ``Recording`` is entered once.
* Keyword arguments are kept in ``Record.kwargs``; ``grad_input`` covers positional tensors only
  and says so (``NoGradientError``) when tensors that need grad came as keywords or in a list.
* A forward hook of your own that replaces a module's output is seen by the record if it was
  registered before the ``with`` block (hooks run in the order they were registered).
"""

from __future__ import annotations

import copy
import functools
import itertools
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .hooks import Hooks
from .layers import select_layers
from .pytorch_internals import version

__all__ = ["NoGradientError", "Record", "Recording", "record"]


class NoGradientError(RuntimeError):
    """A gradient was asked for but none reached that module; the message says why."""


NOT_ASKED = "this recording was made without backward=True: use record(..., backward=True) to record gradients"
GRAD_MODE_OFF = "the forward pass ran with gradients disabled (torch.no_grad / inference_mode)"
NOT_REACHED = (
    "call backward() inside the `with record(..., backward=True)` block, after the forward pass (if you did, "
    "this module's output does not contribute to what backward() started from, or it is a view that a later "
    "in-place operation modified: PyTorch calls no hook on such a view, so make that operation work out of "
    "place, inplace=False)"
)


@dataclass(repr=False, slots=True)
class Record:
    """What one call of one module saw: ``inputs``, ``kwargs``, ``output`` (detached copies), and with
    ``backward=True`` ``grad_input`` and ``grad_output`` (``NoGradientError`` says why one is missing)."""

    name: str
    module_type: str
    call: int = 0
    index: int = 0
    inputs: tuple = ()
    kwargs: dict = field(default_factory=dict)
    output: Any = None
    why_no_grad: str = NOT_ASKED  # what NoGradientError says while no gradient has arrived
    grad_input_problem: str | None = None  # why grad_input cannot be trusted, when it cannot
    _grad_input: list | tuple = ()
    _grad_output: list | tuple = ()
    _got_grad: bool = False
    _views: list | tuple = ()  # (view handed to the module, original input, its version)

    @property
    def grad_output(self) -> tuple:
        if not self._got_grad:
            raise NoGradientError(f"no gradient reached {self.name!r}: {self.why_no_grad}")
        return tuple(self._grad_output)

    @property
    def grad_input(self) -> tuple:
        if not self._got_grad:
            raise NoGradientError(f"no gradient reached {self.name!r}: {self.why_no_grad}")
        if self.grad_input_problem:
            raise NoGradientError(self.grad_input_problem)
        return tuple(self._grad_input)

    def __repr__(self) -> str:
        call = f", call={self.call}" if self.call else ""
        return f"Record({self.name!r}{call}, {self.module_type}, output {shape_of(self.output)})"


class Recording:
    """The records of one ``with record(...)`` block. Iterable, indexable by layer name."""

    def __init__(self, model: nn.Module, modules: dict[str, nn.Module], backward: bool):
        self.model = model
        self.modules = modules
        self.backward = backward
        self.records: list[Record] = []
        self._calls: dict[str, int] = {}  # calls so far, per layer
        self._started: dict[str, list[Record]] = {}  # records begun before their module ran, per layer
        self._copies: dict[int, tuple] = {}  # id(tensor) -> (weak reference to it, its version, its copy)
        self._hooks = Hooks()  # the module hooks, for the whole block
        self._grad_hooks = Hooks()  # the tensor hooks of the passes recorded so far
        self._entered = False  # a recording is one `with` block: its records and call numbers belong to it

    # ----- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def names(self) -> list[str]:
        """Recorded layer names in the order of their first call."""
        return list(dict.fromkeys(r.name for r in self.records))

    def calls(self, name: str) -> list[Record]:
        """Every record of one layer, in call order."""
        if name not in self.modules:
            select_layers(self.model, [name])  # raises UnknownLayerError with close matches
            if f"_orig_mod.{name}" in self.modules:
                raise KeyError(f"this is a torch.compile'd model: its layer {name!r} is recorded as '_orig_mod.{name}'")
            raise KeyError(f"{name!r} is a layer of the model but was not chosen for recording")
        return [r for r in self.records if r.name == name]

    def __getitem__(self, name: str) -> Record:
        """The last record of layer ``name``."""
        found = self.calls(name)
        if not found:
            raise KeyError(f"layer {name!r} was chosen but has not been called yet")
        return found[-1]

    def summary(self) -> str:
        """One line per record: position, name, call, type, output shape."""
        width = max([len("layer"), *(len(r.name) for r in self.records)])
        lines = [f"{'#':>3}  {'layer':<{width}}  call  {'type':<18} output shape"]
        for r in self.records:
            lines.append(f"{r.index:>3}  {r.name:<{width}}  {r.call:>4}  {r.module_type:<18} {shape_of(r.output)}")
        return "\n".join(lines)

    def clear(self) -> None:
        """Forget every record (the module hooks stay while the block runs)."""
        self._grad_hooks.remove()
        self.records.clear()
        self._calls.clear()
        self._copies.clear()

    # ----- the block -----------------------------------------------------------------------
    def __enter__(self) -> Recording:
        if self._entered:
            raise RuntimeError("this recording was already used in a `with` block; call record(...) again for a "
                               "second recording")
        self._entered = True
        try:
            for name, module in self.modules.items():
                if self.backward or may_write_into_input(module):
                    before = functools.partial(self._before, name)
                    self._hooks.add(module.register_forward_pre_hook(before, with_kwargs=True))
                after = functools.partial(self._after, name)
                self._hooks.add(module.register_forward_hook(after, with_kwargs=True))
        except BaseException:
            self._hooks.remove()
            raise
        _OPEN[next(_OPENED)] = self
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._hooks.remove()
        self._grad_hooks.remove()
        self._started.clear()
        self._copies.clear()
        for key in [k for k, r in _OPEN.items() if r is self]:
            del _OPEN[key]
        if exc is not None and self.backward and self.records and all(r.why_no_grad != NOT_REACHED for r in self):
            reasons = "; ".join(sorted({r.why_no_grad for r in self}))
            exc.add_note(f"hooklab.record: no recorded module's output needed a gradient: {reasons}")

    # ----- the hooks -----------------------------------------------------------------------
    def _before(self, name: str, module: nn.Module, args: tuple, kwargs: dict):
        """Forward pre-hook: start the record with the inputs as they come in (a module working in
        place would otherwise show its result as its input)."""
        rec = Record(name, type(module).__name__, inputs=self._keep(args), kwargs=self._keep(kwargs))
        self._started.setdefault(name, []).append(rec)
        if self.backward and torch.is_grad_enabled():
            return self._watch_inputs(rec, module, args, kwargs)
        return None

    def _after(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any):
        """Forward hook: finish the record with the output (and, backward, hook the gradients)."""
        started = self._started.get(name)
        if started:
            rec = started.pop()
        else:  # no pre-hook: the module does not write into its inputs, so they are as they came in
            rec = Record(name, type(module).__name__, inputs=self._keep(args), kwargs=self._keep(kwargs))
        rec.call = self._calls.get(name, 0)
        self._calls[name] = rec.call + 1
        rec.index = len(self.records)
        self.records.append(rec)
        returned = self._give_inputs_back(rec, output) if rec._views else output
        rec.output = self._keep(returned)
        if self.backward:
            self._watch_output(rec, returned)
        return returned if returned is not output else None

    def _watch_inputs(self, rec: Record, module: nn.Module, args: tuple, kwargs: dict):
        """Hook the gradient w.r.t. each positional input. The module gets a view of each input that
        needs grad: a hook on it sees only the gradient flowing back through this module, not that
        of the input's other users. A module with ``inplace=True`` gets the input itself, since a hook
        on a view that is then written into never fires."""
        rec._grad_input = [None] * len(args)
        rec.grad_input_problem = hidden_inputs(rec.name, args, kwargs)
        in_place = bool(getattr(module, "inplace", False))
        new_args, rec._views = list(args), []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                if not in_place:
                    new_args[i] = a[...]  # a view: same memory, same strides
                    rec._views.append((new_args[i], a, version(new_args[i])))
                self._grad_hooks.add(new_args[i].register_hook(self._store(rec, rec._grad_input, i)))
        return (tuple(new_args), kwargs) if rec._views else None

    def _give_inputs_back(self, rec: Record, output: Any) -> Any:
        """A module that returned the view it was given gets its real input back (a later in-place
        write into a view would silence every hook on it), with ``grad_input`` hooked there."""
        originals = {}
        for i, (view, original, before) in enumerate(rec._views):
            if version(view) != before:
                rec.grad_input_problem = (
                    f"{rec.name!r} ({rec.module_type}) wrote into its input in place, so the gradient w.r.t. its "
                    "input cannot be observed; give the module an attribute inplace=True (record then hooks its "
                    "real input) or make it compute a new tensor")
            originals[id(view)] = (view, original, i)
        rec._views = []

        swapped = []

        def swap(t: torch.Tensor) -> torch.Tensor:
            view, original, i = originals.get(id(t), (None, None, None))
            if view is not t:
                return t
            self._grad_hooks.add(original.register_hook(self._store(rec, rec._grad_input, i)))
            swapped.append(i)
            return original

        returned = map_tensors(swap, output)
        return returned if swapped else output

    def _watch_output(self, rec: Record, output: Any) -> None:
        """Hook the gradient w.r.t. each output tensor, or note why none can come."""
        tensors = tensors_in(output)
        if not torch.is_grad_enabled():
            rec.why_no_grad = GRAD_MODE_OFF
        elif not any(t.requires_grad for t in tensors):
            rec.why_no_grad = why_no_grad_output(output, tensors)
        else:
            rec.why_no_grad = NOT_REACHED
            rec._grad_output = [None] * len(tensors)
            for i, t in enumerate(tensors):
                if t.requires_grad:
                    self._grad_hooks.add(t.register_hook(self._store(rec, rec._grad_output, i, arrived=True)))

    @staticmethod
    def _store(rec: Record, values: list, i: int, arrived: bool = False) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            # copied: autograd may hand the same buffer on as a leaf's .grad, which changes later
            values[i] = grad.detach().clone()
            rec._got_grad = rec._got_grad or arrived

        return hook

    # ----- copies ------------------------------------------------------------------------------
    def _keep(self, value: Any) -> Any:
        """``value`` with every tensor in it replaced by a detached copy."""
        return map_tensors(self._copy, value)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """One copy per tensor and version: the records of a layer's output and of the next layer's
        input share it while no in-place operation wrote into the tensor."""
        v = version(t)
        seen = self._copies.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == v:
            return seen[2]
        copy = t.detach().clone()
        if v is not None and not torch.compiler.is_compiling():
            self._copies[id(t)] = (weakref.ref(t), v, copy)
        return copy


#: the recordings entered and not exited yet, in the order they were entered
_OPEN: weakref.WeakValueDictionary[int, Recording] = weakref.WeakValueDictionary()
_OPENED = itertools.count()


def record(
    model: nn.Module,
    layers: Iterable[str] | str | None = None,
    *,
    types: type | tuple[type, ...] | None = None,
    backward: bool = False,
) -> Recording:
    """Record the chosen modules of ``model`` while the ``with`` block runs.

    layers: layer names (``named_modules()`` names, e.g. ``"layer1.0.conv1"``); default: every
        leaf module. An unknown name raises ``UnknownLayerError`` listing close matches.
    types: keep only modules of these types (e.g. ``nn.Conv2d``).
    backward: also record ``grad_input`` / ``grad_output``; run ``backward()`` inside the block.
    """
    return Recording(model, select_layers(model, layers, types), backward=backward)


def open_recordings(model: nn.Module) -> list[Recording]:
    """The ``record`` blocks on ``model``'s modules entered and not exited yet (a notebook cell that
    called ``__enter__`` by hand, say). Exit them with ``__exit__(None, None, None)``."""
    mine = {id(m) for m in model.modules()}
    return [r for r in _OPEN.values() if any(id(m) in mine for m in r.modules.values())]


def may_write_into_input(module: nn.Module) -> bool:
    """Whether the module's inputs must be copied before it runs: ``inplace=True``, or a module from
    outside ``torch.nn`` (PyTorch's own layers write into their input only when ``inplace=True``)."""
    if "inplace" in module.__dict__:  # not hasattr: nn.Module's failing __getattr__ is slow
        return bool(module.inplace)
    return not type(module).__module__.startswith("torch.nn.")


# ----- tensors inside nested values ----------------------------------------------------------------
def map_tensors(fn: Callable, value: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor inside it (in tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) is tuple and len(value) == 1 and isinstance(value[0], torch.Tensor):  # most modules' inputs
        return (fn(value[0]),)
    if isinstance(value, tuple | list):
        items = [map_tensors(fn, v) for v in value]
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*items)
        return type(value)(items)
    if type(value) is dict:
        return {k: map_tensors(fn, v) for k, v in value.items()}
    if isinstance(value, dict):  # a copy keeps the dict's own type (OrderedDict, a model's output class)
        mapped = copy.copy(value)
        for k, v in value.items():
            mapped[k] = map_tensors(fn, v)
        return mapped
    return value


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor inside ``value``, in order."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, value)
    return found


def shape_of(value: Any) -> str:
    """The shape of the tensor in ``value`` as text, or a list of shapes if there are several."""
    shapes = [tuple(t.shape) for t in tensors_in(value)]
    return str(shapes[0]) if len(shapes) == 1 else str(shapes)


# ----- why no gradient ------------------------------------------------------------------------------
def hidden_inputs(name: str, args: tuple, kwargs: dict) -> str | None:
    """Why ``grad_input`` cannot hold every input gradient: tensors that need grad came inside a
    list or dict, or as keyword arguments (``grad_input`` has one entry per positional tensor)."""
    nested = [a for a in args if isinstance(a, list | tuple | dict)]
    for where, values in (("inside a list or dict", nested), ("as keyword arguments", kwargs)):
        if any(t.requires_grad for t in tensors_in(values)):
            return (f"{name!r} received tensors that need grad {where}; grad_input holds gradients only for "
                    "positional tensor arguments (record the layer that produces those tensors instead)")
    return None


def why_no_grad_output(output: Any, tensors: list[torch.Tensor]) -> str:
    """Why no gradient can reach a module whose output (its tensors: ``tensors``) needs no grad."""
    if not torch.is_grad_enabled():
        return GRAD_MODE_OFF
    if not tensors:
        return f"its output ({type(output).__name__}) holds no tensor, so no gradient can reach it"
    if not any(t.is_floating_point() or t.is_complex() for t in tensors):
        return f"its output ({tensors[0].dtype} tensor) carries no gradient: only floating-point tensors do"
    return ("its output does not require grad: no parameter or input before it requires grad "
            "(call requires_grad_() on the input, or unfreeze a parameter)")
