"""Exercises of the field guide G5 (saliency and statistics): a deconvnet ReLU hook (G5.1), the third
of the three ReLU backward rules of its section 5, Layer-CAM from recorded hooks (G5.2, section 7), the
deletion test's loop (G5.3, section 8) and the cascade of re-drawn copies of its sanity checks (G5.4, section 10)."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..audit import clear_hooks
from ..models import DigitsCNN, trained_digits_cnn
from . import Outcome, compare_tensors, exercise, hooks_left_when_raising, kind_of
from .nb05 import _Applied, _call_recorder, _case_problem, _DeconvReLUFunction, _digits, _recorder_cases, _seed_grads


def _images(seed: int, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _input_gradient(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg)[:, target].sum(), xg)
    return grad


def _deconvnet_saliency(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """The deconvnet's input gradient without hooks: a copy of ``model`` whose ReLUs use ``_DeconvReLUFunction``."""
    deconv = copy.deepcopy(model)
    for name, module in list(deconv.named_modules()):
        if isinstance(module, nn.ReLU):
            parent, _, child = name.rpartition(".")
            setattr(deconv.get_submodule(parent), child, _Applied(_DeconvReLUFunction))
    return _input_gradient(deconv, x, target)


def _hook_result_problem(returned, like: torch.Tensor) -> str | None:
    """What is wrong with ``returned`` as the new ``grad_input`` of a one-input module, or None."""
    what = "return a tuple with one tensor, like grad_input"
    if returned is None:
        return f"your hook returned None, which leaves grad_input as it is: {what}, holding the new gradient"
    if isinstance(returned, torch.Tensor):
        return f"{what}, (new_grad_input,), not a bare tensor"
    if not isinstance(returned, tuple | list):
        return f"{what} (got {type(returned).__name__})"
    if len(returned) != 1:
        return f"{what} (nn.ReLU has one input), not {len(returned)} entries"
    new = returned[0]
    if not isinstance(new, torch.Tensor):
        kind = "None" if new is None else f"a {type(new).__name__}"
        return f"{what}: its entry is {kind}, not a tensor"
    if new.shape != like.shape:
        return (f"the new gradient has shape {tuple(new.shape)}, expected {tuple(like.shape)}, the shape of "
                "grad_output[0]")
    if new.dtype != like.dtype:
        dtypes = [str(d).removeprefix("torch.") for d in (new.dtype, like.dtype)]
        return f"the new gradient is {dtypes[0]}, expected {dtypes[1]}: keep the dtype of the gradients you receive"
    return None


@exercise("G5.1", "a deconvnet ReLU hook")
def _deconvnet_hook(hook) -> Outcome:
    """``hook(module, grad_input, grad_output)`` is a full backward hook for ``nn.ReLU`` that returns
    the new ``grad_input`` of the deconvnet rule: the positive part of ``grad_output``, wherever the
    ReLU's input was; its arguments stay unchanged."""
    relu_input = torch.tensor([[1.5, -0.5, 2.0, -1.0], [-2.0, 0.5, -0.3, 1.0]])
    grad_output = torch.tensor([[0.7, 1.2, -0.4, -0.9], [0.3, -1.1, 0.8, 0.6]])
    grad_input = grad_output * (relu_input > 0)  # what autograd's ReLU passes back
    gi, go = grad_input.clone(), grad_output.clone()
    returned = hook(nn.ReLU(), (gi,), (go,))
    if not torch.equal(gi, grad_input) or not torch.equal(go, grad_output):
        changed = "grad_input" if not torch.equal(gi, grad_input) else "grad_output"
        return Outcome(False, f"your hook changed {changed} in place, which backward hooks must not do: "
                              "compute a new tensor and return it in a tuple")
    problem = _hook_result_problem(returned, grad_output)
    if problem:
        return Outcome(False, problem)
    new = returned[0].detach()
    expected = grad_output.clamp(min=0)
    if not torch.allclose(new, expected):
        if torch.allclose(new, grad_input.clamp(min=0)):
            return Outcome(False, "that is guided backprop's rule (it keeps the positive part of grad_input, which "
                                  "is zero where the ReLU was off); the deconvnet rule starts from grad_output")
        if torch.allclose(new, grad_input):
            return Outcome(False, "your hook returned grad_input unchanged: the gradient is the plain one")
        if torch.allclose(new, grad_output):
            return Outcome(False, "negative gradient still passes: keep only the positive part of grad_output")
        diff = (new.double() - expected.double()).abs().max().item()
        return Outcome(False, f"on a sample call the new gradient is off by up to {diff:.1e}: keep the positive "
                              "part of grad_output and zero elsewhere")
    model = DigitsCNN(seed=5).eval()
    x = _images(7)
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    handles = [relu.register_full_backward_hook(hook) for relu in relus]
    try:
        got = _input_gradient(model, x, 6)
    finally:
        for handle in handles:
            handle.remove()
    expected = _deconvnet_saliency(model, x, 6)
    plain = _input_gradient(model, x, 6)
    if torch.allclose(got, plain) and not torch.allclose(plain, expected):
        return Outcome(False, "registered on the ReLUs of a model, your hook did not change the gradient")
    outcome = compare_tensors(got, expected)
    if outcome.passed:
        return Outcome(True, f"deconvnet gradients of 3 digits match ({outcome.detail})")
    return Outcome(False, f"registered on the ReLUs of a model, deconvnet gradients differ: {outcome.detail}")


# ----- G5.2: Layer-CAM, with the recorder's hooks ---------------------------------------------------------
def _layer_cam_maps(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    return (gradients.clamp(min=0) * activations).sum(dim=1).clamp(min=0)


def _layer_cam_hint(got: torch.Tensor, activations: torch.Tensor, gradients: torch.Tensor) -> str | None:
    """What a near miss computed, or None."""
    got = got.detach().double()
    a, g = activations.double(), gradients.double()
    near = [
        ((g.mean(dim=(2, 3), keepdim=True) * a).sum(dim=1).clamp(min=0),
         "that is Grad-CAM, one weight per channel (its gradient's spatial mean): Layer-CAM weights every "
         "activation by the positive part of its own gradient, at its own position"),
        ((g * a).sum(dim=1).clamp(min=0),
         "almost: weight each activation by the positive part of its gradient (relu of G), not by the gradient"),
        ((g.clamp(min=0) * a).sum(dim=1),
         "almost: the map is the positive part of the channel sum (a ReLU after summing)"),
        ((g.clamp(min=0) * a).mean(dim=1).clamp(min=0),
         "almost: sum over channels, not mean (a mean divides every map by the number of channels)"),
        ((g.clamp(min=0) * a.clamp(min=0)).sum(dim=1).clamp(min=0),
         "the activations keep their sign: only the gradient is clipped before weighting, then the sum"),
    ]
    for value, hint in near:
        if got.shape == value.shape and torch.allclose(got, value, atol=1e-6):
            return hint
    expected = _layer_cam_maps(a, g)
    peak = expected.flatten(1).amax(dim=1)[:, None, None]
    low = expected.flatten(1).amin(dim=1)[:, None, None]
    for scaled in (expected / peak, (expected - low) / (peak - low), expected / expected.max()):
        if got.shape == scaled.shape and torch.allclose(got, scaled, atol=1e-6):
            return "almost: return the maps as they are (scaling to a maximum of 1 is for display)"
    return None


def _flatten_head_payoff(layer_cam) -> str:
    """The answer on the trained flatten-head network: how many of 50 maps at features.6 are all zero,
    beside Grad-CAM's."""
    from ..saliency import grad_cam

    flat, x = trained_digits_cnn("flatten"), _digits().x_test[:50]
    result = grad_cam(flat, x, "features.6")
    mine = layer_cam(flat, "features.6", x, result.targets)
    zero = [int((maps.flatten(1).amax(dim=1) == 0).sum()) for maps in (mine, result.maps)]
    return (f"on the trained flatten-head network, {zero[0]} of 50 of your Layer-CAM maps at features.6 are all "
            f"zero (Grad-CAM: {zero[1]})")


@exercise("G5.2", "a Layer-CAM map that keeps the position, from recorded hooks")
def _layer_cam(layer_cam) -> Outcome:
    """``layer_cam(model, layer, images, classes)`` returns the ``(N, H, W)`` maps ``relu(sum_k relu(G_k) * A_k)``
    from the layer's output ``A`` and the gradient ``G`` of the given classes' scores, recorded with hooks
    (lesson 05's recorder of 05.4, or hooklab.record); no hook is left, the images and the parameters'
    ``.grad`` stay as they were."""
    shapes = []
    for case in _recorder_cases():
        model, layer, x, classes = case["model"], case["layer"], case["x"], case["classes"]
        where = f"at layer '{layer}' of a {type(model).__name__}"
        before_x = x.clone()
        _seed_grads(model)
        got, hint = _call_recorder(layer_cam, model, layer, x, classes)
        problem = (hint and f"{where}: {hint}") or _case_problem(model, x, before_x, where)
        if problem:
            clear_hooks(model)
            return Outcome(False, problem)
        expected = _layer_cam_maps(case["activation"], case["gradient"])
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"return the maps as a tensor, got {kind_of(got)}")
        if got.shape != expected.shape:
            hint = "one (H, W) map per image: sum over the channel dimension (dim 1) only"
            if got.shape == expected.shape[1:]:
                hint = "return one map per image of the batch, (N, H, W); " + hint.split(": ", 1)[1]
            return Outcome(False, f"{where} the maps have shape {tuple(got.shape)}, expected "
                                  f"{tuple(expected.shape)}: {hint}")
        if not torch.allclose(got.detach(), expected, atol=1e-6):
            hint = _layer_cam_hint(got, case["activation"], case["gradient"]) or (
                f"{compare_tensors(got, expected).detail}; weight each activation by the positive part of its own "
                "gradient, sum over channels, keep the positive part")
            return Outcome(False, f"{where}: {hint}")
        wrong = hooks_left_when_raising(
            lambda model=model, layer=layer, classes=classes: layer_cam(model, layer, torch.zeros(1, 3, 8, 8),
                                                                        classes[:1]), model)
        if wrong:
            return wrong
        shapes.append(tuple(expected.shape))
    return Outcome(True, f"maps of shapes {', '.join(map(str, shapes))} match, no hook left; "
                         + _flatten_head_payoff(layer_cam))


# ----- G5.4: cascading weight randomisation, graded on what the copies are -------------------------------
_TOP_DOWN = ["head.2", "features.5", "features.2"]


def _cascade_model() -> nn.Module:
    return DigitsCNN(seed=4).eval()


def _layer_params(model: nn.Module, name: str) -> dict:
    return {key: value.detach() for key, value in model.get_submodule(name).named_parameters()}


def _looks_fresh(layer: nn.Module) -> bool:
    """Whether a Conv2d's or Linear's parameters look drawn by its reset_parameters(): uniform within
    ±1/sqrt(fan_in) (weight and bias), the weight's spread that of such a uniform draw."""
    fan_in = layer.weight[0].numel()
    bound = 1 / math.sqrt(fan_in)
    within = all(p.detach().abs().max() <= bound * (1 + 1e-6) for p in layer.parameters())
    spread = layer.weight.detach().std().item() / (bound / math.sqrt(3))
    return within and 0.8 < spread < 1.2


def _cascade_problem(got, model: nn.Module, before: dict) -> str | None:
    if not isinstance(got, list | tuple) or not all(isinstance(m, nn.Module) for m in got):
        what = type(got).__name__ if not isinstance(got, list | tuple) else "a list holding other things"
        return f"return a list of models, one per layer name, got {what}"
    if len(got) != len(_TOP_DOWN):
        return f"return one model per layer name: {len(_TOP_DOWN)} names, {len(got)} models"
    if any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
        return "the model you were given changed: re-draw layers in a copy (copy.deepcopy(model)), never the model"
    if any(m is model for m in got) or len({id(m) for m in got}) < len(got):
        return "each entry must be its own copy of the model (copy.deepcopy), not the same object again"
    return None


def _copy_problem(k: int, copied: nn.Module, previous: nn.Module, model: nn.Module) -> str | None:
    """What is wrong with copy ``k`` of the cascade, compared with the copy before it and with the model."""
    name = _TOP_DOWN[k]
    for other in (m.get_submodule(name) for m in (model, previous)):
        if any(p is q for p, q in zip(copied.get_submodule(name).parameters(), other.parameters(), strict=True)):
            return (f"model {k} shares the parameters of '{name}' with another model: make each copy with "
                    "copy.deepcopy, so that re-drawing one layer leaves the other models alone")
    redrawn = _layer_params(copied, name)
    if any(torch.equal(value, _layer_params(model, name)[key]) for key, value in redrawn.items()):
        return f"model {k} should have layer '{name}' re-drawn, but it still holds the trained values"
    if not _looks_fresh(copied.get_submodule(name)):
        return (f"layer '{name}' of model {k} does not look freshly initialised: re-draw it with its own "
                "reset_parameters()")
    for layer in _TOP_DOWN[:k]:
        if any(not torch.equal(a, b) for a, b in zip(_layer_params(copied, layer).values(),
                                                      _layer_params(previous, layer).values(), strict=True)):
            kept = "the model" if all(torch.equal(a, b) for a, b in zip(
                _layer_params(copied, layer).values(), _layer_params(model, layer).values(), strict=True)) else None
            if kept:
                return (f"model {k} re-draws only '{name}': a cascade keeps the layers above it random too, so "
                        f"model {k} is model {k - 1} (a copy of it) with '{name}' re-drawn as well")
            return (f"model {k} re-drew '{layer}' again: make model {k} from a copy of model {k - 1}, and re-draw "
                    f"only '{name}'")
    for key, value in copied.state_dict().items():
        layer = key.rpartition(".")[0]
        if layer not in _TOP_DOWN[: k + 1] and not torch.equal(value, model.state_dict()[key]):
            return f"model {k} also changed '{key}': re-draw only the layers {_TOP_DOWN[: k + 1]}"
    return None


@exercise("G5.4", "cascading weight randomisation, from the top layer down")
def _cascade(cascade) -> Outcome:
    """``cascade(model, names)`` returns one copy of ``model`` per name: copy ``k`` is a copy of copy ``k - 1``
    (of the model, for the first) with layer ``names[k]`` re-drawn by its ``reset_parameters()``; the model
    is not changed. Graded on what the copies hold, whatever random numbers were drawn."""
    model = _cascade_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = cascade(model, list(_TOP_DOWN))
    problem = _cascade_problem(got, model, before)
    if problem:
        return Outcome(False, problem)
    for k, copied in enumerate(got):
        problem = _copy_problem(k, copied, got[k - 1] if k else model, model)
        if problem:
            return Outcome(False, problem)
    return Outcome(True, f"{len(got)} copies, re-drawn from the top: {', '.join(_TOP_DOWN)}, each a copy of the one "
                         "before; the model unchanged")


# ----- G5.3: the deletion test, the student's loop and hook -------------------------------------------------
def worked_deletion(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, order: torch.Tensor,
                    k: int = 8) -> torch.Tensor:
    """G5.3's worked answer: the mean fall of the ``targets`` scores after the 2×2 patches under the first 1, 2, …
    ``k`` cells of ``order`` (N, 16) are filled with each digit's mean pixel by a forward pre-hook on ``model``."""
    from .nb05 import pixels_under

    fill = x.mean(dim=(1, 2, 3), keepdim=True)
    with torch.no_grad():
        start = model(x).gather(1, targets[:, None])[:, 0]
    falls = []
    for n in range(1, k + 1):
        patch = pixels_under(order[:, :n])
        with model.register_forward_pre_hook(lambda m, args, patch=patch: (torch.where(patch, fill, args[0]),)), \
                torch.no_grad():
            falls.append((start - model(x).gather(1, targets[:, None])[:, 0]).mean())
    return torch.stack(falls)


def _deletion_variants(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, order: torch.Tensor,
                       k: int) -> dict[str, torch.Tensor]:
    """The mean falls of plausible slips, computed without hooks, each named by the hint that explains it."""
    from .nb05 import pixels_under

    with torch.no_grad():
        start = model(x).gather(1, targets[:, None])[:, 0]

        def curve(fill, cumulative=True, fixed=True, reduce=torch.mean):
            out = []
            for n in range(1, k + 1):
                scores = model(torch.where(pixels_under(order[:, :n] if cumulative else order[:, n - 1:n]),
                                           fill, x))
                now = scores.gather(1, (targets if fixed else scores.argmax(dim=1))[:, None])[:, 0]
                out.append(reduce(start - now))
            return torch.stack(out)

        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        right = curve(mean)
        return {
            "right": right,
            "you filled the patches with 0, the background's value: a patch that was background already changes "
            "nothing; fill with each digit's mean pixel, x.mean(dim=(1, 2, 3), keepdim=True)":
                curve(torch.zeros(())),
            "you filled with one mean for the whole batch: fill each digit's patches with that digit's own mean "
            "pixel, x.mean(dim=(1, 2, 3), keepdim=True)": curve(x.mean()),
            "at step n only the n-th cell's patch is filled: the test is cumulative, so at step n the patches of "
            "the first n cells of the order are filled (order[:, :n])": curve(mean, cumulative=False),
            "you took the score of the class predicted on the filled digit: keep the targets you were given, the "
            "class the map was made for, at every step": curve(mean, fixed=False),
            "your values have the wrong sign: a fall is the score before minus the score after, positive when "
            "the score drops": -right,
            "you summed over the digits: return the mean fall over the digits, one number per step":
                curve(mean, reduce=torch.sum),
        }


class RaisingDigitsCNN(nn.Module):
    """A model whose second forward pass raises: where a hook that is not removed in ``finally`` stays behind."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("this model raises on its second pass")
        return self.model(x)


@exercise("G5.3", "the deletion test: cells filled in the map's order, by a forward pre-hook")
def _deletion(deletion) -> Outcome:
    """``deletion(model, x, targets, order, k)``: a tensor of ``k`` mean falls of the ``targets`` scores, after the
    patches under the first 1, 2, … ``k`` cells of ``order`` are filled with each digit's mean pixel; ``x`` is not
    changed and no hook stays on ``model``, also when its forward pass raises."""
    from ..models import trained_digits_cnn as trained

    model, x = trained(), _digits().x_test[:60]
    with torch.no_grad():
        targets = model(x).argmax(dim=1)
    for seed, k in ((3, 5), (4, 3)):
        order = torch.rand(len(x), 16, generator=torch.Generator().manual_seed(seed)).argsort(dim=1)
        given = x.clone()
        got = deletion(model, given, targets.clone(), order.clone(), k)
        left = clear_hooks(model)
        if left:
            return Outcome(False, f"a hook is still registered on the model after your function returned ({left[0]}): "
                                  "use it in a with block, or remove its handle in a finally: block")
        if not torch.equal(given, x):
            return Outcome(False, "your function changed the digits it was given: fill a new tensor "
                                  "(torch.where(mask, fill, x)), never x in place")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"return a tensor of {k} mean falls (torch.stack of them), got {kind_of(got)}")
        got = got.detach().flatten() if got.dim() == 2 and 1 in got.shape else got.detach()
        if got.shape == (k + 1,):
            return Outcome(False, f"{k + 1} values for k = {k}: start at one filled cell, not at none; the fall "
                                  "with nothing filled is 0 by definition")
        if got.dim() == 2 and len(x) in got.shape:
            return Outcome(False, "one fall per digit and step: return the mean over the digits, one number per step")
        variants = _deletion_variants(model, x, targets, order, k)
        if got.shape != (k,):
            return Outcome(False, f"shape {tuple(got.shape)} for k = {k}: return one mean fall per step, ({k},)")
        if torch.allclose(got, variants["right"], atol=1e-4):
            continue
        for hint, wrong in variants.items():
            if hint != "right" and torch.allclose(got, wrong, atol=1e-4):
                return Outcome(False, hint)
        diff = (got - variants["right"]).abs().max().item()
        return Outcome(False, f"with k = {k}, your falls are off by up to {diff:.2f}: at step n, fill the patches "
                              "under order[:, :n] with each digit's mean pixel, and take the targets' scores")
    raising = RaisingDigitsCNN(model)
    outcome = hooks_left_when_raising(lambda: deletion(raising, x, targets, order, 2), raising)
    if outcome:
        return outcome
    return Outcome(True, "the falls of 60 digits match for two orders (k = 5 and 3), the digits unchanged, no hook "
                         "left, also when the model raised")
