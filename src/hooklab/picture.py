"""Pictures for the explorers, drawn straight from arrays to PNG: no matplotlib figure per redraw.

A widget that redraws on every slider move needs a picture in a few milliseconds; a matplotlib
figure takes tens. Here values become palette indices (120 levels of ``viridis`` or ``RdBu_r``),
tiles are laid out with one reshape, and Pillow pastes, frames, labels and encodes an 8-bit
palette PNG (a few times faster to encode than RGB, and half the bytes).

* ``colours(values, cmap, low, high)``: an ``(H, W)`` tensor -> ``(H, W)`` palette indices;
  values outside ``[low, high]`` are clipped, NaN and inf are grey.
* ``shrink(values, side)``: average blocks of a map until it is at most ``side`` pixels a side.
* ``tiles(maps, ncols, signed)``: the channels of a ``(C, H, W)`` tensor as one 2-D grid, each
  scaled on its own (as ``hooklab.plots.tile_channels``), the gaps NaN; maps larger than
  ``TILE`` pixels a side are averaged down first.
* ``figure_png(fig)``: a matplotlib figure as a palette PNG (256 colours picked for it): about a
  third of the bytes of ``savefig``'s RGBA PNG, and quicker to make.
* ``Canvas``: a white picture to paste panels (enlarged to a size, as flat blocks), write text
  and draw frames on; ``png()`` encodes it. ``Picture`` holds the PNG bytes and shows itself in
  a notebook.
"""

from __future__ import annotations

import functools
import io
import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["figure_png", "tiles"]

TILE = 32  # tiles are averaged down to at most this many pixels a side
LEVELS = 120  # colours per colour map
GREY, WHITE, BLACK, RED, DARK, LIGHT = range(2 * LEVELS, 2 * LEVELS + 6)  # palette indices
_CMAPS = {"viridis": 0, "RdBu_r": LEVELS}


@functools.cache
def _palette() -> list[int]:
    import matplotlib

    ramps = [matplotlib.colormaps[name](np.linspace(0, 1, LEVELS))[:, :3] for name in _CMAPS]
    fixed = np.array([[153, 153, 153], [255, 255, 255], [0, 0, 0], [220, 0, 0], [90, 90, 90], [170, 170, 170]])
    table = np.vstack([*(np.round(r * 255) for r in ramps), fixed]).astype(np.uint8)
    return table.flatten().tolist()


def colours(values: torch.Tensor, cmap: str, low: float, high: float) -> np.ndarray:
    """``(H, W)`` values -> ``(H, W)`` uint8 palette indices of ``cmap`` from ``low`` to ``high``."""
    if cmap not in _CMAPS:
        raise ValueError(f"cmap must be one of {', '.join(_CMAPS)}, not {cmap!r}")
    values = values.detach().float()
    span = high - low if high > low else 1.0
    index = ((values - low) * ((LEVELS - 1) / span)).clamp(0, LEVELS - 1).round() + _CMAPS[cmap]
    return torch.where(values.isfinite(), index, torch.full_like(index, GREY)).to(torch.uint8).numpy()


def shrink(values: torch.Tensor, side: int) -> torch.Tensor:
    """An ``(H, W)`` or ``(C, H, W)`` map averaged over blocks until it is at most ``side`` a side."""
    if max(values.shape[-2:]) <= side:
        return values
    factor = math.ceil(max(values.shape[-2:]) / side)
    batch = values.detach().float().reshape(-1, 1, *values.shape[-2:])
    pooled = F.avg_pool2d(batch, factor, ceil_mode=True)
    return pooled.reshape(*values.shape[:-2], *pooled.shape[-2:])


def tiles(maps: torch.Tensor, ncols: int = 8, signed: bool = False) -> tuple[np.ndarray, int, int]:
    """The ``(C, H, W)`` maps as one grid of values in [0, 1] with 1-pixel NaN gaps.

    Each map is scaled on its own: from its minimum to its maximum (a constant map is 0), or with
    ``signed`` divided by its largest |value| and moved from [-1, 1] to [0, 1] (zero is 0.5).
    Maps larger than ``TILE`` pixels a side are averaged down first. Returns the grid and the
    side lengths ``(h, w)`` of one tile in it.
    """
    maps = shrink(maps.detach().float(), TILE)
    finite = maps.isfinite()
    clean = maps.where(finite, torch.zeros(()))
    if signed:
        bound = clean.abs().amax(dim=(1, 2), keepdim=True)
        scaled = torch.where(bound > 0, clean / bound.clamp_min(1e-30), torch.zeros(())) * 0.5 + 0.5
    else:
        low = maps.where(finite, torch.tensor(torch.inf)).amin(dim=(1, 2), keepdim=True)
        high = maps.where(finite, torch.tensor(-torch.inf)).amax(dim=(1, 2), keepdim=True)
        span = high - low
        scaled = torch.where(span > 0, (clean - low) / span.where(span > 0, torch.ones(())), torch.zeros(()))
    scaled = scaled.where(finite, torch.tensor(torch.nan))
    count, h, w = scaled.shape
    ncols = min(ncols, count)
    nrows = math.ceil(count / ncols)
    padded = torch.full((nrows * ncols, h + 1, w + 1), torch.nan)
    padded[:count, :h, :w] = scaled
    grid = padded.view(nrows, ncols, h + 1, w + 1).permute(0, 2, 1, 3).reshape(nrows * (h + 1), ncols * (w + 1))
    return grid[:-1, :-1].numpy(), h, w


def colour_bar(cmap: str, width: int, height: int = 8) -> np.ndarray:
    """A horizontal ``(height, width)`` strip of the colour map's palette indices, low on the left."""
    return np.broadcast_to(colours(torch.linspace(0, 1, width), cmap, 0.0, 1.0), (height, width))


def figure_png(fig) -> bytes:
    """Draw a matplotlib figure with Agg and encode it as an 8-bit palette PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(256, method=Image.Quantize.FASTOCTREE).save(buffer, format="png", compress_level=3)
    return buffer.getvalue()


@functools.cache
def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


class Picture:
    """PNG bytes that a notebook shows as an image (``_repr_png_``); ``size`` is (width, height)."""

    def __init__(self, png: bytes, size: tuple[int, int]):
        self.png, self.size = png, size

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return f"<Picture {self.size[0]}x{self.size[1]} PNG>"


class Canvas:
    """A white palette picture of ``width`` × ``height`` pixels to paste panels and write text on.
    Colours are palette indices: ``colours(...)`` output, or ``GREY``, ``BLACK``, ``RED``, ... ."""

    def __init__(self, width: int, height: int):
        from PIL import Image, ImageDraw

        self.image = Image.new("P", (width, height), WHITE)
        self.image.putpalette(_palette())
        self.draw = ImageDraw.Draw(self.image)
        self.draw.fontmode = "1"  # no anti-aliasing: a palette has no in-between colours

    def paste(self, indices: np.ndarray, x: int, y: int, size: tuple[int, int] | None = None) -> tuple[int, int]:
        """Paste an ``(H, W)`` array of palette indices at ``(x, y)``, enlarged to ``size``
        (width, height) as flat blocks (shrink the values first: ``shrink``). Returns its size."""
        from PIL import Image

        panel = Image.fromarray(np.ascontiguousarray(indices, dtype=np.uint8), mode="L")
        if size is not None and size != panel.size:
            panel = panel.resize(size, Image.Resampling.NEAREST)
        self.image.paste(panel, (x, y))
        return panel.size

    def text(self, x: int, y: int, text: str, size: int = 12, fill: int = BLACK, anchor: str = "la") -> None:
        self.draw.text((x, y), text, fill=fill, font=_font(size), anchor=anchor)

    def frame(self, box: tuple[float, float, float, float], colour: int = RED, width: int = 2) -> None:
        self.draw.rectangle(box, outline=colour, width=width)

    def cross(self, box: tuple[float, float, float, float], colour: int = LIGHT) -> None:
        """Two diagonals, a light line on a black one, so they show on pale and dark tiles alike."""
        x0, y0, x1, y1 = box
        for fill, width in ((BLACK, 3), (colour, 1)):
            self.draw.line((x0, y0, x1, y1), fill=fill, width=width)
            self.draw.line((x0, y1, x1, y0), fill=fill, width=width)

    def png(self) -> Picture:
        buffer = io.BytesIO()
        self.image.save(buffer, format="png", compress_level=1)
        return Picture(buffer.getvalue(), self.image.size)
