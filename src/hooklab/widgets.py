"""The layer explorer of notebook 05: a model's recorded activations and gradients, layer by layer.

Each explorer is a plain object with plain functions that pytest calls without a browser;
``widget()`` is a thin ipywidgets wrapper that calls the same functions when a control moves.

* ``LayerExplorer(model, x)`` runs one forward and backward pass of image ``index`` of the
  batch ``x`` inside ``hooklab.record(..., backward=True)`` and keeps every recorded
  ``(N, C, H, W)`` output with H × W > 1 and its gradient (d score / d output, for the class
  ``target``, by default the predicted one). The hooks are gone when the pass returns; another
  image or class runs one more pass (the last few are kept), a new layer or channel only redraws.
  ``activations``, ``gradients``, ``target`` and ``no_gradient`` are those of image 0 for the
  constructor's ``target``. Its input is checked as ``hooklab.saliency`` checks Grad-CAM's (a batch
  of the model's dtype, the model in eval mode, an int ``target`` in range). A layer that does
  not contribute to the score gets a zero gradient, and ``describe`` says so.
* ``view(layer, channel, kind, index=, target=)`` prints ``summary(...)`` and returns
  ``picture(...)``: the channel's activation and gradient side by side, and 64 channels tiled
  (the page holding the chosen channel, framed in red; dead channels crossed out). That is
  what the widget shows; it is drawn straight to PNG (``hooklab.picture``), fast enough for a
  slider. Its controls: "layer" (a slider, plus "find", a box that completes a typed name),
  "channel", "tiles" (activation / gradient), "image" and "class". The tiles are
  ``hooklab.plots.tile_channels``'s grid (the one ``feature_grid`` draws) of the channels
  averaged down to at most 32 pixels a side. ``describe(...)`` is the short text: name, type,
  shape and statistics.

The panel plumbing (``Panel``, ``describe_tensor``) is shared with the Grad-CAM picker in
``hooklab.cam_widgets``.
"""

from __future__ import annotations

import html
import math
from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import nn

from .checks import check_index, check_inputs, class_scores, non_finite_kinds, targets_for, wanted_targets
from .layers import unknown_name_hint
from .picture import DARK, Canvas, Picture, colour_bar, colours, shrink
from .plots import tile_channels
from .recording import NoGradientError, record
from .saliency import check_gradients

__all__ = ["LayerExplorer", "describe_tensor"]


def _fmt(value: float) -> str:
    return f"{value + 0.0:.4g}"  # + 0.0 turns -0.0 into 0.0


def describe_tensor(t: torch.Tensor) -> str:
    """``mean … std … min … max … zero …%`` of a tensor, four significant digits."""
    t = t.float()
    return (f"mean {_fmt(t.mean())}  std {_fmt(t.std() if t.numel() > 1 else 0.0)}  "
            f"min {_fmt(t.min())}  max {_fmt(t.max())}  zero {(t == 0).float().mean().item():.1%}")


class Panel:
    """The widgets of one explorer; displays as its ``VBox``.

    ``rows`` (widgets or boxes of them) are stacked above the printed text (an ``HTML``) and the
    picture (an ``Image``). Every change of a value in ``controls`` (name -> widget) calls
    ``redraw(panel) -> (text, png_bytes)`` and shows the result, once now and once per change
    (``redraws`` counts them). A control is also an attribute: ``panel.layer`` is
    ``controls["layer"]``. ``hold()`` changes several controls with one redraw.
    """

    def __init__(self, rows: list, controls: dict, redraw):
        from ipywidgets import HTML, Image, Layout, VBox

        self.controls = controls
        self.html = HTML()
        self.image = Image(format="png", layout=Layout(max_width="100%"))
        self.box = VBox([*rows, self.html, self.image])
        self.redraws = 0
        self.text = ""
        self._redraw, self._held = redraw, False
        for control in controls.values():
            control.observe(self._changed, names="value")
        self._changed()

    def __getattr__(self, name: str):
        controls = self.__dict__.get("controls", {})
        if name in controls:
            return controls[name]
        raise AttributeError(name)

    def _changed(self, change=None) -> None:
        if self._held:
            return
        text, png = self._redraw(self)
        self.text = text + "\n"
        self.html.value = f"<pre style='margin:0;line-height:1.3'>{html.escape(text)}</pre>"
        self.image.value = png
        self.redraws += 1

    def hold(self, change) -> None:
        """Run ``change()`` (which sets some controls) without a redraw for each of its changes."""
        self._held = True
        try:
            change()
        finally:
            self._held = False

    @property
    def png(self) -> bytes:
        """The PNG the panel shows now."""
        return self.image.value

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


class Pass(NamedTuple):
    """One recorded forward and backward pass: image ``index``, explained class ``target``."""

    index: int
    target: int
    predicted: int
    score: float
    classes: int
    activations: dict  # label -> (C, H, W)
    gradients: dict  # label -> (C, H, W) d score / d output (zero where no gradient arrived)
    no_gradient: frozenset  # labels the score does not depend on


_TILES, _COLS, _TILE = 64, 8, 32  # 64 channels a page, at most 8 per row, at most 32 pixels a side
_SIDE, _GRID, _TOP = 176, 360, 36  # pixels: a channel panel, the tiles at most, the titles above
_KEPT = 4  # passes kept besides the first


class LayerExplorer:
    """Activations and gradients of every recorded ``(N, C, H, W)`` layer, image by image."""

    def __init__(self, model: nn.Module, x: torch.Tensor, layers=None, *, types=None, target: int | None = None):
        check_inputs(model, x, "LayerExplorer")
        check_gradients(model, "LayerExplorer")
        wanted_targets(target, 1)  # an int or None, checked before any work
        self.model, self.x, self._wanted = model, x.detach(), target
        self._recorded = (layers, types)
        self._passes: OrderedDict = OrderedDict()
        self._cache: dict = {}
        self.types: dict[str, str] = {}  # layer label -> module type, e.g. "Conv2d"
        first = self.recorded(0)
        if not first.activations:
            raise ValueError("no recorded layer returned an (N, C, H, W) tensor with H × W > 1")
        self._first = first
        self.target, self.activations, self.gradients = first.target, first.activations, first.gradients
        self.no_gradient = set(first.no_gradient)

    @property
    def layers(self) -> list[str]:
        """Layer labels in execution order (a second call of a module: ``"name (call 1)"``)."""
        return list(self._first.activations)

    def recorded(self, index: int = 0, target: int | None = None) -> Pass:
        """The pass of image ``index`` for class ``target`` (None: the constructor's ``target``,
        else the predicted class); run now unless it is one of the last few."""
        index = check_index(index, len(self.x), "index", "images in this explorer's batch")
        wanted = wanted_targets(self._wanted if target is None else target, 1)
        key = (index, None if wanted is None else int(wanted[0]))
        if key not in self._passes:
            run = self._run(index, wanted)
            self._passes[key] = self._passes[(index, run.target)] = run  # found under both names
            first = next(iter(self._passes))
            while len(self._passes) > 2 * _KEPT + 2:  # the first pass stays: it backs self.activations
                self._passes.pop(next(k for k in self._passes if self._passes[k] is not self._passes[first]))
        self._passes.move_to_end(key)
        return self._passes[key]

    def _run(self, index: int, wanted) -> Pass:
        layers, types = self._recorded
        x = self.x[index : index + 1].clone().requires_grad_(True)
        with record(self.model, layers, types=types, backward=True) as rec, torch.enable_grad():
            scores = class_scores(self.model(x), 1)
            target = int(targets_for(scores, wanted)[0])
            torch.autograd.grad(scores[0, target], x)  # parameters' .grad stay untouched
        activations, gradients, no_gradient = {}, {}, set()
        for r in rec:
            if isinstance(r.output, torch.Tensor) and r.output.dim() == 4 and r.output[0, 0].numel() > 1:
                label = r.name if r.call == 0 else f"{r.name} (call {r.call})"
                activations[label] = r.output[0]
                try:
                    gradients[label] = r.grad_output[0][0]
                except NoGradientError:
                    gradients[label] = torch.zeros_like(r.output[0])
                    no_gradient.add(label)
                self.types[label] = r.module_type
        scores = scores.detach()[0]
        return Pass(index, target, int(scores.argmax()), float(scores[target]), len(scores),
                    activations, gradients, frozenset(no_gradient))

    def _get(self, layer: str, channel: int, kind: str, index: int = 0, target=None):
        if kind not in ("activation", "gradient"):
            raise ValueError(f"kind must be 'activation' or 'gradient', not {kind!r}")
        if not isinstance(layer, str):
            raise TypeError(f"layer must be one of this explorer's layer names (a str), not {layer!r}")
        if layer not in self._first.activations:
            hint = unknown_name_hint(layer, self.layers, kind="explorable layers")
            raise LookupError(f"{layer!r} is not one of this explorer's layers (recorded outputs of shape "
                              f"(N, C, H, W) with H × W > 1); {hint}")
        run = self._first if index == 0 and target is None else self.recorded(index, target)
        maps = (run.activations if kind == "activation" else run.gradients)[layer]
        return run, maps, check_index(channel, maps.shape[0], "channel", f"channels in {layer}")

    def describe(self, layer: str, channel: int = 0, kind: str = "activation", *, index: int = 0, target=None) -> str:
        """Three lines: name, type and shape; the channel's statistics; the whole layer's."""
        run, maps, channel = self._get(layer, channel, kind, index, target)
        head = f"{layer} ({self.types[layer]}) {kind} shape {tuple(maps.shape)}"
        if kind == "gradient" and layer in run.no_gradient:
            head += f" (zero: the score of class {run.target} does not depend on this layer)"
        return (f"{head}, channel {channel} of {maps.shape[0]}\n"
                f"  channel {channel}: {describe_tensor(maps[channel])}\n"
                f"  layer:      {self._layer_line(run, layer, kind, maps)}")

    def _layer_line(self, run: Pass, layer: str, kind: str, maps: torch.Tensor) -> str:
        key = ("stats", run.index, run.target, layer, kind)
        if key not in self._cache:
            self._cache[key] = describe_tensor(maps)
        return self._cache[key]

    def _input_warning(self, index: int) -> list[str]:
        """One line if image ``index`` holds NaN or inf (what a score of nan comes from), else none."""
        kinds = non_finite_kinds(self.x[index])
        return [f"  the input holds {kinds}: every score and gradient computed from it is NaN, and so is this "
                "pass (replace those values, e.g. x.nan_to_num(0.0))"] if kinds else []

    def dead(self, layer: str, *, index: int = 0, target=None) -> list[int]:
        """Channels whose activation is zero at every position for this image ("dead" here)."""
        run = self._get(layer, 0, "activation", index, target)[0]
        key = ("dead", run.index, layer)
        if key not in self._cache:
            self._cache[key] = (run.activations[layer] == 0).flatten(1).all(dim=1).nonzero().flatten().tolist()
        return self._cache[key]

    def summary(self, layer: str, channel: int = 0, kind: str = "activation", *, index: int = 0, target=None) -> str:
        """What the widget prints: image and class, then both kinds' statistics and the dead channels."""
        run, maps, channel = self._get(layer, channel, kind, index, target)
        page = channel // _TILES * _TILES
        lines = [f"image {run.index} of {len(self.x)}: class {run.target} explained (score {run.score:.4g}), "
                 f"predicted {run.predicted}",
                 *self._input_warning(run.index),
                 f"{layer} ({self.types[layer]}) shape {tuple(maps.shape)}, channel {channel} of {len(maps)}; "
                 f"tiles: {kind}, channels {page}–{min(page + _TILES, len(maps)) - 1}"]
        both = (("activation", run.activations[layer]), ("gradient", run.gradients[layer]))
        lines += [f"  {name + ',':11} channel {channel}: {describe_tensor(values[channel])}" for name, values in both]
        lines += [f"  {name + ',':11} {'layer:':{len(str(channel)) + 10}}{self._layer_line(run, layer, name, values)}"
                  for name, values in both]
        if layer in run.no_gradient:
            lines.append(f"  the gradient is zero: the score of class {run.target} does not depend on this layer")
        dead = self.dead(layer, index=run.index, target=run.target)
        if dead:
            shown = ", ".join(map(str, dead[:12])) + (", …" if len(dead) > 12 else "")
            lines.append(f"  dead (zero everywhere for this image, crossed out): {len(dead)} of {len(maps)}: {shown}")
        return "\n".join(lines)

    def picture(self, layer: str, channel: int = 0, kind: str = "activation", *, index: int = 0,
                target=None) -> Picture:
        """The channel's activation and gradient side by side (true values, with their colour
        ranges), and the 64 channels of the page holding it tiled (``kind``), each tile scaled on
        its own, the chosen one framed in red and dead channels crossed out. Returns a ``Picture``."""
        run, maps, channel = self._get(layer, channel, kind, index, target)
        act, grad = run.activations[layer][channel], run.gradients[layer][channel]
        page = channel // _TILES
        grid, (th, tw), cols = self._grid(run, layer, kind, page)
        scale = min(_GRID / grid.shape[1], _GRID / grid.shape[0])
        size = (round(grid.shape[1] * scale), round(grid.shape[0] * scale))
        canvas = Canvas(2 * _SIDE + size[0] + 48, _TOP + max(_SIDE + 40, size[1]) + 4)
        for x, values, name in ((8, act, "activation"), (_SIDE + 24, grad, "gradient")):
            self._channel_panel(canvas, x, values, f"{name}, channel {channel}", name == "gradient")
        gx = 2 * _SIDE + 40
        canvas.paste(grid, gx, _TOP, size)
        shown = min(_TILES, maps.shape[0] - page * _TILES)
        canvas.text(gx, 4, f"{kind}: channels {page * _TILES}-{page * _TILES + shown - 1} of {maps.shape[0]}")
        canvas.text(gx, 18, "each tile scaled on its own; dead: crossed out", size=11, fill=DARK)
        place = lambda i: divmod(i - page * _TILES, cols)  # noqa: E731  (row, column of channel i)
        box = lambda r, c: (gx + c * (tw + 1) * scale, _TOP + r * (th + 1) * scale,  # noqa: E731
                            gx + (c * (tw + 1) + tw) * scale - 1, _TOP + (r * (th + 1) + th) * scale - 1)
        for i in self.dead(layer, index=run.index, target=run.target):
            if page * _TILES <= i < page * _TILES + _TILES:
                canvas.cross(box(*place(i)))
        x0, y0, x1, y1 = box(*place(channel))
        canvas.frame((x0 - 2, y0 - 2, x1 + 2, y1 + 2))
        return canvas.png()

    def _grid(self, run: Pass, layer: str, kind: str, page: int):
        key = ("grid", run.index, run.target, layer, kind, page)
        if key not in self._cache:
            maps = (run.activations if kind == "activation" else run.gradients)[layer][page * _TILES :][:_TILES]
            cols = min(_COLS, math.ceil(math.sqrt(len(maps))))  # a squarish grid: 16 channels in 4 rows of 4
            maps = shrink(maps, _TILE)
            values = tile_channels(maps, channels=None, ncols=cols, pad=1, signed=kind == "gradient")
            cmap = "viridis" if kind == "activation" else "RdBu_r"
            self._cache[key] = (colours(torch.from_numpy(values), cmap, 0.0, 1.0), tuple(maps.shape[1:]), cols)
        return self._cache[key]

    @staticmethod
    def _channel_panel(canvas: Canvas, x: int, values: torch.Tensor, title: str, signed: bool) -> None:
        finite = values[values.isfinite()]
        low, high = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 0.0)
        if signed:  # zero in the middle (white), also for a map that is zero everywhere
            high = max(abs(low), abs(high))
            low = -high
        cmap = "RdBu_r" if signed else "viridis"
        span = (low, high) if high > low else (-1.0, 1.0) if signed else (low, low + 1.0)
        h, w = values.shape
        scale = _SIDE / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        canvas.text(x, 4, title)
        canvas.text(x, 18, "red > 0 > blue" if signed else "true values", size=11, fill=DARK)
        canvas.paste(colours(shrink(values, _SIDE), cmap, *span), x, _TOP, size)
        canvas.paste(colour_bar(cmap, _SIDE), x, _TOP + size[1] + 6)
        canvas.text(x, _TOP + size[1] + 16, _fmt(low), size=11)
        canvas.text(x + _SIDE, _TOP + size[1] + 16, _fmt(high), size=11, anchor="ra")

    def view(self, layer: str, channel: int = 0, kind: str = "activation", *, index: int = 0, target=None) -> Picture:
        """Print ``summary(...)`` and return ``picture(...)``: what the widget shows."""
        print(self.summary(layer, channel, kind, index=index, target=target))
        return self.picture(layer, channel, kind, index=index, target=target)

    def widget(self, layer: str | None = None, channel: int = 0, kind: str = "activation", *,
               index: int = 0, target: int | None = None) -> Panel:
        """Controls "layer" (slider), "find" (type part of a name), "channel", "tiles", "image" and
        "class"; a new layer or channel only redraws, a new image or class runs one pass."""
        from ipywidgets import Combobox, HBox, IntSlider, Layout, SelectionSlider, ToggleButtons

        layer = layer or self.layers[0]
        run, _, channel = self._get(layer, channel, kind, index, target)  # bad input fails here
        wide = {"layout": Layout(width="560px"), "style": {"description_width": "60px"}}
        narrow = {"layout": Layout(width="280px"), "style": {"description_width": "60px"}}
        controls = {
            "layer": SelectionSlider(options=self.layers, value=layer, description="layer", **wide),
            "channel": IntSlider(channel, 0, len(self._first.activations[layer]) - 1, description="channel", **wide),
            "kind": ToggleButtons(options=["activation", "gradient"], value=kind, description="tiles",
                                  style={"description_width": "60px", "button_width": "90px"}),
            "index": IntSlider(run.index, 0, len(self.x) - 1, description="image", disabled=len(self.x) == 1, **narrow),
            "target": IntSlider(run.target, 0, run.classes - 1, description="class", **narrow),
        }
        find = Combobox(options=self.layers, placeholder=f"type to search {len(self.layers)} layers",
                        description="find", ensure_option=False, **wide)

        def jump(change) -> None:
            if change["new"] in self.layers:
                controls["layer"].value = change["new"]

        find.observe(jump, names="value")
        rows = [controls["layer"], find, controls["channel"], controls["kind"],
                HBox([controls["index"], controls["target"]])]

        def redraw(panel: Panel) -> tuple[str, bytes]:
            name, channel = panel.layer.value, panel.channel
            top = self._first.activations[name].shape[0] - 1
            if channel.max != top:  # a new layer: fit the channel slider (without a redraw of its own)
                panel.hold(lambda: (setattr(channel, "value", min(channel.value, top)), setattr(channel, "max", top)))
            where = {"index": panel.index.value, "target": panel.target.value}
            text = self.summary(name, channel.value, panel.kind.value, **where)
            return text, self.picture(name, channel.value, panel.kind.value, **where).png

        return Panel(rows, controls, redraw)
