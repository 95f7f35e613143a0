"""Exercises of notebook 05, in its order: dead channels found with a hook (05.1), a watch that counts dead
channels at every training step (05.2), a deconvnet ReLU hook (05.3), cascading weight randomisation (05.4),
a Layer-CAM map (05.5)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..audit import clear_hooks
from ..hooks import Hooks
from ..models import DigitsCNN
from ..pytorch_internals import module_hooks
from . import Outcome, compare_tensors, exercise, hooks_left_when_raising


def _images(seed: int, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


class _DeconvReLU(torch.autograd.Function):
    """ReLU forward; backward passes on the positive part of the incoming gradient, wherever the input was."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.clamp(min=0)


class _DeconvReLUModule(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DeconvReLU.apply(x)


def _input_gradient(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg)[:, target].sum(), xg)
    return grad


def _deconvnet_saliency(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """The deconvnet's input gradient without hooks: a copy of ``model`` whose ReLUs use ``_DeconvReLU``."""
    deconv = copy.deepcopy(model)
    for name, module in list(deconv.named_modules()):
        if isinstance(module, nn.ReLU):
            parent, _, child = name.rpartition(".")
            setattr(deconv.get_submodule(parent), child, _DeconvReLUModule())
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


@exercise("05.3", "a deconvnet ReLU hook")
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


@exercise("05.5", "a Layer-CAM map that keeps the position")
def _layer_cam(layer_cam) -> Outcome:
    """``layer_cam(activations, gradients)``: both ``(N, C, H, W)``; returns the ``(N, H, W)`` maps
    ``relu(sum_k relu(G_k) * A_k)`` and leaves both inputs unchanged."""
    generator = torch.Generator().manual_seed(11)
    details = []
    for shape in ((3, 6, 5, 4), (1, 2, 3, 3)):
        activations = torch.rand(*shape, generator=generator) * 1.5 - 0.5  # both signs, as before a ReLU
        gradients = torch.randn(*shape, generator=generator)
        expected = _layer_cam_maps(activations, gradients)
        a, g = activations.clone(), gradients.clone()
        got = layer_cam(a, g)
        for name, original, passed in (("activations", activations, a), ("gradients", gradients, g)):
            if not torch.equal(original, passed):
                return Outcome(False, f"your function changed the {name} in place: don't modify them, compute "
                                      "new tensors (the caller still needs them)")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"return the maps as a tensor, got {type(got).__name__}")
        where = f"for a batch of shape {shape}"
        if got.shape != expected.shape:
            hint = "one (H, W) map per image: sum over the channel dimension (dim 1) only"
            if got.shape == expected.shape[1:]:
                hint = "return one map per image of the batch, (N, H, W); " + hint.split(": ", 1)[1]
            return Outcome(False, f"{where} the result has shape {tuple(got.shape)}, expected "
                                  f"{tuple(expected.shape)}: {hint}")
        outcome = compare_tensors(got, expected)
        if not outcome.passed:
            hint = _layer_cam_hint(got, activations, gradients) or (
                f"{outcome.detail}; weight each activation by the positive part of its own gradient, sum over "
                "channels, keep the positive part"
            )
            return Outcome(False, f"{where}: {hint}")
        details.append(tuple(expected.shape))
    return Outcome(True, f"maps of shapes {details[0]} and {details[1]} match")


def _channels(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def _model_with_dead_channels():
    """A digits CNN with dead channels in ``features.1``, a batch, and that layer's output."""
    model = DigitsCNN(seed=1).eval()
    with torch.no_grad():
        model.features[0].bias[[2, 9, 13]] = -50.0  # these channels never get past the ReLU
        model.features[0].bias[12] -= 1.05  # channel 12 gets past it on the bright last image only
    blank, bright = torch.zeros(1, 1, 8, 8), torch.full((1, 1, 8, 8), 4.0)
    x = torch.cat([blank, _images(3, n=4), bright])  # more channels are zero on the blank image
    with torch.no_grad():
        out = model.features[:2](x)  # the output of features.1, computed without hooks
    return model, x, out


def _wrong_dead_channels(got, out: torch.Tensor) -> Outcome | None:
    """What is wrong with the channels ``dead_channels`` returned for layer output ``out``, if anything."""
    if got is None:
        return Outcome(False, "dead_channels returned None: return the sorted channel indices")
    if isinstance(got, torch.Tensor) and got.dtype == torch.bool:
        return Outcome(False, "return channel indices, not a mask of which channels are dead")
    try:
        indices = [int(c) for c in got]
    except (TypeError, ValueError, RuntimeError):
        return Outcome(False, f"return a list of channel indices (ints), got {type(got).__name__}")
    if len(indices) == out.shape[1] and set(indices) <= {0, 1}:
        return Outcome(False, "return channel indices, not a mask of which channels are dead")
    got = sorted(indices)
    per_image = (out == 0).flatten(2).all(dim=2)
    expected = _channels(per_image.all(dim=0))
    if got != expected:
        if got == _channels(per_image.any(dim=0)):
            return Outcome(False, "these channels are zero for at least one image; dead means zero for every image")
        if got == _channels(per_image[0]):
            return Outcome(False, "these channels are zero for the first image; dead means zero for every image")
        if got == _channels((out == 0).flatten(2).any(dim=2).all(dim=0)):
            return Outcome(False, "these channels are zero somewhere in every image; dead means zero at every "
                                  "position")
        return Outcome(False, f"got channels {got}; a dead channel is zero for every image and every position")
    return None


_REPLACED = ("a forward hook's return value replaces the layer's output, and yours changed it: "
             "keep what you need in the hook and return nothing")


def _wrong_pass(calls: list) -> Outcome | None:
    """What is wrong with how the model ran, from ``(grad enabled, whole batch, hooked)`` per call."""
    if len(calls) != 1:
        return Outcome(False, f"the model ran {len(calls)} times: register a forward hook on the layer and call "
                              "model(x) once")
    grad_enabled, whole_batch, hooked = calls[0]
    if grad_enabled:
        return Outcome(False, "the forward pass ran with gradients enabled: run it under torch.no_grad(), the hook "
                              "only reads the output")
    if not whole_batch:
        return Outcome(False, "run the model once on the whole batch x")
    if not hooked:
        return Outcome(False, "no forward hook of yours was on the layer while the model ran: register one on "
                              "hooklab.get_layer(model, layer) and read the output there")
    return None


@exercise("05.1", "dead channels found with a forward hook")
def _dead_channels(dead_channels) -> Outcome:
    """``dead_channels(model, layer, x)`` returns the sorted channel indices of layer ``layer`` whose
    output is zero for every image of ``x`` and every position, read by a forward hook on that layer
    during one forward pass without gradients; no hook may be left behind, even when the pass raises."""
    model, x, out = _model_with_dead_channels()
    layer, after = model.features[1], model.features[2]
    calls, seen = [], {}

    def before_model(module, args):
        given = args[0] if args else None
        whole = isinstance(given, torch.Tensor) and given.shape == x.shape and torch.equal(given, x)
        others = set(module_hooks(layer, "_forward_hooks")) - {layer_handle.id}
        calls.append((torch.is_grad_enabled(), whole, bool(others)))

    def layer_output(module, args, output):
        seen["output"] = output

    def next_input(module, args):
        given, output = args[0] if args else None, seen.get("output")
        if not isinstance(output, torch.Tensor):
            return
        kept = isinstance(given, torch.Tensor) and given.dtype == output.dtype and given.shape == output.shape
        seen["replaced"] = seen.get("replaced", False) or not (kept and torch.equal(given, output))

    hooks = Hooks()
    layer_handle = hooks.add(layer.register_forward_hook(layer_output))
    hooks.add(model.register_forward_pre_hook(before_model))
    hooks.add(after.register_forward_pre_hook(next_input))
    try:
        got = dead_channels(model, "features.1", x)
    except Exception:
        if seen.get("replaced"):
            return Outcome(False, _REPLACED)
        raise
    finally:
        hooks.remove()
        left = clear_hooks(model)
    if seen.get("replaced"):
        return Outcome(False, _REPLACED)
    if left:
        return Outcome(False, f"a hook was left registered ({left[0]}): remove it in a finally block")
    wrong = _wrong_pass(calls) or _wrong_dead_channels(got, out) or hooks_left_when_raising(
        lambda: dead_channels(model, "features.1", torch.zeros(1, 3, 8, 8)), model)  # 3 channels: the model raises
    if wrong:
        return wrong
    expected = _channels((out == 0).flatten(2).all(dim=2).all(dim=0))
    return Outcome(True, f"channels {expected} of features.1 are dead; one pass without gradients; no hook left "
                         "behind, also when the pass raised")


# ----- 05.2: a watch on dying channels ----------------------------------------------------------------
def _dead_count(output: torch.Tensor) -> int:
    """Channels of an ``(N, C, ...)`` output that are zero for every image and every position."""
    return int((output == 0).flatten(2).all(dim=2).all(dim=0).sum())


def _watch_batches() -> list[torch.Tensor]:
    """Three batches: the last one blank, on which more channels of a digits CNN stay off."""
    return [_images(21, n=5), torch.cat([_images(22, n=2), torch.full((1, 1, 8, 8), 4.0)]), torch.zeros(2, 1, 8, 8)]


def _expected_counts(model: nn.Module, layers: list[str], batches: list[torch.Tensor]) -> dict:
    with torch.no_grad():
        outputs = {name: [] for name in layers}
        for x in batches:
            h = x
            for index, module in enumerate(model.features):
                h = module(h)
                if f"features.{index}" in outputs:
                    outputs[f"features.{index}"].append(h)
    return {name: [_dead_count(out) for out in outs] for name, outs in outputs.items()}


def _run_watch(watch_class, model: nn.Module, layers: list[str], batches: list[torch.Tensor]):
    """Enter the student's watch, run the batches (the second with a backward pass), return its counts."""
    watch = watch_class(model, layers)
    with watch as entered:
        for i, x in enumerate(batches):
            if i == 1:
                model(x).sum().backward()
            else:
                with torch.no_grad():
                    model(x)
    if entered is not watch:
        raise _Wrong("__enter__ must return the watch itself (return self), so that `with DeadWatch(...) as w:` "
                     "gives it")
    return getattr(watch, "counts", None)


class _Wrong(Exception):
    """A problem of the answer found while running it, with the hint to show."""


def _length_hint(got: dict, name: str, entries: int, passes: int) -> str:
    """Why ``counts[name]`` has the wrong length: all counts under one name is the late-binding closure."""
    lengths = {key: len(value) for key, value in got.items() if isinstance(value, list | tuple)}
    crowded = [key for key, n in lengths.items() if n == passes * len(got)]
    if crowded and sum(lengths.values()) == passes * len(got):
        return (f"every count went to counts[{crowded[0]!r}]: a hook defined inside the loop looks the loop variable "
                "up when it runs, after the loop, so all hooks see the last name; give each hook its own name "
                "(a function that makes the hook, or a default argument name=name)")
    return (f"counts[{name!r}] has {entries} entries after {passes} forward passes: each hook should append one "
            "count every time its layer runs")


def _counts_hint(got: dict, expected: dict, model: nn.Module, layers: list[str], batches: list) -> str | None:
    """What is wrong with ``counts``, or None."""
    if not isinstance(got, dict) or set(got) != set(layers):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return f"counts must be a dict with one entry per watched layer name {layers}, got {keys}"
    for name in layers:
        values = list(got[name]) if isinstance(got[name], list | tuple) else None
        if values is None:
            return f"counts[{name!r}] must be a list with one number per forward pass, got {type(got[name]).__name__}"
        if len(values) != len(batches):
            return _length_hint(got, name, len(values), len(batches))
        channels = model.features[int(name.rpartition(".")[2]) - 1].out_channels  # the convolution before
        if values != expected[name]:
            if all(isinstance(v, float) for v in values) and [round(v * channels) for v in values] == expected[name]:
                return "count the dead channels (an int per pass), not their fraction"
            return (f"counts[{name!r}] is {values}, not the number of channels that are zero for every image and "
                    "every position of each batch")
    return None


@exercise("05.2", "a watch that counts dead channels at every step")
def _dead_watch(watch_class) -> Outcome:
    """``DeadWatch(model, layers)`` is a context manager: inside ``with``, each forward pass appends to
    ``counts[name]`` the number of channels of layer ``name``'s output that are zero for every image
    and every position of the batch; its hooks are removed when the block ends, also on error."""
    if not callable(watch_class):
        return Outcome(False, f"pass the class DeadWatch itself, got {type(watch_class).__name__}")
    model, _, _ = _model_with_dead_channels()
    layers, batches = ["features.1", "features.3"], _watch_batches()
    expected = _expected_counts(model, layers, batches)
    try:
        got = _run_watch(watch_class, model, layers, batches)
    except _Wrong as wrong:
        return Outcome(False, str(wrong))
    finally:
        model.zero_grad(set_to_none=True)
        left = clear_hooks(model)
    if left:
        return Outcome(False, f"a hook stayed on the model after the with block ({left[0]}): remove every handle "
                              "in __exit__")
    hint = _counts_hint(got, expected, model, layers, batches)
    if hint:
        return Outcome(False, hint)

    def raise_inside():
        with watch_class(model, layers):
            model(torch.zeros(1, 3, 8, 8))  # the model refuses three channels

    wrong = hooks_left_when_raising(raise_inside, model)
    if wrong:
        return Outcome(False, "when the body of the with block raised, a hook stayed on the model: remove the "
                              "handles in __exit__, which runs also on errors")
    return Outcome(True, f"dead channels per pass: {expected}; hooks removed, also when the block raised")


# ----- 05.4: cascading weight randomisation ---------------------------------------------------------
def _cascade_model() -> nn.Module:
    return DigitsCNN(seed=4).eval()


_TOP_DOWN = ["head.2", "features.5", "features.2"]


def _changed(copy_: nn.Module, model: nn.Module) -> set[str]:
    """Names of the layers (modules with parameters of their own) whose parameters differ."""
    changed = set()
    originals = dict(model.named_parameters())
    for name, value in copy_.named_parameters():
        if name in originals and not torch.equal(value.detach(), originals[name].detach()):
            changed.add(name.rpartition(".")[0])
    return changed


def _cascade_problem(got, model: nn.Module, before: dict) -> str | None:
    if not isinstance(got, list | tuple) or not all(isinstance(m, nn.Module) for m in got):
        return f"return a list of models, one per layer name, got {_kind_of_models(got)}"
    if len(got) != len(_TOP_DOWN):
        return f"return one model per layer name: {len(_TOP_DOWN)} names, {len(got)} models"
    if any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
        return "the model you were given changed: randomise a copy (copy.deepcopy(model)), never the model itself"
    if any(m is model for m in got) or len({id(m) for m in got}) < len(got):
        return "each entry must be its own copy of the model (copy.deepcopy), not the same object again"
    for k, copied in enumerate(got):
        changed, wanted = _changed(copied, model), set(_TOP_DOWN[: k + 1])
        if changed == {_TOP_DOWN[k]} and k:
            return (f"model {k} re-draws only {_TOP_DOWN[k]!r}: a cascade keeps the layers above it random too, "
                    f"so model {k} re-draws {_TOP_DOWN[: k + 1]}")
        if changed != wanted:
            extra, missing = sorted(changed - wanted), sorted(wanted - changed)
            what = f"also changed {extra}" if extra else f"did not change {missing}"
            return f"model {k} should re-draw exactly {_TOP_DOWN[: k + 1]}; it {what}"
    return None


def _kind_of_models(value) -> str:
    return type(value).__name__ if not isinstance(value, list | tuple) else "a list holding other things"


def _same_weights(models, others) -> bool:
    return all(torch.equal(a, b) for m1, m2 in zip(models, others, strict=True)
               for a, b in zip(m1.parameters(), m2.parameters(), strict=True))


def _reference_cascade(model: nn.Module) -> list[nn.Module]:
    """The cascade the exercise asks for: one seed at the start, each copy from the previous one."""
    torch.manual_seed(0)
    copies, current = [], model
    for name in _TOP_DOWN:
        current = copy.deepcopy(current)
        current.get_submodule(name).reset_parameters()
        copies.append(current)
    return copies


@exercise("05.4", "cascading weight randomisation, from the top layer down")
def _cascade(cascade) -> Outcome:
    """``cascade(model, names)`` returns one copy of ``model`` per name: copy ``k`` has the layers
    ``names[:k + 1]`` re-drawn by their ``reset_parameters()``; ``model`` is unchanged, and two calls
    give the same weights (``torch.manual_seed(0)`` first)."""
    model = _cascade_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)  # another state than the answer's own start
    got = cascade(model, list(_TOP_DOWN))
    problem = _cascade_problem(got, model, before)
    if problem:
        return Outcome(False, problem)
    again = cascade(model, list(_TOP_DOWN))
    if not _same_weights(got, again):
        return Outcome(False, "two calls gave different weights: call torch.manual_seed(0) once, as the first line "
                              "of cascade, so that the cascade is the same at every call")
    if not _same_weights(got, _reference_cascade(model)):
        return Outcome(False, "same weights at every call, but not the ones the text asks for: call "
                              "torch.manual_seed(0) once, at the start only (not before each layer), then make "
                              "each copy from the previous one and re-draw just its new layer, so the layers are "
                              "re-drawn in the order of names, each once")
    return Outcome(True, f"{len(got)} copies, re-drawn from the top: {', '.join(_TOP_DOWN)}; the model unchanged")
