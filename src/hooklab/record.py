"""Record what every chosen module receives and returns, forward and (optionally) backward.

``record`` is the course's one recorder (built by hand in notebook 00, used from 02 on):

    with record(model, backward=True) as rec:
        model(x).sum().backward()
    rec["fc1"].output, rec["fc1"].grad_output[0]

Contract
--------
* One ``Record`` per module call, in execution order: a module called twice in one forward
  (torchvision's ResNet reuses each block's ReLU) has two records, ``call=0`` and ``call=1``.
* Tensors in records are detached, and a record always holds the value the module really
  produced, even when a later in-place operation (``ReLU(inplace=True)``, ``out += identity``,
  your own code, during the block or after it) overwrites the module's output. Records hold
  *lazy copies* (``hooklab.keep``): they share the module's memory until something writes into
  it, and only then is that memory copied, once. A record whose own tensor you change in place
  raises ``StaleRecordError`` instead of returning other numbers. ``clone=True`` copies every
  tensor at once (so does a model compiled with ``torch.compile``: Dynamo cannot trace a lazy copy).
* ``backward=True`` records (copies of) ``grad_output`` (gradient w.r.t. each output) and ``grad_input``
  (gradient w.r.t. each positional input, ``None`` where the input needs no grad): the same
  tuples a full backward hook receives. They come from tensor hooks (notebook 03 explains
  why): full backward hooks break on modules whose output is later modified in place, such
  as every block of a torchvision ResNet. Run ``backward()`` inside the ``with`` block.
* Every hook is removed when the block ends, also when it raises. A ``Recording`` is entered once.
* Keyword arguments of a call are kept in ``Record.kwargs``; ``grad_input`` covers positional
  tensor arguments only, and says so (``NoGradientError``) when tensors that need grad came as
  keywords or inside a list or dict.
* Worth knowing: with several ``backward()`` calls in one block, each record keeps the gradients
  of the last one. A module shared by two models is recorded whenever either calls it. A
  forward hook of your own that replaces a module's output is seen by the record if it was
  registered before the ``with`` block, and not if it was registered inside it (hooks run in
  the order they were registered).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .keep import Keeper
from .layers import may_write_into_input, select_layers
from .records import (
    GRAD_MODE_OFF,
    NOT_ASKED,
    NoGradientError,
    Record,
    StaleRecordError,
    hidden_inputs_note,
    shape_of,
    why_no_grad_output,
)

# Record and the two errors are defined in hooklab.records and re-exported here.
__all__ = ["NoGradientError", "Record", "Recording", "StaleRecordError", "open_recordings", "record"]


class Recording:
    """The records of one ``with record(...)`` block. Iterable, indexable by layer name."""

    def __init__(self, model: nn.Module, modules: dict[str, nn.Module], backward: bool, clone: bool):
        self.model = model
        self.modules = modules
        self.backward = backward
        self.clone = clone
        self.records: list[Record] = []
        self._calls: dict[str, int] = {}
        self._started: dict[str, list[Record]] = {}  # records begun by a pre-hook, per layer
        self._keeper = Keeper(copy_at_once=clone)
        self._handles: list = []
        self._tensor_handles: list = []

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
            lines.append(f"{r.index:>3}  {r.name:<{width}}  {r.call:>4}  {r.module_type:<18} {shape_of(r._output)}")
        return "\n".join(lines)

    def clear(self) -> None:
        """Forget every record (hooks stay registered while the block runs)."""
        for handle in self._tensor_handles:
            handle.remove()
        self._tensor_handles.clear()
        self.records.clear()
        self._calls.clear()

    # ----- hooks ---------------------------------------------------------------------------
    def _new_record(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> Record:
        rec = Record(name, type(module).__name__, call=-1, index=-1)
        rec._inputs = self._keeper.keep(rec, tuple(args))
        if kwargs:
            rec._kwargs = self._keeper.keep(rec, kwargs)
        return rec

    def _pre_hook(self, name: str, module: nn.Module, args: tuple, kwargs: dict):
        # The record starts before the module runs, so that its inputs are kept as they came in:
        # a module working in place (ReLU(inplace=True)) would otherwise show its result as input.
        rec = self._new_record(name, module, args, kwargs)
        self._started.setdefault(name, []).append(rec)
        if not (self.backward and torch.is_grad_enabled()):
            return None
        rec._grad_input = (None,) * len(args)
        rec._grad_input_note = hidden_inputs_note(name, args, kwargs)
        in_place = bool(getattr(module, "inplace", False))
        new_args, changed = list(args), False
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                # A view gives this module its own path in the graph, so the hook sees only the
                # gradient flowing back through this module, not that of other users of `a`.
                # A module that writes into its input keeps the original: a hook on a view that
                # is then modified in place never fires. Either way the hook is registered now,
                # before the module runs; registered after an in-place op it would see the
                # gradient of the modified tensor instead.
                target = a if in_place else a.view_as(a)
                if target is not a:
                    new_args[i], changed = target, True
                    rec._input_views.append((target, target._version))
                self._tensor_handles.append(target.register_hook(self._grad_setter(rec, "_grad_input", i)))
        return (tuple(new_args), kwargs) if changed else None

    def _forward_hook(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        started = self._started.get(name)
        if started:
            rec = started.pop()
        else:  # no pre-hook on this module (see may_write_into_input), or it was added mid-forward
            rec = self._new_record(name, module, args, kwargs)
        rec.call = self._calls.get(name, 0)
        self._calls[name] = rec.call + 1
        rec.index = len(self.records)
        rec._output = self._keeper.keep(rec, output)
        self.records.append(rec)
        if not self.backward:
            rec._no_grad_reason = NOT_ASKED
            return
        if not torch.is_grad_enabled():
            rec._no_grad_reason = GRAD_MODE_OFF
            return
        for view, version in rec._input_views:
            if view._version != version:
                rec._grad_input_note = (
                    f"{name!r} ({type(module).__name__}) wrote into its input in place, so the gradient w.r.t. "
                    "its input cannot be observed; give the module an attribute inplace=True (record then "
                    "hooks its real input) or make it compute a new tensor"
                )
        rec._input_views = []
        outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
        if not any(t.requires_grad for t in outputs):
            rec._no_grad_reason = why_no_grad_output(output, outputs)
            return
        if len(outputs) == 1 and outputs[0]._is_view():  # noted for why_no_grad: see Record._why_no_grad
            rec._output_view = (outputs[0].detach(), outputs[0]._version)  # detach shares the version;
            # resolved into _output_written when the block ends, so the alias does not keep the memory alive
        rec._grad_output = (None,) * len(outputs)
        for i, t in enumerate(outputs):
            if t.requires_grad:
                self._tensor_handles.append(t.register_hook(self._grad_setter(rec, "_grad_output", i)))

    def _grad_setter(self, rec: Record, attr: str, i: int):
        def hook(grad):
            values = list(getattr(rec, attr))  # set before this hook was registered
            # Gradients are always copied: autograd may hand the same buffer on as a leaf's
            # .grad, which later backward calls and zero_grad() change in place.
            values[i] = grad.detach().clone()
            setattr(rec, attr, tuple(values))
            rec._got_grad = True

        return hook

    # ----- context manager -----------------------------------------------------------------
    def __enter__(self) -> Recording:
        if self._handles:
            raise RuntimeError("this recording is already inside a `with` block; call record(...) again for a "
                               "second recording")
        try:
            for name, module in self.modules.items():
                if self.backward or may_write_into_input(module):
                    pre_hook = functools.partial(self._pre_hook, name)
                    self._handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
                hook = functools.partial(self._forward_hook, name)
                self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        except BaseException:
            self._remove_hooks()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if isinstance(exc, RuntimeError) and self.backward and "does not require grad" in str(exc):
            reasons = {r._no_grad_reason for r in self.records if r._no_grad_reason}
            if reasons:
                exc.add_note(f"hooklab.record: the recorded modules got no gradient: {'; '.join(sorted(reasons))}")
        for r in self.records:
            if r._output_view is not None:  # gradients arrive only inside the block: decide now
                view, version = r._output_view
                r._output_written, r._output_view = view._version != version, None
        self._remove_hooks()
        self._started.clear()

    def _remove_hooks(self) -> None:
        for handle in self._handles + self._tensor_handles:
            handle.remove()
        self._handles.clear()
        self._tensor_handles.clear()


def record(
    model: nn.Module,
    layers: Iterable[str] | str | None = None,
    *,
    types: type | tuple[type, ...] | None = None,
    backward: bool = False,
    clone: bool = False,
) -> Recording:
    """Record the chosen modules of ``model`` while the ``with`` block runs.

    layers: layer names (``named_modules()`` names, e.g. ``"layer1.0.conv1"``); default: every
        leaf module. An unknown name raises ``UnknownLayerError`` listing close matches.
    types: keep only modules of these types (e.g. ``nn.Conv2d``).
    backward: also record ``grad_input`` / ``grad_output``; run ``backward()`` inside the block.
    clone: copy every tensor when it is recorded (by default records hold lazy copies, which
        share memory with the model's tensors until something writes into it).
    """
    return Recording(model, select_layers(model, layers, types), backward=backward, clone=clone)


def open_recordings(model: nn.Module) -> list[Recording]:
    """The ``record`` blocks whose hooks are on ``model``'s modules: entered and not exited yet
    (a notebook cell that called ``__enter__`` by hand, say). Exit them with ``__exit__(None, None, None)``."""
    found: list[Recording] = []
    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for fn in hooks.values():
                owner = getattr(getattr(fn, "func", None), "__self__", None)  # our hooks are partials of methods
                if isinstance(owner, Recording) and all(owner is not r for r in found):
                    found.append(owner)
    return found
