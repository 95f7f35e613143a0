"""Exercises of the field guide G5 (saliency and statistics): a deconvnet ReLU hook (G5.1), the third
of the three ReLU backward rules of its section 5, and Layer-CAM from recorded hooks (G5.2, section 7)."""

from __future__ import annotations

import copy

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
