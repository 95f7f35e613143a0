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
  and a fixed-bin histogram (``LayerStats``). No activation or gradient
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
* Plots: ``plot_mean_std(tracker)`` (statistics per layer against the step) and
  ``plot_colorful_dimension(stats)`` (one layer's histograms, one column per step); every argument
  is checked before a figure is made, so a bad call leaves no figure open.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from .checks import whole_number
from .hooks import Hooks
from .layers import get_layer, select_layers
from .recording import why_no_grad_output

__all__ = ["plot_colorful_dimension", "plot_mean_std", "track_stats"]


# ----- one layer's rows ---------------------------------------------------------------------------
#: the scalar statistics of a row: ``values`` holds the first four in this order, ``nonfinite`` the last
COLUMNS = ("mean", "std", "zero", "dead", "nonfinite")


class _Row(NamedTuple):
    """One step's summary: everything ``LayerStats.add`` computes from one tensor."""

    step: int
    values: tuple[float, float, float, float]  # mean, std, zero, dead
    hist: torch.Tensor  # float32, `bins` counts
    nonfinite: float  # fraction of NaN / inf elements


@dataclass
class LayerStats:
    """The summaries of one layer's activations (``kind="activation"``) or gradients.

    ``nonfinite`` is the fraction of NaN or ±inf elements of each row: mean and std are then NaN
    or inf too, and the histogram counts only the finite elements. ``note`` says why no row was
    added where the tracker knows (for gradients: why the output needed none). ``steps``,
    ``values``, ``hists`` and ``nonfinite`` are read-only tuples with one entry per row, all read
    from one deque of rows, so they always line up.
    """

    name: str
    kind: str
    bins: int
    hist_range: tuple[float, float]
    keep_last: int | None = None
    note: str = ""
    # one _Row per step, the oldest dropped beyond keep_last: a step's numbers stay together
    _rows: deque = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rows = deque(maxlen=self.keep_last)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def steps(self) -> tuple[int, ...]:
        """The step of each row."""
        return tuple(r.step for r in self._rows)

    @property
    def values(self) -> tuple[tuple[float, float, float, float], ...]:
        """One ``(mean, std, zero, dead)`` tuple per row."""
        return tuple(r.values for r in self._rows)

    @property
    def hists(self) -> tuple[torch.Tensor, ...]:
        """One float32 tensor of ``bins`` counts per row."""
        return tuple(r.hist for r in self._rows)

    @property
    def nonfinite(self) -> tuple[float, ...]:
        """The fraction of NaN / inf elements of each row."""
        return tuple(r.nonfinite for r in self._rows)

    def add(self, step: int, t: torch.Tensor) -> None:
        """Reduce ``t`` to one row of statistics (called from the hooks)."""
        t = t.detach().float()
        zero = t == 0
        units = zero.reshape(t.shape[0], t.shape[1], -1) if t.dim() >= 2 else zero.reshape(1, -1, 1)
        dead = units.all(dim=2).all(dim=0).float().mean()
        row = torch.stack([t.mean(), t.std() if t.numel() > 1 else t.new_zeros(()), zero.float().mean(), dead])
        values = tuple(row.tolist())
        nonfinite = 0.0
        if not math.isfinite(values[0]):  # a NaN or inf element makes the mean non-finite
            finite = t.isfinite()
            nonfinite = 1.0 - finite.float().mean().item()
            t = t[finite]  # the histogram counts the finite elements only
        lo, hi = self.hist_range
        magnitudes = t.abs() if self.kind == "activation" else t.abs().log10()
        hist = torch.histc(magnitudes.clamp(lo, hi), bins=self.bins, min=lo, max=hi)
        self._rows.append(_Row(step, values, hist, nonfinite))

    def column(self, name: str) -> torch.Tensor:
        """One statistic (``"mean"``, ``"std"``, ``"zero"``, ``"dead"`` or ``"nonfinite"``) for every row."""
        if name not in COLUMNS:
            raise KeyError(f"unknown statistic {name!r}; choose one of {', '.join(COLUMNS)}")
        if name == "nonfinite":
            return torch.tensor([r.nonfinite for r in self._rows])
        i = COLUMNS.index(name)
        return torch.tensor([r.values[i] for r in self._rows])

    def hist_image(self) -> torch.Tensor:
        """The histograms as a ``(bins, rows)`` tensor: one column per step (bin 0 at row 0)."""
        if not self._rows:
            return torch.zeros(self.bins, 0)
        return torch.stack([r.hist for r in self._rows], dim=1)


class LayerTable(dict):
    """``{layer name: LayerStats}``; a missing name raises an error that says why it is missing:
    ``untracked`` when given (this kind was not tracked), else the close matches of an unknown
    layer, or that the layer was not chosen."""

    def __init__(self, items: dict, model: nn.Module, untracked: str = ""):
        super().__init__(items)
        self._model = model
        self._untracked = untracked

    def __missing__(self, name):
        if self._untracked:
            raise KeyError(self._untracked)
        get_layer(self._model, name)  # raises UnknownLayerError with close matches
        raise KeyError(f"{name!r} is a layer of the model but was not chosen for tracking")


def _range(label: str, value) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{label} must be two numbers (low, high), not {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"{label} must be two finite numbers (low, high) with low < high, not {(lo, hi)}")
    return lo, hi


def check_settings(bins, act_range, grad_range, keep_last) -> tuple:
    """``track_stats``'s histogram and row settings, checked (clear errors) and normalised."""
    bins = whole_number("bins", bins, 1)
    keep_last = whole_number("keep_last", keep_last, 1, none_ok=True)
    return bins, _range("act_range", act_range), _range("grad_range", grad_range), keep_last


# ----- the tracker -------------------------------------------------------------------------------
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
        self._hooks = Hooks()  # the module hooks, for the whole block
        self._grad_hooks = Hooks()  # the tensor hooks on outputs, until their backward has run

    def __getitem__(self, name: str) -> LayerStats:
        """The activation statistics of layer ``name`` (gradients: ``tracker.gradients[name]``)."""
        return self.activations[name]

    # ----- hooks ---------------------------------------------------------------------------
    def _counting(self) -> bool:
        return self.model.training or not self.only_training

    def _count_step(self, module: nn.Module, args: tuple) -> None:
        if self._counting():
            self.step += 1
            self._grad_hooks.drop_gone()  # tensor hooks whose tensor is gone (backward done): memory stays flat
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
                self._grad_hooks.add(output.register_hook(lambda g: target.add(step, g)))
            elif not target.note:
                target.note = why_no_grad_output(output, [output])

    def __enter__(self) -> StatsTracker:
        if self._hooks:
            raise RuntimeError("this tracker is already inside a with block; call track_stats(...) again for a "
                               "second one")
        try:
            self._hooks.add(self.model.register_forward_pre_hook(self._count_step))
            for name, module in self.modules.items():
                self._hooks.add(module.register_forward_hook(functools.partial(self._forward_hook, name)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._hooks.remove()
        self._grad_hooks.remove()

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


# ----- plots -----------------------------------------------------------------------------------------
def _columns(columns: Any) -> tuple[str, ...]:
    chosen = (columns,) if isinstance(columns, str) else columns
    try:
        chosen = tuple(chosen)
    except TypeError:
        raise TypeError(f"columns is a tuple of statistic names such as ('mean', 'std'), not {columns!r}") from None
    unknown = [c for c in chosen if c not in COLUMNS]
    if unknown or not chosen:
        what = f"unknown statistic {unknown[0]!r}" if unknown else "no statistic given"
        raise ValueError(f"{what} in columns; choose from {', '.join(COLUMNS)}")
    return chosen


def _axes_list(axes: Any, count: int) -> list:
    from matplotlib.axes import Axes

    found = [axes] if isinstance(axes, Axes) else list(getattr(axes, "flat", axes))
    if not all(isinstance(ax, Axes) for ax in found):
        raise TypeError(f"axes must be matplotlib Axes (one per statistic in columns), not {axes!r}")
    if len(found) != count:
        raise ValueError(f"got {len(found)} Axes for {count} statistics in columns: pass one Axes per statistic")
    return found


def plot_mean_std(tracker, kind: str = "activation", axes=None, columns=("mean", "std")):
    """One panel per statistic in ``columns`` (default: mean, then std; a single name is one panel),
    every tracked layer against the step, in one colour per layer; returns the figure.

    axes: matplotlib axes to draw on, one per column (a single ``Axes`` for a single column; default:
    a new figure, 4.5 in wide per panel). A std of gradients is drawn on a logarithmic axis: their
    sizes span decades (a linear one when no std is positive, all gradients being zero).
    """
    import matplotlib.pyplot as plt

    if not isinstance(tracker, StatsTracker):
        raise TypeError(f"expected the tracker of track_stats(...), got {type(tracker).__name__}")
    table = tracker._table(kind)
    columns = _columns(columns)
    if axes is None:
        _, grid = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.2), layout="constrained", squeeze=False)
        axes = grid[0]
    else:
        axes = _axes_list(axes, len(columns))
    fig = axes[0].figure
    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.9, max(len(table), 1)).tolist())
    for ax, column in zip(axes, columns, strict=True):
        positive = False
        for color, (name, st) in zip(colors, table.items(), strict=False):
            values = st.column(column)
            positive = positive or bool((values > 0).any())
            ax.plot(list(st.steps), values.tolist(), color=color, label=name)
        ax.set_title(f"{kind} {column} per layer")
        ax.set_xlabel("step")
        if column == "std" and kind == "gradient" and positive:
            ax.set_yscale("log")
    axes[-1].legend(fontsize="small", title="layer", loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def plot_colorful_dimension(stats: LayerStats, ax=None):
    """The histogram of every step as one image column (log(1 + count)); returns the figure.

    Bright rows near the bottom of an activation plot mean many values near zero.
    """
    import matplotlib.pyplot as plt

    if not isinstance(stats, LayerStats):
        raise TypeError(f"expected one layer's statistics such as stats['features.1'], got {type(stats).__name__}")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3), layout="constrained")
    image = stats.hist_image().log1p()
    steps = list(stats.steps) or [0]
    lo, hi = stats.hist_range
    ax.imshow(image.numpy(), origin="lower", aspect="auto", cmap="viridis",
              extent=(steps[0] - 0.5, steps[-1] + 0.5, lo, hi))
    ax.set_title(f"{stats.name}: histogram of {'|x|' if stats.kind == 'activation' else 'log10 |grad|'} per step")
    ax.set_xlabel("step")
    ax.set_ylabel("|x|" if stats.kind == "activation" else "log10 |grad|")
    return ax.figure
