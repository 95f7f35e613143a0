"""Pictures for the explorers, drawn straight from arrays to PNG: no matplotlib figure per redraw.

A widget that redraws on every slider move needs a picture in a few milliseconds; a matplotlib
figure takes tens to hundreds. Here values become colours by table look-up, and Pillow pastes,
frames, labels and encodes the PNG. The layer explorer paints palette indices (120 levels of
``viridis`` or ``RdBu_r``: an 8-bit palette PNG, a few times faster to encode than RGB, and half
the bytes); the Grad-CAM picker lays maps over photos, so it paints RGB colours and the PNG gets
the 256 colours picked for it.

* ``colours(values, cmap, low, high)``: an ``(H, W)`` tensor -> ``(H, W)`` palette indices;
  values outside ``[low, high]`` are clipped, NaN and inf are grey.
* ``rgb(values, cmap, low, high)``: the same as ``(H, W, 3)`` RGB bytes, from any matplotlib
  colour map (256 levels).
* ``shrink(values, side)``: average blocks of a map until it is at most ``side`` pixels a side.
* ``fit(values, size)``: a map brought to ``size`` pixels: averaged over blocks where it is larger
  (what matplotlib's anti-aliasing does), enlarged as flat blocks where it is smaller.
* ``Canvas``: a white picture to paste panels (enlarged to a size, as flat blocks), write text
  and draw frames and lines on (``rgb=True``: RGB, for photos); ``png()`` encodes it. ``Picture``
  holds the PNG bytes and shows itself in a notebook.

The channel grids come from ``hooklab.plots.tile_channels``, the one tiling the course has.
"""

from __future__ import annotations

import functools
import io
import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["Canvas", "Picture", "colours", "fit", "rgb", "shrink"]

LEVELS = 120  # colours per colour map
GREY, WHITE, BLACK, RED, DARK, LIGHT, CYAN = range(2 * LEVELS, 2 * LEVELS + 7)  # palette indices
_CMAPS = {"viridis": 0, "RdBu_r": LEVELS}


@functools.cache
def _palette() -> list[int]:
    import matplotlib

    ramps = [matplotlib.colormaps[name](np.linspace(0, 1, LEVELS))[:, :3] for name in _CMAPS]
    fixed = np.array([[153, 153, 153], [255, 255, 255], [0, 0, 0], [220, 0, 0], [90, 90, 90], [170, 170, 170],
                      [0, 255, 255]])
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


@functools.cache
def _ramp(cmap: str) -> torch.Tensor:
    """256 RGB bytes of a matplotlib colour map, then grey for NaN and inf."""
    import matplotlib

    table = np.round(matplotlib.colormaps[cmap](np.linspace(0, 1, 256))[:, :3] * 255)
    return torch.from_numpy(np.vstack([table, [153, 153, 153]]).astype(np.uint8))


def rgb(values: torch.Tensor, cmap: str, low: float, high: float) -> np.ndarray:
    """``(H, W)`` values -> ``(H, W, 3)`` RGB bytes of the matplotlib colour map ``cmap`` from ``low``
    to ``high`` (256 levels; values outside are clipped, NaN and inf are grey)."""
    values = values.detach().float()
    span = high - low if high > low else 1.0
    index = ((values - low) * (255 / span)).clamp(0, 255).round().long()
    index = torch.where(values.isfinite(), index, torch.full_like(index, 256))
    return _ramp(cmap)[index].numpy()


def fit(values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """An ``(H, W)`` or ``(C, H, W)`` map brought to ``size`` = (width, height): each side averaged
    over blocks where the map is larger (``area``), cells repeated as flat blocks where it is
    smaller (``nearest``)."""
    width, height = size
    values = values.detach().float()
    if values.shape[-2:] == (height, width):
        return values
    mode = "area" if values.shape[-2] > height or values.shape[-1] > width else "nearest"
    batch = values.reshape(-1, 1, *values.shape[-2:])
    return F.interpolate(batch, size=(height, width), mode=mode).reshape(*values.shape[:-2], height, width)


def shrink(values: torch.Tensor, side: int) -> torch.Tensor:
    """An ``(H, W)`` or ``(C, H, W)`` map averaged over blocks until it is at most ``side`` a side."""
    if max(values.shape[-2:]) <= side:
        return values
    factor = math.ceil(max(values.shape[-2:]) / side)
    batch = values.detach().float().reshape(-1, 1, *values.shape[-2:])
    pooled = F.avg_pool2d(batch, factor, ceil_mode=True)
    return pooled.reshape(*values.shape[:-2], *pooled.shape[-2:])


def colour_bar(cmap: str, width: int, height: int = 8) -> np.ndarray:
    """A horizontal ``(height, width)`` strip of the colour map's palette indices, low on the left."""
    return np.broadcast_to(colours(torch.linspace(0, 1, width), cmap, 0.0, 1.0), (height, width))


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
    """A white picture of ``width`` × ``height`` pixels to paste panels, write text and draw on.

    Colours are palette indices: ``colours(...)`` output, or ``GREY``, ``BLACK``, ``RED``, ... .
    With ``rgb=True`` the picture is RGB: it also takes ``(H, W, 3)`` RGB bytes (``rgb(...)``,
    photos), and ``png()`` encodes it with the 256 colours picked for it.
    """

    def __init__(self, width: int, height: int, *, rgb: bool = False):
        from PIL import Image, ImageDraw

        self.rgb = rgb
        if rgb:
            self.image = Image.new("RGB", (width, height), self._fill(WHITE))
        else:
            self.image = Image.new("P", (width, height), WHITE)
            self.image.putpalette(_palette())
        self.draw = ImageDraw.Draw(self.image)
        self.draw.fontmode = "1"  # no anti-aliasing: a palette has no in-between colours

    def _fill(self, colour: int):
        return tuple(_palette()[3 * colour : 3 * colour + 3]) if self.rgb else colour

    def paste(self, pixels: np.ndarray, x: int, y: int, size: tuple[int, int] | None = None) -> tuple[int, int]:
        """Paste an ``(H, W)`` array of palette indices (or, on an RGB canvas, ``(H, W, 3)`` RGB bytes)
        at ``(x, y)``, enlarged to ``size`` (width, height) as flat blocks (shrink the values first:
        ``shrink``, ``fit``). Returns its size."""
        from PIL import Image

        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        if pixels.ndim == 3 and not self.rgb:
            raise ValueError("RGB pixels need a Canvas(..., rgb=True)")
        if pixels.ndim == 2 and self.rgb:  # palette indices -> their RGB colours
            pixels = np.asarray(_palette(), dtype=np.uint8).reshape(-1, 3)[pixels]
        panel = Image.fromarray(pixels, mode="RGB" if pixels.ndim == 3 else "L")
        if size is not None and size != panel.size:
            panel = panel.resize(size, Image.Resampling.NEAREST)
        self.image.paste(panel, (x, y))
        return panel.size

    def text(self, x: int, y: int, text: str, size: int = 12, fill: int = BLACK, anchor: str = "la") -> None:
        self.draw.text((x, y), text, fill=self._fill(fill), font=_font(size), anchor=anchor)

    def frame(self, box: tuple[float, float, float, float], colour: int = RED, width: int = 2) -> None:
        self.draw.rectangle(box, outline=self._fill(colour), width=width)

    def cross(self, box: tuple[float, float, float, float], colour: int = LIGHT) -> None:
        """Two diagonals, a light line on a black one, so they show on pale and dark tiles alike."""
        x0, y0, x1, y1 = box
        for fill, width in ((BLACK, 3), (colour, 1)):
            self.draw.line((x0, y0, x1, y1), fill=self._fill(fill), width=width)
            self.draw.line((x0, y1, x1, y0), fill=self._fill(fill), width=width)

    def line(self, points: list[tuple[float, float]], colour: int = CYAN, width: int = 2) -> None:
        """A line through ``points`` (x, y), drawn ``width`` pixels wide on a black line 2 pixels
        wider, so that it shows on pale and dark colours alike."""
        for fill, wide in ((BLACK, width + 2), (colour, width)):
            self.draw.line(points, fill=self._fill(fill), width=wide, joint="curve")

    def png(self) -> Picture:
        from PIL import Image

        image = self.image
        if self.rgb:  # the 256 colours picked for this picture: a third of the bytes, quicker to encode
            image = image.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
            palette = image.getpalette()
            white = image.getpixel((0, 0))  # the background's entry (the mean of the near-white colours)
            palette[3 * white : 3 * white + 3] = [255, 255, 255]
            image.putpalette(palette)
        buffer = io.BytesIO()
        image.save(buffer, format="png", compress_level=1)
        return Picture(buffer.getvalue(), self.image.size)
