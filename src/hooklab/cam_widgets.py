"""The Grad-CAM picker of notebook 05, and the one way the course draws a Grad-CAM map over an image.

* ``draw_cam(image, cam, title, ax=None)``: the map at its own resolution over the image (``inferno``, from 0
  to the map's maximum) with the digit's outline on top, so both stay readable at 8×8 pixels.
* ``GradCamPicker(model, images, labels, layers)`` draws Grad-CAM, guided backprop and guided
  Grad-CAM for a chosen layer, class and image (``hooklab.cam``; hooks live only inside each
  ``compute``). ``render(...)`` prints the numbers and returns the figure; ``widget()`` is the
  same code behind a ``SelectionSlider`` "layer" and ``IntSlider``\\ s "class" and "image"
  (a ``hooklab.widgets.Panel``). The constructor runs one forward pass: it checks the images,
  the labels (one per image) and that every layer returns an ``(N, C, H, W)`` tensor, and
  counts the class scores (the range of the "class" slider). As in ``hooklab.widgets``,
  ``figure`` is not tracked by pyplot and ``render`` returns a pyplot figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from torch import nn

from .checks import check_index, check_inputs, class_scores, drawn, new_figure
from .plots import draw_signed
from .recording import record
from .saliency import guided_grad_cam_parts
from .widgets import Panel, describe_tensor, show_in_output

__all__ = ["GradCamPicker", "draw_cam"]


def draw_cam(image: torch.Tensor, cam: torch.Tensor, title: str | None = None, ax=None):
    """Draw an ``(h, w)`` Grad-CAM map stretched over an ``(H, W)`` image, with the image's outline.

    The map is drawn at its own resolution (a 4×4 map: 16 blocks over an 8×8 digit, no
    interpolation), so its maximum is the one ``grad_cam`` returned. The colours run from 0
    (black) to that maximum (pale yellow), printed in the title: compare maps by that number,
    not by brightness. The cyan line is the image's contour at half its maximum. ``ax``: the
    ``Axes`` to draw on, a new 3×3-inch figure when None. Returns the figure.
    """
    image, cam = _plane(image, "an (H, W) image", "image[0]"), _plane(cam, "an (h, w) map", "result.maps[0]")
    if ax is not None:
        _draw_cam(ax, image, cam, title)
        return ax.figure
    ax = plt.subplots(figsize=(3, 3))[1]
    return drawn(ax.figure, lambda fig: _draw_cam(ax, image, cam, title))


def _plane(value, what: str, fix: str) -> torch.Tensor:
    value = torch.as_tensor(value).detach().cpu()
    if value.dim() != 2:
        hint = f": use {fix}" if value.dim() == 3 and len(value) == 1 else ""
        raise ValueError(f"draw_cam expects {what}; got {tuple(value.shape)}{hint}")
    return value


def _draw_cam(ax, image: torch.Tensor, cam: torch.Tensor, title: str | None) -> None:
    top = float(cam.max())
    height, width = image.shape
    ax.imshow(cam.numpy(), cmap="inferno", vmin=0, vmax=top or 1.0, interpolation="nearest",
              extent=(-0.5, width - 0.5, height - 0.5, -0.5))
    image = image.numpy()
    ax.contour(image, levels=[0.5 * float(image.max())], colors="cyan", linewidths=1.2)
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(f"{title}\nmax {top:.4g}", fontsize=9)


class GradCamPicker:
    """Grad-CAM, guided backprop and guided Grad-CAM of single-channel images (the digits)."""

    def __init__(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, layers: list[str]):
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 1:
            raise ValueError(f"images must be (N, 1, H, W), got shape {tuple(getattr(images, 'shape', ()))}")
        check_inputs(model, images, "GradCamPicker")
        try:
            count = len(labels)
        except TypeError:
            count = None
        if count != len(images):
            got = repr(labels) if count is None else f"{count} labels"
            raise ValueError(f"labels must hold one class label per image: got {got} for {len(images)} images")
        if isinstance(layers, str) or not layers:
            raise ValueError(f"layers must be a non-empty list of layer names, not {layers!r}")
        self.model, self.images, self.labels, self.layers = model, images, labels, list(layers)
        with record(model, self.layers) as rec, torch.no_grad():
            scores = class_scores(model(images), len(images))
        for name in self.layers:
            output = rec.calls(name)[-1].output if rec.calls(name) else None
            if not isinstance(output, torch.Tensor) or output.dim() != 4:
                got = f"shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else "no tensor"
                raise ValueError(f"layer {name!r} returns {got}; Grad-CAM needs a layer that returns an "
                                 "(N, C, H, W) tensor, such as a convolution")
        self.classes = scores.shape[1]  # the "class" slider's range
        self.predicted = scores.argmax(dim=1)

    def _index(self, index: int) -> int:
        return check_index(index, len(self.images), "index", "images")

    def compute(self, layer: str, target: int, index: int = 0) -> dict:
        """Grad-CAM at ``layer`` (and upsampled), guided backprop and guided Grad-CAM for one image."""
        index = self._index(index)
        parts = guided_grad_cam_parts(self.model, self.images[index : index + 1], layer, target)
        return {key: value if key == "result" else value[0] for key, value in parts.items()}

    def describe(self, layer: str, target: int, index: int, parts: dict) -> str:
        """Three lines: image, class and score; the Grad-CAM map's peak and sign; guided Grad-CAM."""
        r, index = parts["result"], self._index(index)
        cam = r.maps[0]
        row, col = divmod(int(cam.flatten().argmax()), cam.shape[1])
        return (f"image {index}: label {int(self.labels[index])}, predicted {int(self.predicted[index])}; "
                f"class {target} (score {r.scores[0]:.4f}) explained at {layer}\n"
                f"  Grad-CAM {tuple(cam.shape)}: max {cam.max():.4f} at row {row}, col {col}; "
                f"{(cam > 0).float().mean():.1%} of cells > 0; sum before ReLU {r.raw[0].sum():.4f}\n"
                f"  guided Grad-CAM: {describe_tensor(parts['guided'])}")

    def render(self, layer: str, target: int, index: int = 0):
        """Print the numbers and return the four-panel figure the widget shows, as a pyplot figure."""
        parts = self.compute(layer, target, index)
        print(self.describe(layer, target, index, parts))
        return self._figure(True, layer, target, index, parts)

    def figure(self, layer: str, target: int, index: int, parts: dict):
        """Input, Grad-CAM with the digit's outline, guided backprop, guided Grad-CAM; returns the figure
        (not tracked by pyplot)."""
        return self._figure(False, layer, target, index, parts)

    def _figure(self, pyplot: bool, layer: str, target: int, index: int, parts: dict):
        index = self._index(index)
        return new_figure(pyplot, lambda fig: self._draw(fig, layer, target, index, parts),
                           figsize=(9, 2.9), layout="constrained")

    def _draw(self, fig, layer: str, target: int, index: int, parts: dict) -> None:
        axes = fig.subplots(1, 4)
        image = self.images[index, 0]
        axes[0].imshow(image.numpy(), cmap="gray_r")
        axes[0].set_title(f"image {index}\nlabel {int(self.labels[index])}", fontsize=9)
        draw_cam(image, parts["result"].maps[0], f"Grad-CAM {layer}, class {target}", ax=axes[1])
        for ax, key, title in ((axes[2], "saliency", "guided backprop"), (axes[3], "guided", "guided Grad-CAM")):
            draw_signed(parts[key], ax=ax)
            ax.set_title(f"{title}, class {target}\nred > 0 > blue", fontsize=9)
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])

    def widget(self) -> Panel:
        """Sliders "layer", "class" and "image"; each move recomputes (hooks live only meanwhile)."""
        from ipywidgets import IntSlider, Layout, Output, SelectionSlider

        wide = {"layout": Layout(width="560px"), "style": {"description_width": "60px"}}
        controls = {
            "layer": SelectionSlider(options=self.layers, value=self.layers[-1], description="layer", **wide),
            "target": IntSlider(int(self.predicted[0]), 0, self.classes - 1, description="class", **wide),
            "index": IntSlider(0, 0, len(self.images) - 1, description="image", **wide),
        }

        def redraw(panel: Panel) -> None:
            layer, target, index = panel.layer.value, panel.target.value, panel.index.value
            parts = self.compute(layer, target, index)
            show_in_output(panel.output, self.describe(layer, target, index, parts),
                           self.figure(layer, target, index, parts))

        return Panel(controls, Output(), redraw)
