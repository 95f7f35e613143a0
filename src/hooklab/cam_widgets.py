"""The Grad-CAM picker of notebook 05, and the one way the course draws a class map over an image.

* ``draw_cam(image, cam, title, ax=None, vmax=None)``: the map at its own resolution over the
  image (``inferno``, from 0 to ``vmax``, by default the map's maximum): over a digit with the
  digit's outline on top, over a photo half transparent.
* ``METHODS``: how a map is made from one layer's activations ``A`` and the gradient ``G`` of the
  score with respect to them, both ``(N, C, h, w)``, before the final ReLU: Grad-CAM
  ``Σ_k mean(G_k) A_k`` (Selvaraju et al. 2017; guided Grad-CAM multiplies its map by guided
  backprop), HiResCAM ``Σ_k G_k ⊙ A_k`` (Draelos & Carin 2020), Layer-CAM
  ``Σ_k relu(G_k) ⊙ A_k`` (Jiang et al. 2021). A student's own ``f(A, G) -> (N, h, w)`` joins
  them through ``GradCamPicker(..., methods={"mine": f})``.
* ``GradCamPicker(model, images, labels, layers)``: for a chosen layer, class, image and method,
  the map (``compute``: one recorded forward and backward pass, hooks removed before it
  returns, also on error; the last few passes and their guided backprop are kept), printed
  (``describe(parts)``) and drawn (``figure(parts)``) over the image:
  single-channel digits ``(N, 1, H, W)`` and RGB photos ``(N, 3, H, W)`` alike. Options: the
  colour scale of the map (``scale="own"``, or ``"shared"`` with the predicted class's map, so a
  weak map looks weak), the signed map before the ReLU (``signed=True``), and the weight
  randomisation sanity check (``weights="random"``: the same model with every layer re-drawn;
  Adebayo et al. 2018: a map that does not change when the weights are randomised explains
  nothing). ``render(...)`` prints and returns the figure; ``widget()`` is the same code behind
  controls (a ``hooklab.widgets.Panel``). As in ``hooklab.widgets``, ``figure`` is not tracked
  by pyplot and ``render`` returns a pyplot figure.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import matplotlib.pyplot as plt
import torch
from torch import nn

from .checks import check_index, check_inputs, class_scores, drawn, new_figure, targets_for, wanted_targets
from .data import to_display
from .layers import unknown_name_hint
from .picture import figure_png
from .plots import draw_signed
from .recording import NoGradientError, record
from .saliency import check_gradients, grad_cam_map, guided_parts
from .widgets import Panel, describe_tensor

__all__ = ["GradCamPicker", "draw_cam"]


def draw_cam(image, cam, title: str | None = None, ax=None, vmax: float | None = None):
    """Draw an ``(h, w)`` class map stretched over an ``(H, W)`` digit or an ``(H, W, 3)`` photo.

    The map is drawn at its own resolution (a 4×4 map: 16 blocks over an 8×8 digit, no
    interpolation), so its maximum is the one the method returned. The colours run from 0
    (black) to ``vmax`` (pale yellow; default: the map's maximum), printed in the title: compare
    maps by that number, not by brightness. Over a digit, the cyan line is its contour at half
    its maximum; over a photo (values in [0, 1]) the map is half transparent. ``ax``: the
    ``Axes`` to draw on, a new 3×3-inch figure when None. Returns the figure.
    """
    image, cam = _image(image), _plane(cam, "an (h, w) map", "result.maps[0]")
    if ax is not None:
        _draw_cam(ax, image, cam, title, vmax)
        return ax.figure
    ax = plt.subplots(figsize=(3, 3))[1]
    return drawn(ax.figure, lambda fig: _draw_cam(ax, image, cam, title, vmax))


def _image(value) -> torch.Tensor:
    value = torch.as_tensor(value).detach().cpu()
    if value.dim() == 3 and value.shape[-1] == 3:
        return value.float()
    if value.dim() == 3 and value.shape[0] == 3:
        raise ValueError(f"draw_cam expects an (H, W) image or an (H, W, 3) photo; got {tuple(value.shape)}: "
                         "use hooklab.data.to_display(x) for a photo batch x")
    return _plane(value, "an (H, W) image", "image[0]")


def _plane(value, what: str, fix: str) -> torch.Tensor:
    value = torch.as_tensor(value).detach().cpu()
    if value.dim() != 2:
        hint = f": use {fix}" if value.dim() == 3 and len(value) == 1 else ""
        raise ValueError(f"draw_cam expects {what}; got {tuple(value.shape)}{hint}")
    return value


def _draw_cam(ax, image: torch.Tensor, cam: torch.Tensor, title: str | None, vmax: float | None) -> None:
    top = float(cam.max())
    height, width = image.shape[:2]
    extent = (-0.5, width - 0.5, height - 0.5, -0.5)
    photo = image.dim() == 3
    if photo:
        ax.imshow(image.clamp(0, 1).numpy())
    ax.imshow(cam.numpy(), cmap="inferno", vmin=0, vmax=(vmax if vmax is not None else top) or 1.0,
              interpolation="nearest", extent=extent, alpha=0.55 if photo else None)
    if not photo:
        image = image.numpy()
        from matplotlib import patheffects

        outline = ax.contour(image, levels=[0.5 * float(image.max())], colors="cyan", linewidths=1.4)
        outline.set_path_effects([patheffects.withStroke(linewidth=3.2, foreground="black")])  # readable on yellow
    ax.set_xlim(extent[:2])
    ax.set_ylim(extent[2:])
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        scale = f", colours 0..{vmax:.4g}" if vmax is not None else ""
        ax.set_title(f"{title}\nmax {top:.4g}{scale}", fontsize=9)


def hires_cam_map(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """HiResCAM before its ReLU: gradient × activation, summed over channels (the position is kept)."""
    return (gradients * activations).sum(dim=1)


def layer_cam_map(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Layer-CAM before its ReLU: each activation weighted by the positive part of its own gradient."""
    return (gradients.clamp(min=0) * activations).sum(dim=1)


# Grad-CAM's map is hooklab.saliency.grad_cam_map, the very function hooklab.saliency.GradCAM uses
METHODS = {"Grad-CAM": grad_cam_map, "guided Grad-CAM": grad_cam_map, "HiResCAM": hires_cam_map,
           "Layer-CAM": layer_cam_map}  # fmt: skip
_KEPT = 12  # recorded passes kept


def _shown(image: torch.Tensor) -> torch.Tensor:
    """One image of the batch as ``draw_cam`` takes it: a digit ``(1, H, W)`` -> ``(H, W)``, a photo
    ``(3, H, W)`` -> ``(H, W, 3)`` in [0, 1]. A photo with values outside [0, 1] is taken as
    normalised the way ``hooklab.data.photo`` does, and ``hooklab.data.to_display`` undoes that."""
    if len(image) == 1:
        return image[0]
    if image.min() < 0 or image.max() > 1:
        return torch.from_numpy(to_display(image[None]))
    return image.clamp(0, 1).permute(1, 2, 0)


class GradCamPicker:
    """Class maps of digits ``(N, 1, H, W)`` or photos ``(N, 3, H, W)``, layer by layer; see the module docstring."""

    def __init__(self, model: nn.Module, images: torch.Tensor, labels, layers: list[str], *,
                 methods: dict | None = None, seed: int = 0):
        if isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[1] not in (1, 3):
            raise ValueError(f"images must be (N, 1, H, W) digits or (N, 3, H, W) photos, got shape "
                             f"{tuple(images.shape)}")
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
        self.methods = {**METHODS, **self._checked_methods(methods)}
        self.model, self.images, self.labels, self.layers = model, images.detach(), labels, list(layers)
        self.seed, self.random_seed, self._random, self._passes = seed, None, None, OrderedDict()
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

    @staticmethod
    def _checked_methods(methods) -> dict:
        if methods is None:
            return {}
        if not isinstance(methods, dict) or not all(isinstance(k, str) and callable(f) for k, f in methods.items()):
            raise TypeError("methods must map a name to a function f(activations, gradients) -> (N, h, w) maps, "
                            f"e.g. {{'my Layer-CAM': layer_cam}}; got {methods!r}")
        return methods

    def _index(self, index: int) -> int:
        return check_index(index, len(self.images), "index", "images")

    def _method(self, method: str) -> str:
        if method not in self.methods:
            hint = unknown_name_hint(str(method), list(self.methods), kind="methods")
            raise LookupError(f"unknown method {method!r}; {hint}")
        return method

    def _model(self, weights: str) -> nn.Module:
        if weights == "trained":
            return self.model
        if weights != "random":
            raise ValueError(f"weights must be 'trained' or 'random', not {weights!r}")
        if self._random is None:
            self._random, self.random_seed = _randomised(self.model, self.seed)
        return self._random

    def _check_layer(self, layer: str) -> None:
        if layer not in self.layers:
            raise LookupError(f"{layer!r} is not one of this picker's layers; "
                              f"{unknown_name_hint(str(layer), self.layers, kind='layers')}")

    def _record(self, layer: str, target, index: int, weights: str) -> dict:
        """Activation, gradient and score at ``layer`` for one image (kept for the last few calls, with
        the guided backprop ``compute`` adds to them)."""
        self._check_layer(layer)
        key = (layer, target, index, weights)
        if key in self._passes:
            self._passes.move_to_end(key)
            return self._passes[key]
        model = self._model(weights)
        check_gradients(model, "GradCamPicker")
        x = self.images[index : index + 1].clone().requires_grad_(True)
        with record(model, layer, backward=True) as rec, torch.enable_grad():
            scores = class_scores(model(x), 1)
            chosen = int(targets_for(scores, wanted_targets(target, 1))[0])
            torch.autograd.grad(scores[0, chosen], x)  # the parameters' .grad stay untouched
        last = rec.calls(layer)[-1]  # a layer called twice (a ResNet ReLU) is explained at its last call
        try:
            gradient = last.grad_output[0]
        except NoGradientError:
            raise NoGradientError(f"layer {layer!r} does not contribute to the score of class {chosen}: no gradient "
                                  "reaches it; pick a layer the scores depend on") from None
        found = {"activation": last.output, "gradient": gradient, "target": chosen,
                 "score": float(scores[0, chosen].detach()), "predicted": int(scores[0].argmax())}
        self._passes[key] = found
        while len(self._passes) > _KEPT:
            self._passes.popitem(last=False)
        return found

    def _raw(self, layer: str, target: int | None, index: int, method: str, weights: str) -> tuple[dict, torch.Tensor]:
        """The recorded pass (``_record``) and ``method``'s ``(h, w)`` map before the ReLU; no guided backprop."""
        if target is None and weights == "random":  # the class the trained model predicts, not the random one
            target = int(self.predicted[index])
        found = self._record(layer, target, index, weights)
        raw = self.methods[method](found["activation"], found["gradient"])
        if not isinstance(raw, torch.Tensor) or raw.shape != (1, *found["activation"].shape[2:]):
            got = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
            raise ValueError(f"method {method!r} must return (N, h, w) maps, here (1, "
                             f"{', '.join(map(str, found['activation'].shape[2:]))}); it returned {got}")
        return found, raw.detach()[0]

    def compute(self, layer: str, target: int | None, index: int = 0, *, method: str = "guided Grad-CAM",
                weights: str = "trained") -> dict:
        """The map of ``method`` at ``layer`` for class ``target`` (None: predicted) and image ``index``:
        a dict with ``map`` (after the ReLU) and ``raw`` (before it), both ``(h, w)``, ``score``,
        ``target``, ``predicted``, and what was asked (``layer``, ``index``, ``method``, ``weights``);
        guided Grad-CAM adds ``saliency`` (guided backprop, summed over colour channels), ``cam`` (the
        map upsampled) and ``guided`` (their product), all ``(H, W)``, kept with the recorded pass."""
        index, method = self._index(index), self._method(method)
        found, raw = self._raw(layer, target, index, method, weights)
        parts = {key: found[key] for key in ("score", "target", "predicted")}
        parts.update(layer=layer, index=index, method=method, weights=weights, raw=raw, map=raw.clamp(min=0))
        if method == "guided Grad-CAM":
            if "guided parts" not in found:  # guided backprop once per recorded pass (layer, class, image, weights)
                x = self.images[index : index + 1]
                guided = guided_parts(self._model(weights), x, parts["map"][None], found["target"])
                found["guided parts"] = {key: value[0] for key, value in guided.items()}
            parts.update(found["guided parts"])
        return parts

    def describe(self, parts: dict) -> str:
        """``compute``'s ``parts`` in words: image, class and score; the map's peak and sign; guided
        Grad-CAM's statistics; and, with random weights, how much the map still resembles the
        trained model's."""
        layer, index, cam = parts["layer"], parts["index"], parts["map"]
        name = "Grad-CAM" if parts["method"] == "guided Grad-CAM" else parts["method"]
        row, col = divmod(int(cam.flatten().argmax()), cam.shape[1])
        lines = [f"image {index}: label {int(self.labels[index])}, predicted {int(self.predicted[index])}; "
                 f"class {parts['target']} (score {parts['score']:.4f}) explained at {layer}",
                 f"  {name} {tuple(cam.shape)}: max {cam.max():.4f} at row {row}, col {col}; "
                 f"{(cam > 0).float().mean():.1%} of cells > 0; sum before ReLU {parts['raw'].sum():.4f}"]
        if "guided" in parts:
            lines.append(f"  guided Grad-CAM: {describe_tensor(parts['guided'])}")
        if parts["weights"] == "random":
            trained = self._raw(layer, parts["target"], index, parts["method"], "trained")[1]
            rho = _rank_correlation(parts["raw"], trained)
            lines += [f"  random weights (every layer re-drawn, seed {self.random_seed}; it predicts "
                      f"{parts['predicted']}): rank correlation with the trained model's map {rho:.2f}",
                      "  (a map that stays the same when the weights are random explains nothing: "
                      "Adebayo et al. 2018)"]
        return "\n".join(lines)

    def render(self, layer: str, target: int | None, index: int = 0, *, method: str = "guided Grad-CAM",
               weights: str = "trained", scale: str = "own", signed: bool = False):
        """Print ``describe`` and return the figure the widget shows, as a pyplot figure."""
        parts = self.compute(layer, target, index, method=method, weights=weights)
        print(self.describe(parts))
        return self._figure(True, parts, scale, signed)

    def figure(self, parts: dict, *, scale: str = "own", signed: bool = False):
        """``compute``'s ``parts`` drawn: the image; the map over it; with ``signed``, the map before the
        ReLU (red > 0 > blue); for guided Grad-CAM, guided backprop and guided Grad-CAM. Returns a
        figure pyplot does not track."""
        return self._figure(False, parts, scale, signed)

    def _figure(self, pyplot: bool, parts: dict, scale: str, signed: bool):
        if scale not in ("own", "shared"):
            raise ValueError(f"scale must be 'own' (each map from 0 to its maximum) or 'shared', not {scale!r}")
        vmax = None
        if scale == "shared":  # the larger of this map's and the predicted class's maximum
            reference = self._raw(parts["layer"], None, parts["index"], parts["method"], parts["weights"])[1]
            vmax = max(float(parts["map"].max()), float(reference.clamp(min=0).max()))
        panels = 2 + bool(signed) + 2 * ("guided" in parts)
        return new_figure(pyplot, lambda fig: self._draw(fig, parts, vmax, signed),
                          figsize=(2.25 * panels, 2.9), layout="constrained")

    def _draw(self, fig, parts: dict, vmax, signed: bool) -> None:
        axes = list(fig.subplots(1, 2 + bool(signed) + 2 * ("guided" in parts)))
        layer, target, index = parts["layer"], parts["target"], parts["index"]
        image = self.images[index]
        shown = _shown(image)
        axes[0].imshow(shown.numpy(), cmap="gray_r" if len(image) == 1 else None)
        axes[0].set_title(f"image {index}\nlabel {int(self.labels[index])}", fontsize=9)
        name = "Grad-CAM" if parts["method"] == "guided Grad-CAM" else parts["method"]
        random = "\nrandom weights" if parts["weights"] == "random" else ""
        draw_cam(shown, parts["map"], f"{name} {layer}, class {target}{random}", ax=axes[1], vmax=vmax)
        more = [(parts["raw"], f"before the ReLU, class {target}\nsum {parts['raw'].sum():.4g}")] if signed else []
        if "guided" in parts:
            more += [(parts[key], f"{title}, class {target}\nred > 0 > blue")
                     for key, title in (("saliency", "guided backprop"), ("guided", "guided Grad-CAM"))]
        for ax, (values, title) in zip(axes[2:], more, strict=True):
            draw_signed(values, ax=ax)
            ax.set_title(title, fontsize=9)
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])

    def widget(self, layer: str | None = None, *, method: str = "guided Grad-CAM") -> Panel:
        """Controls "layer", "class", "image", "method", "scale", "before ReLU" and "weights"; each
        move recomputes (hooks live only meanwhile)."""
        from ipywidgets import Checkbox, Dropdown, HBox, IntSlider, Layout, SelectionSlider, ToggleButtons

        layer = layer or self.layers[-1]
        self._check_layer(layer)
        wide = {"layout": Layout(width="560px"), "style": {"description_width": "60px"}}
        short = {"style": {"description_width": "60px", "button_width": "80px"}}
        controls = {
            "layer": SelectionSlider(options=self.layers, value=layer, description="layer", **wide),
            "target": IntSlider(int(self.predicted[0]), 0, self.classes - 1, description="class", **wide),
            "index": IntSlider(0, 0, len(self.images) - 1, description="image", disabled=len(self.images) == 1, **wide),
            "method": Dropdown(options=list(self.methods), value=self._method(method), description="method",
                               layout=Layout(width="280px"), style={"description_width": "60px"}),
            "signed": Checkbox(False, description="before ReLU", indent=False, layout=Layout(width="110px")),
            "scale": ToggleButtons(options=["own", "shared"], description="scale", **short),
            "weights": ToggleButtons(options=["trained", "random"], description="weights", **short),
        }
        rows = [controls["layer"], controls["target"], controls["index"],
                HBox([controls["method"], controls["signed"]]), HBox([controls["scale"], controls["weights"]])]

        def redraw(panel: Panel) -> tuple[str, bytes]:
            layer, target, index = panel.layer.value, panel.target.value, panel.index.value
            parts = self.compute(layer, target, index, method=panel.method.value, weights=panel.weights.value)
            fig = self.figure(parts, scale=panel.scale.value, signed=panel.signed.value)
            return self.describe(parts), figure_png(fig)

        return Panel(rows, controls, redraw)


def _randomised(model: nn.Module, seed: int) -> tuple[nn.Module, int]:
    """A copy of ``model`` with every layer re-drawn by its ``reset_parameters()`` (its default
    initialisation) from ``seed``, or the next seed if that gives the very same weights (a model
    built from that seed); the caller's random numbers stay untouched."""
    copied = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        for attempt in range(seed, seed + 3):
            torch.manual_seed(attempt)
            for module in copied.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
            if not all(torch.equal(a, b) for a, b in zip(copied.parameters(), model.parameters(), strict=True)):
                return copied, attempt
    raise ValueError(f"re-drawing the weights of {type(model).__name__} changed none of them: its layers need a "
                     "reset_parameters() method (as torch.nn's layers have)")


def _rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two maps' cells (1: the same order, 0: unrelated)."""
    ranks = [t.flatten().argsort().argsort().double() for t in (a, b)]
    centred = [r - r.mean() for r in ranks]
    norm = float(centred[0].norm() * centred[1].norm())
    return float((centred[0] * centred[1]).sum()) / norm if norm else 0.0
