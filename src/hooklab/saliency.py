"""Where did the network look? Guided backpropagation, Grad-CAM and guided Grad-CAM.

Notebook 05 builds each of these by hand first; this module is what it moves into the package.

* ``GuidedBackprop(model)``: a context manager that puts a full backward hook on every
  ``nn.ReLU`` (found with ``model.modules()``, so also inside ``Sequential`` blocks). The hook
  ``hook(module, grad_input, grad_output) -> (grad_input[0].clamp(min=0),)`` replaces the
  gradient the ReLU passes back, so only positive evidence flows to the input. Full backward
  hooks refuse ReLUs that work in place, so ``inplace`` is switched off while the hooks live
  and restored afterwards. ``saliency(x, target)`` returns d score / d input.
* ``GradCAM(model, layer)``: each call records ``layer`` with
  ``hooklab.record(model, layer, backward=True)`` for one pass: the layer's output and
  the gradient with respect to it (tensor hooks, which also work where full backward hooks
  break, e.g. torchvision's ResNets). ``__call__(x, target)`` returns a ``CamResult``:
  ``relu(sum_k alpha_k A_k)`` with ``alpha_k`` the spatial mean of d score / d A_k. A layer
  called more than once per forward pass (a ResNet block's ReLU) is explained at its last call.
  ``grad_cam_map(A, G)`` is that formula before the ReLU, the one ``hooklab.cam_widgets`` uses too.
* ``guided_grad_cam``: guided backprop saliency times the Grad-CAM map upsampled to the input
  (``guided_parts`` makes it from maps already computed).
* The sanity checks of notebook 05 (Adebayo et al., 2018): ``input_gradient(model, x, target)``,
  the plain gradient d score / d input; ``rank_correlation(a, b)``, Spearman's rank correlation of
  two batches of maps, one number per map (ties get their average rank); and
  ``randomised_cascade(model, names)``, copies of ``model`` with its layers re-drawn from the top down;
  ``ranks(maps)``, each map's values replaced by their ranks from 0 to 1 (what Spearman's correlation compares).
* Worked versions of notebook 05's exercises, which its cells use until your own answer passes:
  ``dead_channels(model, layer, x)`` (05.1), ``DeadWatch(model, layers)`` (05.2) and
  ``layer_cam(model, layer, x, classes)`` (field guide G5.2).

Every handle is owned by the context manager that registered it (a ``hooklab.hooks.Hooks``) and
removed in ``__exit__``, also when the body raises. ``target=None`` means "the predicted class" of each image; an int is
one class for every image, a list or tensor one class per image.

Inputs are checked before any work: ``x`` an ``(N, C, H, W)`` floating-point batch of the model's
dtype and device, the model in eval mode (a BatchNorm or Dropout in train mode raises: it would
change its running statistics or drop other units on each pass), class indices in range. The
gradients are computed also under ``torch.no_grad()`` (not under ``torch.inference_mode()``,
which raises). Grad-CAM inside ``with GuidedBackprop(model):`` raises: its gradients would be
the guided ones.
"""

from __future__ import annotations

import copy
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_inputs, class_scores, short, targets_for, wanted_targets
from .hooks import Hooks
from .layers import get_layer
from .recording import NoGradientError, record

__all__ = ["DeadWatch", "GradCAM", "GuidedBackprop", "dead_channels", "grad_cam", "guided_grad_cam",
           "input_gradient", "layer_cam", "randomised_cascade", "rank_correlation", "ranks"]


def check_grad_mode(what: str) -> None:
    """Raise if no gradient can be computed now (``no_grad`` is fine: the tools enable gradients)."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{what} needs gradients; call it outside torch.inference_mode()")


#: the GuidedBackprop blocks entered and not exited yet
_GUIDED: weakref.WeakSet = weakref.WeakSet()


def check_gradients(model: nn.Module, what: str) -> None:
    """``check_grad_mode``, and raise if guided backprop would replace the plain gradient."""
    check_grad_mode(what)
    guided = {id(relu) for gb in _GUIDED for relu in gb.relus}
    if any(id(m) in guided for m in model.modules()):
        raise RuntimeError(f"{what} inside `with GuidedBackprop(model):` would use guided gradients; "
                           "call it outside that block")


def _score(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of each image's own target score: one backward gives every image's gradient."""
    return scores.gather(1, targets[:, None]).sum()


class GuidedBackprop:
    """``with GuidedBackprop(model) as gb: s = gb.saliency(x)``: guided gradients of the input."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
        if not self.relus:
            raise ValueError(f"{type(model).__name__} has no nn.ReLU module: guided backprop needs them")
        self._hooks = Hooks()
        self._inplace: list[bool] = []
        self._fired = 0

    @staticmethod
    def hook(module: nn.Module, grad_input: tuple, grad_output: tuple) -> tuple:
        """Full backward hook: keep only the positive part of the gradient the ReLU passes back."""
        return (grad_input[0].clamp(min=0),)

    def _counting_hook(self, module: nn.Module, grad_input: tuple, grad_output: tuple) -> tuple:
        self._fired += 1
        return self.hook(module, grad_input, grad_output)

    def __enter__(self) -> GuidedBackprop:
        if self._hooks:  # the inner block's exit would remove the outer block's hooks
            raise RuntimeError("this GuidedBackprop is already inside a `with` block")
        _GUIDED.add(self)
        try:
            for relu in self.relus:
                self._inplace.append(relu.inplace)
                relu.inplace = False  # full backward hooks raise on modules that modify their input
                self._hooks.add(relu.register_full_backward_hook(self._counting_hook))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.remove()
        for relu, inplace in zip(self.relus, self._inplace, strict=False):
            relu.inplace = inplace
        self._inplace.clear()
        _GUIDED.discard(self)

    def saliency(self, x: torch.Tensor, target=None) -> torch.Tensor:
        """d (target score) / d x with guided ReLUs, same shape as ``x``; ``x`` is not changed.

        Only ``nn.ReLU`` modules are guided: a model that calls ``torch.relu`` for some of its
        ReLUs gets the plain gradient through those (one that never runs an ``nn.ReLU`` raises).
        """
        if not self._hooks:
            raise RuntimeError("use saliency() inside `with GuidedBackprop(model) as gb:`")
        check_inputs(self.model, x, "guided backprop")
        check_grad_mode("guided backprop")
        wanted = wanted_targets(target, len(x))
        x = x.detach().clone().requires_grad_(True)
        self._fired = 0
        with torch.enable_grad():
            scores = class_scores(self.model(x), len(x))
            (grad,) = torch.autograd.grad(_score(scores, targets_for(scores, wanted)), x)
        if not self._fired:
            raise ValueError(f"no nn.ReLU ran in the forward pass of {type(self.model).__name__} on the way to the "
                             "score (does it call torch.relu or F.relu?): this would be the plain gradient")
        return grad


class CamResult(NamedTuple):
    maps: torch.Tensor  # (N, h, w) Grad-CAM at the layer's resolution, >= 0
    raw: torch.Tensor  # (N, h, w) the same before the ReLU
    weights: torch.Tensor  # (N, C) alpha: spatial mean of the gradient per channel
    targets: torch.Tensor  # (N,) class explained
    scores: torch.Tensor  # (N,) that class's score


class GradCAM:
    """``with GradCAM(model, "features.3") as cam: result = cam(x)``; see the module docstring."""

    def __init__(self, model: nn.Module, layer: str):
        self.model, self.name = model, layer
        self.layer = get_layer(model, layer)  # a wrong name or type fails here, listing close matches
        self._inside = False

    def __enter__(self) -> GradCAM:
        if self._inside:
            raise RuntimeError("this GradCAM is already inside a `with` block")
        self._inside = True
        return self

    def __exit__(self, *exc) -> None:
        self._inside = False

    def __call__(self, x: torch.Tensor, target=None) -> CamResult:
        if not self._inside:
            raise RuntimeError("call the GradCAM inside `with GradCAM(model, layer) as cam:`")
        check_inputs(self.model, x, "Grad-CAM")
        check_gradients(self.model, "Grad-CAM")
        wanted = wanted_targets(target, len(x))
        x = x.detach().clone().requires_grad_(True)  # a gradient reaches the layer even if its weights are frozen
        # the layer's hooks live for this one pass: hooklab.record owns them
        with record(self.model, self.name, backward=True) as recording, torch.enable_grad():
            scores = class_scores(self.model(x), len(x))
            targets = targets_for(scores, wanted)
            # autograd.grad instead of backward(): the parameters' .grad stay untouched
            torch.autograd.grad(_score(scores, targets), x)
        calls = recording.calls(self.name)
        if not calls:
            raise RuntimeError(f"layer {self.name!r} did not run in the forward pass")
        last = calls[-1]  # its activation and the gradient that reached that same call
        if not isinstance(last.output, torch.Tensor) or last.output.dim() != 4:
            raise ValueError(f"layer {self.name!r} must return an (N, C, H, W) tensor for Grad-CAM")
        try:
            gradient = last.grad_output[0]
        except NoGradientError:
            classes = sorted(set(targets.tolist()))
            which = f"class {classes[0]}" if len(classes) == 1 else "classes " + ", ".join(map(str, classes))
            raise NoGradientError(f"layer {self.name!r} does not contribute to the score of {which}: "
                                  "no gradient reaches it; pick a layer the scores depend on") from None
        raw = grad_cam_map(last.output, gradient)
        chosen = scores.detach().gather(1, targets[:, None])[:, 0]
        return CamResult(raw.clamp(min=0), raw, channel_weights(gradient), targets, chosen)


def channel_weights(gradients: torch.Tensor) -> torch.Tensor:
    """Grad-CAM's ``alpha_k``: the spatial mean of each channel's gradient, ``(N, C, h, w) -> (N, C)``."""
    return gradients.mean(dim=(2, 3))


def grad_cam_map(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Grad-CAM before its ReLU, ``(N, C, h, w)`` twice -> ``(N, h, w)``: ``sum_k alpha_k A_k``, each
    channel of the activations weighted by its gradient's spatial mean (``channel_weights``)."""
    return (channel_weights(gradients)[:, :, None, None] * activations).sum(dim=1)


def check_order(what: str, x, layer) -> None:
    """Raise if the images and the layer name of ``what(model, x, layer)`` came the other way round."""
    if isinstance(x, str) and not isinstance(layer, str):
        raise TypeError(f"{what}(model, x, layer) takes the images before the layer name: it got the name {x!r} "
                        f"as x and {short(layer)} as layer; call {what}(model, x, {x!r})")


def grad_cam(model: nn.Module, x: torch.Tensor, layer: str, target=None) -> CamResult:
    """One-shot Grad-CAM: hooks registered, used and removed inside this call."""
    check_order("grad_cam", x, layer)
    with GradCAM(model, layer) as cam:
        return cam(x, target)


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, h, w) maps -> (N, H, W), bilinear, for laying a map over the input image."""
    return F.interpolate(maps[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]


def guided_grad_cam(model: nn.Module, x: torch.Tensor, layer: str, target=None) -> torch.Tensor:
    """Guided backprop saliency (summed over colour channels) times the upsampled Grad-CAM map."""
    return guided_grad_cam_parts(model, x, layer, target)["guided"]


def guided_grad_cam_parts(model: nn.Module, x: torch.Tensor, layer: str, target=None) -> dict:
    """What guided Grad-CAM is made of, for a batch: the Grad-CAM ``result``, its maps upsampled
    to the input (``cam``), the guided-backprop ``saliency`` summed over colour channels, and their
    product (``guided``)."""
    check_order("guided_grad_cam", x, layer)
    result = grad_cam(model, x, layer, target)
    return {"result": result, **guided_parts(model, x, result.maps, result.targets)}


def guided_parts(model: nn.Module, x: torch.Tensor, maps: torch.Tensor, targets) -> dict:
    """Guided Grad-CAM from class maps already made: ``maps`` ``(N, h, w)`` (after the ReLU) upsampled
    to the input (``cam``), guided backprop of ``targets`` summed over colour channels (``saliency``)
    and their product (``guided``), all ``(N, H, W)``."""
    with GuidedBackprop(model) as gb:  # hooks removed on exit, also on error
        saliency = gb.saliency(x, targets).sum(dim=1)
    cam = upsample(maps, tuple(x.shape[-2:]))
    return {"cam": cam, "saliency": saliency, "guided": saliency * cam}


# ----- the sanity checks of notebook 05 --------------------------------------------------------------
def input_gradient(model: nn.Module, x: torch.Tensor, target=None) -> torch.Tensor:
    """The plain gradient: d (each image's target score) / d x, same shape as ``x``; ``x`` and the
    parameters' ``.grad`` are left as they were (``torch.autograd.grad``, not ``backward()``)."""
    check_inputs(model, x, "the input gradient")
    check_gradients(model, "the input gradient")
    wanted = wanted_targets(target, len(x))
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        scores = class_scores(model(x), len(x))
        (grad,) = torch.autograd.grad(_score(scores, targets_for(scores, wanted)), x)
    return grad


def _ranks(t: torch.Tensor) -> torch.Tensor:
    """Each row's values replaced by their ranks 0 .. n-1, tied values by their average rank."""
    t = t.detach().flatten(1).double().contiguous()
    ordered = t.sort(dim=1).values
    below = torch.searchsorted(ordered, t, side="left")
    up_to = torch.searchsorted(ordered, t, side="right")
    return (below + up_to - 1).double() / 2


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of two batches of maps of one shape ``(N, ...)``: ``(N,)`` numbers
    from -1 (reversed order) through 0 (unrelated) to 1 (the same order). Tied values get their
    average rank, so equal values (a map's zeros) count as equal; a constant map gives ``nan``.
    Compare ``a.abs()`` with ``b.abs()`` to ask whether the same places are large, whatever the sign."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dim() < 2:
        got = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (a, b)]
        raise ValueError(f"rank_correlation needs two batches of maps of one shape (N, ...), got {got[0]} and {got[1]}")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(dim=1, keepdim=True), rb - rb.mean(dim=1, keepdim=True)
    return ((ra * rb).sum(dim=1) / (ra.norm(dim=1) * rb.norm(dim=1))).float()


def randomised_cascade(model: nn.Module, names: list[str], seed: int = 0) -> list[nn.Module]:
    """Cascading randomisation (Adebayo et al., 2018): one copy of ``model`` per name; copy ``k`` is
    copy ``k - 1`` (the model, for the first) with layer ``names[k]`` re-drawn by its
    ``reset_parameters()``, so it has ``names[:k + 1]`` random. ``model`` is not changed; the draws
    come from a generator seeded with ``seed``, and the caller's random stream stays as it was."""
    layers = [get_layer(model, name) for name in names]  # a wrong name fails here, listing close matches
    without = [name for name, layer in zip(names, layers, strict=True) if not hasattr(layer, "reset_parameters")]
    if without:
        raise ValueError(f"layers without reset_parameters() cannot be re-drawn: {without}")
    copies, current = [], model
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for name in names:
            current = copy.deepcopy(current)
            current.get_submodule(name).reset_parameters()
            copies.append(current)
    return copies


def ranks(maps: torch.Tensor) -> torch.Tensor:
    """Each map of a batch ``(N, ...)`` with its values replaced by their ranks scaled to 0 .. 1 (0 the
    smallest value, 1 the largest; tied values share their average rank), in the maps' shape: the
    numbers whose correlation ``rank_correlation`` computes, so one colour scale fits every map."""
    r = _ranks(maps)
    return (r / max(r.shape[1] - 1, 1)).float().reshape(maps.shape)


# ----- worked versions of notebook 05's exercises ----------------------------------------------------
def _dead_mask(output: torch.Tensor) -> torch.Tensor:
    """Channels of an ``(N, C, ...)`` output that are zero for every image and every position."""
    return (output == 0).flatten(2).all(dim=2).all(dim=0)


def dead_channels(model: nn.Module, layer: str, x: torch.Tensor) -> list[int]:
    """The sorted channels of ``layer`` dead on the batch ``x`` (zero for every image and every
    position), read by a forward hook during one pass without gradients (exercise 05.1)."""
    kept = []
    handle = get_layer(model, layer).register_forward_hook(lambda module, args, output: kept.append(output))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return _dead_mask(kept[0]).nonzero().flatten().tolist()


class DeadWatch:
    """``with DeadWatch(model, names) as watch:`` appends to ``watch.counts[name]`` the number of
    channels of layer ``name`` dead on each batch that passes through it (exercise 05.2)."""

    def __init__(self, model: nn.Module, layers: list[str]):
        self.model, self.layers = model, list(layers)
        self.counts: dict[str, list[int]] = {name: [] for name in self.layers}
        self._hooks = Hooks()

    def _counter(self, name: str):
        def count(module, args, output):
            self.counts[name].append(int(_dead_mask(output).sum()))

        return count

    def __enter__(self) -> DeadWatch:
        for name in self.layers:
            self._hooks.add(get_layer(self.model, name).register_forward_hook(self._counter(name)))
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.remove()


def layer_cam(model: nn.Module, layer: str, x: torch.Tensor, classes) -> torch.Tensor:
    """Layer-CAM (Jiang et al., 2021), ``relu(sum_k relu(G_k) * A_k)``: every activation weighted by
    the positive part of its own gradient, ``(N, H, W)`` at the layer's resolution (field guide exercise G5.2)."""
    check_inputs(model, x, "Layer-CAM")
    check_gradients(model, "Layer-CAM")
    with record(model, layer, backward=True) as rec, torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        scores = class_scores(model(x), len(x))
        torch.autograd.grad(_score(scores, targets_for(scores, wanted_targets(classes, len(x)))), x)
    last = rec.calls(layer)[-1]  # a layer called twice is explained at its last call, as in Grad-CAM
    activation, gradient = last.output, last.grad_output[0]
    return (gradient.clamp(min=0) * activation).sum(dim=1).clamp(min=0)
