"""Exercises and predictions of notebook 03: module backward hooks.

Predictions 03.a-03.e compute their truth with torch; exercises 03.1-03.5 are the hooks the lesson's
sections are about. The guide's exercises on the same hooks are in ``g3.py``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..audit import clear_hooks
from ..models import TinyConvNet, TinySigmoidNet
from . import (
    Outcome,
    compare_tensors,
    exercise,
    hint_for,
    hooks_left_when_raising,
    kind_of,
    not_a_handle,
    prediction,
)

GUIDE = "the field guide G3"


def _first_failure(*outcomes: tuple[str, Outcome]) -> Outcome | None:
    for what, outcome in outcomes:
        if not outcome.passed:
            return Outcome(False, f"{what}: {outcome.detail}")
    return None


_RETURNED_A_VALUE = (
    "returned an invalid number of grad_input",  # a tuple of the wrong length
    "has changed the size of value",  # grad_output (or another tensor) of the wrong shape
    "len() of a 0-d tensor",  # a scalar tensor
    "has no len()",  # a float, True, ...
)

_DEPRECATED = (
    f"register_backward_hook is deprecated ({GUIDE}, section 4): it hooks only the last autograd node of the "
    "module's forward"
)
_LEGACY = f"{_DEPRECATED}; use register_full_backward_hook"
_LEGACY_CLIP = (
    f"{_DEPRECATED}, after that node's own backward; to change grad_output before the module uses it, "
    "use register_full_backward_pre_hook"
)
_LEGACY_IN_PLACE = f"{_DEPRECATED}; on in-place networks register a tensor hook from a forward hook"
_FULL_HOOK_IN_PLACE = (
    "a full backward hook cannot watch a module whose output is then changed in place (section 3): its output is "
    "a view, and autograd refuses the in-place change; register a tensor hook on the output from a forward hook"
)
_RETURNED_HANDLE = (
    "the forward hook returned the tensor hook's handle, and a forward hook's return value replaces the module's "
    "output: make it a def that returns None (a lambda returns whatever its expression gives)"
)


def _used_legacy_hook(*modules: nn.Module) -> bool:
    """Whether ``register_backward_hook`` was ever called on one of ``modules`` (the flag stays)."""
    return any(getattr(m, "_is_full_backward_hook", None) is False for m in modules)


def _remove(handles) -> None:
    for handle in handles:
        handle.remove()


# ----- predictions -----------------------------------------------------------------------------------
@prediction(
    "03.a", "the order in which the full backward hooks of fc1, s1, fc2, s2 run",
    why="backward starts at the loss, so it reaches the last layer first: s2, fc2, s1, fc1. Each hook runs once "
        "the gradient w.r.t. its module's input is known.",
    wrong=[(["fc1", "s1", "fc2", "s2"], "that is the order of the forward pass; backward starts at the loss and "
                                        "meets the layers the other way round")],
)  # fmt: skip
def _backward_order() -> list[str]:
    net, order = TinySigmoidNet(), []
    handles = [m.register_full_backward_hook(lambda m, gi, go, name=name: order.append(name))
               for name, m in net.named_children()]  # fmt: skip
    try:
        net(torch.tensor([[0.05, 0.1]], requires_grad=True)).backward(torch.tensor([[1.0, 1.0]]))
    finally:
        _remove(handles)
    return order


class _ScaleAdd(nn.Module):
    """``a * w * scale + b``: a tensor, a number, a tensor; ``w`` a parameter of ones."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, a: torch.Tensor, scale: float, b: torch.Tensor) -> torch.Tensor:
        return a * self.w * scale + b


@prediction(
    "03.b", "grad_input's entry for a tensor input that needs no grad",
    why="b needs no grad, so autograd never computes dL/db (which would be [1, 1, 1]): the hook's wrapper marks b "
        "as not differentiable and its slot holds zeros. None is only for arguments that are not tensors, like "
        "scale (and for every entry when no input requires grad).",
    wrong=[
        (None, "None is for arguments that are not tensors, like scale, and for every entry when no input requires "
               "grad; b is a tensor and a requires grad: b's slot holds zeros"),
        ([1.0, 1.0, 1.0], "that is the true dL/db, but b needs no grad, so nothing computes it: its slot holds "
                          "zeros"),
        ([2.0, 2.0, 2.0], "that is a's entry, dL/da = w · scale; b needs no grad: its slot holds zeros"),
    ],
)  # fmt: skip
def _slot_of_b() -> list[float] | None:
    module, seen = _ScaleAdd(), {}
    handle = module.register_full_backward_hook(lambda m, gi, go: seen.update(gi=gi))
    try:
        module(torch.ones(3, requires_grad=True), 2.0, torch.ones(3)).sum().backward()
    finally:
        handle.remove()
    b_slot = seen["gi"][2]
    return None if b_slot is None else b_slot.tolist()


@prediction(
    "03.c", "the factor by which weight.grad changes under each backward hook's return value",
    why="a pre-hook's return replaces grad_output, from which the module computes all its gradients: weight.grad "
        "is halved (0.5). A full backward hook runs after the module's gradients are computed: its returned "
        "grad_input only flows on to earlier layers, and weight.grad stays as it was (1.0).",
    wrong=[
        ([0.5, 10.0], "the full backward hook runs after the weight's gradient was computed: its return value "
                      "reaches only the earlier layers, so weight.grad is unchanged"),
        ([1.0, 10.0], "the full backward hook runs after the weight's gradient was computed (weight.grad unchanged), "
                      "but the pre-hook runs before: the halved grad_output halves weight.grad too"),
        ([1.0, 1.0], "the pre-hook runs before the module's backward: every gradient computed from the halved "
                     "grad_output, the weight's included, is halved"),
    ],
)  # fmt: skip
def _weight_factors() -> list[float]:
    torch.manual_seed(0)
    layer, x = nn.Linear(3, 2), torch.randn(4, 3, requires_grad=True)

    def weight_grad(register, hook) -> torch.Tensor:
        layer.zero_grad()
        handle = None if hook is None else getattr(layer, register)(hook)
        try:
            layer(x).sum().backward()
        finally:
            if handle is not None:
                handle.remove()
        return layer.weight.grad.clone()

    plain = weight_grad(None, None)
    halved = weight_grad("register_full_backward_pre_hook", lambda m, go: (go[0] * 0.5,))
    times_ten = weight_grad("register_full_backward_hook", lambda m, gi, go: (gi[0] * 10,))
    return [(halved / plain).mean().item(), (times_ten / plain).mean().item()]


@prediction(
    "03.d", "when a full backward hook on resnet18's layer1.0.bn2 goes wrong",
    why="the forward pass fails: with the hook, bn2 hands out a view of its output, and `out += identity` changes "
        "that view in place, which autograd refuses as it happens.",
    wrong=[
        ("backward", "autograd checks an in-place change of a view when it happens, in the forward pass: the "
                     "error comes before any backward"),
        ("never", "the hook makes bn2's output a view that autograd protects, and `out += identity` changes it in "
                  "place: the forward pass raises"),
    ],
)  # fmt: skip
def _when_it_fails() -> str:
    import torchvision

    torch.manual_seed(0)
    block = torchvision.models.resnet18(weights=None).layer1[0]
    with block.bn2.register_full_backward_hook(lambda m, gi, go: None):
        try:
            out = block(torch.randn(1, 64, 8, 8))
        except RuntimeError:
            return "forward"
        try:
            out.sum().backward()
        except RuntimeError:
            return "backward"
    return "never"


@prediction(
    "03.e", "the largest factor by which a sigmoid passes a gradient on",
    why="σ'(z) = σ(z)(1 − σ(z)) is largest at z = 0, where it is 0.5 · 0.5 = 0.25: a sigmoid passes on at most a "
        "quarter of the gradient it receives.",
    wrong=[
        (0.5, "0.5 is σ(0), the sigmoid's value; its slope there is σ(0)(1 − σ(0)) = 0.25"),
        (1.0, "1 is the slope of ReLU for positive inputs; a sigmoid's slope σ(z)(1 − σ(z)) is at most 0.25"),
    ],
)  # fmt: skip
def _sigmoid_slope() -> float:
    z = torch.linspace(-6, 6, 1201, requires_grad=True)
    (slope,) = torch.autograd.grad(torch.sigmoid(z).sum(), z)
    return slope.max().item()


# ----- 03.1: how much each layer scales the gradient -----------------------------------------------
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


# ----- 03.2: clip each sample's gradient -------------------------------------------------------------
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
        given = upstream.clone()  # what the caller passes to backward(): a hook must leave it alone
        try:
            layer(x).backward(given)
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
        if not torch.equal(given, upstream):
            return Outcome(False, f"{shape}: your hook changed grad_output in place, and with it the gradient the "
                                  "caller passed to backward(); a hook should not modify its arguments (documented): "
                                  "return the new tuple instead")
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


# ----- 03.3: the gradient at an output that is changed in place ------------------------------------------
def _basic_block() -> nn.Module:
    """torchvision's BasicBlock, resnet18's block, with 4 channels: bn1's output goes through an in-place ReLU,
    bn2's gets ``out += identity`` and an in-place ReLU."""
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(6)
    return BasicBlock(4, 4)


def _conv_net_grads(x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(dL/d(output), dL/d(what the in-place ReLU made of it)) of conv1 and conv2 of a TinyConvNet, run
    without in-place operations."""
    net = TinyConvNet(seed=0, inplace=False)
    h1 = net.conv1(x)
    a1 = torch.relu(h1)
    h2 = net.conv2(a1)
    a2 = torch.relu(h2)
    g_h1, g_a1, g_h2, g_a2 = torch.autograd.grad(a2.sum(), [h1, a1, h2, a2])
    return {"conv1": (g_h1, g_a1), "conv2": (g_h2, g_a2)}


def _block_grads(block: nn.Module, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The same for bn1 and bn2 of a BasicBlock, written out without in-place operations."""
    h1 = block.bn1(block.conv1(x))
    a1 = torch.relu(h1)
    h2 = block.bn2(block.conv2(a1))
    out = torch.relu(h2 + x)
    g_h1, g_a1, g_h2, g_out = torch.autograd.grad(out.sum(), [h1, a1, h2, out])
    return {"bn1": (g_h1, g_a1), "bn2": (g_h2, g_out)}


def _output_grads_outcome(output_grads, model: nn.Module, names: list[str], x: torch.Tensor, reference) -> Outcome:
    """What is wrong with the answer on one model, or a passed Outcome."""
    try:
        got = output_grads(model, list(names), x.clone())
    except (TypeError, RuntimeError) as error:
        clear_hooks(model)
        return hint_for(error, {"BackwardHookFunction is a view": _FULL_HOOK_IN_PLACE,
                                "RemovableHandle": _RETURNED_HANDLE})  # fmt: skip
    if _used_legacy_hook(*model.modules()):
        return Outcome(False, _LEGACY_IN_PLACE)
    left = clear_hooks(model)
    if left:
        return Outcome(False, f"remove your hooks before returning: {left[0]}")
    if not isinstance(got, dict) or sorted(got) != sorted(names):
        keys = sorted(got) if isinstance(got, dict) else kind_of(got)
        return Outcome(False, f"return a dict with the keys {sorted(names)}, got {keys}")
    expected = reference(x)
    for name in names:
        right, past = expected[name]
        outcome = compare_tensors(got[name], right)
        if outcome.passed:
            continue
        if isinstance(got[name], torch.Tensor) and compare_tensors(got[name], past).passed:
            return Outcome(False, f"{name}: this is the gradient w.r.t. what the next in-place operation made of the "
                                  "output: your tensor hook (or retain_grad) was attached after that change; attach "
                                  "it in a forward hook, which runs before anything else touches the output")
        return Outcome(False, f"{name}: {outcome.detail}")
    return Outcome(True, "")


@exercise("03.3", "dL/d(output) of modules whose output is changed in place")
def _output_grads(output_grads) -> Outcome:
    """``output_grads(model, names, x)`` runs ``model(x).sum().backward()`` and returns ``{name: dL/d(output
    of that module)}``, also where an in-place operation changes the output afterwards."""
    conv_net, block = TinyConvNet(seed=0, inplace=True), _basic_block()
    image = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(5))
    features = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(6))
    cases = (("TinyConvNet(inplace=True)", conv_net, ["conv1", "conv2"], image, _conv_net_grads),
             ("resnet18's block with 4 channels", block, ["bn1", "bn2"], features,
              lambda x: _block_grads(block, x)))  # fmt: skip
    for label, model, names, x, reference in cases:
        outcome = _output_grads_outcome(output_grads, model, names, x, reference)
        if not outcome.passed:
            return Outcome(False, f"on {label}: {outcome.detail}")
    failed = hooks_left_when_raising(lambda: output_grads(conv_net, ["conv1", "conv2"], torch.randn(2, 3, 6, 6)),
                                     conv_net)  # fmt: skip
    if failed is not None:
        return failed
    return Outcome(True, "on the in-place TinyConvNet and on resnet18's block, every gradient equals autograd's "
                         "on the same network without in-place operations")


# ----- 03.4: a gradient tracker ---------------------------------------------------------------------
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


@exercise("03.4", "track the std of each layer's output gradient")
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
            "BackwardHookFunction is a view": _FULL_HOOK_IN_PLACE,
            "RemovableHandle": _RETURNED_HANDLE,
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


# ----- 03.5: where the gradient vanishes -------------------------------------------------------------------
def _sigmoid_mlp(depth: int = 9, width: int = 16) -> nn.Sequential:
    """6 features → depth × (Linear → Sigmoid) → Linear → 5 classes, PyTorch's default init."""
    torch.manual_seed(1)
    layers = [m for k in range(depth) for m in (nn.Linear(6 if k == 0 else width, width), nn.Sigmoid())]
    return nn.Sequential(*layers, nn.Linear(width, 5))


def _relu_mlp(scales: dict[str, float], depth: int = 8, width: int = 16) -> nn.Sequential:
    """6 → depth × (Linear → in-place ReLU) → Linear → 5, He init, then the weights of ``scales`` multiplied."""
    torch.manual_seed(2)
    layers = [m for k in range(depth) for m in (nn.Linear(6 if k == 0 else width, width), nn.ReLU(inplace=True))]
    model = nn.Sequential(*layers, nn.Linear(width, 5))
    with torch.no_grad():
        for layer in model[::2]:
            nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
        for name, scale in scales.items():
            model.get_submodule(name).weight.mul_(scale)
    return model


def _output_grad_stds(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """std of dL/d(output) of every Linear, in forward order, computed without in-place operations."""
    h, outputs, names = x, [], []
    for name, module in model.named_children():
        h = torch.relu(h) if isinstance(module, nn.ReLU) else module(h)
        if isinstance(module, nn.Linear):
            outputs.append(h)
            names.append(name)
    grads = torch.autograd.grad(F.cross_entropy(h, y), outputs)
    return {name: g.std().item() for name, g in zip(names, grads, strict=True)}


def _first_below(names, stds: dict[str, float], limit: float) -> str | None:
    return next((name for name in names if stds[name] < limit), None)


def _vanishing_mistakes(stds: dict[str, float], limit: float, want: str | None) -> dict[str, str]:
    """Plausible wrong answers (a name) with what each did."""
    below = [name for name in stds if stds[name] < limit]
    if not below:
        return {}
    reasons: dict[str, list[str]] = {}
    for name, reason in (
        (below[0], "it is the first layer below the limit counted from the input"),
        (min(below, key=stds.get), "it has the smallest gradient std"),
        (_first_below(sorted(stds, reverse=True), stds, limit), "the names were sorted as strings, where '8' comes "
                                                                "after '10'"),
    ):  # fmt: skip
        reasons.setdefault(name, []).append(reason)
    reasons.pop(want, None)
    return {name: " and ".join(found) + "; backward meets the layers from the loss end, and the gradient fell below "
            "the limit earlier on that way: take the order the hooks fire in (or the forward order, reversed)"
            for name, found in reasons.items()}  # fmt: skip


@exercise("03.5", "the layer where the gradient vanishes, seen from the loss")
def _vanishing(vanishing_point) -> Outcome:
    """``vanishing_point(model, x, y, limit=1e-5)`` runs one backward of ``F.cross_entropy(model(x), y)`` and
    returns the name of the first ``Linear``, in the order backward reaches them, whose output gradient has a
    std below ``limit``, or None."""
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(12, 6, generator=g), torch.randint(0, 5, (12,), generator=g)
    cases = (
        ("the deep sigmoid network", _sigmoid_mlp, {}),
        ("the deep sigmoid network with limit=1e-3", _sigmoid_mlp, {"limit": 1e-3}),
        ("a He-initialised ReLU network with in-place ReLUs", lambda: _relu_mlp({}), {}),
        ("a ReLU network whose layer '12' has tiny weights, and layers '6' and '4' large ones",
         lambda: _relu_mlp({"12": 1e-6, "6": 10.0, "4": 1e4}), {}),
    )  # fmt: skip
    for label, build, kwargs in cases:
        model = build()
        try:
            got = vanishing_point(model, x.clone(), y.clone(), **kwargs)
        except (TypeError, RuntimeError) as error:
            clear_hooks(model)
            return hint_for(error, {"BackwardHookFunction is a view": f"on {label}: {_FULL_HOOK_IN_PLACE}",
                                    "RemovableHandle": f"on {label}: {_RETURNED_HANDLE}"})  # fmt: skip
        left = clear_hooks(model)
        if left:
            return Outcome(False, f"on {label}: remove your hooks before returning: {left[0]}")
        limit = kwargs.get("limit", 1e-5)
        stds = _output_grad_stds(build(), x, y)
        want = _first_below(reversed(stds), stds, limit)
        if got is not None and not isinstance(got, str):
            return Outcome(False, f"return a layer's name (a str, as named_modules gives it) or None, "
                                  f"not {kind_of(got)}")
        if got == want:
            continue
        if want is None:
            return Outcome(False, f"on {label}: no Linear's output gradient has a std below {limit:g}: return None, "
                                  f"not {got!r}")
        if got is None:
            return Outcome(False, f"on {label}: the output gradient of layer {want!r} has a std of {stds[want]:.2g}, "
                                  f"below {limit:g}, and you returned None")
        if kwargs and got == _first_below(reversed(stds), stds, 1e-5):
            return Outcome(False, f"on {label}: that is the answer for limit=1e-5; use the limit you are given")
        hint = _vanishing_mistakes(stds, limit, want).get(got, "")
        return Outcome(False, f"on {label}: expected {want!r}, got {got!r}" + (f": {hint}" if hint else ""))
    model = _sigmoid_mlp()
    failed = hooks_left_when_raising(lambda: vanishing_point(model, torch.randn(3, 7), y[:3]), model)
    return failed or Outcome(True, "on every network, the first layer below the limit on the way back from the "
                                   "loss, and None where the gradient never vanishes")
