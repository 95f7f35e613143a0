"""The layer explorer of notebook 05: sliders over a model's recorded activations and gradients.

Each explorer is a plain object whose ``render(...)`` prints a few lines (name, shape,
statistics) and returns a matplotlib figure; ``widget()`` is a thin ipywidgets wrapper that
calls the same code when a slider moves. pytest drives ``render`` and the widget alike, no
browser needed.

* ``LayerExplorer(model, x)`` runs **one** forward and backward pass of ``x[:1]`` inside
  ``hooklab.record(..., backward=True)`` and keeps every recorded ``(N, C, H, W)`` output
  with H × W > 1 and its gradient (d score / d output, for the class ``target``, by default
  the predicted one). The hooks are gone
  when the constructor returns; moving a slider only redraws. Its widget: a
  ``SelectionSlider`` "layer", an ``IntSlider`` "channel", ``ToggleButtons`` "show"
  (activation / gradient) and an ``Output`` holding the printed text and the figure. Its input
  is checked as ``hooklab.cam`` checks Grad-CAM's (a batch of the model's dtype, the model in
  eval mode, an int ``target`` in range). A layer that does not contribute to the score gets a
  zero gradient, and ``describe`` says so.

``figure(...)`` returns a figure that pyplot does not track (nothing to close; a notebook shows
it once when a cell ends with it). ``render(...)`` returns a pyplot figure, so that
``plt.show()`` displays it, as notebook 05 does after each ``render``: in a script, close it with
``plt.close(fig)`` (or ``plt.show()``), and in a notebook end the cell with ``plt.show()`` or a
``;``, or the figure is shown twice.

The panel plumbing (``show_in_output``, ``describe_tensor``) is shared with the Grad-CAM picker
in ``hooklab.cam_widgets``.
"""

from __future__ import annotations

import base64
import io

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle
from torch import nn

from .checks import check_index, check_inputs, class_scores, new_figure, targets_for, wanted_targets
from .layers import unknown_name_hint
from .plots import draw_signed, tile_channels
from .recording import NoGradientError, record
from .saliency import check_gradients

__all__ = ["LayerExplorer", "Panel", "describe_tensor", "figure_png", "show_in_output"]


def _fmt(value: float) -> str:
    return f"{value + 0.0:.4g}"  # + 0.0 turns -0.0 into 0.0


def describe_tensor(t: torch.Tensor) -> str:
    """``mean … std … min … max … zero …%`` of a tensor, four significant digits."""
    t = t.float()
    return (f"mean {_fmt(t.mean())}  std {_fmt(t.std() if t.numel() > 1 else 0.0)}  "
            f"min {_fmt(t.min())}  max {_fmt(t.max())}  zero {(t == 0).float().mean().item():.1%}")


def figure_png(fig) -> str:
    """The figure as base64 PNG text (what a notebook stores for an image)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def show_in_output(output, text: str, fig) -> None:
    """Replace what an ``ipywidgets.Output`` shows: ``text`` as stdout, then the figure as an image.

    The outputs are set directly (not captured from a running cell), so this works the same in
    a kernel and in a test, and nothing leaks into the cell's own output. The figure is closed.
    """
    png = figure_png(fig)
    plt.close(fig)
    output.outputs = (
        {"output_type": "stream", "name": "stdout", "text": text + "\n"},
        {"output_type": "display_data", "data": {"image/png": png, "text/plain": repr(fig)}, "metadata": {}},
    )


class Panel:
    """The widgets of one explorer; displays as its ``VBox``.

    ``controls`` (name -> widget) are stacked above ``output``; every change of a control's value
    calls ``redraw(panel)``, once now and once per change (``redraws`` counts them). A control is
    also an attribute: ``panel.layer`` is ``controls["layer"]``.
    """

    def __init__(self, controls: dict, output, redraw):
        from ipywidgets import VBox

        self.controls, self.output = controls, output
        self.box = VBox([*controls.values(), output])
        self.redraws = 0
        self._redraw = redraw
        for control in controls.values():
            control.observe(self._changed, names="value")
        self._changed()

    def __getattr__(self, name: str):
        controls = self.__dict__.get("controls", {})
        if name in controls:
            return controls[name]
        raise AttributeError(name)

    def _changed(self, change=None) -> None:
        self._redraw(self)
        self.redraws += 1

    @property
    def text(self) -> str:
        """The printed text the output shows now."""
        return "".join(o["text"] for o in self.output.outputs if o["output_type"] == "stream")

    @property
    def png(self) -> str:
        """The base64 PNG the output shows now."""
        return next(o["data"]["image/png"] for o in self.output.outputs if o["output_type"] == "display_data")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


_TILES, _COLS = 64, 8  # the explorer tiles the first 64 channels, 8 per row, 1-pixel gaps


class LayerExplorer:
    """Activations and gradients of every recorded ``(N, C, H, W)`` layer for one input."""

    def __init__(self, model: nn.Module, x: torch.Tensor, layers=None, *, types=None, target: int | None = None):
        check_inputs(model, x, "LayerExplorer")
        check_gradients(model, "LayerExplorer")
        wanted = wanted_targets(target, 1)
        x = x[:1].detach().clone().requires_grad_(True)
        with record(model, layers, types=types, backward=True) as rec, torch.enable_grad():
            scores = class_scores(model(x), 1)
            self.target = int(targets_for(scores, wanted)[0])
            torch.autograd.grad(scores[0, self.target], x)  # parameters' .grad stay untouched
        self.activations: dict[str, torch.Tensor] = {}
        self.gradients: dict[str, torch.Tensor] = {}
        self.types: dict[str, str] = {}
        self.no_gradient: set[str] = set()  # layers the score does not depend on: their gradient is zero
        for r in rec:
            if isinstance(r.output, torch.Tensor) and r.output.dim() == 4 and r.output[0, 0].numel() > 1:
                label = r.name if r.call == 0 else f"{r.name} (call {r.call})"
                self.activations[label] = r.output[0]
                try:
                    self.gradients[label] = r.grad_output[0][0]
                except NoGradientError:
                    self.gradients[label] = torch.zeros_like(r.output[0])
                    self.no_gradient.add(label)
                self.types[label] = r.module_type
        if not self.activations:
            raise ValueError("no recorded layer returned an (N, C, H, W) tensor with H × W > 1")
        self._tiles: dict = {}

    @property
    def layers(self) -> list[str]:
        """Layer labels in execution order (a second call of a module: ``"name (call 1)"``)."""
        return list(self.activations)

    def _get(self, layer: str, channel: int, kind: str) -> tuple[torch.Tensor, int]:
        if kind not in ("activation", "gradient"):
            raise ValueError(f"kind must be 'activation' or 'gradient', not {kind!r}")
        if not isinstance(layer, str):
            raise TypeError(f"layer must be one of this explorer's layer names (a str), not {layer!r}")
        if layer not in self.activations:
            hint = unknown_name_hint(layer, self.layers, kind="explorable layers")
            raise LookupError(f"{layer!r} is not one of this explorer's layers (recorded outputs of shape "
                              f"(N, C, H, W) with H × W > 1); {hint}")
        maps = (self.activations if kind == "activation" else self.gradients)[layer]
        return maps, check_index(channel, maps.shape[0], "channel", f"channels in {layer}")

    def describe(self, layer: str, channel: int = 0, kind: str = "activation") -> str:
        """Three lines: name, type and shape; the channel's statistics; the whole layer's."""
        maps, channel = self._get(layer, channel, kind)
        head = f"{layer} ({self.types[layer]}) {kind} shape {tuple(maps.shape)}"
        if kind == "gradient" and layer in self.no_gradient:
            head += f" (zero: the score of class {self.target} does not depend on this layer)"
        return (f"{head}, channel {channel} of {maps.shape[0]}\n"
                f"  channel {channel}: {describe_tensor(maps[channel])}\n"
                f"  layer:      {describe_tensor(maps)}")

    def figure(self, layer: str, channel: int = 0, kind: str = "activation"):
        """The channel with a colour bar (left) and every channel tiled (right); returns the figure
        (not tracked by pyplot: see the module docstring).

        Activations are drawn in viridis, each tile scaled to [0, 1]; gradients in RdBu_r
        (red > 0 > blue), each tile divided by its largest |value|, so zero is white in every
        tile and in the channel on the left.
        """
        return self._figure(False, layer, channel, kind)

    def _figure(self, pyplot: bool, layer: str, channel: int, kind: str):
        maps, channel = self._get(layer, channel, kind)
        return new_figure(pyplot, lambda fig: self._draw(fig, layer, maps, channel, kind), figsize=(9, 3.6))

    def _draw(self, fig, layer: str, maps: torch.Tensor, channel: int, kind: str) -> None:
        left, right = fig.subplots(1, 2, width_ratios=(1, 1.3))
        if kind == "activation":
            left.imshow(maps[channel].numpy(), cmap="viridis", interpolation="nearest")
        else:
            draw_signed(maps[channel], ax=left, interpolation="nearest")
        fig.colorbar(left.images[-1], ax=left, fraction=0.046, pad=0.04)
        left.set_title(f"{layer}\n{kind}, channel {channel}", fontsize=10)
        key = (layer, kind)
        if key not in self._tiles:
            self._tiles[key] = tile_channels(maps, channels=_TILES, ncols=_COLS, pad=1, signed=kind == "gradient")
        cmap = plt.get_cmap("viridis" if kind == "activation" else "RdBu_r").with_extremes(bad="0.6")
        right.imshow(self._tiles[key], cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        if channel < _TILES:
            h, w = maps.shape[1:]
            row, col = divmod(channel, _COLS)
            right.add_patch(Rectangle((col * (w + 1) - 1, row * (h + 1) - 1), w + 1, h + 1,
                                      fill=False, edgecolor="red", linewidth=1.5))
        scaling = "scaled to [0, 1]" if kind == "activation" else "divided by its max |value|"
        right.set_title(f"{min(_TILES, maps.shape[0])} of {maps.shape[0]} channels, each {scaling}", fontsize=10)
        for ax in (left, right):
            ax.set_xticks([])
            ax.set_yticks([])

    def render(self, layer: str, channel: int = 0, kind: str = "activation"):
        """Print ``describe(...)`` and return what ``figure(...)`` draws, as a pyplot figure: ``plt.show()``
        displays it (and ``plt.close(fig)`` closes it)."""
        print(self.describe(layer, channel, kind))
        return self._figure(True, layer, channel, kind)

    def widget(self, layer: str | None = None) -> Panel:
        """Sliders "layer" and "channel", toggle "show"; moving one redraws (no new forward pass)."""
        from ipywidgets import IntSlider, Layout, Output, SelectionSlider, ToggleButtons

        layer = layer or self.layers[0]
        self._get(layer, 0, "activation")  # an unknown layer fails here, listing close matches
        controls = {
            "layer": SelectionSlider(options=self.layers, value=layer, description="layer",
                                     layout=Layout(width="560px"), style={"description_width": "60px"}),
            "channel": IntSlider(0, 0, self.activations[layer].shape[0] - 1, description="channel",
                                 layout=Layout(width="560px"), style={"description_width": "60px"}),
            "kind": ToggleButtons(options=["activation", "gradient"], description="show",
                                  style={"description_width": "60px"}),
        }

        def redraw(panel: Panel) -> None:
            name, channel = panel.layer.value, panel.channel
            top = self.activations[name].shape[0] - 1
            if channel.max != top:  # a new layer: fit the channel slider (this does not redraw)
                channel.unobserve(panel._changed, names="value")
                channel.value = min(channel.value, top)
                channel.max = top
                channel.observe(panel._changed, names="value")
            text = self.describe(name, channel.value, panel.kind.value)
            show_in_output(panel.output, text, self.figure(name, channel.value, panel.kind.value))

        return Panel(controls, Output(), redraw)
