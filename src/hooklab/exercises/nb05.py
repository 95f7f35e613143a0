"""Exercises and predictions of notebook 05, in its order: what the network uses, its dead or its live channels
set to 0 (05.a), dead channels found with a forward hook (05.1), why they stay dead and a watch that counts them at
every step (05.b, 05.2), whether an untrained network's guided map follows the ink too, and guided backpropagation as
a class of ReLU hooks (05.c, 05.3), the Grad-CAM recorder: a tensor hook registered from a forward hook (05.4),
which channels of features.3 Grad-CAM weighs and which add to its map (05.d), which map changes with the class
(05.e), and layers re-drawn by forward hooks that run a fresh copy (05.5). 05.3 and 05.5 subclass ``Hooked``, the
student's DeadWatch generalised. ``SLOW_RUNS`` stores longer runs (12 and 48 epochs); ``_deletion_drops`` is a
deletion test with 4 cells filled (the field guide's G5 §8 runs the full test, written by the student in G5.3).
Layer-CAM, with that recorder, is the field guide's exercise G5.2, and the cascade of copies G5.4 (their checkers, in
g5.py, use the cases here)."""

from __future__ import annotations

import contextlib
import copy
import functools

import torch
from torch import nn

from ..audit import clear_hooks
from ..hooks import Hooks
from ..models import DigitsCNN, TinyConvNet, trained_digits_cnn
from ..pytorch_internals import module_hooks
from . import Outcome, compare_tensors, exercise, hooks_left_when_raising, kind_of, prediction


def _images(seed: int, n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


@functools.cache
def _digits():
    from ..data import digits

    return digits()


class _Wrong(Exception):
    """A problem of the answer found while running it, with the hint to show."""


def _grads_untouched(model: nn.Module) -> str | None:
    """A hint when the answer left gradients in the parameters' ``.grad`` (they were all None)."""
    if any(p.grad is not None for p in model.parameters()):
        return ("your function left gradients in the model's parameters (.grad): compute the gradient with "
                "torch.autograd.grad(score, images), which writes into no .grad; a caller in the middle of "
                "training would learn from them")
    return None


_SEED = 0.25  # what 05.4's check puts in every parameter's .grad before calling the answer


def _seed_grads(model: nn.Module) -> None:
    """Give every parameter a ``.grad`` the answer must leave as it is: a caller's gradients of an unfinished step."""
    for p in model.parameters():
        p.grad = torch.full_like(p, _SEED)


def _grads_kept(model: nn.Module, wrt: str = "images") -> str | None:
    """A hint when the answer changed the ``.grad`` that ``_seed_grads`` put in the parameters."""
    if all(p.grad is not None and torch.equal(p.grad, torch.full_like(p, _SEED)) for p in model.parameters()):
        return None
    wiped = any(p.grad is None for p in model.parameters())
    what = "set them to None (model.zero_grad)" if wiped else "added to them (a .backward())"
    return (f"the parameters' .grad held a caller's gradients, and your function {what}: a caller in the middle "
            f"of training would lose or mix them; compute the gradient with torch.autograd.grad(score, {wrt}), "
            "which writes into no .grad, so there is nothing to clean up")


# ----- predictions ------------------------------------------------------------------------------------
def _pick_one(choices: tuple[str, ...]) -> str:
    return "pick one of " + ", ".join(f'"{c}"' for c in choices) + ", spelt as here, then run the cell again"


def _one_of(choices: tuple[str, ...]):
    """A ``form`` for ``prediction``: None for one of the offered words (any case, quotes, spaces), else the list
    of choices (a typo, an abbreviation, a number)."""
    offered = {c.lower() for c in choices}

    def form(guess: object) -> str | None:
        if isinstance(guess, str) and " ".join(guess.strip().strip("'\"`").lower().split()) in offered:
            return None
        return _pick_one(choices)

    return form


def _two_booleans(guess: object) -> str | None:
    """A ``form`` for ``prediction``: None for two booleans, else what the question wants ([0, 1], ["no", "yes"])."""
    if isinstance(guess, list | tuple) and len(guess) == 2 and all(isinstance(g, bool) for g in guess):
        return None
    return "answer each question with True or False, without quotes, two in a list, then run the cell again"


def _two_counts(guess: object) -> str | None:
    """A ``form`` for ``prediction``: None for two whole numbers, else what the question wants (["8", 32], 8)."""
    if isinstance(guess, list | tuple) and len(guess) == 2 and all(
            isinstance(g, int) and not isinstance(g, bool) for g in guess):
        return None
    return "write two whole numbers in a list, without quotes, e.g. [0, 0], then run the cell again"


def _zeroed(model: nn.Module, channels) -> torch.Tensor:
    """The trained network's predictions for the test digits, with a forward hook on features.3 whose
    return value sets the given channels to 0."""

    def hook(module, args, output):
        output = output.clone()
        output[:, channels] = 0
        return output

    with model.features[3].register_forward_hook(hook), torch.no_grad():
        return model(_digits().x_test).argmax(dim=1)


def _knockouts() -> tuple[dict[int, float], dict[int, float]]:
    """For each live channel of features.3 (test digits): its mean output, and the test accuracy with that channel
    alone set to 0 by a forward hook. Computed once (nine passes over the test digits), then copied per call."""
    means, accuracies = _knockouts_once()
    return dict(means), dict(accuracies)


@functools.cache
def _knockouts_once() -> tuple[dict[int, float], dict[int, float]]:
    model, data, kept = trained_digits_cnn(), _digits(), {}
    handle = model.features[3].register_forward_hook(lambda module, args, output: kept.update(output=output))
    try:
        with torch.no_grad():
            model(data.x_test)
    finally:
        handle.remove()
    out = kept["output"]
    live = (out != 0).flatten(2).any(dim=2).any(dim=0).nonzero().flatten().tolist()
    means = {c: float(out[:, c].mean()) for c in live}
    accuracies = {c: float((_zeroed(model, [c]) == data.y_test).float().mean()) for c in live}
    return means, accuracies


EFFECTS = ("unchanged", "lower", "chance")


def _two_effects(guess: object) -> str | None:
    """A ``form`` for ``prediction``: None for two of the offered words, else the words to pick from."""
    if isinstance(guess, list | tuple) and len(guess) == 2 and all(
            isinstance(g, str) and g.strip().strip("'\"").lower() in EFFECTS for g in guess):
        return None
    return ("write two words in a list, each one of " + ", ".join(f'"{c}"' for c in EFFECTS)
            + ', e.g. ["lower", "lower"], then run the cell again')


def _effect(accuracy: float, full: float) -> str:
    return "unchanged" if accuracy == full else "chance" if accuracy <= 0.15 else "lower"


@prediction("05.a", "the test accuracy with half of features.3's 8 live channels set to 0: its first four (0, 1, 2, "
                    "6), then its other four (11, 23, 27, 31)",
            why="each half of the live channels still carries part of the digit, so the network still beats chance "
                "(about one digit in ten right); but no live channel is spare, so losing either half costs most of "
                "the accuracy. Only with all 8 at 0 does every digit get the same class",
            wrong=[(["unchanged", "unchanged"], "the network has no spare live channels: it uses all 8, so losing "
                                                "four of them costs accuracy"),
                   (["chance", "chance"], "each half alone still carries part of the digit: the network stays well "
                                          "above one digit in ten right; only all 8 at 0 leaves it at chance")],
            form=_two_effects)
def _what_the_network_uses() -> list[str]:
    model, data = trained_digits_cnn(), _digits()
    _, accuracies = _knockouts()
    live = sorted(accuracies)
    full = float((_zeroed(model, []) == data.y_test).float().mean())
    return [_effect(float((_zeroed(model, channels) == data.y_test).float().mean()), full)
            for channels in (live[:4], live[4:])]


def _blocked() -> dict:
    """features.3 of the trained network on 64 training digits: its output, and the gradients a full
    backward hook sees arrive (grad_output) and leave (grad_input)."""
    import torch.nn.functional as F

    model, data, seen = trained_digits_cnn(), _digits(), {}

    def keep(module, grad_input, grad_output):
        seen["arrives"], seen["passes"] = grad_output[0], grad_input[0]

    relu = model.features[3]
    with Hooks() as hooks:
        hooks.add(relu.register_forward_hook(lambda module, args, output: seen.update(output=output)))
        hooks.add(relu.register_full_backward_hook(keep))
        loss = F.cross_entropy(model(data.x_train[:64]), data.y_train[:64])
        (seen["weight_grad"],) = torch.autograd.grad(loss, model.features[2].weight)
    seen["dead"] = (seen["output"] == 0).flatten(2).all(dim=2).all(dim=0)
    return seen


@prediction("05.b", "whether a dead channel receives a gradient from above, and whether the weights feeding it "
                    "get one",
            why="the gradient arrives from above whatever the channel did (the max-pool hands each window's "
                "gradient to one position, the first on a tie), but a ReLU passes it back only where its input was "
                "positive: a dead channel's input never is, so nothing reaches the weights feeding it",
            wrong=[([True, True], "it does receive one, but the ReLU is where it stops: a ReLU passes the gradient "
                                  "back only where its input was positive, and a dead channel's never is, so "
                                  "nothing reaches the weights below it"),
                   ([False, False], "nothing reaches its weights, right; but it does receive a gradient: the "
                                    "max-pool above hands each window's gradient to one position, even in a window "
                                    "of zeros"),
                   ([False, True], "the other way round: the gradient arrives from above whatever the channel did; "
                                   "the ReLU, seeing an input that is never positive, passes none of it down to "
                                   "the weights")],
            form=_two_booleans)
def _dead_gradients() -> list:
    seen = _blocked()
    dead = seen["dead"]
    return [bool((seen["arrives"][:, dead] != 0).any()), bool((seen["weight_grad"][dead] != 0).any())]


def _guided_resemblance() -> tuple[float, list[float]]:
    """How much guided backprop's map resembles the digit (mean rank correlation with the pixels, first 6 test
    digits, their own classes): for the trained network, and for 8 never-trained ones (seeds 0 to 7)."""
    from ..saliency import GuidedBackprop, rank_correlation

    data = _digits()
    x, labels = data.x_test[:6], data.y_test[:6]
    means = []
    for net in [trained_digits_cnn()] + [DigitsCNN(seed=seed) for seed in range(8)]:
        with GuidedBackprop(net) as gb:
            means.append(float(rank_correlation(gb.saliency(x, labels), x).mean()))
    return means[0], means[1:]


FOLLOWS = ("above", "about the same", "below")
NEAR = 0.05  # "about the same": within 0.05 of the trained network's mean rank correlation


@prediction("05.c", "whether never-trained networks' guided-backprop maps follow the digit's ink more closely than "
                    "the trained network's (mean rank correlation with the pixels above, about the same as (within "
                    "0.05) or below its 0.60)",
            why="the clamps pass back only positive gradient, through the units the digit switches on, so the map "
                "redraws the ink those units see, whatever the weights are (Nie et al., 2018). Measured: all 8 "
                "never-trained networks' maps follow the ink more closely than the trained one's: a map that looks "
                "like the digit says nothing about what training taught",
            wrong=[("below", "the clamps decide what passes, not the weights: the gradient flows back only through "
                             "the units the digit switches on, and only its positive part, so the map lands on the "
                             "ink with any weights. Measured: all 8 never-trained networks' maps follow it more "
                             "closely than the trained one's"),
                   ("about the same", "right that the weights do not make the map follow the ink: the clamps do. But "
                                      "the trained weights pull it away from the ink: all 8 never-trained networks' "
                                      "maps follow the ink more closely than the trained one's, each by more than "
                                      "0.05")],
            form=_one_of(FOLLOWS))
def _untrained_follows_the_ink() -> str:
    trained, untrained = _guided_resemblance()
    if min(untrained) > trained + NEAR:
        return "above"
    if max(untrained) < trained - NEAR:
        return "below"
    if all(abs(u - trained) <= NEAR for u in untrained):
        return "about the same"
    return "some above, some below"


def _cam_channels() -> list:
    """Grad-CAM at features.3 for the first test digit's predicted class: how many of the 32 channels have
    α_k ≠ 0, and how many add something to the map (α_k A_k not zero everywhere)."""
    from ..saliency import grad_cam

    model, x = trained_digits_cnn(), _digits().x_test[:1]
    kept = {}
    with model.features[3].register_forward_hook(lambda module, args, output: kept.update(a=output.detach())):
        cam = grad_cam(model, x, "features.3")
    alpha = cam.weights[0]
    adds = ((alpha[:, None, None] * kept["a"][0]) != 0).flatten(1).any(dim=1)
    return [int((alpha != 0).sum()), int(adds.sum())]


@prediction("05.d", "how many channels of features.3 get a Grad-CAM weight, and how many add to the map",
            why="α_k is the mean of the gradient arriving at channel k, and the gradient arrives at dead channels "
                "too (prediction 05.b): all 32 get a weight. But a dead channel's A_k is 0 at every position, so "
                "α_k A_k is 0: only the 8 live channels add to the map",
            wrong=[([8, 8], "α_k is made from what arrives at channel k, and 05.b showed that the gradient does "
                            "arrive at a dead channel; it stops only on the way back through the ReLU"),
                   ([32, 32], "a dead channel's A_k is 0 at every position, so α_k A_k is 0 whatever α_k is"),
                   ([24, 8], "all 32 channels get a gradient from above, live or dead: count them all"),
                   ([8, 32], "the other way round: the weight comes from the gradient, which reaches all 32; the "
                             "map needs A_k, which only 8 have")],
            form=_two_counts)
def _grad_cam_channels() -> list:
    return _cam_channels()


def _deletion_drops(cells: int = 4, orders: int = 5) -> dict:
    """The deletion test of lesson 05 on all 450 test digits: Grad-CAM at features.6 for the predicted class, the
    2×2 pixels under ``cells`` of its 16 cells filled with the digit's mean pixel by a forward pre-hook on the
    model, for the brightest cells, the darkest cells and cells in ``orders`` random orders per digit (seeds 0, 1,
    ...). The fall of the class score, digit by digit, for each (``random``: a list, one per order)."""
    from ..saliency import grad_cam

    model, x = trained_digits_cnn(), _digits().x_test
    cam = grad_cam(model, x, "features.6")
    order = cam.raw.flatten(1).argsort(dim=1, descending=True)
    fill = x.mean(dim=(1, 2, 3), keepdim=True)

    def falls(ranked):
        patch = pixels_under(ranked[:, :cells])
        with model.register_forward_pre_hook(lambda m, args: (torch.where(patch, fill, args[0]),)), torch.no_grad():
            return cam.scores - model(x).gather(1, cam.targets[:, None])[:, 0]

    return {"brightest": falls(order), "darkest": falls(order.flip(1)),
            "random": [falls(random_orders(len(x), seed)) for seed in range(orders)]}


MAP_CHOICES = ("plain gradient", "guided backprop", "Grad-CAM")


@prediction("05.e", "which map changes least for another class: the plain gradient, guided backprop or Grad-CAM",
            why="the class enters only at the top, as w_c/16 at each channel of features.6: guided backprop's clamp "
                "there drops the channels with w_ck < 0, and below it each ReLU passes only positive gradient, "
                "through masks set by the digit. Another class starts from another half of the channels, then "
                "follows the same paths: measured, a guided map started from no class at all (gradient 1 "
                "everywhere) correlates about 0.9 with each class's. The plain gradient and Grad-CAM are linear in "
                "w_c and partly reverse (about -0.4)",
            wrong=[("plain gradient", "the plain gradient is linear in the class's row w_c (the ReLU masks are set "
                                      "by the digit): another class's row, negatively correlated with it here, "
                                      "reverses much of its order"),
                   ("Grad-CAM", "Grad-CAM's α_k = w_k/16 are the class's row of the head (section 4): another class "
                                "re-weights the same channels directly, and its row is negatively correlated here")],
            form=_one_of(MAP_CHOICES))
def _which_changes_more() -> str:
    from ..saliency import GuidedBackprop, grad_cam, input_gradient, rank_correlation

    model, data = trained_digits_cnn(), _digits()
    x, labels = data.x_test[:50], data.y_test[:50]
    other = (labels + 5) % 10
    with GuidedBackprop(model) as gb:
        guided = rank_correlation(gb.saliency(x, labels), gb.saliency(x, other)).mean().item()
    cam = rank_correlation(grad_cam(model, x, "features.6", labels).raw,
                           grad_cam(model, x, "features.6", other).raw).mean().item()
    plain = rank_correlation(input_gradient(model, x, labels), input_gradient(model, x, other)).mean().item()
    kept = sorted(zip((plain, guided, cam), MAP_CHOICES, strict=True), reverse=True)
    return kept[0][1] if kept[0][0] > kept[1][0] + 0.2 else "no single one"


# ----- 05.1: dead channels, found with a forward hook ------------------------------------------------
def _channels(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def _model_with_dead_channels():
    """A digits CNN with dead channels in ``features.1``, a batch, and that layer's output."""
    model = DigitsCNN(seed=1).eval()
    with torch.no_grad():
        model.features[0].bias[[2, 9, 13]] = -50.0  # these channels never get past the ReLU
        model.features[0].bias[12] -= 1.05  # channel 12 gets past it on the bright last image only
        model.features[0].bias[1] -= 0.12  # channel 1 is alive, but its largest value is about 0.05
    blank, bright = torch.zeros(1, 1, 8, 8), torch.full((1, 1, 8, 8), 4.0)
    x = torch.cat([blank, _images(3, n=4), bright])  # more channels are zero on the blank image
    with torch.no_grad():  # channel 15 is alive, but its largest value is about 1e-4: below a 1e-3 threshold
        model.features[0].bias[15] -= model.features[0](x)[:, 15].max() - 1e-4
        model.features[0].weight[4] = 0.0  # channel 4 is 1e-9 everywhere: tiny, alive, caught only by == 0
        model.features[0].bias[4] = 1e-9
    with torch.no_grad():
        out = model.features[:2](x)  # the output of features.1, computed without hooks
    return model, x, out


def _wrong_dead_channels(got, out: torch.Tensor) -> Outcome | None:
    """What is wrong with the channels ``dead_channels`` returned for layer output ``out``, if anything."""
    if got is None:
        return Outcome(False, "dead_channels returned None: return the sorted channel indices")
    if isinstance(got, torch.Tensor) and got.dtype == torch.bool:
        return Outcome(False, "return channel indices, not a mask of which channels are dead")
    if isinstance(got, torch.Tensor):
        return Outcome(False, "you returned a tensor of indices: return a list of ints (add .tolist()). Its "
                              "entries are 0-d tensors, which print as tensor(3), and a set of them keeps "
                              "equal channels apart, so comparing two results goes wrong silently")
    if isinstance(got, set | frozenset):
        return Outcome(False, "you returned a set: return a sorted list of ints, sorted(...), as asked")
    try:
        indices = [int(c) for c in got]
    except (TypeError, ValueError, RuntimeError):
        return Outcome(False, f"return a list of channel indices (ints), got {type(got).__name__}")
    if len(indices) == out.shape[1] and set(indices) <= {0, 1}:
        return Outcome(False, "return channel indices, not a mask of which channels are dead")
    if indices != sorted(indices):
        return Outcome(False, f"got {indices}: return the channels sorted, smallest first (sorted(...))")
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
        small = [c for c in set(got) - set(expected) if 0 <= c < out.shape[1] and out[:, c].abs().max() < 0.5]
        if small and set(expected) <= set(got):
            c = max(small, key=lambda c: float(out[:, c].abs().max()))
            return Outcome(False, f"channel {c} reaches {float(out[:, c].max()):.2g}: small is "
                                  "not dead. Dead means exactly 0 at every position for every image, so compare "
                                  "the output with == 0, not with a threshold")
        return Outcome(False, f"got channels {got}; a dead channel is zero for every image and every position")
    return None


def _signed_case() -> tuple[nn.Module, torch.Tensor]:
    """A convolution (outputs of both signs) then a ReLU, and two images. At the convolution, channel 0 is +1 at one
    position of the first image, -1 there in the second and 0 elsewhere: its mean is exactly 0, yet it is not dead;
    channel 1 is 0 everywhere: dead; channel 2 is -1 everywhere: below 0, not 0, so not dead; channel 3 is 0 at that
    position of the first image and negative everywhere else (-1, and -2 in the second image): its largest value is
    0, yet it is not dead."""
    conv = nn.Conv2d(1, 4, 3, padding=1)
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        conv.weight[0, 0, 1, 1] = 1.0
        conv.bias[2] = -1.0
        conv.weight[3, 0, 1, 1], conv.bias[3] = 1.0, -1.0
    x = torch.zeros(2, 1, 4, 4)
    x[0, 0, 1, 2], x[1, 0, 1, 2] = 1.0, -1.0
    return nn.Sequential(conv, nn.ReLU()), x


def _wrong_on_signed(dead_channels) -> Outcome | None:
    """What is wrong with ``dead_channels`` on layer '0' of ``_signed_case``, a layer whose outputs can be negative."""
    model, x = _signed_case()
    with torch.no_grad():
        out = model[0](x)
    try:
        got = dead_channels(model, "0", x)
    finally:
        left = clear_hooks(model)
    if left:
        return Outcome(False, f"on a convolution, a hook was left registered ({left[0]}): remove it in a finally block")
    try:
        indices = {int(c) for c in got}
    except (TypeError, ValueError, RuntimeError):
        indices = set()
    where = "on a convolution (layer '0' of a small model, before its ReLU), whose outputs can be negative"
    if 0 in indices:
        return Outcome(False, f"{where}, channel 0 averages exactly 0 but is +1 in one image and -1 in the other: a "
                              "mean of 0 is not all zeros (after a ReLU, where nothing is negative, the two agree); "
                              "compare each value with == 0")
    if 2 in indices:
        return Outcome(False, f"{where}, channel 2 is -1 everywhere: below 0 is not 0. Dead means the layer's "
                              "output is exactly 0 at every position for every image, so compare with == 0, not "
                              "<= 0 (after a ReLU the two agree; <= 0 is the test on a ReLU's input, not its output)")
    if 3 in indices:
        return Outcome(False, f"{where}, channel 3's largest value is 0, but everywhere else it is negative (-1 or "
                              "-2): a largest value of 0 is not all zeros (after a ReLU the two agree); dead means "
                              "exactly 0 at every position, so compare each value with == 0, not the max")
    wrong = _wrong_dead_channels(got, out)
    return Outcome(False, f"{where}: {wrong.detail}") if wrong else None


_REPLACED = ("a forward hook's return value replaces the layer's output, and yours changed it: "
             "keep what you need in the hook and return nothing")


def _from_record(hook) -> bool:
    """Whether a forward hook is one that ``hooklab.record`` registered."""
    from ..recording import Recording

    return isinstance(getattr(getattr(hook, "func", None), "__self__", None), Recording)


def _wrong_pass(calls: list) -> Outcome | None:
    """What is wrong with how the model ran, from ``(grad enabled, whole batch, hooked, hooklab.record used)``
    per call (gradients enabled is not wrong, only wasteful: the checker's pass message says so)."""
    if any(call[3] for call in calls):
        return Outcome(False, "you used hooklab.record: this exercise asks for your own forward hook; register "
                              "one with model.get_submodule(layer).register_forward_hook(...) and remove "
                              "it in a finally block")
    if len(calls) != 1:
        return Outcome(False, f"the model ran {len(calls)} times: register a forward hook on the layer and call "
                              "model(x) once")
    _, whole_batch, hooked, _ = calls[0]
    if not whole_batch:
        return Outcome(False, "run the model once on the whole batch x")
    if not hooked:
        return Outcome(False, "no forward hook of yours was on the layer while the model ran: register one on "
                              "model.get_submodule(layer) and read the output there")
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
        recorded = any(_from_record(hook) for hook in module_hooks(layer, "_forward_hooks").values())
        calls.append((torch.is_grad_enabled(), whole, bool(others), recorded))

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
        lambda: dead_channels(model, "features.1", torch.zeros(1, 3, 8, 8)), model  # 3 channels: the model raises
    ) or _wrong_on_signed(dead_channels)
    if wrong:
        return wrong
    expected = _channels((out == 0).flatten(2).all(dim=2).all(dim=0))
    if calls[0][0]:
        return Outcome(True, f"channels {expected} of features.1 are dead; no hook left behind, also when the pass "
                             "raised. One thing to change: the pass ran with gradients enabled, so it built a graph "
                             "for a backward that never comes; the hook only reads, so run it under torch.no_grad()")
    return Outcome(True, f"channels {expected} of features.1 are dead; one pass without gradients; no hook left "
                         "behind, also when the pass raised")


# ----- 05.2: a watch on dying channels ----------------------------------------------------------------
def _dead_count(output: torch.Tensor) -> int:
    """Channels of an ``(N, C, ...)`` output that are zero for every image and every position."""
    return int((output == 0).flatten(2).all(dim=2).all(dim=0).sum())


def _watch_batches() -> list[torch.Tensor]:
    """Three batches: the last one blank, on which more channels of a digits CNN stay off."""
    return [_images(21, n=5), torch.cat([_images(22, n=2), torch.full((1, 1, 8, 8), 4.0)]), torch.zeros(2, 1, 8, 8)]


def _expected_counts(model: nn.Module, layers: list[str], batches: list[torch.Tensor], count=None) -> dict:
    with torch.no_grad():
        outputs = {name: [] for name in layers}
        for x in batches:
            h = x
            for index, module in enumerate(model.features):
                h = module(h)
                if f"features.{index}" in outputs:
                    outputs[f"features.{index}"].append(h)
    return {name: [(count or _dead_count)(out) for out in outs] for name, outs in outputs.items()}


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
        if any(isinstance(v, torch.Tensor) for v in values):
            return (f"counts[{name!r}] holds tensors: append a plain number, int(...) of the count, so the list "
                    "keeps no tensors alive and prints as numbers")
        if values != expected[name]:
            for limit in (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8):
                small = _expected_counts(model, layers, batches, lambda out, t=limit: int(
                    (out.abs() < t).flatten(2).all(dim=2).all(dim=0).sum()))
                if values == small[name]:
                    return (f"counts[{name!r}] is {values}: it counts channels whose outputs are small but not 0 "
                            "(one channel is about 1e-9 everywhere, alive). Dead means exactly 0 at every position "
                            "for every image: compare with == 0, not with a threshold")
            if all(isinstance(v, float) for v in values) and [round(v * channels) for v in values] == expected[name]:
                return "count the dead channels (an int per pass), not their fraction"
            return (f"counts[{name!r}] is {values}, not the number of channels that are zero for every image and "
                    "every position of each batch")
    return None


def _counted_before_the_with_block(watch_class, model: nn.Module, layers: list[str], x: torch.Tensor) -> str | None:
    """Make the watch, run a pass before ``with``: it must count nothing (its hooks go on in ``__enter__``)."""
    try:
        watch = watch_class(model, layers)
        with torch.no_grad():
            model(x)
    finally:
        left = clear_hooks(model)
    counted = {name: n for name, n in (getattr(watch, "counts", None) or {}).items() if n}
    if counted or left:
        return ("your DeadWatch counted a pass that ran before the with block (right after DeadWatch(...)): "
                "register the hooks in __enter__, not in __init__, so it watches only inside the with block")
    return None


def _swallows_the_error(call, model: nn.Module) -> str | None:
    """Run ``call()``, whose with block raises: the error must come out (``__exit__`` returns a false value)."""
    try:
        call()
    except Exception:
        return None
    clear_hooks(model)
    return ("the body of the with block raised, but no error came out of it: your __exit__ returned True, which "
            "swallows the error; let it return None (no return statement), so the error reaches the caller")


def _raising_outcome(call, model: nn.Module) -> Outcome | None:
    """``call()``'s with block raises: the error must come out, and no hook may stay on ``model``."""
    wrong = _swallows_the_error(call, model)
    if not wrong and hooks_left_when_raising(call, model):
        wrong = ("when the body of the with block raised, a hook stayed on the model: __exit__ runs then too, so "
                 "remove the handles there")
    return Outcome(False, wrong) if wrong else None


@exercise("05.2", "a watch that counts dead channels at every step")
def _dead_watch(watch_class) -> Outcome:
    """``DeadWatch(model, layers)`` is a context manager: inside ``with``, each forward pass appends to
    ``counts[name]`` the number of channels of layer ``name``'s output that are zero for every image
    and every position of the batch; its hooks are removed when the block ends, also on error."""
    if not callable(watch_class):
        return Outcome(False, f"pass the class DeadWatch itself, got {type(watch_class).__name__}")
    model, _, _ = _model_with_dead_channels()
    layers, batches = ["features.1", "features.3"], _watch_batches()
    early = _counted_before_the_with_block(watch_class, model, layers, batches[0])
    if early:
        return Outcome(False, early)
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

    wrong = _raising_outcome(raise_inside, model)
    if wrong:
        return wrong
    return Outcome(True, f"dead channels per pass: {expected}; hooks removed, also when the block raised")


# ----- 05.3: guided backpropagation, a class of ReLU hooks --------------------------------------------------
class _GuidedReLUFunction(torch.autograd.Function):
    """Guided backprop's ReLU without hooks: the positive part of the gradient, where the input was positive."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad.clamp(min=0) * (x > 0)


class _DeconvReLUFunction(torch.autograd.Function):
    """The deconvnet's ReLU: the positive part of the gradient from above, wherever the input was."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.clamp(min=0)


class _Applied(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x)


class _Probe(nn.Module):
    """TinyConvNet (two in-place ReLUs, inside a submodule) → Linear → ReLU (a direct child, not in place) →
    Linear: three class scores for ``(N, 1, 8, 8)`` images."""

    def __init__(self) -> None:
        super().__init__()
        self.tiny = TinyConvNet(seed=0, inplace=True)
        with torch.random.fork_rng():
            torch.manual_seed(8)
            self.mix = nn.Linear(36, 12)
            self.relu = nn.ReLU()
            self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.relu(self.mix(self.tiny(x).flatten(1))))


def _probe_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(9)), torch.tensor([0, 2, 1, 2])


def _gradient(model: nn.Module, x: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(x).gather(1, classes[:, None]).sum(), x)
    return grad


def _replaced(model: nn.Module, function, names=None) -> nn.Module:
    """A copy of ``model`` whose ReLUs (those named in ``names``, or all) apply ``function`` instead."""
    copied = copy.deepcopy(model)
    for name, module in list(copied.named_modules()):
        if isinstance(module, nn.ReLU) and (names is None or name in names):
            parent, _, child = name.rpartition(".")
            setattr(copied.get_submodule(parent), child, _Applied(function))
    return copied


def _relu_states(model: nn.Module) -> dict:
    return {name: m.inplace for name, m in model.named_modules() if isinstance(m, nn.ReLU)}


def _hooked_relus(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.ReLU) and module_hooks(m, "_backward_hooks")]


_IN_PLACE_ARGS = ("your hook changed {what} in place (a method ending in _, such as clamp_, or an assignment "
                  "into it){call}: PyTorch's docs say a backward hook should not "
                  "modify its arguments. Leave them as they are and return a new tuple, whose value replaces "
                  "grad_input: return (grad_input[0].clamp(min=0),)")


@contextlib.contextmanager
def _watch_hook_arguments(slips: list):
    """While inside, every full backward hook registered is wrapped: a hook that changes its grad_input or
    grad_output in place (their version counters move) appends the slip's message to ``slips``."""
    register = nn.Module.register_full_backward_hook

    def watched(module, hook, *args, **kwargs):
        def wrapper(mod, grad_input, grad_output):
            before = [[g._version if isinstance(g, torch.Tensor) else None for g in grads]
                      for grads in (grad_input, grad_output)]
            result = hook(mod, grad_input, grad_output)
            named = zip(("grad_input", "grad_output"), (grad_input, grad_output), before, strict=True)
            for what, grads, versions in named:
                if any(isinstance(g, torch.Tensor) and g._version != v for g, v in zip(grads, versions, strict=True)):
                    call = " and returned None" if result is None else ""
                    slips.append(_IN_PLACE_ARGS.format(what=what, call=call))
            return result

        return register(module, wrapper, *args, **kwargs)

    nn.Module.register_full_backward_hook = watched
    try:
        yield
    finally:
        nn.Module.register_full_backward_hook = register


def _enter_and_run(cls, model: nn.Module, x: torch.Tensor, classes: torch.Tensor):
    """Enter the student's class on ``model``, note the hooked ReLUs, return (saliency, hooked names)."""
    guide, slips = cls(model), []
    with _watch_hook_arguments(slips), guide as entered:
        if entered is not guide:
            raise _Wrong("__enter__ must return the object itself (return self), so that "
                         "`with GuidedBackpropagation(model) as gbp:` gives it")
        hooked = _hooked_relus(model)
        if any(getattr(m, "_is_full_backward_hook", True) is False for m in model.modules()):
            raise _Wrong("register_backward_hook is the deprecated module backward hook (lesson 03): use "
                         "register_full_backward_hook")
        got = entered.saliency(x, classes)
    if slips:
        raise _Wrong(slips[0])
    return got, hooked


_INPLACE = ("a ReLU that works in place refuses a full backward hook (its output is a view that PyTorch "
            "protects, lesson 03): in __enter__, set each ReLU's inplace to False before you register its hook, "
            "and give it back in __exit__")


def _after_exit(model: nn.Module, before: dict, when: str) -> str | None:
    """What the block left behind on ``model``: hooks, or a ReLU whose ``inplace`` was not given back."""
    left = clear_hooks(model)
    if left:
        return (f"{when}, a hook stayed on the model ({left[0]}): remove every handle in __exit__ (a Hooked subclass: "
                "append each handle to self.handles, and its __exit__ removes them)")
    changed = [name for name, inplace in _relu_states(model).items() if inplace != before[name]]
    if changed:
        return (f"{when}, ReLU '{changed[0]}' has inplace={not before[changed[0]]}, not {before[changed[0]]} as "
                "before: give each ReLU back the inplace it had, in __exit__ (a Hooked subclass: in undo, which "
                "its __exit__ calls)")
    return None


def _guided_value_hint(got, model: nn.Module, x: torch.Tensor, classes: torch.Tensor, hooked: list) -> str | None:
    if not hooked:
        return ("no full backward hook was on any ReLU inside the with block: in __enter__ register one on each "
                "nn.ReLU of the model")
    relus = list(_relu_states(model))
    if set(hooked) < set(relus):
        missing = sorted(set(relus) - set(hooked))
        return (f"only {hooked} got a hook, not {missing}: model.children() lists the direct children only; "
                "model.modules() walks the whole tree")
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else kind_of(got)
        return f"saliency should return the gradient of the images, of shape {tuple(x.shape)}, got {shape}"
    expected = _gradient(_replaced(model, _GuidedReLUFunction), x, classes)
    if torch.allclose(got, expected, atol=1e-6):
        return None
    if torch.allclose(got, _gradient(model, x, classes), atol=1e-6):
        return ("the gradient is the plain one: your hook must return (grad_input[0].clamp(min=0),), whose value "
                "replaces what the ReLU passes back")
    if torch.allclose(got, _gradient(_replaced(model, _DeconvReLUFunction), x, classes), atol=1e-6):
        return ("that is the deconvnet's rule (the positive part of grad_output, what arrives from above); guided "
                "backprop keeps the positive part of grad_input")
    return f"the guided gradients differ: {compare_tensors(got, expected).detail}"


@exercise("05.3", "guided backpropagation: a backward hook on every ReLU")
def _guided_class(cls) -> Outcome:
    """``GuidedBackpropagation(model)`` is a context manager: inside ``with``, every ``nn.ReLU`` of the model
    (found with ``modules()``) has a full backward hook returning ``(grad_input[0].clamp(min=0),)``, with
    ``inplace`` off; ``__exit__`` removes the hooks and gives each ReLU its ``inplace`` back, also when the
    block raises; ``saliency(images, classes)`` is then the guided gradient."""
    if not callable(cls):
        return Outcome(False, f"pass the class GuidedBackpropagation itself, got {kind_of(cls)}")
    x, classes = _probe_inputs()
    for attempt in ("run", "raise", "twice"):
        model = _Probe().eval()
        before = _relu_states(model)
        try:
            if attempt == "run":
                got, hooked = _enter_and_run(cls, model, x.clone(), classes)
            elif attempt == "raise":
                with cls(model):
                    model(torch.zeros(1, 3, 8, 8))  # the first convolution refuses three channels
            else:
                guide = cls(model)
                with guide:
                    pass
                with guide:
                    got = guide.saliency(x.clone(), classes)
        except _Wrong as wrong:
            clear_hooks(model)
            return Outcome(False, str(wrong))
        except RuntimeError as error:
            clear_hooks(model)
            if "modified inplace" in str(error):
                return Outcome(False, _INPLACE)
            if "invalid number of grad_input" in str(error):
                return Outcome(False, "your hook returned a tensor, and PyTorch read it as a sequence of its rows "
                                      "(hence 'got 4, but expected 1'): a full backward hook returns a tuple like "
                                      "grad_input, one entry per input: (grad_input[0].clamp(min=0),)")
            if attempt != "raise":
                raise
        when = {"run": "after the with block", "raise": "when the body of the with block raised",
                "twice": "after a second with block on the same object"}[attempt]
        problem = _after_exit(model, before, when)
        if problem:
            return Outcome(False, problem)
        if attempt == "run":
            problem = _guided_value_hint(got, model, x, classes, hooked) or _grads_untouched(model)
            if problem:
                return Outcome(False, problem)
        if attempt == "twice" and not torch.allclose(got, _gradient(_replaced(model, _GuidedReLUFunction), x,
                                                                     classes), atol=1e-6):
            return Outcome(False, "used in a second with block, the same object no longer gives guided gradients: "
                                  "start each block from empty lists of handles")
    return Outcome(True, "guided gradients match on a model with in-place ReLUs nested in a submodule; hooks "
                         "removed and inplace given back, also when the block raised and on a second use")


# ----- 05.4: the Grad-CAM recorder ---------------------------------------------------------------------
def _inplace_net() -> nn.Module:
    """conv → ReLU(inplace) → conv → ReLU(inplace) → pool → Linear: the layer "2" is overwritten in place."""
    with torch.random.fork_rng():
        torch.manual_seed(12)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 5, 3, padding=1),
                             nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3)).eval()


def _two_convs() -> nn.Module:
    """conv → conv → ReLU → pool → Linear: the output of layer "0" has both signs, and so has its gradient
    (no ReLU right after it zeroes the gradient where the activation is negative)."""
    with torch.random.fork_rng():
        torch.manual_seed(15)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3)).eval()


def _gradients(activation: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor) -> dict:
    """The gradient w.r.t. ``activation`` of the given classes' scores, and of two wrong scores."""
    wanted = {"gradient": scores.gather(1, classes[:, None]).sum(),
              "predicted": scores.gather(1, scores.argmax(dim=1, keepdim=True)).sum(), "all": scores.sum()}
    return {key: torch.autograd.grad(score, activation, retain_graph=True)[0] for key, score in wanted.items()}


def _recorder_cases() -> list[dict]:
    """Three cases: a model, a layer, images and classes; the layer's output and the gradients of
    ``_gradients``, computed without hooks and without in-place operations."""
    digits_cnn = DigitsCNN(seed=6).eval()
    x, classes = _images(30, n=4), torch.tensor([1, 7, 3, 3])
    activation = digits_cnn.features[:6](x).detach().requires_grad_(True)
    scores = digits_cnn.head(digits_cnn.features[6](activation))
    first = {"model": digits_cnn, "layer": "features.5", "x": x, "classes": classes, "activation": activation.detach(),
             **_gradients(activation, scores, classes)}
    net = _inplace_net()
    x, classes = torch.randn(3, 1, 6, 6, generator=torch.Generator().manual_seed(13)), torch.tensor([2, 0, 2])
    activation = net[2](net[0](x).relu()).detach().requires_grad_(True)
    scores = net[6](net[5](net[4](activation.relu())))
    after_relu = activation.detach().relu().requires_grad_(True)  # what the kept output tensor becomes
    (past_relu,) = torch.autograd.grad(net[6](net[5](net[4](after_relu))).gather(1, classes[:, None]).sum(), after_relu)
    second = {"model": net, "layer": "2", "x": x, "classes": classes, "activation": activation.detach(),
              "past_relu": past_relu, **_gradients(activation, scores, classes)}
    net = _two_convs()
    x, classes = torch.randn(2, 1, 5, 5, generator=torch.Generator().manual_seed(14)), torch.tensor([1, 2])
    activation = net[0](x).detach().requires_grad_(True)
    scores = net[5](net[4](net[3](net[2](net[1](activation)))))
    third = {"model": net, "layer": "0", "x": x, "classes": classes, "activation": activation.detach(),
             **_gradients(activation, scores, classes)}
    return [first, second, third]


_ERRORS = {
    "One of the differentiated Tensors does not require grad": "torch.autograd.grad was asked for the gradient "
        "with respect to a tensor that does not require grad (the images given do not): run the model on a copy, "
        "x = images.detach().clone().requires_grad_(), and differentiate with respect to x",
    "modified inplace": "a full backward hook fails where an in-place ReLU follows the layer (lesson 03): from the "
                        "forward hook, register a tensor hook on the output instead",
    "does not require grad": "register_hook needs a tensor that requires grad: run the pass with gradients enabled "
                             "(not under torch.no_grad())",
    "doesn't require grad": "register_hook needs a tensor that requires grad: run the pass with gradients enabled "
                            "(not under torch.no_grad())",
}


@contextlib.contextmanager
def _tensor_hooks_seen():
    """While inside: the shapes of the tensors that ``Tensor.register_hook`` is called on (the checker's own
    probe on the model's input included), so that 05.4 can see the tensor hook its contract asks for."""
    shapes, original = [], torch.Tensor.register_hook

    def register_hook(self, hook):
        shapes.append(tuple(self.shape))
        return original(self, hook)

    torch.Tensor.register_hook = register_hook
    try:
        yield shapes
    finally:
        torch.Tensor.register_hook = original


def _call_recorder(answer, model, layer, x, classes):
    """The answer's result, or a hint for an error a hook of the wrong kind causes, or for a gradient taken
    with respect to something other than the images the model ran on."""
    reached = []

    def watch_input(module, args):  # the checker's own probe: did a gradient reach the model's input?
        if isinstance(args[0], torch.Tensor) and args[0].requires_grad:
            args[0].register_hook(lambda grad: reached.append(True))

    probe = model.register_forward_pre_hook(watch_input)
    try:
        got = answer(model, layer, x, classes)
    except RuntimeError as error:
        clear_hooks(model)
        hint = next((text for part, text in _ERRORS.items() if part in str(error)), None)
        if hint is None:
            raise
        return None, hint
    except (KeyError, IndexError) as error:  # the gradient kept by the tensor hook was never written
        clear_hooks(model)
        if reached:
            raise
        return None, (f"your code raised {type(error).__name__}: {error}: your tensor hook never ran, because no "
                      "gradient passed the layer's output on its way down. Differentiating with respect to the kept "
                      "output (torch.autograd.grad(total, out)) stops at that tensor, and where an in-place ReLU "
                      "follows the layer, that tensor is the ReLU's result, past your hook. Run the model on a copy, "
                      "x = images.detach().clone().requires_grad_(), and differentiate with respect to x")
    finally:
        probe.remove()
    if not reached:
        return got, ("no gradient reached the images you ran through the model: take torch.autograd.grad with "
                     "respect to x, the copy x = images.detach().clone().requires_grad_() (not a weight), so the "
                     "gradient flows all the way down and passes the layer on the way")
    return got, None


def _case_problem(model, x, before_x, where: str) -> str | None:
    left = clear_hooks(model)
    if left:
        return f"{where}: a hook stayed on the model ({left[0]}): remove your forward hook in a finally block"
    if not torch.equal(x, before_x):
        return f"{where}: your function changed the images it was given: work on a copy"
    if x.requires_grad or x.grad is not None:
        return (f"{where}: your function switched on requires_grad of the caller's images (images.requires_grad_()), "
                "which changes the caller's tensor: work on a copy, x = images.detach().clone().requires_grad_()")
    return _grads_kept(model, wrt="x) for a copy x = images.detach().clone().requires_grad_(")


def _pair_problem(got, case: dict, where: str) -> str | None:
    if not isinstance(got, tuple | list) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        return f"{where}: return (activation, gradient), two tensors, got {kind_of(got)}"
    act, grad = got
    for name, value in (("activation", act), ("gradient", grad)):
        if value.shape != case[name].shape:
            return (f"{where}: the {name} has shape {tuple(value.shape)}, expected {tuple(case[name].shape)}, "
                    "the shape of the layer's output")
        if value.requires_grad:
            return (f"{where}: return detached copies (.detach().clone()): the {name} you returned is still "
                    "attached to the graph, and keeps it alive")
    kept_tensor = "past_relu" in case and torch.allclose(grad, case["past_relu"], atol=1e-6)
    if kept_tensor:
        return (f"{where}: you took the gradient of the output tensor itself (its .grad after retain_grad(), or "
                "torch.autograd.grad with respect to it): the in-place ReLU after the layer made that tensor the "
                "ReLU's result, so its gradient is the one leaving the ReLU, not the one reaching the layer's output. "
                "Inside the forward hook, register a tensor hook on output: it receives the gradient of the layer's "
                "output as it was when you registered it (lesson 03)")
    if not torch.allclose(act, case["activation"], atol=1e-6):
        if torch.allclose(act, case["activation"].relu(), atol=1e-6):
            return (f"{where}: the activation you kept was overwritten by the in-place ReLU after the layer: you "
                    "kept output, or a view that shares its memory (output.detach(); output.cpu().detach() too, "
                    "since on the CPU .cpu() returns the tensor itself), and the ReLU wrote over it after your hook "
                    "ran. Keep a copy with memory of its own, output.detach().clone(), made inside the forward "
                    "hook (lesson 02)")
        return f"{where}: the activation is not the layer's output: {compare_tensors(act, case['activation']).detail}"
    if not torch.allclose(grad, case["gradient"], atol=1e-6):
        if torch.allclose(grad, case["predicted"], atol=1e-6):
            return f"{where}: that is the gradient of each image's predicted class: use the classes you were given"
        if torch.allclose(grad, case["all"], atol=1e-6):
            return (f"{where}: that is the gradient of the sum of all scores: take each image's own class score, "
                    "scores.gather(1, classes[:, None]).sum()")
        return f"{where}: the gradient differs: {compare_tensors(grad, case['gradient']).detail}"
    return None


@exercise("05.4", "the Grad-CAM recorder: a tensor hook from a forward hook")
def _recorder(answer) -> Outcome:
    """``activation_and_gradient(model, layer, images, classes)`` returns detached copies of the layer's output
    and of the gradient of ``sum_n score[n, classes[n]]`` with respect to it, recorded by a forward hook that
    registers a tensor hook on the output; it works where an in-place ReLU follows the layer, removes its
    hook (also when the pass raises), and leaves the images and the parameters' ``.grad`` as they were."""
    late = no_tensor_hook = None
    for case in _recorder_cases():
        model, layer, x, classes = case["model"], case["layer"], case["x"], case["classes"]
        where = f"at layer '{layer}' of a {type(model).__name__}"
        before_x = x.clone()
        _seed_grads(model)
        with _tensor_hooks_seen() as shapes:
            got, hint = _call_recorder(answer, model, layer, x, classes)
        if got is not None and hint:  # a gradient taken with respect to another tensor: named after the rest
            late = late or f"{where}: {hint}"
        problem = (got is None and hint and f"{where}: {hint}") or _case_problem(model, x, before_x, where) or \
            _pair_problem(got, case, where)
        if not problem and tuple(case["activation"].shape) not in shapes:  # named once every case is right
            no_tensor_hook = no_tensor_hook or (
                f"{where}: the numbers are right, but no tensor hook was registered on the layer's output. "
                "Contract item 1: inside the forward hook, call output.register_hook(...) to catch the gradient "
                "as it passes. Returning a copy of the output from the forward hook (or taking the gradient with "
                "respect to the kept output) changes what the layers above receive, and works only while nothing "
                "else replaces or overwrites that output")
        if problem:
            clear_hooks(model)
            return Outcome(False, problem)
        wrong = hooks_left_when_raising(
            lambda model=model, layer=layer, classes=classes: answer(model, layer, torch.zeros(1, 3, 8, 8),
                                                                     classes[:1]), model)
        if wrong:
            return wrong
    if late or no_tensor_hook:
        return Outcome(False, late or no_tensor_hook)
    return Outcome(True, "activations and gradients match at a DigitsCNN's features.5, at a layer an in-place "
                         "ReLU overwrites and at one whose activation and gradient have both signs; no hook left, "
                         "also when the pass raised; the parameters' .grad as they were")




# ----- 05.5: layers re-drawn by forward hooks, graded on what the layers compute -------------------------
_REDRAWN = ["head.2", "features.5"]


def _redrawn_model() -> nn.Module:
    return DigitsCNN(seed=4).eval()


def _linear_inside(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias the Linear ``layer`` computes with, hooks included (calling it runs its hooks)."""
    with torch.no_grad():
        zero = layer(torch.zeros(1, layer.in_features))[0]
        columns = layer(torch.eye(layer.in_features)) - zero
    return columns.T, zero


def _gradient_flows(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether a backward pass from the model's scores reaches the images, finite and not all zero."""
    images = x.clone().requires_grad_()
    with torch.enable_grad():
        scores = model(images)
        if not scores.requires_grad:
            return False
        (grad,) = torch.autograd.grad(scores.sum(), images, allow_unused=True)
    return grad is not None and bool(torch.isfinite(grad).all()) and bool((grad != 0).any())


def _redrawn_problem(cls, model: nn.Module, before: dict, x: torch.Tensor, plain: dict) -> str | None:
    """Run ``cls(model, names)`` once and say what is wrong with what the named layers compute inside it."""
    outputs, probes = {}, []
    layers = {name: model.get_submodule(name) for name in _REDRAWN}
    try:
        redrawn = cls(model, list(_REDRAWN))
        with redrawn as entered:
            if entered is not redrawn:
                return ("__enter__ must return the object itself (return self), so that `with Redrawn(...) as r:` "
                        "gives it, as every context manager of this lesson does")
            for name, layer in layers.items():
                if model.get_submodule(name) is not layer:
                    return (f"inside the with block, '{name}' is another module: you put a new layer in the model. "
                            "Leave the model's layers in place and register a forward hook on each named layer "
                            "that returns fresh(*args)")
            changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
            if changed:  # an answer that re-draws the model's own layers, and puts them back in undo/__exit__
                return (f"you changed the model's own layer inside the block: '{changed[0]}' is not the trained "
                        "one there. Leave the model's parameters as they are, re-draw a copy of each layer "
                        "(copy.deepcopy, then its reset_parameters()) and let the hook return fresh(*args)")
            unhooked = [name for name, layer in layers.items() if not layer._forward_hooks]
            flows = bool(unhooked) or _gradient_flows(model, x)  # backward to the images: finite, not all zero
            own = {}  # what each named layer's own forward gives, next to what its hooks made of it
            probes = [model.get_submodule(n).register_forward_hook(  # after the answer's hooks: the replaced outputs
                lambda m, a, out, n=n: outputs.setdefault(n, []).append(out.detach())) for n in plain]
            probes += [layer.register_forward_hook(  # returns None: leaves the output as it is
                lambda m, a, out, n=n: None if n in own else own.update({n: (m.forward(*a), out.detach())}))
                for n, layer in layers.items()]
            with torch.no_grad():
                model(x), model(x)
            weight, _ = _linear_inside(model.get_submodule("head.2"))
    finally:
        for p in probes:
            p.remove()
    if any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
        return ("the model's own parameters changed: re-draw a copy of each layer (copy.deepcopy, then its "
                "reset_parameters()) and let the hook run the copy; the model must stay as it was")
    if unhooked:
        return (f"inside the with block, no forward hook is registered on '{unhooked[0]}': register one on each "
                "named layer, returning fresh(*args)")
    for name in plain:
        first, second = outputs[name][0], outputs[name][1]
        if not torch.allclose(first[0], first[-1], atol=1e-6):  # the batch's last image is its first again
            return (f"inside the with block, '{name}' gave two copies of one image different outputs: the hook must "
                    "compute from the layer's input, fresh(*args), not return random numbers")
        if not torch.equal(first, second):
            return (f"two passes in the same with block gave '{name}' different outputs: draw each fresh copy once, "
                    "in attach, not inside the hook at every pass")
        if name in _REDRAWN and torch.allclose(first, plain[name]):
            return (f"inside the with block, '{name}' still computes what the trained layer computes: the hook's "
                    "return value must be the re-drawn copy's output, fresh(*args)")
        if name in ("features.0", "features.2") and not torch.allclose(first, plain[name], atol=1e-5):
            return f"'{name}' was not named, but its output changed: re-draw only the named layers"
    for name, (computed, returned) in own.items():
        if torch.equal(computed, returned):
            return (f"inside the with block, the hook on '{name}' gives back the layer's own output: it must "
                    "return fresh(*args), the re-drawn copy's output for the layer's input, not its output o")
    if not flows:
        return ("inside the with block no gradient flows back through the re-drawn layers to the images: your "
                "hook returns fresh(*args) cut off from autograd (.detach(), or computed under torch.no_grad()), so "
                "section 5's saliency maps cannot be computed with it. Return fresh(*args) as it is")
    trained = model.get_submodule("head.2")
    bound = 1 / trained.in_features ** 0.5
    spread = weight.std().item() / (bound / 3**0.5)  # a uniform draw in ±bound: 1
    if torch.allclose(weight, trained.weight.detach()):
        return ("inside the with block, 'head.2' still computes with the trained weights: the hook should return "
                "fresh(*args), where fresh is a copy of the layer re-drawn by reset_parameters()")
    if weight.abs().max() > bound * (1 + 1e-4) or not 0.8 < spread < 1.2:
        return ("inside the with block, 'head.2' does not compute like a copy re-drawn by its reset_parameters() "
                "(the layer's own init, uniform within ±1/√in_features): re-draw the copy with reset_parameters(), "
                "not normal_(...) or a draw of your own, and return fresh(*args), not a changed output")
    return None


_LATE_FRESH = ("Each name alone runs, so the hooks mix up their copies: a hook defined inside the loop looks fresh "
               "up when it runs, after the loop, so every hook runs the last copy (a layer of another shape); give "
               "each hook its own copy (a function that makes the hook, or a default argument fresh=fresh)")


def _each_name_alone_runs(cls, model: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``cls(model, [name])`` runs a pass for each name of ``_REDRAWN`` on its own (the late-binding test)."""
    try:
        for name in _REDRAWN:
            with cls(model, [name]), torch.no_grad():
                model(x)
        return True
    except Exception:
        return False
    finally:
        clear_hooks(model)


@exercise("05.5", "layers re-drawn by forward hooks that run a fresh copy")
def _redrawn(cls) -> Outcome:
    """``with Redrawn(model, names):`` every named layer computes with freshly drawn weights (a forward hook
    returns a re-drawn copy's output for the layer's input); the model's parameters never change, and the
    hooks are gone after the block, also when it raises. Graded on what the layers compute."""
    if not callable(cls):
        return Outcome(False, "pass the class Redrawn itself, not an instance: check(\"05.5\", Redrawn)")
    model, x = _redrawn_model(), _images(11, 6)
    x = torch.cat([x, x[:1]])  # the first image twice: a replacement made from the input gives both one output
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = ["features.0", "features.2", "features.5", "features.6", "head.2"]
    plain = {}
    with Hooks() as hooks, torch.no_grad():
        for n in names:
            hooks.add(model.get_submodule(n).register_forward_hook(lambda m, a, out, n=n: plain.update({n: out})))
        expected = model(x)
    try:
        problem = _redrawn_problem(cls, model, before, x, plain)
    except NotImplementedError:
        clear_hooks(model)
        raise
    except RecursionError:
        clear_hooks(model)
        return Outcome(False, "RecursionError: a copy.deepcopy of a layer copies its hooks too, so a copy made inside "
                              "the hook (or after registering it) runs the hook again, which copies again: make each "
                              "fresh copy in attach, before registering the hook")
    except Exception as e:
        clear_hooks(model)
        late = " " + _LATE_FRESH if _each_name_alone_runs(cls, model, x) else ""
        return Outcome(False, f"running `with Redrawn(model, {_REDRAWN}):` raised {type(e).__name__}: {e}.{late}")
    if problem:
        clear_hooks(model)
        return Outcome(False, problem)
    left = clear_hooks(model)
    if left:
        return Outcome(False, f"after the with block a hook is still registered ({left[0]}): remove every handle "
                              "in __exit__ (a Hooked subclass: append each handle to self.handles)")
    with torch.no_grad():
        if not torch.allclose(model(x), expected):
            return Outcome(False, "after the with block the model computes something else: it must be as it was")

    def raising():
        with cls(model, list(_REDRAWN)):
            raise RuntimeError("a pass that fails inside the block")

    wrong = _raising_outcome(raising, model)
    if wrong:
        return wrong
    return Outcome(True, f"inside the block {', '.join(_REDRAWN)} compute with freshly drawn weights (drawn once), "
                         "the other layers as trained; the model's parameters untouched, no hook left, also when "
                         "the block raised")


# ----- the base class of 05.3 and 05.5: the student's DeadWatch (05.2), generalised ---------------------------
class Hooked:
    """``with Sub(model, names) as s:``: hooks on the model inside the block only. A subclass's ``attach`` registers
    them (``__enter__`` calls it) and keeps each handle in ``self.handles``; ``__exit__`` removes them all, also
    when the block raises (the error goes on), then calls ``undo`` to give back whatever ``attach`` changed."""

    def __init__(self, model: nn.Module, names=()) -> None:
        self.model, self.names, self.handles = model, list(names), []

    def __enter__(self):
        self.handles = []
        try:
            self.attach()
        except BaseException:  # a hook already registered must not stay when attach fails half-way
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            while self.handles:
                self.handles.pop().remove()
        finally:
            self.undo()

    def attach(self) -> None:
        """Register the hooks; append each handle to ``self.handles``."""
        raise NotImplementedError

    def undo(self) -> None:
        """Give back what ``attach`` changed besides the hooks (nothing, unless a subclass says otherwise)."""


# ----- worked answer and bookkeeping the lesson uses -------------------------------------------------------
def worked_recorder(model: nn.Module, layer: str, images: torch.Tensor, classes: torch.Tensor):
    """Exercise 05.4's worked answer, used in the lesson until the student's passes: the layer's output and the
    gradient of ``sum_n score[n, classes[n]]`` at it, both detached, kept by a forward hook that registers a
    tensor hook on the output."""
    kept = {}

    def forward_hook(module, args, output):
        kept["activation"] = output.detach().clone()
        output.register_hook(lambda grad: kept.update(gradient=grad.detach().clone()))

    handle = model.get_submodule(layer).register_forward_hook(forward_hook)
    try:
        x = images.detach().clone().requires_grad_(True)
        torch.autograd.grad(model(x).gather(1, classes[:, None]).sum(), x)
    finally:
        handle.remove()
    return kept["activation"], kept["gradient"]


def pixels_under(cells: torch.Tensor, grid: int = 4, size: int = 2) -> torch.Tensor:
    """The deletion test's bookkeeping: ``cells`` (N, k), indices into each map's ``grid × grid`` cells (row by
    row), to an (N, 1, grid·size, grid·size) boolean mask, True on the ``size × size`` pixels under each cell."""
    picked = torch.zeros(len(cells), grid * grid).scatter_(1, cells, 1.0).reshape(-1, 1, grid, grid)
    return picked.repeat_interleave(size, 2).repeat_interleave(size, 3).bool()


def random_orders(n: int, seed: int, cells: int = 16) -> torch.Tensor:
    """(n, cells): a random order of the cells for each of n maps, from a generator seeded with ``seed``."""
    return torch.rand(n, cells, generator=torch.Generator().manual_seed(seed)).argsort(dim=1)


# ----- section 2's longer runs: twelve epochs and more, too long for the lesson -------------------------------
SLOW_RUNS = {
    (5e-3, 12): {0: (24, 0.973), 1: (21, 0.984), 2: (17, 0.978), 3: (17, 0.982), 4: (22, 0.96), 5: (9, 0.976)},
    (1e-3, 12): {0: (1, 0.896), 1: (2, 0.907)},
    (1e-3, 48): {0: (1, 0.967), 1: (2, 0.967)},
}
"""(lr, epochs) → seed → (channels of features.3 dead on all 1,347 training digits, test accuracy) after
``slow_run(seed, lr, epochs)``, measured on torch 2.14.1 and stored: long runs turn last-bit differences between
CPUs into other networks, so another machine may find a channel or a percent more or less
(tests/test_exercises_nb05.py re-runs three of them). (5e-3, 12) with seed 0 is ``trained_digits_cnn``, the lesson's
``model``: its stored entry is the shipped weights' (24 dead, 0.973); re-run on this CPU it gives 24 and 0.976."""


def slow_run(seed: int, lr: float = 1e-3, epochs: int = 12) -> tuple[int, float]:
    """Lesson 02's digits CNN from ``DigitsCNN(seed=seed)``, trained with Adam like ``trained_digits_cnn`` but for
    ``epochs`` epochs at ``lr``: its dead channels at features.3 and its test accuracy (3 digits)."""
    from ..models import accuracy, train_digits
    from ..saliency import dead_channels

    data = _digits()
    net = train_digits(DigitsCNN(seed=seed), data, epochs=epochs, lr=lr, progress=False)
    return len(dead_channels(net, "features.3", data.x_train)), round(accuracy(net, data.x_test, data.y_test), 3)
