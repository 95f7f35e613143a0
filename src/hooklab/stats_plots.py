"""Plots of ``hooklab.stats``: statistics per layer against the step, and the "colorful dimension".

Both are also importable from ``hooklab.stats`` (notebooks 03 and 05 import them from there).
Every argument is checked before a figure is made, so a bad call leaves no figure open.
"""

from __future__ import annotations

from typing import Any

import torch

from .layer_stats import COLUMNS, LayerStats

__all__ = ["plot_colorful_dimension", "plot_mean_std"]


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

    if not hasattr(tracker, "_table"):
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
