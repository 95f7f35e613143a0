"""The Grad-CAM picker of notebook 05, and ``draw_cam``, which draws a class map over an image.

* ``draw_cam(image, cam, title, ax=None, vmax=None)``: the map at its own resolution over the
  image (``inferno``, from 0 to ``vmax``, by default the map's maximum) on a matplotlib ``Axes``:
  over a digit with the digit's outline on top, over a photo half transparent.
* ``METHODS``: how a map is made from one layer's activations ``A`` and the gradient ``G`` of the
  score with respect to them, both ``(N, C, h, w)``, before the final ReLU: Grad-CAM
  ``Σ_k mean(G_k) A_k`` (Selvaraju et al. 2017; guided Grad-CAM multiplies its map by guided
  backprop), HiResCAM ``Σ_k G_k ⊙ A_k`` (Draelos & Carin 2020), Layer-CAM
  ``Σ_k relu(G_k) ⊙ A_k`` (Jiang et al. 2021). A student's own ``f(A, G) -> (N, h, w)`` joins
  them through ``GradCamPicker(..., methods={"mine": f})``.
* ``GradCamPicker(model, images, labels, layers)``: for a chosen layer, class, image and method,
  the map (``compute``), printed (``describe(parts)``) and drawn over the image (``picture(parts)``,
  straight to PNG): single-channel digits ``(N, 1, H, W)`` and RGB photos ``(N, 3, H, W)`` alike.
  Options: the colour scale of the map (``scale="own"``, or ``"shared"`` with the predicted
  class's map, so a weak map looks weak), the signed map before the ReLU (``signed=True``), and
  the weight randomisation sanity check (``weights="random"``: the same model with every layer
  re-drawn, and every bare ``nn.Parameter`` outside the layers, ``bare_parameters``; Adebayo et
  al. 2018: a map that does not change when the weights are randomised explains nothing).
  ``render(...)`` prints and returns the picture in a pyplot figure, ``figure(parts)`` in a figure
  pyplot does not track; ``widget()`` is the same code behind controls (a ``hooklab.widgets.Panel``).

What is kept, so that a move of the widget waits for as little as it can: per image and model
(trained or random), one forward pass with its graph (the last few); on it, per class, one
backward pass that gives every layer's gradient at once, and for guided Grad-CAM one more, with
the ReLUs guided; per layer, class and method, the map. A new layer, method, scale or
"before ReLU" runs no pass: it computes a map from what is kept, or only colours it again. The
kept passes belong to the weights they were made with: any in-place write into a parameter or
buffer (``load_state_dict``, an optimiser step, re-drawn weights) bumps its version counter, and
the next ``compute`` runs the pass again. The module hooks live only while a forward pass runs.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from .checks import (
    check_index,
    check_inputs,
    class_scores,
    drawn,
    new_figure,
    non_finite_kinds,
    targets_for,
    wanted_targets,
)
from .data import to_display
from .hooks import Hooks
from .layers import get_layer, unknown_name_hint
from .picture import BLACK, DARK, Canvas, Picture, fit, rgb
from .pytorch_internals import version
from .recording import NoGradientError, record
from .saliency import check_grad_mode, check_gradients, grad_cam_map, upsample
from .widgets import Panel, _fmt, describe_tensor

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
_KEPT = 3  # forward passes kept, each with its graph: the image shown with both weights, and one more
_SIDE, _GAP = 176, 16  # pixels: a panel of the picture, the gap between panels


def _shown(image: torch.Tensor) -> torch.Tensor:
    """One image of the batch as ``draw_cam`` takes it: a digit ``(1, H, W)`` -> ``(H, W)``, a photo
    ``(3, H, W)`` -> ``(H, W, 3)`` in [0, 1]. A photo with values outside [0, 1] is taken as
    normalised the way ``hooklab.data.photo`` does, and ``hooklab.data.to_display`` undoes that."""
    if len(image) == 1:
        return image[0]
    if image.min() < 0 or image.max() > 1:
        return torch.from_numpy(to_display(image[None]))
    return image.clamp(0, 1).permute(1, 2, 0)


class _Pass:
    """One image's forward pass through one model, its graph kept for the backward passes the
    picker runs on it: one per class for the layers' gradients, one per class for guided backprop.

    While the forward pass runs (and only then) a forward hook on each of the picker's layers keeps
    its output, the graph node to differentiate by, and hands the model a copy instead, so that a
    later in-place write (``out += identity``, ``ReLU(inplace=True)``) changes the copy, not the
    kept output; a forward hook on each ``nn.ReLU`` registers a tensor hook on its output that
    clamps the gradient at 0 while ``guided[0]`` is on: guided backprop, with the same numbers as
    ``GuidedBackprop``'s full backward hooks, which clamp what the ReLU passes back (the ReLU
    multiplies by a mask of 0s and 1s: clamping before it or after it gives the same).
    The module hooks are removed when the forward pass returns, also on error; the tensor hooks
    ride on the kept graph and go with it.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, layers: list[str], state: tuple):
        self.state, self.relus = state, 0
        self.guided = [False]  # read by the tensor hooks: a list, so that they hold no reference to the pass
        self.kept: dict[str, torch.Tensor] = {}
        self.gradients: dict[int, dict] = {}  # class -> layer -> gradient (None: it does not reach the layer)
        self.saliency: dict[int, torch.Tensor] = {}  # class -> guided backprop, summed over colour channels
        self.maps: dict[tuple, torch.Tensor] = {}  # (layer, class, method) -> (h, w) map before the ReLU
        self.guided_parts: dict[tuple, dict] = {}  # (layer, class) -> guided Grad-CAM's (H, W) parts
        versions: dict[str, int] = {}
        self.x = x.detach().clone().requires_grad_(True)

        def keeper(name: str):
            def keep(module, args, output):
                self.kept[name], versions[name] = output, version(output)  # a layer called twice: its last call
                return output.clone()

            return keep

        guided = self.guided

        def guide(module, args, output):
            self.relus += 1
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: grad.clamp(min=0) if guided[0] else None)

        with Hooks() as hooks, torch.enable_grad():
            for name in layers:
                hooks.add(get_layer(model, name).register_forward_hook(keeper(name)))
            for module in model.modules():
                if isinstance(module, nn.ReLU):
                    hooks.add(module.register_forward_hook(guide))
            self.scores = class_scores(model(self.x), 1)
        for name, output in self.kept.items():
            if version(output) != versions[name]:  # the model wrote into it, not into the copy it was handed
                raise ValueError(f"layer {name!r}: its output was changed in place after it returned (the model "
                                 "does not use what the layer returns); pick another layer")
        self.predicted = int(self.scores[0].argmax())

    def gradient(self, layer: str, target: int) -> torch.Tensor:
        """d score[target] / d output of ``layer``: one backward pass per class gives every layer's."""
        if target not in self.gradients:
            names = list(self.kept)
            with torch.enable_grad():  # also under torch.no_grad(): the score is taken from the kept graph
                found = torch.autograd.grad(self.scores[0, target], [self.kept[n] for n in names],
                                            retain_graph=True, allow_unused=True)  # fmt: skip
            self.gradients[target] = dict(zip(names, found, strict=True))
        gradient = self.gradients[target][layer]
        if gradient is None:
            raise NoGradientError(f"layer {layer!r} does not contribute to the score of class {target}: no gradient "
                                  "reaches it; pick a layer the scores depend on")
        return gradient

    def guided_saliency(self, model: nn.Module, target: int) -> torch.Tensor:
        """Guided backprop of class ``target``, summed over colour channels: ``(H, W)``."""
        if target not in self.saliency:
            if not any(isinstance(m, nn.ReLU) for m in model.modules()):
                raise ValueError(f"{type(model).__name__} has no nn.ReLU module: guided backprop needs them")
            if not self.relus:
                raise ValueError(f"no nn.ReLU ran in the forward pass of {type(model).__name__} on the way to the "
                                 "score (does it call torch.relu or F.relu?): this would be the plain gradient")
            self.guided[0] = True
            try:
                with torch.enable_grad():
                    (grad,) = torch.autograd.grad(self.scores[0, target], self.x, retain_graph=True)
            finally:
                self.guided[0] = False
            self.saliency[target] = grad.sum(dim=1)[0]
        return self.saliency[target]


class _Panel(NamedTuple):
    """One panel of the picker's picture: what it shows and how its values become colours."""

    title: tuple  # lines of text above it
    kind: str  # "image", "map" (over the image, 0..high in inferno) or "signed" (RdBu_r, -high..high)
    values: torch.Tensor | None  # (h, w); None for the image itself
    high: float = 1.0  # the colour scale's top


def _weights_state(model: nn.Module) -> tuple:
    """Which tensors the model computes with and how often each was written in place: PyTorch's
    version counters, which every in-place write bumps (an optimiser step, ``load_state_dict``,
    ``reset_parameters``, ``nn.init``); writes through ``.data`` escape them."""
    return tuple((id(t), version(t)) for t in (*model.parameters(), *model.buffers()))


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
        self.seed, self.random_seed, self._random, self._random_from = seed, None, None, None
        self._passes: OrderedDict = OrderedDict()  # (index, weights) -> _Pass, the last few
        self._shown: dict = {}  # (index, size) -> the image's pixels, as the picture shows them
        with record(model, self.layers) as rec, torch.no_grad():
            scores = class_scores(model(images), len(images))
        for name in self.layers:
            output = rec.calls(name)[-1].output if rec.calls(name) else None
            if not isinstance(output, torch.Tensor) or output.dim() != 4:
                got = f"shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else "no tensor"
                raise ValueError(f"layer {name!r} returns {got}; Grad-CAM needs a layer that returns an "
                                 "(N, C, H, W) tensor, such as a convolution")
        self.classes = scores.shape[1]  # the "class" slider's range
        self.predicted = scores.argmax(dim=1)  # by the trained model; kept up to date with its passes

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
        trained = _weights_state(self.model)
        if self._random is None or self._random_from != trained:  # re-drawn from the model as it is now
            self._random, self.random_seed = _randomised(self.model, self.seed)
            self._random_from = trained
        return self._random

    def _check_layer(self, layer: str) -> None:
        if layer not in self.layers:
            raise LookupError(f"{layer!r} is not one of this picker's layers; "
                              f"{unknown_name_hint(str(layer), self.layers, kind='layers')}")

    def _pass(self, index: int, weights: str) -> _Pass:
        """The forward pass of image ``index`` through the ``weights`` model, run now unless one of the
        last few was made with the weights as they are now (a write into any of them runs it again)."""
        model = self._model(weights)
        key, state = (index, weights), _weights_state(model)
        found = self._passes.get(key)
        if found is None or found.state != state:
            check_gradients(model, "GradCamPicker")
            self._passes.pop(key, None)
            found = self._passes[key] = _Pass(model, self.images[index : index + 1], self.layers, state)
            while len(self._passes) > _KEPT:
                self._passes.popitem(last=False)
            if weights == "trained":
                self.predicted[index] = found.predicted
        self._passes.move_to_end(key)
        return found

    def _raw(self, layer: str, target: int | None, index: int, method: str, weights: str) -> tuple:
        """The pass (``_pass``), the class explained and ``method``'s ``(h, w)`` map before the ReLU."""
        self._check_layer(layer)
        check_grad_mode("GradCamPicker")
        if target is None and weights == "random":  # the class the trained model predicts, not the random one
            target = self._pass(index, "trained").predicted
        run = self._pass(index, weights)
        chosen = int(targets_for(run.scores.detach(), wanted_targets(target, 1))[0])
        key = (layer, chosen, method)
        if key not in run.maps:
            activation = run.kept[layer].detach()  # copies below: a method that writes in place changes only them
            raw = self.methods[method](activation.clone(), run.gradient(layer, chosen).clone())
            if not isinstance(raw, torch.Tensor) or raw.shape != (1, *activation.shape[2:]):
                got = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
                raise ValueError(f"method {method!r} must return (N, h, w) maps, here (1, "
                                 f"{', '.join(map(str, activation.shape[2:]))}); it returned {got}")
            run.maps[key] = raw.detach()[0]
        return run, chosen, run.maps[key]

    def compute(self, layer: str, target: int | None, index: int = 0, *, method: str = "guided Grad-CAM",
                weights: str = "trained") -> dict:
        """The map of ``method`` at ``layer`` for class ``target`` (None: predicted) and image ``index``:
        a dict with ``map`` (after the ReLU) and ``raw`` (before it), both ``(h, w)``, ``score``,
        ``target``, ``predicted``, and what was asked (``layer``, ``index``, ``method``, ``weights``);
        guided Grad-CAM adds ``saliency`` (guided backprop, summed over colour channels), ``cam`` (the
        map upsampled) and ``guided`` (their product), all ``(H, W)``. Everything is kept with the
        image's forward pass: asking again, or for another layer or method, runs no pass."""
        index, method = self._index(index), self._method(method)
        run, chosen, raw = self._raw(layer, target, index, method, weights)
        parts = {"score": float(run.scores[0, chosen].detach()), "target": chosen, "predicted": run.predicted}
        parts.update(layer=layer, index=index, method=method, weights=weights, raw=raw, map=raw.clamp(min=0))
        if method == "guided Grad-CAM":
            if (layer, chosen) not in run.guided_parts:
                saliency = run.guided_saliency(self._model(weights), chosen)
                cam = upsample(parts["map"][None], tuple(saliency.shape))[0]
                run.guided_parts[layer, chosen] = {"cam": cam, "saliency": saliency, "guided": saliency * cam}
            parts.update(run.guided_parts[layer, chosen])
        return parts

    def describe(self, parts: dict) -> str:
        """``compute``'s ``parts`` in words: image, class and score; the map's peak and sign; guided
        Grad-CAM's statistics; and, with random weights, how much the map still resembles the
        trained model's."""
        layer, index, cam = parts["layer"], parts["index"], parts["map"]
        name = "Grad-CAM" if parts["method"] == "guided Grad-CAM" else parts["method"]
        row, col = divmod(int(cam.flatten().argmax()), cam.shape[1])
        trained = self._pass(index, "trained").predicted
        kinds = non_finite_kinds(self.images[index])
        lines = [f"image {index}: label {int(self.labels[index])}, predicted {trained}; "
                 f"class {parts['target']} (score {parts['score']:.4f}) explained at {layer}",
                 *([f"  the input holds {kinds}: every score, gradient and map computed from it is NaN "
                    "(replace those values, e.g. images.nan_to_num(0.0))"] if kinds else []),
                 f"  {name} {tuple(cam.shape)}: max {cam.max():.4f} at row {row}, col {col}; "
                 f"{(cam > 0).float().mean():.1%} of cells > 0; sum before ReLU {parts['raw'].sum():.4f}"]
        if "guided" in parts:
            lines.append(f"  guided Grad-CAM: {describe_tensor(parts['guided'])}")
        if parts["weights"] == "random":
            trained_map = self._raw(layer, parts["target"], index, parts["method"], "trained")[2]
            rho = _rank_correlation(parts["raw"], trained_map)
            lines += [f"  random weights (every layer re-drawn, seed {self.random_seed}; it predicts "
                      f"{parts['predicted']}): rank correlation with the trained model's map {rho:.2f}",
                      "  (a map that stays the same when the weights are random explains nothing: "
                      "Adebayo et al. 2018)"]
            bare = list(bare_parameters(self._random))
            if bare:  # re-drawn too, though no layer's reset_parameters() covers them
                lines.append(f"  parameters outside any layer, re-drawn from a normal of their own mean and std: "
                             f"{', '.join(map(repr, bare[:4]))}{' …' if len(bare) > 4 else ''}")
        return "\n".join(lines)

    def _panels(self, parts: dict, scale: str, signed: bool) -> list[_Panel]:
        """What the picture shows, panel by panel, with each colour scale."""
        if scale not in ("own", "shared"):
            raise ValueError(f"scale must be 'own' (each map from 0 to its maximum) or 'shared', not {scale!r}")
        layer, target, index, cam = parts["layer"], parts["target"], parts["index"], parts["map"]
        top = float(cam.max())
        high, scaled = top, ""
        if scale == "shared":  # the larger of this map's and the predicted class's maximum
            reference = self._raw(layer, None, index, parts["method"], parts["weights"])[2]
            high, scaled = max(top, float(reference.clamp(min=0).max())), ", scale shared"
        name = "Grad-CAM" if parts["method"] == "guided Grad-CAM" else parts["method"]
        random = ", random weights" if parts["weights"] == "random" else ""
        panels = [_Panel((f"image {index}", f"label {int(self.labels[index])}"), "image", None),
                  _Panel((f"{name}, class {target}", f"{layer}{random}", f"max {top:.4g}{scaled}"), "map", cam,
                         high or 1.0)]  # fmt: skip
        more = [(parts["raw"], "before the ReLU", f"sum {parts['raw'].sum():.4g}")] if signed else []
        if "guided" in parts:
            more += [(parts["saliency"], "guided backprop", "red > 0 > blue"),
                     (parts["guided"], "guided Grad-CAM", "red > 0 > blue")]  # fmt: skip
        for values, title, note in more:
            finite = values[values.isfinite()]
            bound = float(finite.abs().max()) if finite.numel() else 0.0
            panels.append(_Panel((title, f"class {target}", note), "signed", values, bound or 1.0))
        return panels

    def _canvas(self, parts: dict, scale: str, signed: bool) -> Canvas:
        """The picture on a canvas: a panel beside the other, titles above, colour bars below."""
        panels = self._panels(parts, scale, signed)
        image = self.images[parts["index"]]
        zoom = _SIDE / max(image.shape[-2:])
        size = (max(1, round(image.shape[-1] * zoom)), max(1, round(image.shape[-2] * zoom)))
        top = 6 + 15 * max(len(p.title) for p in panels)
        canvas = Canvas(len(panels) * (_SIDE + _GAP) + _GAP // 2, top + size[1] + 34, rgb=True)
        shown, photo = self._image(parts["index"], size), image.shape[0] == 3
        for i, panel in enumerate(panels):
            x = _GAP // 2 + i * (_SIDE + _GAP)
            for j, line in enumerate(panel.title):
                canvas.text(x, 4 + 15 * j, line, size=12 if j == 0 else 11, fill=BLACK if j == 0 else DARK)
            canvas.frame((x - 1, top - 1, x + size[0], top + size[1]), colour=DARK, width=1)  # where white ends
            if panel.kind == "image":
                canvas.paste(shown, x, top)
                continue
            values = fit(panel.values, size)
            if panel.kind == "map":
                pixels = rgb(values, "inferno", 0.0, panel.high)
                if photo:  # over a photo, half transparent (as matplotlib's alpha 0.55)
                    pixels = (0.55 * pixels + 0.45 * shown).round().astype(np.uint8)
                canvas.paste(pixels, x, top)
                if not photo:
                    self._outline(canvas, image[0], x, top, size)
                low, cmap = 0.0, "inferno"
            else:
                low, cmap = -panel.high, "RdBu_r"
                canvas.paste(rgb(values, cmap, low, panel.high), x, top)
            canvas.paste(rgb(torch.linspace(0, 1, _SIDE)[None].expand(8, _SIDE), cmap, 0.0, 1.0), x, top + size[1] + 6)
            canvas.text(x, top + size[1] + 18, _fmt(low), size=11)
            canvas.text(x + _SIDE, top + size[1] + 18, _fmt(panel.high), size=11, anchor="ra")
        return canvas

    def _image(self, index: int, size: tuple[int, int]) -> np.ndarray:
        """The image as the picture shows it, ``size`` pixels, as ``(h, w, 3)`` RGB bytes (a digit in
        ``gray_r`` from its minimum to its maximum), kept per image."""
        key = (index, size)
        if key not in self._shown:
            image = _shown(self.images[index])
            if image.dim() == 2:
                self._shown[key] = rgb(fit(image, size), "gray_r", float(image.min()), float(image.max()))
            else:
                pixels = fit(image.permute(2, 0, 1), size).permute(1, 2, 0) * 255
                self._shown[key] = pixels.round().to(torch.uint8).numpy()
        return self._shown[key]

    @staticmethod
    def _outline(canvas: Canvas, image: torch.Tensor, x: int, y: int, size: tuple[int, int]) -> None:
        """The digit's contour at half its maximum, a cyan line on a black one, over the map."""
        from contourpy import contour_generator

        values = image.detach().double().numpy()
        if not values.max() > values.min():
            return
        sx, sy = size[0] / values.shape[1], size[1] / values.shape[0]
        for line in contour_generator(z=values).lines(0.5 * float(values.max())):
            canvas.line([(x + (c + 0.5) * sx, y + (r + 0.5) * sy) for c, r in line])

    def picture(self, parts: dict, *, scale: str = "own", signed: bool = False) -> Picture:
        """``compute``'s ``parts`` drawn as the widget shows them, straight to PNG: the image; the map
        over it (inferno from 0 to its maximum, or with ``scale="shared"`` to the larger of its own
        and the predicted class's maximum, so that a weak map looks weak; over a digit, the digit's
        outline); with ``signed``, the map before the ReLU; for guided Grad-CAM, guided backprop and
        guided Grad-CAM (red > 0 > blue). Colour bars give each scale's ends."""
        return self._canvas(parts, scale, signed).png()

    def render(self, layer: str, target: int | None, index: int = 0, *, method: str = "guided Grad-CAM",
               weights: str = "trained", scale: str = "own", signed: bool = False):
        """Print ``describe`` and return the picture the widget shows in a pyplot figure."""
        parts = self.compute(layer, target, index, method=method, weights=weights)
        print(self.describe(parts))
        return self._figure(True, parts, scale, signed)

    def figure(self, parts: dict, *, scale: str = "own", signed: bool = False):
        """``picture(parts, ...)`` in a matplotlib figure pyplot does not track (one pixel a pixel at
        its 100 dpi), for ``savefig`` or a page of figures."""
        return self._figure(False, parts, scale, signed)

    def _figure(self, pyplot: bool, parts: dict, scale: str, signed: bool):
        image = self._canvas(parts, scale, signed).image
        width, height = image.size
        return new_figure(pyplot, lambda fig: self._draw(fig, np.asarray(image)), figsize=(width / 100, height / 100),
                          dpi=100)  # fmt: skip

    @staticmethod
    def _draw(fig, pixels: np.ndarray) -> None:
        ax = fig.add_axes((0, 0, 1, 1))
        ax.imshow(pixels, interpolation="nearest")
        ax.set_axis_off()

    def widget(self, layer: str | None = None, *, method: str = "guided Grad-CAM") -> Panel:
        """Controls "layer", "class", "image", "method", "scale", "before ReLU" and "weights". A move
        of "class", "image" or "weights" runs a pass the first time it is asked for; "layer",
        "method", "scale" and "before ReLU" only compute a map from what is kept and draw it. The
        random weights are drawn when the widget is made."""
        from ipywidgets import Checkbox, Dropdown, HBox, IntSlider, Layout, SelectionSlider, ToggleButtons

        layer = layer or self.layers[-1]
        self._check_layer(layer)
        with contextlib.suppress(ValueError):  # weights no reset_parameters() re-draws: it says so when picked
            self._model("random")  # re-drawn now, so that the "weights" toggle waits only for its pass
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
            shown = self.picture(parts, scale=panel.scale.value, signed=panel.signed.value)
            return self.describe(parts), shown.png

        return Panel(rows, controls, redraw)


def _randomised(model: nn.Module, seed: int) -> tuple[nn.Module, int]:
    """A copy of ``model`` with every layer re-drawn by its ``reset_parameters()`` (its default
    initialisation) from ``seed``, or the next seed if that gives the very same weights (a model
    built from that seed); the caller's random numbers stay untouched. A parameter that no
    ``reset_parameters()`` covers (a bare ``nn.Parameter`` of a module of your own) is re-drawn
    too, from a normal distribution with its own mean and standard deviation (``bare_parameters``)."""
    copied = copy.deepcopy(model)
    bare = bare_parameters(copied)
    with torch.random.fork_rng(devices=[]):
        for attempt in range(seed, seed + 3):
            torch.manual_seed(attempt)
            for module in copied.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
            with torch.no_grad():
                for p in bare.values():
                    _redraw(p)
            if not all(torch.equal(a, b) for a, b in zip(copied.parameters(), model.parameters(), strict=True)):
                return copied, attempt
    raise ValueError(f"re-drawing the weights of {type(model).__name__} changed none of them: its layers need a "
                     "reset_parameters() method (as torch.nn's layers have)")


def bare_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that no ``reset_parameters()`` re-draws: those held directly by a module
    that has no such method (``self.scale = nn.Parameter(...)`` in a module of your own), by name."""
    covered = {id(p) for m in model.modules() if hasattr(m, "reset_parameters") for p in m.parameters(recurse=False)}
    bare: dict[str, nn.Parameter] = {}
    for name, p in model.named_parameters():
        if id(p) not in covered and all(p is not q for q in bare.values()):
            bare[name] = p
    return bare


def _redraw(p: torch.Tensor) -> None:
    """Fill ``p`` from a normal distribution with its own mean and standard deviation (one value, or
    values all equal: the spread is the mean's size, or 1 for zeros)."""
    mean = float(p.mean()) if p.numel() else 0.0
    std = float(p.std()) if p.numel() > 1 else 0.0
    if not std > 0:
        std = abs(mean) or 1.0
    p.normal_(mean, std)


def _rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two maps' cells (1: the same order, 0: unrelated)."""
    ranks = [t.flatten().argsort().argsort().double() for t in (a, b)]
    centred = [r - r.mean() for r in ranks]
    norm = float(centred[0].norm() * centred[1].norm())
    return float((centred[0] * centred[1]).sum()) / norm if norm else 0.0
