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
  (mean, std, fraction of zero elements, fraction of dead units) and a fixed-bin histogram.
  No activation or gradient tensor is kept, so memory does not depend on batch or layer size;
  ``keep_last=N`` also caps the number of steps kept (older steps are dropped).
* A step is one call of ``model`` itself (a forward pre-hook on the model counts them).
  With ``only_training=True`` (default) calls made in ``eval()`` mode are ignored, so an
  evaluation pass between epochs does not add rows.
* ``grads=True`` also summarises ``grad_output`` (the gradient w.r.t. each module's output)
  with a tensor hook that the forward hook registers on the output: unlike a full backward
  hook, this keeps working when a later module modifies the output in place (notebook 03).
* Histograms: activations bin ``|x|`` linearly over ``act_range``; gradients bin
  ``log10 |g|`` over ``grad_range``. Values outside a range are clamped into its first or last
  bin (zeros land in a gradient histogram's first bin), so each row sums to the element count.
* "dead unit": a channel (dim 1 of an ``(N, C, ...)`` tensor; a feature of an ``(N, F)``
  tensor) whose values are all zero over the whole batch. "zero": fraction of zero elements.
* Every hook is removed when the ``with`` block ends, also when it raises.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from .layers import get_layer, select_layers

__all__ = ["LayerStats", "StatsTracker", "plot_colorful_dimension", "plot_mean_std", "track_stats"]

#: the scalar statistics kept per step, in this order
COLUMNS = ("mean", "std", "zero", "dead")


@dataclass
class LayerStats:
    """The summaries of one layer's activations (``kind="activation"``) or gradients."""

    name: str
    kind: str
    bins: int
    hist_range: tuple[float, float]
    keep_last: int | None = None
    steps: deque = field(init=False)
    values: deque = field(init=False)  # one (mean, std, zero, dead) tuple per row
    hists: deque = field(init=False)  # one float32 tensor of `bins` counts per row

    def __post_init__(self) -> None:
        self.steps, self.values, self.hists = (deque(maxlen=self.keep_last) for _ in range(3))

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, t: torch.Tensor) -> None:
        """Reduce ``t`` to one row of statistics (called from the hooks)."""
        t = t.detach().float()
        zero = t == 0
        units = zero.reshape(t.shape[0], t.shape[1], -1) if t.dim() >= 2 else zero.reshape(1, -1, 1)
        dead = units.all(dim=2).all(dim=0).float().mean()
        row = torch.stack([t.mean(), t.std() if t.numel() > 1 else t.new_zeros(()), zero.float().mean(), dead])
        lo, hi = self.hist_range
        values = t.abs() if self.kind == "activation" else t.abs().log10()
        hist = torch.histc(values.clamp(lo, hi).nan_to_num(lo), bins=self.bins, min=lo, max=hi)
        self.steps.append(step)
        self.values.append(tuple(row.tolist()))
        self.hists.append(hist)

    def column(self, name: str) -> torch.Tensor:
        """One statistic (``"mean"``, ``"std"``, ``"zero"`` or ``"dead"``) for every row."""
        if name not in COLUMNS:
            raise KeyError(f"unknown statistic {name!r}; choose one of {', '.join(COLUMNS)}")
        return torch.tensor([v[COLUMNS.index(name)] for v in self.values])

    def hist_image(self) -> torch.Tensor:
        """The histograms as a ``(bins, rows)`` tensor: one column per step (bin 0 at row 0)."""
        if not self.hists:
            return torch.zeros(self.bins, 0)
        return torch.stack(list(self.hists), dim=1)


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
        self.activations = {n: LayerStats(n, "activation", bins, act_range, keep_last) for n in modules}
        self.gradients = {n: LayerStats(n, "gradient", bins, grad_range, keep_last) for n in modules} if grads else {}
        self._handles: list = []
        self._tensor_handles: list = []

    def __getitem__(self, name: str) -> LayerStats:
        """The activation statistics of layer ``name`` (gradients: ``tracker.gradients[name]``)."""
        if name not in self.activations:
            get_layer(self.model, name)  # raises UnknownLayerError with close matches
            raise KeyError(f"{name!r} is a layer of the model but was not chosen for tracking")
        return self.activations[name]

    # ----- hooks ---------------------------------------------------------------------------
    def _counting(self) -> bool:
        return self.model.training or not self.only_training

    def _count_step(self, module: nn.Module, args: tuple) -> None:
        if self._counting():
            self.step += 1
            # tensor hooks whose graph is gone (backward done) are dropped: memory stays flat
            self._tensor_handles = [h for h in self._tensor_handles if h.hooks_dict_ref() is not None]

    def _forward_hook(self, name: str, module: nn.Module, args: tuple, output) -> None:
        if not (self._counting() and isinstance(output, torch.Tensor)):
            return
        step = self.step
        self.activations[name].add(step, output)
        if self.grads and output.requires_grad and torch.is_grad_enabled():
            target = self.gradients[name]
            self._tensor_handles.append(output.register_hook(lambda g: target.add(step, g)))

    def __enter__(self) -> StatsTracker:
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
        """A plain-text table: per layer, rows kept, mean and std (first → last row), dead units."""
        table = self._table(kind)
        width = max([len(n) for n in table] + [5])
        lines = [f"{'layer':<{width}}  rows  {'mean first → last':>21}  {'std first → last':>21}  dead (last)"]
        for name, st in table.items():
            if not len(st):
                lines.append(f"{name:<{width}}  {0:>4}  (no {kind} seen)")
                continue
            mean, std = st.column("mean"), st.column("std")
            lines.append(
                f"{name:<{width}}  {len(st):>4}  {_num(mean[0]):>9} → {_num(mean[-1]):>9}  "
                f"{_num(std[0]):>9} → {_num(std[-1]):>9}  {st.column('dead')[-1]:>10.1%}"
            )
        return "\n".join(lines)

    def _table(self, kind: str) -> dict[str, LayerStats]:
        if kind == "activation":
            return self.activations
        if kind == "gradient":
            if not self.grads:
                raise ValueError("gradients were not tracked: use track_stats(..., grads=True)")
            return self.gradients
        raise ValueError(f"kind must be 'activation' or 'gradient', not {kind!r}")


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

    layers / types: which modules, as in ``hooklab.record`` (default: every leaf module).
    grads: also summarise ``grad_output`` of each module (run ``backward()`` inside the block).
    bins, act_range, grad_range: the fixed histogram bins (``|x|`` and ``log10 |g|``).
    only_training: count only calls made while ``model.training`` is True.
    keep_last: keep only the last N rows per layer (default: all; each row is ~bins+4 numbers).
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, not {bins}")
    for label, (lo, hi) in (("act_range", act_range), ("grad_range", grad_range)):
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"{label} must be two finite numbers (low, high) with low < high, not {(lo, hi)}")
    return StatsTracker(model, select_layers(model, layers, types), grads=grads, bins=bins, act_range=act_range,
                        grad_range=grad_range, only_training=only_training, keep_last=keep_last)


def plot_mean_std(tracker: StatsTracker, kind: str = "activation", axes=None, columns=("mean", "std")):
    """One panel per statistic in ``columns`` (default: mean, then std), every tracked layer
    against the step, in one colour per layer; returns the figure.

    axes: matplotlib axes to draw on, one per column (default: a new figure, 4.5 in wide per
    panel). A std of gradients is drawn on a logarithmic axis: their sizes span decades.
    """
    import matplotlib.pyplot as plt

    table = tracker._table(kind)
    if axes is None:
        _, axes = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.2), layout="constrained", squeeze=False)
        axes = axes[0]
    fig = axes[0].figure
    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.9, max(len(table), 1)).tolist())
    for ax, column in zip(axes, columns, strict=True):
        for color, (name, st) in zip(colors, table.items(), strict=False):
            ax.plot(list(st.steps), st.column(column).tolist(), color=color, label=name)
        ax.set_title(f"{kind} {column} per layer")
        ax.set_xlabel("step")
        if column == "std" and kind == "gradient":
            ax.set_yscale("log")
    axes[-1].legend(fontsize="small", title="layer", loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def plot_colorful_dimension(stats: LayerStats, ax=None):
    """The histogram of every step as one image column (log(1 + count)); returns the figure.

    Bright rows near the bottom of an activation plot mean many values near zero.
    """
    import matplotlib.pyplot as plt

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
