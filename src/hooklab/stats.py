"""Per-layer summary statistics of activations (and gradients) while a model trains.

Introduced in notebook 03 (gradient statistics: vanishing or exploding?) and used in
notebook 05 (activation statistics, the "colorful dimension" plot):

    with track_stats(model, types=nn.ReLU, grads=True) as stats:
        train(model)                       # any loop: each forward of ``model`` is one step
    print(stats.summary())
    plot_mean_std(stats)                   # mean and std of every layer against the step
    plot_colorful_dimension(stats["features.1"])

Contract
--------
* Each chosen module gets a forward hook that reduces its output **at once** to a few numbers
  (mean, std, fraction of zero elements, fraction of dead units, fraction of NaN / inf elements)
  and a fixed-bin histogram (``hooklab.layer_stats.LayerStats``). No activation or gradient
  tensor is kept, so memory does not depend on batch or layer size; ``keep_last=N`` also caps
  the number of steps kept (older steps are dropped).
* A step is one call of ``model`` itself (a forward pre-hook on the model counts them).
  With ``only_training=True`` (default) calls made in ``eval()`` mode are ignored, so an
  evaluation pass between epochs does not add rows (the summary says so when nothing else ran).
* ``grads=True`` also summarises ``grad_output`` (the gradient w.r.t. each module's output)
  with a tensor hook that the forward hook registers on the output: unlike a full backward
  hook, this keeps working when a later module modifies the output in place (notebook 03).
* Histograms: activations bin ``|x|`` linearly over ``act_range``; gradients bin
  ``log10 |g|`` over ``grad_range``. Values outside a range are clamped into its first or last
  bin (zeros land in a gradient histogram's first bin), so each row sums to the number of
  finite elements: NaN and inf are left out of the histogram and counted in ``nonfinite``.
* "dead unit": a channel (dim 1 of an ``(N, C, ...)`` tensor; a feature of an ``(N, F)``
  tensor) whose values are all zero over the whole batch. "zero": fraction of zero elements.
* Every hook is removed when the ``with`` block ends, also when it raises. A tracker is used
  in one ``with`` block at a time (entering it again inside its block raises).
* The plots are in ``hooklab.stats_plots`` and importable from here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import nn

from .layer_stats import COLUMNS, LayerStats, LayerTable, check_settings
from .layers import select_layers
from .records import why_no_grad_output
from .stats_plots import plot_colorful_dimension, plot_mean_std

__all__ = [
    "COLUMNS",
    "LayerStats",
    "StatsTracker",
    "plot_colorful_dimension",
    "plot_mean_std",
    "rounding_noise",
    "track_stats",
]


class StatsTracker:
    """Hooks that fill one ``LayerStats`` per chosen layer (and per kind); see module docstring."""

    def __init__(self, model: nn.Module, modules: dict[str, nn.Module], *, grads: bool, bins: int,
                 act_range: tuple[float, float], grad_range: tuple[float, float],
                 only_training: bool, keep_last: int | None):
        self.model = model
        self.modules = modules
        self.grads = grads
        self.only_training = only_training
        self.step = 0  # number of counted calls of the model so far
        self.skipped = 0  # calls not counted: made in eval mode with only_training=True
        self.activations = LayerTable({n: LayerStats(n, "activation", bins, act_range, keep_last) for n in modules},
                                      model)
        grad_stats = {n: LayerStats(n, "gradient", bins, grad_range, keep_last) for n in modules} if grads else {}
        untracked = "" if grads else "gradients were not tracked: track_stats(..., grads=True) records gradients"
        self.gradients = LayerTable(grad_stats, model, untracked)
        self._handles: list = []
        self._tensor_handles: list = []

    def __getitem__(self, name: str) -> LayerStats:
        """The activation statistics of layer ``name`` (gradients: ``tracker.gradients[name]``)."""
        return self.activations[name]

    # ----- hooks ---------------------------------------------------------------------------
    def _counting(self) -> bool:
        return self.model.training or not self.only_training

    def _count_step(self, module: nn.Module, args: tuple) -> None:
        if self._counting():
            self.step += 1
            # tensor hooks whose graph is gone (backward done) are dropped: memory stays flat
            self._tensor_handles = [h for h in self._tensor_handles if h.hooks_dict_ref() is not None]
        else:
            self.skipped += 1

    def _forward_hook(self, name: str, module: nn.Module, args: tuple, output) -> None:
        if not (self._counting() and isinstance(output, torch.Tensor)):
            return
        step = self.step
        self.activations[name].add(step, output)
        if self.grads:
            target = self.gradients[name]
            if output.requires_grad and torch.is_grad_enabled():
                self._tensor_handles.append(output.register_hook(lambda g: target.add(step, g)))
            elif not target.note:
                target.note = why_no_grad_output(output, [output])

    def __enter__(self) -> StatsTracker:
        if self._handles:
            raise RuntimeError("this tracker is already inside a with block; call track_stats(...) again for a "
                               "second one")
        try:
            self._handles.append(self.model.register_forward_pre_hook(self._count_step))
            for name, module in self.modules.items():
                self._handles.append(module.register_forward_hook(functools.partial(self._forward_hook, name)))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles + self._tensor_handles:
            handle.remove()
        self._handles.clear()
        self._tensor_handles.clear()

    # ----- reading -------------------------------------------------------------------------
    def summary(self, kind: str = "activation") -> str:
        """A plain-text table: per layer, rows kept, mean and std (first → last row), dead units.
        A mean below a millionth of its std prints as ``≈0`` (rounding noise).

        Layers without rows are followed by a line that says why, where the tracker knows; a layer
        with NaN or inf values says in how many rows."""
        table = self._table(kind)
        width = max([len(n) for n in table] + [5])
        lines = [f"{'layer':<{width}}  rows  {'mean first → last':>23}  {'std first → last':>23}  dead (last)"]
        empty: dict[str, list[str]] = {}
        for name, st in table.items():
            if not len(st):
                lines.append(f"{name:<{width}}  {0:>4}  (no {kind} seen)")
                empty.setdefault(self._why_empty(name, kind), []).append(name)
                continue
            mean, std = st.column("mean"), st.column("std")
            bad = sum(1 for f in st.nonfinite if f)
            lines.append(
                f"{name:<{width}}  {len(st):>4}  {_mean(mean[0], std[0]):>10} → {_mean(mean[-1], std[-1]):>10}  "
                f"{_num(std[0]):>10} → {_num(std[-1]):>10}  {st.column('dead')[-1]:>10.1%}"
                + (f"  NaN/inf in {bad} row{'s' if bad > 1 else ''}" if bad else "")
            )
        for reason, names in empty.items():
            where = "any layer" if len(names) == len(table) else ", ".join(names)
            lines.append(f"no {kind} seen in {where}: {reason}")
        return "\n".join(lines)

    def _why_empty(self, name: str, kind: str) -> str:
        if self.step == 0 and self.skipped:
            times = "once" if self.skipped == 1 else f"{self.skipped} times"
            return (f"the model ran {times}, in eval mode, and only_training=True counts training calls only: "
                    "call model.train(), or use track_stats(..., only_training=False)")
        if self.step == 0:
            return "the model was not called inside the with block"
        if kind == "gradient" and len(self.activations[name]):
            return self.gradients[name].note or "call backward() inside the with block"
        return "the layer did not run while the model was training, or its output is not a tensor"

    def _table(self, kind: str) -> dict[str, LayerStats]:
        if kind == "activation":
            return self.activations
        if kind == "gradient":
            if not self.grads:
                raise ValueError("gradients were not tracked: use track_stats(..., grads=True)")
            return self.gradients
        raise ValueError(f"kind must be 'activation' or 'gradient', not {kind!r}")


def rounding_noise(mean: float, std: float) -> bool:
    """Whether a mean is below a millionth of its std: then it is the rounding left of a sum that
    cancels exactly (the gradient at the logits of a softmax cross-entropy sums to zero over the
    classes, batch norm in training mode gives each channel mean zero), sign included, and its
    digits change with the CPU's kernels. Tables print it as ``≈0``."""
    return abs(float(mean)) < 1e-6 * abs(float(std))


def _mean(mean: float, std: float) -> str:
    return "≈0" if rounding_noise(mean, std) else _num(mean)


def _num(x: torch.Tensor | float) -> str:
    """4 significant digits, in scientific notation when very small or large."""
    x = float(x)
    return f"{x:.3e}" if x != 0 and not 1e-3 <= abs(x) < 1e4 else f"{x:.4f}"


def track_stats(
    model: nn.Module,
    layers: Iterable[str] | str | None = None,
    *,
    types: type | tuple[type, ...] | None = None,
    grads: bool = False,
    bins: int = 40,
    act_range: tuple[float, float] = (0.0, 10.0),
    grad_range: tuple[float, float] = (-10.0, 0.0),
    only_training: bool = True,
    keep_last: int | None = None,
) -> StatsTracker:
    """Collect per-layer, per-step statistics while the ``with`` block runs.

    layers / types: which modules, as in ``hooklab.record`` (default: every leaf module); a choice
        that selects nothing raises ``ValueError``.
    grads: also summarise ``grad_output`` of each module (run ``backward()`` inside the block).
    bins, act_range, grad_range: the fixed histogram bins (``|x|`` and ``log10 |g|``).
    only_training: count only calls made while ``model.training`` is True.
    keep_last: keep only the last N >= 1 rows per layer (default: all; each row is ~bins+5 numbers).
    """
    bins, act_range, grad_range, keep_last = check_settings(bins, act_range, grad_range, keep_last)
    return StatsTracker(model, select_layers(model, layers, types), grads=grads, bins=bins, act_range=act_range,
                        grad_range=grad_range, only_training=only_training, keep_last=keep_last)
