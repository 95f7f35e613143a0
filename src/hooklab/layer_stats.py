"""One layer's summaries in ``hooklab.stats``: the rows of statistics and histograms, one per step.

Each row reduces one activation (or gradient) tensor at once to a few numbers (mean, std, fraction
of zero elements, fraction of dead units, fraction of non-finite elements) and a fixed-bin
histogram; no tensor is kept. See ``hooklab.stats`` for how the rows are collected. Also here:
``LayerTable`` (the per-layer dicts, with errors that say why a name is missing) and the checks
of ``track_stats``'s settings.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from .checks import whole_number
from .layers import get_layer

__all__ = ["COLUMNS", "LayerStats", "LayerTable", "check_settings"]

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
