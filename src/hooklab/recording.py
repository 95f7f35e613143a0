"""``record``: what chosen modules receive and return, one ``Record`` per call, and their gradients.

    with record(model, backward=True) as rec:    # every leaf module; record(model, ["fc"]) one
        model(x).sum().backward()
    rec["fc"].output, rec["fc"].grad_output[0]

* ``record(model, layers=None, *, types=None, backward=False)`` makes a ``Recording``, the context
  manager above: ``rec[name]`` (a layer's last call), ``rec.calls(name)``, ``rec.names``,
  ``rec.records`` (in the order the modules ran), ``rec.summary()``.
* ``Record``: one call of one module: ``name``, ``module_type``, ``call`` (0, 1, … for a module
  called twice, as ResNet calls each block's ReLU), ``inputs``, ``kwargs``, ``output``, and with
  ``backward=True`` ``grad_input``, ``grad_output``.
* ``NoGradientError``: raised by ``grad_input`` / ``grad_output`` when no gradient came; it says why.
* ``TrainModeWarning``: shown when a ``with record(...)`` block starts on a model whose BatchNorm
  layers are in train mode (once per model): each pass in the block updates their running
  statistics. ``model.eval()`` first, or ``warnings.filterwarnings("ignore", category=TrainModeWarning)``
  when you mean to train.

It is the recorder you built in notebooks 00 and 02 (one record per call, the inputs copied by a
pre-hook before the call and the output by a forward hook with ``.detach().clone()``, every handle
removed in ``__exit__``, also when the block raises), plus:

* a pre-hook only where a module may write into its inputs (``inplace=True``, or a module from
  outside ``torch.nn``); the forward hook copies the other modules' inputs;
* one copy shared by a layer's output and the next layer's input (and by their gradients), while
  nothing wrote into the tensor in between;
* keyword arguments, and a ``Record`` with named fields instead of a tuple;
* with ``backward=True``, tensor hooks for the gradients (``Recording._watch_inputs`` says why the
  one for ``grad_input`` goes on a view of the input).
"""

from __future__ import annotations

import copy
import functools
import sys
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .hooks import Hooks
from .layers import select_layers
from .pytorch_internals import version

__all__ = ["NoGradientError", "Record", "Recording", "TrainModeWarning", "record"]


class NoGradientError(RuntimeError):
    """A gradient was asked for but none reached that module; the message says why."""


class TrainModeWarning(UserWarning):
    """A recording starts on a model whose BatchNorm layers are in train mode (``model.eval()``)."""


NOT_ASKED = "this recording was made without backward=True: use record(..., backward=True) to record gradients"
GRAD_MODE_OFF = (
    "the forward pass ran with gradients disabled (torch.no_grad() or torch.inference_mode()), so it built no "
    "graph for backward() to go through: run the model outside torch.no_grad() (or inside `with "
    "torch.enable_grad():`) and call backward() inside the `with record(..., backward=True)` block")
NO_GRAPH = (
    "record(..., backward=True): the forward pass in this block ran under torch.no_grad() (or "
    "torch.inference_mode()), so it built no graph: no gradient was recorded, and a backward() after it fails "
    "(\"element 0 of tensors does not require grad\"); run the model with gradients on (outside torch.no_grad(), or "
    "inside `with torch.enable_grad():`) and call backward() inside the block")
NOT_ENTERED = (
    "this recording was never entered, so it recorded nothing: record(...) records only inside a `with` block; "
    "write `with record(model) as rec:` and run the model inside the block")
NOT_REACHED = (
    "call backward() inside the `with record(..., backward=True)` block, after the forward pass (if you did, "
    "this module's output does not contribute to what backward() started from, or it is a view that a later "
    "in-place operation modified: PyTorch calls no hook on such a view, so make that operation work out of "
    "place, inplace=False)"
)


@dataclass(eq=False, slots=True)
class Record:
    """What one call of one module saw. ``inputs``, ``kwargs``, ``output`` and the gradients are
    detached copies: a later in-place operation (``ReLU(inplace=True)``, ``out += identity``) cannot
    change them, but two records may share one (a layer's output is the next layer's input), so
    clone one before changing it in place."""

    name: str  # the layer's name in model.named_modules()
    module_type: str  # "Conv2d", "ReLU", ...
    call: int = 0  # 0 for the module's first call in the block, 1 for its second, ...
    inputs: tuple = ()  # the positional arguments, as the module received them
    kwargs: dict = field(default_factory=dict)  # the keyword arguments
    output: Any = None  # what it returned (as changed by your forward hooks registered before record)
    _gradients: _Gradients | None = field(default=None, repr=False)  # None: recorded without backward=True

    @property
    def grad_output(self) -> tuple:
        """The gradient w.r.t. each output tensor (what a tensor hook on it receives), from the last
        backward() inside the block."""
        return tuple(self._arrived().outputs)

    @property
    def grad_input(self) -> tuple:
        """The gradient w.r.t. each positional input through this module only (``None`` where the
        input needs no grad), as a full backward hook receives it. ``NoGradientError`` where it
        cannot be observed: the module wrote into its input, or got tensors needing grad as keyword
        arguments or inside a list."""
        gradients = self._arrived()
        if gradients.input_problem:
            raise NoGradientError(gradients.input_problem)
        return tuple(gradients.inputs)

    def _arrived(self) -> _Gradients:
        """The gradients, once backward() has delivered one to an output; else why not."""
        gradients = self._gradients
        if gradients is None or all(g is None for g in gradients.outputs):
            reason = NOT_ASKED if gradients is None else gradients.missing
            raise NoGradientError(f"no gradient reached {self.name!r}: {reason}")
        return gradients

    def __repr__(self) -> str:
        call = f", call={self.call}" if self.call else ""
        return f"Record({self.name!r}{call}, {self.module_type}, output {shape_of(self.output)})"


@dataclass(eq=False, slots=True)
class _Gradients:
    """A record's gradients, filled in during backward() by the tensor hooks of its ``Recording``."""

    inputs: list  # grad_input: one entry per positional argument
    outputs: list = field(default_factory=list)  # grad_output: one entry per output tensor
    missing: str = NOT_REACHED  # what NoGradientError says while no gradient has reached the outputs
    input_problem: str | None = None  # why grad_input cannot be observed, when it cannot


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
    backward: also record ``grad_input`` / ``grad_output``; run ``backward()`` inside the block
        (after several, each record keeps the gradients of the last).
    """
    return Recording(model, select_layers(model, layers, types), backward=backward)


class Recording:
    """The records of one ``with record(...)`` block, in the order the modules ran. Iterable,
    indexable by layer name; entered once."""

    def __init__(self, model: nn.Module, modules: dict[str, nn.Module], backward: bool):
        self.model = model
        self.modules = modules
        self.backward = backward
        self.records: list[Record] = []
        self._by_name: dict[str, list[Record]] = defaultdict(list)  # each layer's records, in call order
        self._started: dict[str, list] = {}  # (record, views) begun by a pre-hook, waiting for the module
        self._copies: dict[int, tuple] = {}  # id(tensor) -> (weak reference to it, its version, its copy)
        self._hooks = Hooks()  # the module hooks, for the whole block
        self._grad_hooks = Hooks()  # the tensor hooks of the passes recorded so far
        self._entered = False

    # ----- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def names(self) -> list[str]:
        """Recorded layer names in the order of their first call."""
        return list(self._by_name)

    def calls(self, name: str) -> list[Record]:
        """Every record of one layer, in call order."""
        if name not in self.modules:
            select_layers(self.model, [name])  # raises UnknownLayerError with close matches
            if f"_orig_mod.{name}" in self.modules:
                raise KeyError(f"this is a torch.compile'd model: its layer {name!r} is recorded as '_orig_mod.{name}'")
            raise KeyError(f"{name!r} is a layer of the model but was not chosen for recording")
        if not self._entered:
            raise RuntimeError(NOT_ENTERED)
        return list(self._by_name.get(name, ()))

    def __getitem__(self, name: str) -> Record:
        """The last record of layer ``name``."""
        found = self.calls(name)
        if not found:
            raise KeyError(f"layer {name!r} was chosen but has not been called yet")
        return found[-1]

    def summary(self) -> str:
        """One line per record: position, name, call, type, output shape."""
        if not self._entered:
            raise RuntimeError(NOT_ENTERED)
        width = max([len("layer"), *(len(r.name) for r in self.records)])
        lines = [f"{'#':>3}  {'layer':<{width}}  call  {'type':<18} output shape"]
        for i, r in enumerate(self.records):
            lines.append(f"{i:>3}  {r.name:<{width}}  {r.call:>4}  {r.module_type:<18} {shape_of(r.output)}")
        return "\n".join(lines)

    def clear(self) -> None:
        """Forget every record (the module hooks stay while the block runs)."""
        self._grad_hooks.remove()
        self.records.clear()
        self._by_name.clear()
        self._copies.clear()

    # ----- the with block ----------------------------------------------------------------------------
    def __enter__(self) -> Recording:
        if self._entered:
            raise RuntimeError("this recording was already used in a `with` block; call record(...) again for a "
                               "second recording")
        self._entered = True
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("hooklab."):  # hooklab's tools know
            warn_train_mode(self.model)
        try:
            for name, module in self.modules.items():  # partial(hook, name): your loop's `name=name`
                if self.backward or may_write_into_input(module):
                    before = functools.partial(self._before, name)
                    self._hooks.add(module.register_forward_pre_hook(before, with_kwargs=True))
                after = functools.partial(self._after, name)
                self._hooks.add(module.register_forward_hook(after, with_kwargs=True))
        except BaseException:
            self._hooks.remove()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._hooks.remove()
        self._grad_hooks.remove()
        self._started.clear()
        self._copies.clear()
        if exc is None and self.backward and self.records and all(
                r._gradients is not None and r._gradients.missing == GRAD_MODE_OFF for r in self.records):
            warnings.warn(NO_GRAPH, stacklevel=2)
        if exc is not None and self.backward:  # say so if no recorded output could get a gradient
            reasons = {r._gradients.missing for r in self.records if r._gradients}
            if reasons and NOT_REACHED not in reasons:
                why = "; ".join(sorted(reasons))
                exc.add_note(f"hooklab.record: no recorded module's output needed a gradient: {why}")

    # ----- the forward hooks -------------------------------------------------------------------------
    def _before(self, name: str, module: nn.Module, args: tuple, kwargs: dict):
        """Forward pre-hook, on a module that may write into its inputs (or on every module, when
        recording gradients): start the record with the inputs as they come in."""
        rec, views = self._begin(name, module, args, kwargs), ()
        if self.backward and torch.is_grad_enabled():
            args, views = self._watch_inputs(rec, module, args, kwargs)
        self._started.setdefault(name, []).append((rec, views))
        return (args, kwargs) if views else None

    def _after(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any):
        """Forward hook: finish the record with a copy of the output."""
        started = self._started.get(name)
        if started:
            rec, views = started.pop()
        else:  # no pre-hook: the module cannot have written into its inputs, so copy them now
            rec, views = self._begin(name, module, args, kwargs), ()
        calls = self._by_name[name]
        rec.call = len(calls)
        calls.append(rec)
        self.records.append(rec)
        if not self.backward:
            rec.output = map_tensors(self._copy, output)
            return None
        returned = self._give_inputs_back(rec, views, output) if views else output
        rec.output = map_tensors(self._copy, returned)
        self._watch_output(rec, returned)
        return returned if returned is not output else None

    def _begin(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> Record:
        """A record of this call, with copies of its inputs."""
        kept = map_tensors(self._copy, kwargs) if kwargs else {}
        return Record(name, type(module).__name__, inputs=map_tensors(self._copy, args), kwargs=kept)

    # ----- copies ------------------------------------------------------------------------------------
    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """``t.detach().clone()``, made once per tensor and version: a layer's output is usually the
        next layer's input, and both records share one copy while PyTorch's version counter says
        that nothing wrote into the tensor in between (a write it does not count, through ``.data``
        or a NumPy array, is not seen)."""
        v = version(t)
        seen = self._copies.get(id(t))
        if seen is not None and seen[1] == v and seen[0]() is t:
            return seen[2]
        kept = t.detach().clone()
        if v is not None and not torch.compiler.is_compiling():
            self._copies[id(t)] = (weakref.ref(t), v, kept)
        return kept

    # ----- the gradients (backward=True) ----------------------------------------------------------
    def _watch_inputs(self, rec: Record, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        """Hook the gradient w.r.t. each positional input that needs grad; returns the arguments the
        module gets instead, and the views among them as ``(view, original, i, version)``."""
        rec._gradients = _Gradients([None] * len(args), input_problem=hidden_inputs(rec.name, args, kwargs))
        in_place = bool(getattr(module, "inplace", False))
        new_args, views = list(args), []
        for i, a in enumerate(args):
            if not (isinstance(a, torch.Tensor) and a.requires_grad):
                continue
            # grad_input is the gradient flowing back through this module only. A hook on the input
            # itself would get the sum over all its users (a ResNet block's input also feeds the
            # shortcut), so the module gets a view, `a[...]` (same memory, used by this module
            # alone), and the hook goes on the view. Not for an in-place module: a hook on a view
            # that is then written into never fires, so it keeps its real input, hooked.
            if not in_place:
                new_args[i] = a[...]
                views.append((new_args[i], a, i, version(new_args[i])))
            self._grad_hooks.add(new_args[i].register_hook(self._store(rec._gradients.inputs, i)))
        return tuple(new_args), views

    def _give_inputs_back(self, rec: Record, views: list, output: Any) -> Any:
        """The module ran on the views of ``_watch_inputs``: check that it did not write into them,
        and put the real input back where it returned a view (``Identity`` returns its input)."""
        by_id, swapped = {}, []
        for view, original, i, before in views:
            if version(view) != before:  # it wrote into the view: PyTorch will call no hook on it
                rec._gradients.input_problem = (
                    f"{rec.name!r} ({rec.module_type}) wrote into its input in place, so the gradient w.r.t. its "
                    "input cannot be observed; give the module an attribute inplace=True (record then hooks its "
                    "real input) or make it compute a new tensor")
            by_id[id(view)] = (view, original, i)

        def swap(t: torch.Tensor) -> torch.Tensor:
            # A view going out could be written into by what comes next (EfficientNet's block adds
            # `result += input` after StochasticDepth returns its input), silencing every hook on
            # it. So the real input goes out instead, hooked for grad_input (= grad_output here).
            view, original, i = by_id.get(id(t), (None, None, None))
            if view is not t:
                return t
            self._grad_hooks.add(original.register_hook(self._store(rec._gradients.inputs, i)))
            swapped.append(i)
            return original

        returned = map_tensors(swap, output)
        return returned if swapped else output

    def _watch_output(self, rec: Record, output: Any) -> None:
        """Hook the gradient w.r.t. each output tensor, or note why none can come."""
        tensors = tensors_in(output)
        gradients = rec._gradients or _Gradients([])
        rec._gradients = gradients
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
            gradients.missing = why_no_grad_output(output, tensors)
            return
        gradients.outputs = [None] * len(tensors)
        for i, t in enumerate(tensors):
            if t.requires_grad:
                self._grad_hooks.add(t.register_hook(self._store(gradients.outputs, i)))

    def _store(self, values: list, i: int) -> Callable:
        """A tensor hook that keeps a copy of the gradient it receives as ``values[i]``: autograd
        may hand the same buffer on as a leaf's ``.grad``, which changes later. Shared like the
        forward copies (``_copy``): a layer's grad_input is often the grad_output of the one before."""
        copy = self._copy

        def hook(grad: torch.Tensor) -> None:
            values[i] = copy(grad)

        return hook


#: the models warned about (TrainModeWarning is shown once per model)
_WARNED: weakref.WeakSet = weakref.WeakSet()


def warn_train_mode(model: nn.Module) -> None:
    """``TrainModeWarning`` if the model's BatchNorm layers would update their running statistics
    (train mode), once per model."""
    if model in _WARNED:
        return
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._NormBase)
             and m.training and getattr(m, "running_mean", None) is not None]
    if not norms:
        return
    _WARNED.add(model)
    shown = ", ".join(repr(n) for n in norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
    warnings.warn(f"{type(model).__name__} is in train mode: each forward pass in this block updates the running "
                  f"statistics of its BatchNorm layers ({shown}); call model.eval() first if you only want to look "
                  "(shown once per model)", TrainModeWarning, stacklevel=3)


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
