"""Exercises of notebook 03: module backward hooks."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ..audit import clear_hooks
from ..models import TinyConvNet
from . import (
    Outcome,
    compare_tensors,
    exercise,
    hint_for,
    hooks_left_when_raising,
    is_handle,
    kind_of,
    not_a_handle,
)


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

_DEPRECATED = (
    "register_backward_hook is deprecated (section 1): it hooks only the last autograd node of the module's forward"
)
_LEGACY = f"{_DEPRECATED}; use register_full_backward_hook"
_LEGACY_CLIP = (
    f"{_DEPRECATED}, after that node's own backward; to change grad_output before the module uses it, "
    "use register_full_backward_pre_hook"
)
_LEGACY_IN_PLACE = (
    f"{_DEPRECATED}; on in-place ReLUs use a forward pre-hook that registers a tensor hook on the input"
)


def _used_legacy_hook(*modules: nn.Module) -> bool:
    """Whether ``register_backward_hook`` was ever called on one of ``modules`` (the flag stays)."""
    return any(getattr(m, "_is_full_backward_hook", None) is False for m in modules)


@exercise("03.3", "how much each layer scales the gradient")
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
        return hint_for(error, dict.fromkeys(_RETURNED_A_VALUE, "your hook returned something, and a full backward "
            "hook's return value replaces grad_input; make it return None (a lambda returns whatever its "
            "expression gives)"))  # fmt: skip
    if _used_legacy_hook(*model.children()):
        return Outcome(False, _LEGACY)
    if clear_hooks(model):
        return Outcome(False, "hooks are still registered on the model: remove them before returning")
    expected = _gains_by_autograd(model, x)
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict {{layer name: gain}}, not {kind_of(got)}")
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


def _per_sample(g: torch.Tensor, factor) -> torch.Tensor:
    """``g`` with sample ``n`` (``g[n]``, all its elements) multiplied by ``factor(norms)[n]``."""
    norms = g.flatten(1).norm(dim=1)
    return g * factor(norms).view(-1, *[1] * (g.dim() - 1))


def _clip_cases() -> list[tuple[float, torch.Tensor, torch.Tensor]]:
    """(max_norm, input, grad_output arriving at the layer): a batch of vectors, in which two
    samples are within the limit, and a batch of 3-token sequences, whose first sample has every
    row within the limit but not as a whole."""
    g = torch.Generator().manual_seed(4)
    vectors = torch.tensor([[5.0, -0.1], [-3.0, 0.2], [0.3, -0.4], [0.4, 9.0], [0.6, 0.0]])
    rows = torch.randn(2, 3, 2, generator=g)
    tokens = torch.stack([rows[0] / rows[0].norm(dim=-1, keepdim=True) * 0.4,  # rows 0.4, sample 0.69
                          rows[1] / rows[1].norm() * 0.2])  # sample 0.2
    return [(1.0, torch.randn(5, 3, generator=g), vectors), (0.5, torch.randn(2, 3, 3, generator=g), tokens)]


_CLIP_MISTAKES = (  # (what was done instead, transform of grad_output, message); "per row" and "over dim 1"
    # first: on the token batch they may equal "unclipped", and only an answer right on the vector batch gets there
    ("per row", lambda g, m: g * (m / g.norm(dim=-1, keepdim=True)).clamp(max=1),
     "each row of a (batch, tokens, features) gradient was clipped on its own; a sample is grad_output[0][n] "
     "with all its tokens: take the norm over all of its elements"),
    ("over dim 1", lambda g, m: g * (m / g.norm(dim=1, keepdim=True)).clamp(max=1),
     "the norm was taken over dim=1 only: on a (batch, tokens, features) gradient that is the tokens axis, so "
     "each feature got its own factor; a sample is grad_output[0][n] with all its elements: g.flatten(1) puts "
     "them in one row"),
    ("over the batch", lambda g, m: g * (m / g.norm(dim=0, keepdim=True)).clamp(max=1),
     "the norm was taken over dim=0, the batch axis, so it mixes the samples; take one norm per sample, over "
     "all of grad_output[0][n]'s elements"),
    ("unclipped", lambda g, m: g, "it is the unclipped weight gradient: nothing changed grad_output before the "
                                  "module's own backward used it (a hook that runs after it is too late, and "
                                  "reassigning a local name inside the hook changes nothing: return the new "
                                  "tuple)"),
    ("clamped", lambda g, m: g.clamp(-m, m), "each element was clamped on its own; scale each sample's gradient "
                                             "as a whole, so its direction stays the same"),
    ("one factor", lambda g, m: g * min(1.0, m / g.norm().item()), "the whole batch was scaled by one factor; "
                                                                    "each sample needs its own"),
    ("normalized", lambda g, m: _per_sample(g, lambda n: m / n), "samples whose norm was already at most max_norm "
                                                                 "were scaled too: they must stay unchanged"),
)


def _linear_grads(layer: nn.Linear, x: torch.Tensor, used: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight.grad, x.grad) of ``layer(x)`` when its backward starts from ``used``."""
    return used.flatten(0, -2).T @ x.detach().flatten(0, -2), used @ layer.weight.detach()


@exercise("03.2", "clip each sample's grad_output before the layer's backward")
def _clip(clip_grad_output) -> Outcome:
    """``clip_grad_output(module, max_norm)`` registers a full backward pre-hook that rescales each
    sample ``grad_output[0][n]`` to an L2 norm of at most ``max_norm`` and returns its handle."""
    for max_norm, x, upstream in _clip_cases():
        torch.manual_seed(4)
        layer = nn.Linear(3, 2)
        x = x.clone().requires_grad_()
        handle = clip_grad_output(layer, max_norm)
        failed = not_a_handle(handle, "clip_grad_output", layer)
        if failed:
            return failed
        try:
            layer(x).backward(upstream.clone())
        except RuntimeError as error:
            if "returned an invalid number of grad_output" in str(error):
                return Outcome(False, "the pre-hook returned something that is not a one-element tuple: its return "
                                      "value replaces the whole grad_output tuple, so return (new_grad,), not the "
                                      "bare tensor (PyTorch counted its rows as entries)")
            if not _used_legacy_hook(layer):
                raise
        finally:
            handle.remove()
        if _used_legacy_hook(layer):
            return Outcome(False, _LEGACY_CLIP)
        if clear_hooks(layer):
            return Outcome(False, "removing the returned handle left a hook behind: return the hook's handle")
        shape = f"a batch of shape {tuple(x.shape)}"
        clipped = _per_sample(upstream, lambda norms, m=max_norm: (m / norms).clamp(max=1))
        expected_w, expected_x = _linear_grads(layer, x, clipped)
        weight_ok = compare_tensors(layer.weight.grad, expected_w)
        if not weight_ok.passed:
            for _, transform, message in _CLIP_MISTAKES:
                if compare_tensors(layer.weight.grad, _linear_grads(layer, x, transform(upstream, max_norm))[0]).passed:
                    return Outcome(False, f"{shape}: weight.grad: {weight_ok.detail}; {message}")
        failed = _first_failure(("weight.grad", weight_ok), ("input gradient", compare_tensors(x.grad, expected_x)))
        if failed:
            return Outcome(False, f"{shape}: {failed.detail}")
    return Outcome(True, "on both batches, the weight gradient and the input gradient used grad_output "
                         "clipped sample by sample")


def _relu_grads(seed: int, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(dL/d(ReLU input), dL/d(ReLU output)) of each ReLU of a TinyConvNet run without in-place ops."""
    net = TinyConvNet(seed=seed, inplace=False)
    h1 = net.conv1(x)
    a1 = net.relu1(h1)
    h2 = net.conv2(a1)
    a2 = net.relu2(h2)
    g_h1, g_a1, g_h2, g_a2 = torch.autograd.grad(a2.sum(), [h1, a1, h2, a2])
    return {"relu1": (g_h1, g_a1), "relu2": (g_h2, g_a2)}


@exercise("03.4", "dL/d(input) of in-place ReLUs, without full backward hooks")
def _in_place(relu_grad_inputs) -> Outcome:
    """``relu_grad_inputs(model, x)`` runs ``model(x).sum().backward()`` on a ``TinyConvNet``
    (in-place ReLUs) and returns ``{name: gradient w.r.t. that ReLU's input}``."""
    model = TinyConvNet(seed=0, inplace=True)
    x = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    try:
        got = relu_grad_inputs(model, x)
    except (TypeError, RuntimeError) as error:
        return hint_for(error, {
            "RemovableHandle": "a forward pre-hook that returns something replaces the module's input, and yours "
                               "returned the tensor hook's handle; make the pre-hook return None",
            "BackwardHookFunction is a view": "a full backward hook cannot be used on a module whose input or output "
                "is changed in place (section 3); use a forward pre-hook that registers a tensor hook",
        })  # fmt: skip
    if _used_legacy_hook(model.relu1, model.relu2):
        return Outcome(False, _LEGACY_IN_PLACE)
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


# ----- 03.5: a gradient tracker ---------------------------------------------------------------------
def _in_place_mlp() -> nn.Sequential:
    """Linear → in-place ReLU → Linear → in-place ReLU → Linear: a full backward hook on '0' or '2' fails."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.ReLU(inplace=True),
                         nn.Linear(8, 3))


def _reference_stds(batches: list[torch.Tensor]) -> dict[str, list[float]]:
    """std of dL/d(output of '0', '2', '4') for each batch, on the same MLP without in-place ReLUs."""
    model = _in_place_mlp()
    stds: dict[str, list[float]] = {"0": [], "2": [], "4": []}
    for x in batches:
        h0 = model[0](x)
        h2 = model[2](torch.relu(h0))
        h4 = model[4](torch.relu(h2))
        for name, g in zip(stds, torch.autograd.grad(h4.pow(2).sum(), [h0, h2, h4]), strict=True):
            stds[name].append(g.std().item())
    return stds


def _remove_all(hooks) -> None:
    """``hooks`` as the answer returned it: a ``hooklab.Hooks``, one handle or a list of handles."""
    if isinstance(hooks, list | tuple):
        for handle in hooks:
            handle.remove()
    else:
        hooks.remove()


def _tracked_run(track_grad_std, model: nn.Module, batches: list[torch.Tensor]):
    """The answer's stds over three steps, each followed by an evaluation forward under ``no_grad``, then the
    hooks removed, then one more step."""
    stds, hooks = track_grad_std(model, ["0", "2", "4"])
    try:
        for x in batches:
            model(x).pow(2).sum().backward()
            with torch.no_grad():
                model(x)  # an evaluation pass: no backward, no gradient
    finally:
        _remove_all(hooks)
    model(batches[0]).pow(2).sum().backward()  # after the removal: nothing may be added
    return stds


@exercise("03.5", "track the std of each layer's output gradient")
def _track(track_grad_std) -> Outcome:
    """``track_grad_std(model, names)`` returns ``(stds, hooks)``: ``stds[name]`` gets the std of dL/d(output)
    of module ``name`` on every backward until ``hooks`` is removed."""
    model = _in_place_mlp()
    g = torch.Generator().manual_seed(8)
    batches = [torch.randn(5, 6, generator=g) * (k + 1) for k in range(3)]
    try:
        stds = _tracked_run(track_grad_std, model, batches)
    except (TypeError, RuntimeError, AttributeError) as error:
        clear_hooks(model)
        return hint_for(error, {
            "BackwardHookFunction is a view": "a full backward hook cannot watch a module whose output an in-place "
                "ReLU overwrites (section 3): register a tensor hook on the output from a forward hook",
            "RemovableHandle": "the forward hook returned the tensor hook's handle, and a forward hook's return "
                               "value replaces the output: make it a def that returns None",
            "has no attribute 'remove'": "return (stds, hooks) where hooks is a hooklab.Hooks or a list of handles",
            "doesn't require gradient": "the check evaluates the model under torch.no_grad() between steps: those "
                "outputs need no gradient and cannot take a tensor hook; register one only when "
                "output.requires_grad",
        })  # fmt: skip
    if clear_hooks(model):
        return Outcome(False, "removing the returned hooks left a hook on the model")
    expected = _reference_stds(batches)
    if not isinstance(stds, dict) or sorted(stds) != sorted(expected):
        return Outcome(False, f"stds must be a dict with the keys {sorted(expected)}, got {kind_of(stds)}")
    for name, want in expected.items():
        got = [float(v) for v in stds[name]]
        if len(got) != len(want):
            return Outcome(False, f"{name!r}: {len(got)} values for 3 backward passes (and none after the removal)")
        if not all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(got, want, strict=True)):
            return Outcome(False, f"{name!r}: stds {[f'{v:.4g}' for v in got]}, expected "
                                  f"{[f'{v:.4g}' for v in want]} (the std of the gradient w.r.t. the output)")
    return Outcome(True, "three steps tracked on every layer, in-place ReLUs and all, evaluation passes under "
                         "no_grad skipped, nothing after the removal")


# ----- 03.1: a warm-up, the grad_input tuple ----------------------------------------------------------
class _ScaleAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

    def forward(self, a: torch.Tensor, scale: float, b: torch.Tensor) -> torch.Tensor:
        return a * self.w * scale + b


def _halved_grads(halve_grad_input, grad_a: bool, grad_b: bool, hooked: bool):
    """(a.grad, b.grad, w.grad) of ``_ScaleAdd`` with the answer's hook (or none); raises what the answer raises."""
    module = _ScaleAdd()
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(3, generator=g).requires_grad_(grad_a), torch.randn(3, generator=g).requires_grad_(grad_b)
    handle = halve_grad_input(module) if hooked else None
    if hooked and not is_handle(handle):
        clear_hooks(module)
        raise _NotAHandle(kind_of(handle))
    try:
        with warnings.catch_warnings():  # no input requiring grad: PyTorch warns, the exercise says so already
            warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
            (module(a, 3.0, b) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    finally:
        if handle is not None:
            handle.remove()
    return a.grad, b.grad, module.w.grad


class _NotAHandle(Exception):
    pass


def _halved_outcome(halve_grad_input, grad_a: bool, grad_b: bool) -> Outcome | None:
    """What is wrong on one case (which of a, b require grad), if anything."""
    case = f"with {'a' if grad_a else 'no a'} and {'b' if grad_b else 'no b'} requiring grad"
    try:
        got = _halved_grads(halve_grad_input, grad_a, grad_b, hooked=True)
    except _NotAHandle as error:
        return Outcome(False, f"halve_grad_input must return the handle of the hook it registers, got {error}")
    except (TypeError, RuntimeError) as error:
        return hint_for(error, {
            "NoneType": f"{case}: grad_input holds None for every input that needs no gradient (and for the number "
                        "scale): keep those entries None instead of multiplying them",
            "no input requires gradient": f"{case}: when no input requires grad, the hook must return None or a "
                                          "tuple of Nones",
            **dict.fromkeys(_RETURNED_A_VALUE, f"{case}: return a tuple with one entry per entry of grad_input "
                                                "(None where grad_input has None), not a bare tensor"),
        })  # fmt: skip
    want = _halved_grads(halve_grad_input, grad_a, grad_b, hooked=False)
    for what, got_grad, plain, factor in zip(("a.grad", "b.grad", "the weight's gradient"), got, want,
                                             (0.5, 0.5, 1.0), strict=True):
        if plain is None or (got_grad is not None and torch.allclose(got_grad, factor * plain)):
            continue
        if factor == 1.0:
            return Outcome(False, f"{case}: {what} changed too: halve grad_input in a full backward hook (which "
                                  "runs after the module's own gradients), not grad_output in a pre-hook")
        return Outcome(False, f"{case}: {what} is not half of what it is without the hook: halve every tensor "
                              "of grad_input")
    return None


@exercise("03.1", "halve every gradient in grad_input, keeping the Nones")
def _halve(halve_grad_input) -> Outcome:
    """``halve_grad_input(module)`` registers a full backward hook returning grad_input with every tensor
    halved and every None kept, and returns its handle."""
    for grad_a, grad_b in ((True, True), (True, False), (False, False)):
        wrong = _halved_outcome(halve_grad_input, grad_a, grad_b)
        if wrong:
            return wrong
    return Outcome(True, "a.grad and b.grad halved, the weight's gradient untouched, the Nones kept (also when "
                         "no input required grad)")
