"""Plots the course draws more than once. Every function takes ``ax=None`` and returns the figure.

``feature_grid`` (introduced in notebook 02) tiles the channels of one layer's output into a
grid of small images, the picture people mean by "feature maps":

    with hooklab.record(model, types=nn.Conv2d) as rec:
        model(photo)
    fig = feature_grid(rec["conv1"], title="conv1")

The tiles are drawn as one image on one ``Axes`` (fast, and two grids fit side by side in one
figure). Each channel is scaled to [0, 1] on its own, as ``imshow`` would do for a single map,
so a channel with small values is as visible as one with large values. That grid of values is
``tile_channels``, the course's one tiling: ``hooklab.widgets.LayerExplorer`` paints it too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .checks import check_index, whole_number

__all__ = ["draw_signed", "feature_grid"]


def _maps(value: Any, sample: int) -> torch.Tensor:
    """A record, an ``(N, C, H, W)`` or a ``(C, H, W)`` tensor -> ``(C, H, W)`` float tensor."""
    if hasattr(value, "output") and not isinstance(value, torch.Tensor):  # a hooklab Record
        value = value.output
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor or a hooklab Record, got {type(value).__name__}")
    if value.dim() == 4:
        value = value[check_index(sample, value.shape[0], "sample", "items in the batch")]
    if value.dim() != 3:
        raise ValueError(f"feature maps must be (N, C, H, W) or (C, H, W), got shape {tuple(value.shape)}")
    return value.detach().cpu().float()


def tile_channels(
    maps: torch.Tensor, channels: int | None = 64, ncols: int = 8, pad: int | None = None, signed: bool = False
) -> np.ndarray:
    """Tile the first ``channels`` maps of a ``(C, H, W)`` tensor into one 2-D array.

    Each map is scaled to [0, 1] on its own: from its minimum to its maximum (a constant map
    becomes 0), or with ``signed=True`` (gradients) divided by its largest |value| and mapped
    from [-1, 1] to [0, 1], so that zero is 0.5 in every tile. The ``pad``-pixel gaps between
    tiles (default: 1/16 of a tile's side, at least 1) and the unused tiles of the last row are
    NaN, which ``imshow`` leaves blank. NaN and inf values stay NaN (blank pixels; a map of them
    only is a blank tile) and are left out of their map's scaling.
    """
    if not isinstance(maps, torch.Tensor):
        raise TypeError(f"expected a (C, H, W) tensor, got {type(maps).__name__}")
    if maps.dim() != 3:
        raise ValueError(f"expected (C, H, W), got shape {tuple(maps.shape)}")
    if 0 in maps.shape[1:]:
        raise ValueError(f"the maps are empty ({maps.shape[1]}×{maps.shape[2]} pixels): there is nothing to draw")
    channels = whole_number("channels", channels, 1, none_ok=True)
    ncols = whole_number("ncols", ncols, 1)
    pad = whole_number("pad", pad, 0, none_ok=True)
    count = maps.shape[0] if channels is None else min(channels, maps.shape[0])
    if count < 1:
        raise ValueError("the maps have no channels (C = 0): there is nothing to draw")
    maps = maps[:count].detach().cpu().double()
    finite = maps.isfinite()
    bad = not bool(finite.all())
    if bad:
        maps = maps.where(finite, torch.nan)
    if signed:
        bound = (maps.abs().nan_to_num(0.0) if bad else maps.abs()).amax(dim=(1, 2), keepdim=True)
        scaled = ((torch.where(bound > 0, maps / bound.clamp_min(1e-300), torch.zeros_like(maps)) + 1) / 2).numpy()
    else:
        low = maps.nan_to_num(torch.inf) if bad else maps
        high = maps.nan_to_num(-torch.inf) if bad else maps
        low = low.amin(dim=(1, 2), keepdim=True)
        span = high.amax(dim=(1, 2), keepdim=True) - low
        scaled = torch.where(span > 0, (maps - low) / span.clamp_min(1e-300), torch.zeros_like(maps)).numpy()
    if bad:
        scaled[~finite.numpy()] = np.nan
    h, w = scaled.shape[1:]
    pad = max(1, min(h, w) // 16) if pad is None else pad
    ncols = min(ncols, count)
    nrows = math.ceil(count / ncols)
    # every tile with its gap below and to its right, then rows of tiles side by side: one reshape
    padded = np.full((nrows * ncols, h + pad, w + pad), np.nan)
    padded[:count, :h, :w] = scaled
    grid = padded.reshape(nrows, ncols, h + pad, w + pad).transpose(0, 2, 1, 3)
    grid = grid.reshape(nrows * (h + pad), ncols * (w + pad))
    return np.ascontiguousarray(grid[: nrows * (h + pad) - pad, : ncols * (w + pad) - pad])


def feature_grid(
    maps: Any,
    ax=None,
    *,
    channels: int | None = 64,
    ncols: int = 8,
    sample: int = 0,
    title: str | None = None,
    cmap: str = "viridis",
):
    """Draw the channels of one layer's output as a grid of tiles; return the figure.

    maps: a hooklab ``Record`` (its ``output`` is drawn), an ``(N, C, H, W)`` tensor (item
        ``sample`` of the batch is drawn) or a ``(C, H, W)`` tensor.
    ax: the ``Axes`` to draw on; a new 6×6-inch figure when None.
    channels: how many channels, from the first (None: all); ncols: tiles per row.
    title: default ``"C channels, H×W"`` (what is shown of how many). When some shown channels
        hold NaN or inf values (blank pixels), a second line of the title says how many.
    """
    import matplotlib.pyplot as plt

    tensor = _maps(maps, sample)
    grid = tile_channels(tensor, channels=channels, ncols=ncols)
    shown = tensor.shape[0] if channels is None else min(channels, tensor.shape[0])
    c, h, w = tensor.shape
    title = title if title is not None else f"{shown} of {c} channels, {h}×{w}"
    nonfinite = int((~tensor[:shown].isfinite()).flatten(1).any(dim=1).sum())
    if nonfinite:
        title += f"\n{nonfinite} with NaN/inf values (blank pixels)"
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 6))
    else:
        fig = ax.figure
    colormap = plt.get_cmap(cmap).with_extremes(bad="white")
    ax.imshow(grid, cmap=colormap, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def draw_signed(values: Any, ax=None, **imshow_kwargs):
    """Draw a 2-D map of signed values (a gradient) with zero in white: ``RdBu_r`` from -max|value|
    (blue) to +max|value| (red); NaN and inf values are grey. Extra keywords go to ``imshow`` and
    may override ``cmap``, ``vmin`` and ``vmax``. Returns the figure.

    values: an ``(H, W)`` tensor or array; for one ``(1, H, W)`` channel pass ``values[0]``.
    """
    import matplotlib.pyplot as plt

    if isinstance(values, np.ndarray):
        values = torch.from_numpy(values)
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"expected an (H, W) tensor, got {type(values).__name__}")
    if values.dim() != 2:
        hint = ": pass values[0]" if values.dim() == 3 and values.shape[0] == 1 else ""
        raise ValueError(f"draw_signed draws one (H, W) map, got shape {tuple(values.shape)}{hint}")
    values = values.detach().cpu()
    finite = values[values.isfinite()]
    bound = float(finite.abs().max()) if finite.numel() else 0.0
    bound = bound or 1.0
    options = {"cmap": plt.get_cmap("RdBu_r").with_extremes(bad="0.6"), "vmin": -bound, "vmax": bound}
    options.update(imshow_kwargs)
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(values.numpy(), **options)
    return ax.figure
