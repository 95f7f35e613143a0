"""Exercises of notebook 03: module backward hooks."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ..audit import clear_hooks
from ..models import SeedConvNet
from . import Outcome, compare_tensors, exercise, hooks_left_when_raising, not_a_handle


def _first_failure(*outcomes: tuple[str, Outcome]) -> Outcome | None:
    for what, outcome in outcomes:
        if not outcome.passed:
            return Outcome(False, f"{what}: {outcome.detail}")
    return None


def _tanh_mlp(seed: int, loud: str) -> nn.Sequential:
    """8 → 3 × (Linear(16) → Tanh) → Linear(4), layer ``loud``'s weights made 30 times larger."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )
    with torch.no_grad():
        model.get_submodule(loud).weight.mul_(30)
    return model


def _gains_by_autograd(model: nn.Sequential, x: torch.Tensor) -> dict[str, float]:
    """|dL/d(input)| / |dL/d(output)| of every child but the first, output end first."""
    values = [x]
    for layer in model:
        values.append(layer(values[-1]))
    grads = torch.autograd.grad(values[-1].sum(), values[1:])  # grads[k] = dL/d(output of layer k)
    names = [name for name, _ in model.named_children()]
    return {names[k]: (grads[k - 1].norm() / grads[k].norm()).item() for k in reversed(range(1, len(names)))}


_RETURNED_A_VALUE = (
    "returned an invalid number of grad_input",  # a tuple of the wrong length
    "has changed the size of value",  # grad_output (or another tensor) of the wrong shape
    "len() of a 0-d tensor",  # a scalar tensor
    "has no len()",  # a float, True, ...
)

_LEGACY = (
    "register_backward_hook is deprecated (section 2): it hooks only the last autograd node of the "
    "module's forward; use register_full_backward_hook"
)


def _used_legacy_hook(*modules: nn.Module) -> bool:
    """Whether ``register_backward_hook`` was ever called on one of ``modules`` (the flag stays)."""
    return any(getattr(m, "_is_full_backward_hook", None) is False for m in modules)


@exercise("03.1", "how much each layer scales the gradient")
def _gains(gradient_gains) -> Outcome:
    """``gradient_gains(model, x)`` puts a full backward hook on every child of ``model``, runs
    ``model(x).sum().backward()`` and returns ``{name: |grad_input[0]| / |grad_output[0]|}`` in
    the order the hooks ran, leaving out layers whose ``grad_input[0]`` is None."""
    model = _tanh_mlp(seed=0, loud="2")
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))  # needs no grad: layer 0 gets (None,)
    try:
        with warnings.catch_warnings():  # PyTorch warns that layer 0 gets (None,): the exercise says so already
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
            got = gradient_gains(model, x.clone())
    except (RuntimeError, TypeError) as error:
        if not any(sign in str(error) for sign in _RETURNED_A_VALUE):
            raise
        return Outcome(False, "your hook returned something, and a full backward hook's return value replaces "
                              "grad_input; make it return None (a lambda returns whatever its expression gives)")
    if _used_legacy_hook(*model.children()):
        return Outcome(False, _LEGACY)
    if clear_hooks(model):
        return Outcome(False, "hooks are still registered on the model: remove them before returning")
    expected = _gains_by_autograd(model, x)
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict {{layer name: gain}}, not a {type(got).__name__}")
    if "0" in got:
        return Outcome(False, "leave out layer '0': its input needs no grad, so its grad_input is (None,) "
                              "(use x as it is given)")
    if sorted(got) != sorted(expected):
        return Outcome(False, f"expected the layers {sorted(expected)}, got {sorted(got)}")
    try:
        values = {name: float(v.detach() if isinstance(v, torch.Tensor) else v) for name, v in got.items()}
    except (TypeError, ValueError, RuntimeError):
        return Outcome(False, "every gain should be one number (a float or a one-element tensor)")
    if all(math.isclose(values[n] * expected[n], 1, rel_tol=1e-4) for n in expected):
        return Outcome(False, "every gain is upside down: grad_input is the gradient the module sends on to "
                              "earlier layers, so divide |grad_input[0]| by |grad_output[0]|")
    for name, gain in expected.items():
        if not math.isclose(values[name], gain, rel_tol=1e-4):
            return Outcome(False, f"layer {name!r}: gain {values[name]:.4g}, expected {gain:.4g}")
    if list(got) != list(expected):
        return Outcome(False, f"the gains are right, but list them in the order the hooks ran: {list(expected)}, "
                              f"not {list(got)} (backward reaches the last layer first)")
    failed = hooks_left_when_raising(lambda: gradient_gains(model, torch.randn(5, 7)), model)
    if failed is not None:
        return failed
    loudest = max(expected, key=expected.get)
    return Outcome(True, f"every gain matches autograd; layer {loudest!r}, the one with 30× weights, "
                         f"multiplies the gradient by {expected[loudest]:.1f}")


@exercise("03.2", "a backward pre-hook that clips grad_output")
def _clip(clip_grad_output) -> Outcome:
    """``clip_grad_output(module, limit)`` registers a full backward pre-hook that clamps every
    element of ``grad_output`` to ``[-limit, limit]`` and returns its handle."""
    torch.manual_seed(4)
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    upstream = torch.tensor([[5.0, -0.1], [-3.0, 0.2], [0.4, 9.0], [-0.3, -7.0]])
    handle = clip_grad_output(layer, 0.5)
    failed = not_a_handle(handle, "clip_grad_output", layer)
    if failed:
        return failed
    try:
        layer(x).backward(upstream)
    finally:
        handle.remove()
    if clear_hooks(layer):
        return Outcome(False, "removing the returned handle left a hook behind: return the hook's handle")
    clipped = upstream.clamp(-0.5, 0.5)
    weight_ok = compare_tensors(layer.weight.grad, clipped.T @ x.detach())
    if not weight_ok.passed and compare_tensors(layer.weight.grad, upstream.T @ x.detach()).passed:
        return Outcome(False, f"weight.grad: {weight_ok.detail}; it is the unclipped weight gradient: "
                              "the hook ran after the module's own backward")
    input_ok = compare_tensors(x.grad, clipped @ layer.weight.detach())
    failed = _first_failure(("weight.grad", weight_ok), ("input gradient", input_ok))
    return failed or Outcome(True, "both the weight gradient and the input gradient used the clipped grad_output")


def _relu_grads(seed: int, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(dL/d(ReLU input), dL/d(ReLU output)) of each ReLU of a SeedConvNet run without in-place ops."""
    net = SeedConvNet(seed=seed, inplace=False)
    h1 = net.conv1(x)
    a1 = net.relu1(h1)
    h2 = net.conv2(a1)
    a2 = net.relu2(h2)
    g_h1, g_a1, g_h2, g_a2 = torch.autograd.grad(a2.sum(), [h1, a1, h2, a2])
    return {"relu1": (g_h1, g_a1), "relu2": (g_h2, g_a2)}


@exercise("03.3", "dL/d(input) of in-place ReLUs, without full backward hooks")
def _in_place(relu_grad_inputs) -> Outcome:
    """``relu_grad_inputs(model, x)`` runs ``model(x).sum().backward()`` on a ``SeedConvNet``
    (in-place ReLUs) and returns ``{name: gradient w.r.t. that ReLU's input}``."""
    model = SeedConvNet(seed=0, inplace=True)
    x = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    try:
        got = relu_grad_inputs(model, x)
    except TypeError as error:
        if "RemovableHandle" not in str(error):
            raise
        return Outcome(False, "a forward pre-hook that returns something replaces the module's input, and yours "
                              "returned the tensor hook's handle; make the pre-hook return None")
    except RuntimeError as error:
        if "BackwardHookFunction is a view" not in str(error):
            raise
        return Outcome(False, "a full backward hook cannot be used on a module whose input or output is changed "
                              "in place (section 5); use a forward pre-hook that registers a tensor hook")
    if _used_legacy_hook(model.relu1, model.relu2):
        return Outcome(False, _LEGACY)
    if clear_hooks(model):
        return Outcome(False, "hooks are still registered on the model: remove them before returning")
    if not isinstance(got, dict) or sorted(got) != ["relu1", "relu2"]:
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return Outcome(False, f"expected a dict with keys ['relu1', 'relu2'], got {keys}")
    reference = _relu_grads(0, x)
    for name, (grad_in, grad_out) in reference.items():
        outcome = compare_tensors(got[name], grad_in)
        if outcome.passed:
            continue
        if compare_tensors(got[name], grad_out).passed:
            return Outcome(False, f"{name}: this is dL/d(ReLU output): what caught the gradient followed the tensor "
                                  "past the in-place ReLU (a tensor hook added after the ReLU ran, retain_grad, or "
                                  "autograd.grad on the kept tensor); register a tensor hook in a forward "
                                  "pre-hook, before the ReLU runs")
        return Outcome(False, f"{name}: {outcome.detail}")
    failed = hooks_left_when_raising(lambda: relu_grad_inputs(model, torch.randn(2, 3, 6, 6)), model)
    if failed is not None:
        return failed
    return Outcome(True, "both gradients match autograd on the same network without in-place ReLUs")
