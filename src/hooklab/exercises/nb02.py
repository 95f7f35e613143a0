"""Predictions and exercises of notebook 02: module forward hooks.

The lesson's problem is a digits CNN whose weights are drawn with std 0.01: its loss does not
move. The predictions recompute what the lesson shows (``_fresh`` is the lesson's ``fresh``); the
exercises are the hooks of each section: one hook per layer (02.1), a hook that changes weights (02.2),
statistics kept at every training step (02.3), and the student's recorder grown to one record per
call, its inputs copied before in-place layers run (02.4).

At the end, the worked answers the lesson falls back on while a student's own has not passed
(``output_stds``, ``rescale_to_unit_std``, ``StepStats``, ``CallRecorder``).
"""

from __future__ import annotations

import copy
import functools
import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..audit import clear_hooks
from ..pytorch_internals import MODULE_HOOK_DICTS, module_hooks
from . import Outcome, compare_tensors, exercise, kind_of, prediction

# ----- what the messages say about hooks left behind -------------------------------------------------
_KINDS = dict(zip(MODULE_HOOK_DICTS, ("forward pre-hook", "forward hook", "backward pre-hook", "backward hook",
                                      "state-dict hook", "state-dict hook", "load-state-dict hook",
                                      "load-state-dict hook"), strict=True))


def left_on(model: nn.Module) -> list[str]:
    """Every module hook left on ``model`` or its submodules, in a student's words ("a forward hook is
    still registered on layer '0'"); then every one of them is dropped."""
    found = []
    for name, module in model.named_modules():
        where = f"layer {name!r}" if name else "the model itself"
        for kind in MODULE_HOOK_DICTS:
            count = len(module_hooks(module, kind))
            if count:
                what = f"a {_KINDS[kind]} is" if count == 1 else f"{count} {_KINDS[kind]}s are"
                found.append(f"{what} still registered on {where}")
    clear_hooks(model)
    return found


def left_when_raising(call, model: nn.Module) -> Outcome | None:
    """Run ``call()``, which makes the answer run a forward pass that raises; fail if a hook then stays
    on ``model`` (it is dropped): hooks are removed in a ``finally`` block."""
    try:
        call()
    except Exception:  # expected: the point is what the answer leaves behind
        pass
    left = left_on(model)
    if left:
        return Outcome(False, f"when the forward pass raised, {left[0]}: remove hooks in a `finally:` block")
    return None


LATE_BINDING = ("a function made in a loop looks up the loop variable when it runs, after the loop has ended; "
                "pin each hook's own name with a default argument: lambda module, args, output, name=name: ...")
POPULATION = "the population std (unbiased=False, dividing by n); use .std(), which divides by n − 1"
RETURNED = ("which replaced the layer's {what} (a value a hook returns takes its place); a hook that only "
            "looks returns None")


# ----- hooks that return a value -------------------------------------------------------------------
class _Replacements:
    """The checker's own hooks around the answer's: on every module, one pre-hook and one forward hook
    put first (``prepend=True``) and one of each registered after the answer's. They note each module
    whose inputs or output the answer's hooks replaced by returning a value."""

    def __init__(self, model: nn.Module) -> None:
        self.found: list[tuple[str, str, object]] = []  # (layer, "inputs" or "output", the value returned)
        self.handles = []
        for name, module in model.named_modules():
            seen = {}
            self.handles += [
                module.register_forward_pre_hook(functools.partial(self._first, seen, "inputs"), prepend=True),
                module.register_forward_pre_hook(functools.partial(self._last, seen, "inputs", name)),
                module.register_forward_hook(functools.partial(self._first, seen, "output"), prepend=True),
                module.register_forward_hook(functools.partial(self._last, seen, "output", name)),
            ]

    @staticmethod
    def _first(seen, what, module, args, *output):
        seen[what] = output[0] if output else args

    def _last(self, seen, what, name, module, args, *output):
        now = output[0] if output else args
        if now is not seen.get(what) and not any(layer == name and kind == what for layer, kind, _ in self.found):
            self.found.append((name, what, now[0] if what == "inputs" and len(now) == 1 else now))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def outcome(self) -> Outcome:
        name, what, value = self.found[0]
        hook = "pre-hook" if what == "inputs" else "hook"
        shown = f"the tuple {kind_of(value)}" if isinstance(value, tuple) else f"a {kind_of(value)}"
        return Outcome(False, f"your {hook} on layer {name!r} returned a value, {shown}, "
                              + RETURNED.format(what=what))


_NOT_A_TENSOR = re.compile(r"must be Tensor, not (\w+)|arguments - got \((\w+),|'(\w+)' object has no attribute")


def _returned_hint(error: Exception) -> Outcome | None:
    """A failed Outcome when ``error`` is a layer refusing a value that is not a tensor, which is what a
    forward hook returning, say, a tuple makes happen downstream; else None."""
    match = _NOT_A_TENSOR.search(str(error)) if isinstance(error, TypeError | AttributeError) else None
    kind = next((group for group in match.groups() if group), None) if match else None
    if kind not in {"tuple", "list", "dict", "float", "int", "str", "bool"}:
        return None
    return Outcome(False, f"a layer received a {kind} where a tensor belongs: your hook returned a value, "
                          + RETURNED.format(what="output"))


# ----- the lesson's network and training loop ------------------------------------------------------
@functools.cache
def _digits():
    from ..data import digits

    return digits()


def _fresh(std: float | None = 0.01) -> nn.Module:
    """The lesson's ``fresh``: a digits CNN, weights normal with ``std`` (None: He init), biases 0."""
    from ..models import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                m.weight.normal_(0, std or (2 / m.weight[0].numel()) ** 0.5)
                m.bias.zero_()
    return model


def _naming(model_map: str):
    """A failure that quotes a layer of the check's model also shows that model, which the student never sees."""

    def wrap(checker):
        @functools.wraps(checker)
        def named(answer) -> Outcome:
            outcome = checker(answer)
            if outcome.passed or "'" not in outcome.detail:
                return outcome
            return Outcome(False, f"{outcome.detail}\n(the check's model: {model_map})")

        return named

    return wrap


# ----- the predictions -----------------------------------------------------------------------------
WEIGHTED = ("features.0", "features.2", "features.5", "head.2")


def _shrink_factors() -> dict[str, float]:
    """How many times each layer with weights of the std-0.01 network makes its output's std smaller than its
    input's root mean square (the lesson's table)."""
    model, factors, handles = _fresh(0.01), {}, []
    for name in WEIGHTED:
        handles.append(model.get_submodule(name).register_forward_hook(
            lambda module, args, output, name=name: factors.__setitem__(
                name, (args[0].pow(2).mean().sqrt() / output.std()).item())))
    try:
        with torch.no_grad():
            model(_digits().x_train[:256])
    finally:
        for handle in handles:
            handle.remove()
    return factors


@prediction("02.a", "how many times features.2 divides the spread of its input",
            why="features.2 is Conv2d(16, 32, 3): each output adds up fan_in = 16 channels × 3×3 = 144 products, so "
                "its output std ≈ 0.01·√144 = 0.12 × its input's RMS: the rule divides by 1 / 0.12 = 8.3, and the "
                "table measures 8.4. The check accepts 10 % either side of the measured 8.4",
            wrong=[(0.12, "0.01·√144 = 0.12 is what the layer multiplies the spread by; it divides it by 1 / 0.12"),
                   (25.0, "fan_in counts every input an output adds up, m.weight[0].numel(): 16 channels × 3×3 "
                          "pixels = 144, not 16"),
                   (5.9, "if you counted 32 × 3×3 = 288 inputs: 32 is the number of output channels; each "
                         "output adds up 16 channels × 3×3 = 144 inputs, so the rule gives 1 / (0.01·√144) = 8.3"),
                   (0.69, "the rule has the square root: 0.01·√144 = 0.12, so the spread is divided by 8.3"),
                   (12.0, "√144 = 12 is how many times larger the spread of a sum of 144 products is than one "
                          "product's; each product is already 0.01 times its input, so the layer multiplies the "
                          "spread by 0.01·12 = 0.12: it divides it by 8.3"),
                   (100.0, "a sum of 144 products has √144 = 12 times the spread of one product: the layer "
                           "divides by 1 / (0.01·12) = 8.3, not by 1 / 0.01")],
            rel=0.1)
def _features2_divisor() -> float:
    """The divisor the lesson's table measures for features.2, 8.38 (the rule says 8.33); ``rel`` = 10 % of it
    accepts 7.6 to 9.2 (7.3 and 9.5 fail)."""
    return round(_shrink_factors()["features.2"], 2)


def _doubled_layer() -> nn.Linear:
    layer = nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.fill_(3.0)
        layer.bias.fill_(1.0)
    return layer


@prediction("02.b", "what a doubled input and a doubled output make",
            why="the pre-hook's return value replaces the input (x becomes 2), forward computes 3·2 + 1 = 7, and "
                "the forward hook's return value replaces the output: 14",
            wrong=[(8.0, "the pre-hook ran too: forward received 2·x, not x"),
                   (7.0, "the forward hook's return value replaces the output: it is doubled"),
                   (16.0, "the pre-hook doubles only the input, before the bias is added: 2·(3·2 + 1)")])
def _doubled() -> float:
    layer = _doubled_layer()
    with torch.no_grad():
        pre = layer.register_forward_pre_hook(lambda module, args: 2 * args[0])
        post = layer.register_forward_hook(lambda module, args, output: 2 * output)
        try:
            return layer(torch.ones(1)).item()
        finally:
            pre.remove()
            post.remove()


def _bias_over_weight() -> float:
    """The std-0.01 network's first backward on 64 digits: std of features.5's bias gradient over that of its
    weight gradient (the lesson prints it)."""
    data, model = _digits(), _fresh(0.01)
    F.cross_entropy(model(data.x_train[:64]), data.y_train[:64]).backward()
    conv = model.features[5]
    return (conv.bias.grad.std() / conv.weight.grad.std()).item()


def _a_power_of_ten(guess) -> str | None:
    """The form 02.c asks for: log10 of the factor, a number between -10 and 10."""
    if isinstance(guess, int | float) and not isinstance(guess, bool) and abs(guess) >= 10:
        return "write the power of ten, log10 of the factor: 2 for a factor of 100, not 100"
    return None


@prediction("02.c", "by what power of ten features.5's bias gradient exceeds its weight gradient",
            why="dL/db adds up dL/dy over every image and position; dL/dw adds up the same terms, each multiplied "
                "by the layer's input, here of size about 10⁻³ (features.4's output: RMS 1.1e-03, std 8.9e-04). "
                "So the bias gradient is about 1 / 10⁻³ = 10³ times the weight's: measured 1.3·10³, log10 3.1; "
                "the check accepts half a decade either way",
            wrong=[(0.0, "they would be the same size only if the inputs were of size 1: dL/dw multiplies each "
                         "term of dL/db by an input of size about 10⁻³"),
                   (-3.0, "the other way round: dL/dw multiplies each term of dL/db by an input of size about "
                          "10⁻³, so the weight's gradient is the smaller one")],
            rel=0.165, form=_a_power_of_ten)
def _bias_over_weight_decades() -> float:
    """log10 of the factor, 3.11; ``rel`` = 16.5 % of it is half a decade: 2.6 to 3.6 pass, 2.5 and 3.7 fail."""
    return round(math.log10(_bias_over_weight()), 2)


def _resnet18():
    import torchvision

    return torchvision.models.resnet18(weights=None).eval()


def _four_copies(images: torch.Tensor) -> dict[str, torch.Tensor]:
    """The lesson's four copies in the He-initialised digits CNN with in-place ReLUs: features.0's output
    in its forward hook, and the ReLU features.1's input in its pre-hook (twice) and in its forward hook."""
    model, kept = _fresh(None), {}
    for layer in model.features:
        if isinstance(layer, nn.ReLU):
            layer.inplace = True

    def before(module, args):
        kept["pre-hook, .detach()"] = args[0].detach()
        kept["pre-hook, .detach().clone()"] = args[0].detach().clone()

    handles = [model.features[0].register_forward_hook(
                   lambda module, args, output: kept.__setitem__("features.0's hook, .detach().clone()",
                                                                 output.detach().clone())),
               model.features[1].register_forward_pre_hook(before),
               model.features[1].register_forward_hook(
                   lambda module, args, output: kept.__setitem__("forward hook, .detach().clone()",
                                                                 args[0].detach().clone()))]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    order = ["features.0's hook, .detach().clone()", "pre-hook, .detach()", "pre-hook, .detach().clone()",
             "forward hook, .detach().clone()"]
    return {label: kept[label] for label in order}


def _four_bools(guess) -> str | None:
    """The form 02.d asks for: a list of four True/False, one per copy, in the order (1) to (4)."""
    if not isinstance(guess, list | tuple):
        return f"write a list of four True/False, one per copy (1) to (4), not {kind_of(guess)}"
    if len(guess) != 4:
        return f"write four True/False, one per copy (1) to (4): your list has {len(guess)}"
    if all(isinstance(g, int) and not isinstance(g, bool) and g in (0, 1) for g in guess):
        bools = [bool(g) for g in guess]
        return f"write True or False for each copy, not 1 or 0: {bools}"
    if not all(isinstance(g, bool) for g in guess):
        return "write True or False for each of the four copies, without quotes"
    return None


@prediction("02.d", "which of four copies of the ReLU's input still hold negative values",
            why="a .detach() copy shares memory with the tensor, so the in-place ReLU overwrites it later; a "
                ".clone() made before the ReLU runs keeps the values; and by the time the ReLU's forward hook runs, "
                "args[0] holds the ReLU's result, so a clone made there copies no negatives",
            wrong=[([True, True, True, True], "two of them lost their negatives: a .detach() copy shares memory, "
                                              "and a forward hook runs after the in-place ReLU wrote its result"),
                   ([True, True, True, False], "the pre-hook's .detach() copy is taken before the ReLU runs, but it "
                                               "shares memory with the tensor the ReLU then overwrites"),
                   ([True, False, True, True], "the ReLU's forward hook runs after the ReLU has written its result "
                                               "into args[0]: a clone made then copies that result")],
            form=_four_bools)
def _which_keep_negatives() -> list[bool]:
    return [bool((kept < 0).any()) for kept in _four_copies(_digits().x_train[:64]).values()]


@prediction("02.e", "how many names a forward hook on every submodule of resnet18 appends",
            why="67 modules are hooked, and each of the 8 blocks calls its one ReLU twice (after bn1, and after "
                "the residual sum): 67 + 8 = 75 calls",
            wrong=[(67, "one name per call, and each of the 8 blocks calls its ReLU twice"),
                   (52, "containers (the blocks, layer1 …) are submodules too, and each block calls its ReLU "
                        "twice"),
                   (60, "each block calls its ReLU twice, and the containers are hooked too: 67 modules")])
def _resnet_calls() -> int:
    resnet = _resnet18()
    calls, handles = [], []
    for name, module in resnet.named_modules():
        if name:
            handles.append(module.register_forward_hook(lambda module, args, output, name=name: calls.append(name)))
    try:
        with torch.no_grad():
            resnet(torch.randn(1, 3, 64, 64))
    finally:
        for handle in handles:
            handle.remove()
    return len(calls)


# ----- 02.1: the spread of every layer's output ------------------------------------------------------
class _Pair(nn.Module):
    """A module with children of its own: its leaves are ``first``, ``second`` and ``conv``; ``second``
    runs twice (before and after ``conv``), as resnet18's ReLUs do."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 5)
        self.second = nn.Tanh()
        self.conv = nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.second(self.first(x))
        return self.second(3 * self.conv(h.unsqueeze(1)).squeeze(1))


def _spread_model() -> nn.Module:
    torch.manual_seed(5)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.ReLU(), _Pair()), nn.Linear(5, 3))


def _leaves(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if name and next(m.children(), None) is None}


def _spreads(model: nn.Module, x: torch.Tensor, of: str = "output") -> dict[str, float]:
    stds, handles = {}, []

    def keep(name):
        def hook(module, args, output):
            if of == "first" and name in stds:
                return
            stds[name] = (args[0] if of == "input" else output).std(unbiased=of != "population").item()

        return hook

    try:
        for name, module in _leaves(model).items():
            handles.append(module.register_forward_hook(keep(name)))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return stds


def _number(value) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _spread_keys_outcome(got: dict, expected: dict, model: nn.Module) -> Outcome | None:
    """What is wrong with the names the answer used, if anything."""
    if got and all(isinstance(key, nn.Module) for key in got):
        return Outcome(False, "the keys are modules: key the dict by the names named_modules() gives ('1.1.first')")
    keys = [str(key) for key in got]
    if "" in keys:
        return Outcome(False, "leave out the root (name ''): it is the whole model, not a layer")
    if len(keys) == 1 and keys[0] == list(expected)[-1]:
        return Outcome(False, f"only {keys[0]!r} is in the dict, the last layer hooked: every hook wrote under the "
                              f"same name; {LATE_BINDING}")
    containers = [k for k in keys if k in dict(model.named_modules()) and k not in expected]
    if containers:
        return Outcome(False, f"{containers[0]!r} is a container (it has children, and its output is its last "
                              "child's): hook only the leaves, the modules without children")
    if not keys:
        return Outcome(False, "the dict is empty: register the hooks, then run model(x), then remove them")
    missing = [k for k in expected if k not in keys]
    if missing and all("." not in k for k in keys):
        return Outcome(False, f"no spread for {missing}: named_children() lists only the top level; "
                              "named_modules() walks the whole tree")
    if missing:
        kinds = ", ".join(sorted({type(model.get_submodule(k)).__name__ for k in missing}))
        return Outcome(False, f"no spread for {missing} ({kinds}): hook every leaf (every module without "
                              "children), whatever its type; a list of types misses the ones you did not list")
    return None


@exercise("02.1", "the spread of every layer's output")
@_naming("'0' Linear → '1' Sequential('1.0' ReLU, '1.1' a module running '1.1.first' Linear, "
         "'1.1.second' Tanh, '1.1.conv' Conv1d, then '1.1.second' again) → '2' Linear")
def _output_stds(output_stds) -> Outcome:
    """``output_stds(model, x)`` hooks every leaf module, runs ``model(x)`` once and returns
    ``{name: std of the output}``."""
    model = _spread_model()
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    try:
        got = output_stds(model, x)
    except (TypeError, AttributeError) as error:
        left_on(model)
        returned = _returned_hint(error)
        if returned:
            return returned
        raise
    finally:
        left = left_on(model)
    if left:
        return Outcome(False, f"{left[0]} after output_stds returned: remove every handle before returning")
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict {{layer name: std}}, got {kind_of(got)}")
    expected = _spreads(model, x)
    wrong = _spread_keys_outcome(got, expected, model)
    if wrong:
        return wrong
    tensor = next((str(k) for k, v in got.items() if isinstance(v, torch.Tensor)), None)
    if tensor is not None:
        return Outcome(False, f"layer {tensor!r} keeps a tensor: keep a plain number (.item()), so that nothing "
                              "of the layer's output stays in memory")
    values = {str(k): _number(v) for k, v in got.items()}
    if any(v is None for v in values.values()):
        name = next(k for k, v in values.items() if v is None)
        return Outcome(False, f"layer {name!r}: give one number (output.std().item()), got {kind_of(got[name])}")
    inputs = _spreads(model, x, of="input")
    if all(math.isclose(values[n], inputs[n], rel_tol=1e-4) for n in expected) and inputs != expected:
        return Outcome(False, "these are the spreads of the inputs: a forward hook's third argument is the output")
    population, first = _spreads(model, x, of="population"), _spreads(model, x, of="first")
    twice = next((n for n in expected if not math.isclose(first[n], expected[n], rel_tol=1e-4)), None)
    if twice and math.isclose(values[twice], first[twice], rel_tol=1e-4):
        return Outcome(False, f"layer {twice!r} runs twice in forward, and you kept its first call's std: let each "
                              "call overwrite the entry (stds[name] = ...), so the dict keeps the last call, "
                              "as your 00.3 Recorder kept the last copy")
    for name, std in expected.items():
        if not math.isclose(values[name], std, rel_tol=1e-4) and math.isclose(values[name], population[name],
                                                                               rel_tol=1e-6):
            return Outcome(False, f"layer {name!r}: {values[name]:.4g}, expected {std:.4g}: that is " + POPULATION)
        if not math.isclose(values[name], std, rel_tol=1e-4):
            return Outcome(False, f"layer {name!r}: {values[name]:.4g}, expected {std:.4g} (output.std(), over "
                                  "every element of the output)")
    failed = left_when_raising(lambda: output_stds(model, torch.randn(2, 7)), model)
    if failed:
        return failed
    return Outcome(True, f"the spread of all {len(expected)} leaves, the ones inside containers too, the last "
                         "call of the one called twice, and no hook left behind (also when the forward raised)")


# ----- 02.2: weights rescaled from what a hook measures -----------------------------------------------
class _Watched(nn.Sequential):
    """The check's model for 02.2: a chain of containers whose forward notes, at each call, whether a
    forward hook or pre-hook of the answer's (any but the checker's own, ``ours``) is on one of its modules."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__(*layers)
        self.hooked: list[bool] = []
        self.ours: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hooked.append(any(key not in self.ours for m in self.modules()
                               for kind in ("_forward_pre_hooks", "_forward_hooks") for key in module_hooks(m, kind)))
        return super().forward(x)


NEEDS_HOOKS = ("that works only while forward is a plain chain of the model's layers, run in the order they were "
               "added: a skip connection, a layer used twice or any other code in forward escapes a loop over "
               "them. A hook on each layer measures what model(x) really gives it, whatever forward does")


def _unhooked(model: _Watched) -> Outcome | None:
    """Why an answer that rescaled without hooks is refused, or None when model(x) ran with its hooks on."""
    if not model.hooked:
        return Outcome(False, f"your answer registered no hook and never called model(x): it ran the layers itself, "
                              f"and {NEEDS_HOOKS}")
    if not any(model.hooked):
        return Outcome(False, f"your answer registered no hook while model(x) ran: it measured by running the "
                              f"layers itself, and {NEEDS_HOOKS}")
    return None


class _Backwards(nn.Module):
    """Two layers registered in one order and run in the other: ``b`` comes first in ``modules()``, ``a``
    runs first."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Linear(16, 5)
        self.a = nn.Linear(8 * 6 * 6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


OUT_OF_ORDER = ("layer '2.b' is listed before '2.a' by model.modules(), which gives the order layers were "
                "registered, but runs after it")


def _rescale_model() -> nn.Module:
    """Weights with std 0.01, biases 0, in nested containers: each layer shrinks the spread; the last two
    layers are registered in the opposite order to the one they run in."""
    torch.manual_seed(8)
    model = _Watched(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Flatten()),
        _Backwards(),
    )
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                m.weight.normal_(0, 0.01)
                m.bias.zero_()
    return model


def _weighted(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)}


def _rescaled_outcome(model: nn.Module, before: dict, x: torch.Tensor) -> Outcome | None:
    """What is wrong with the weights after the answer ran, if anything."""
    layers = _weighted(model)
    replaced = [name for name, m in layers.items() if m.weight is not before[name][0]]
    if replaced:
        return Outcome(False, f"layer {replaced[0]!r} has a new weight Parameter: an optimizer made before holds "
                              "the old one; change the weight in place (module.weight.div_(std))")
    swapped = [name for name, m in layers.items() if m.weight.data_ptr() != before[name][3]]
    if swapped:
        return Outcome(False, f"layer {swapped[0]!r}: its weight Parameter now holds new memory (weight.data = "
                              "...), swapped in where autograd does not see it; change the weight in place, under "
                              "torch.no_grad(): module.weight.div_(std)")
    unchanged = [name for name, m in layers.items() if torch.equal(m.weight, before[name][1])]
    if len(unchanged) == len(layers):
        return Outcome(False, "no weight changed: divide each layer's weight in place by its output's std (a "
                              "returned output changes only that forward pass); every layer of the check's model "
                              "sits inside a container, which model.children() does not open: walk model.modules()")
    for name, m in layers.items():
        ratio = (m.weight.detach() / before[name][1]).flatten()
        if not torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4) or ratio[0] <= 0:
            return Outcome(False, f"layer {name!r}: its weight is not the old one divided by one number: divide "
                                  "the whole weight by the output's std")
        if not torch.equal(m.bias, before[name][2]):
            return Outcome(False, f"layer {name!r}: its bias changed; rescale the weight only")
    untouched = [name for name, m in layers.items() if torch.equal(m.weight, before[name][1])]
    skipped = {type(layers[name]).__name__ for name in untouched}
    if untouched and skipped.isdisjoint(type(m).__name__ for name, m in layers.items() if name not in untouched):
        kind = " and ".join(sorted(skipped))
        return Outcome(False, f"your hooks skipped the {kind} layers: the weights of {untouched} did not change; "
                              "hook every nn.Conv2d and every nn.Linear: isinstance(m, nn.Conv2d | nn.Linear)")
    if untouched and all("." in name for name in untouched):
        return Outcome(False, f"the weights of {untouched} did not change: those layers sit inside containers, "
                              "which model.children() does not open; walk model.modules() to reach nested layers")
    got = _stds_of(model, x)  # within 1 %: the population std (dividing by n) passes too
    far = next((name for name, std in got.items() if abs(std - 1) > 1e-2), None)
    if far == "2.b" and abs(got["2.a"] - 1) <= 1e-2:
        return Outcome(False, f"afterwards layer '2.b' gives std {got[far]:.4g} on x, not 1: it was measured "
                              f"before '2.a', the layer that feeds it, was rescaled: {OUT_OF_ORDER}. Hook every "
                              "layer at once, each hook dividing its weight and returning output / std, so that "
                              "each layer is rescaled when it runs and the layers after it see the result")
    if far is not None:
        return Outcome(False, f"afterwards layer {far!r} gives std {got[far]:.4g} on x, not 1: it was measured "
                              "before the layers before it were rescaled; in one pass, each hook must also return "
                              "output / std, so that the next layer sees the rescaled output")
    return None


def _per_layer(model: nn.Module, x: torch.Tensor, measure) -> dict:
    """``measure(output)`` of each weighted layer on one pass of ``x``, read by hooks removed afterwards."""
    values, handles = {}, []
    for name, m in _weighted(model).items():
        handles.append(m.register_forward_hook(lambda m, a, out, name=name: values.__setitem__(name, measure(out))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return values


def _stds_of(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    return _per_layer(model, x, lambda out: out.std().item())


class _WeightsPassedOn:
    """The checker's pre-hooks on every module (put first) and a forward hook on the root: they note a
    parameter arriving where an activation belongs, which is what a hook returning a weight makes happen
    (its value replaces the layer's output, so the next layer, or the model's caller, receives it)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.found: tuple[str, str] | None = None
        self.handles = [m.register_forward_pre_hook(self._look, prepend=True) for m in model.modules()]
        self.handles.append(model.register_forward_hook(lambda m, args, output: self._look(m, (output,))))

    def _look(self, module, args):
        # the parameters' memory as it is now: a weight swapped by ``weight.data = ...`` frees its old memory,
        # which a later output may reuse
        owners = {p.data_ptr(): (name.rpartition(".")[0], name.rpartition(".")[2])
                  for name, p in self.model.named_parameters()}
        for value in args:
            if self.found is None and isinstance(value, torch.Tensor) and value.data_ptr() in owners:
                self.found = owners[value.data_ptr()]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def outcome(self) -> Outcome | None:
        if self.found is None:
            return None
        name, param = self.found
        return Outcome(False, f"your hook on layer {name!r} returned its {param}, which replaced the layer's output: "
                              "an in-place method such as div_ returns the tensor it changed, so a lambda whose "
                              "body is module.weight.div_(std) returns the weight; write a def that changes the "
                              "weight and returns nothing (or returns output / std)")


@exercise("02.2", "rescale each layer's weight to an output of std 1")
def _rescale(rescale_to_unit_std) -> Outcome:
    """``rescale_to_unit_std(model, x)`` divides each Conv2d / Linear weight in place by the std of its
    output on ``x``, so that afterwards every one of them gives std 1."""
    model = _rescale_model()
    x = torch.randn(16, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    before = {name: (m.weight, m.weight.detach().clone(), m.bias.detach().clone(), m.weight.data_ptr())
              for name, m in _weighted(model).items()}
    replacements = _WeightsPassedOn(model)
    model.ours = {handle.id for handle in replacements.handles}
    try:
        rescale_to_unit_std(model, x.clone())
    except RuntimeError as error:
        replacements.remove()
        left_on(model)
        if replacements.outcome():
            return replacements.outcome()
        if "leaf Variable that requires grad" in str(error):
            return Outcome(False, "autograd refuses to change a parameter in place while it records: divide the "
                                  "weight under torch.no_grad()")
        raise
    except (TypeError, AttributeError) as error:
        replacements.remove()
        left_on(model)
        returned = replacements.outcome() or _returned_hint(error)
        if returned:
            return returned
        raise
    finally:
        replacements.remove()
        left = left_on(model)
    returned = replacements.outcome()
    if returned:
        return returned
    if left:
        return Outcome(False, f"{left[0]} after rescale_to_unit_std returned: remove each hook (in a finally "
                              "block)")
    changed = any(not torch.equal(m.weight, before[name][1]) for name, m in _weighted(model).items())
    wrong = (_unhooked(model) if changed else None) or _rescaled_outcome(model, before, x)
    if wrong:
        return wrong
    broken = _rescale_model()
    failed = left_when_raising(lambda: rescale_to_unit_std(broken, torch.randn(2, 3, 6, 6)), broken)
    if failed:
        return failed
    return Outcome(True, f"all {len(before)} layers give std 1 on x, each weight divided by one number and still "
                         "the same Parameter (an optimizer made before keeps it), no hook left behind")


# ----- running an answer's recorder ---------------------------------------------------------------------
def _pre_hooked(model: nn.Module) -> bool:
    """Whether the answer put a forward pre-hook on ``model`` or a submodule."""
    return any(module_hooks(m, "_forward_pre_hooks") for m in model.modules())


def _entered(recorder_class, model: nn.Module, run, on_enter=None,
             usage: str | None = None) -> tuple[object, Outcome | None]:
    """Make the answer's recorder for ``model``, run ``run()`` inside its ``with`` block, with the checker's
    own hooks watching for hooks that return a value; the recorder, or what went wrong. ``on_enter()``
    runs first in the block, before the checker adds its hooks."""
    recorder, watch = recorder_class(model), None
    early = left_on(model)  # made, not yet entered: nothing may be registered
    if early:
        made = (usage or f"{type(recorder).__name__}(model) as rec").split(" as ")[0]
        return None, Outcome(False, f"right after {made}, before any with block, {early[0]}: register the hooks "
                                    "in __enter__, not __init__ (lesson 00.3's rule: a recorder never used in a "
                                    "with block must leave nothing), and return self")
    try:
        with recorder as rec:
            if rec is not recorder:
                usage = usage or f"{type(recorder).__name__}(model) as rec"
                return None, Outcome(False, f"__enter__ returned {kind_of(rec)}: return self, so that `with "
                                            f"{usage}:` gives the recorder")
            if on_enter is not None:
                on_enter()
            watch = _Replacements(model)
            try:
                run()
            finally:
                watch.remove()
    except Exception:
        if watch is not None and watch.found:
            left_on(model)
            return None, watch.outcome()
        raise
    if watch.found:
        left_on(model)
        return None, watch.outcome()
    left = left_on(model)
    if left:
        return None, Outcome(False, f"after the with block {left[0]}: keep every handle in self.handles, "
                                    "__exit__ removes them")
    return recorder, None


def _raise_inside(recorder, model: nn.Module, x: torch.Tensor | None = None) -> None:
    """A forward pass that raises inside the recorder's with block: the first Linear refuses 7 features."""
    with recorder:
        model(torch.randn(2, 7) if x is None else x)


def _tensor_outcome(what: str, got, want: torch.Tensor) -> Outcome | None:
    if not isinstance(got, torch.Tensor):
        return Outcome(False, f"{what}: keep a tensor, got {kind_of(got)}")
    if got.requires_grad or got.grad_fn is not None:
        return Outcome(False, f"{what} is still in the autograd graph: keep a .detach().clone() copy")
    outcome = compare_tensors(got, want)
    if not outcome.passed:
        return Outcome(False, f"{what} differs from that call's value: {outcome.detail}")
    return None


def _lost_negatives(got, want: torch.Tensor) -> bool:
    """Whether ``got`` looks like ``want`` after a ReLU wrote into it: no negative value left."""
    return (isinstance(got, torch.Tensor) and got.shape == want.shape and bool((want < 0).any())
            and bool((got >= 0).all()))


def _inputs_outcome(where: str, inputs, want: tuple, pre_hooked: bool) -> Outcome | None:
    """What is wrong with the inputs kept for one call, if anything."""
    if not isinstance(inputs, tuple) or len(inputs) != len(want):
        return Outcome(False, f"{where}: keep a tuple of the {len(want)} positional inputs (args), got "
                              f"{kind_of(inputs)}: tuple(a.detach().clone() for a in args)")
    for got, right in zip(inputs, want, strict=True):
        if _lost_negatives(got, right):
            if not pre_hooked:
                return Outcome(False, f"the input kept for {where} has no negative values: a forward hook runs "
                                      "after the in-place ReLU overwrote it; copy the inputs in a forward pre-hook")
            return Outcome(False, f"the input kept for {where} has no negative values: it shares memory with the "
                                  "tensor the in-place ReLU overwrote; .clone() it")
        wrong = _tensor_outcome(f"the input kept for {where}", got, right)
        if wrong:
            return wrong
    return None


def _output_outcome(where: str, out, want: torch.Tensor) -> Outcome | None:
    if _lost_negatives(out, want):
        return Outcome(False, f"the output kept for {where} has no negative values although that call gave some: "
                              "the in-place ReLU after it overwrote the memory your copy shares; keep "
                              "output.detach().clone()")
    return _tensor_outcome(f"the output kept for {where}", out, want)


# ----- 02.3: statistics at every step --------------------------------------------------------------------
def _stats_model() -> nn.Module:
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 3))
    with torch.no_grad():  # '2.1' outputs values of about 1e-5 and exact zeros: only `output == 0` counts the zeros
        model[2][0].weight.mul_(1e-5)
        model[2][0].bias.mul_(1e-5)
    return model


STATS_NAMES = ["1", "2.1", "3"]


def _stats_expected(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, dict[str, list[float]]]:
    """The two numbers of each named layer at each call, and the population std (a common slip)."""
    rows = {field: {n: [] for n in STATS_NAMES} for field in ("stds", "zeros", "population", "nonpositive")}
    handles = []
    for name in STATS_NAMES:
        def hook(m, args, out, name=name):
            rows["stds"][name].append(out.std().item())
            rows["zeros"][name].append((out == 0).float().mean().item())
            rows["population"][name].append(out.std(unbiased=False).item())
            rows["nonpositive"][name].append((out <= 0).float().mean().item())

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
    return rows


def _close(value, right: float) -> bool:
    return isinstance(value, int | float) and math.isclose(value, right, rel_tol=1e-4, abs_tol=1e-7)


def _stats_outcome(stats, expected: dict) -> Outcome | None:
    """What is wrong with the lists the answer kept, if anything."""
    for field in ("stds", "zeros"):
        got = getattr(stats, field, None)
        if not isinstance(got, dict) or sorted(map(str, got)) != sorted(STATS_NAMES):
            return Outcome(False, f"self.{field} should be a dict with a list for each of {STATS_NAMES}, got "
                                  f"{kind_of(got)}")
        counts = {name: len(got[name]) if isinstance(got[name], list) else None for name in STATS_NAMES}
        if counts[STATS_NAMES[-1]] == 3 * len(STATS_NAMES) and not any(counts[n] for n in STATS_NAMES[:-1]):
            return Outcome(False, f"every hook appended to the lists of {STATS_NAMES[-1]!r}, the last name: "
                                  f"{LATE_BINDING}")
        wrong = next((n for n in STATS_NAMES if counts[n] != 3), None)
        if wrong is not None:
            return Outcome(False, f"self.{field}[{wrong!r}] holds {counts[wrong]} values after 3 forward passes: "
                                  "append one value per call")
        for name in STATS_NAMES:
            kept = got[name]
            if any(isinstance(v, torch.Tensor) for v in kept):
                return Outcome(False, f"self.{field}[{name!r}] keeps tensors: keep plain numbers (.item()), so "
                                      "that nothing of the layer's output stays in memory")
            for step, (value, right) in enumerate(zip(kept, expected[field][name], strict=True), start=1):
                if _close(value, right):
                    continue
                shown = f"{value:.4g}" if isinstance(value, int | float) else kind_of(value)
                if field == "zeros" and isinstance(value, int | float) and _close(value, 100 * right) and right:
                    return Outcome(False, f"self.zeros[{name!r}] at call {step}: {shown}, a percentage: write the "
                                          f"share as a fraction from 0 to 1, {right:.4g} for {shown} %")
                if field == "zeros" and isinstance(value, int | float) and value > 1:
                    return Outcome(False, f"self.zeros[{name!r}] at call {step}: {shown}, a count, not a share: "
                                          f"expected {right:.4g}, the zeros divided by the number of values "
                                          "(.float().mean())")
                if field == "zeros" and _close(value, expected["nonpositive"][name][step - 1]):
                    return Outcome(False, f"self.zeros[{name!r}] at call {step}: {shown}, expected {right:.4g}: "
                                          "≤ 0 counts negatives too; count only the exact zeros (output == 0)")
                if field == "zeros" and isinstance(value, int | float) and value > right:
                    return Outcome(False, f"self.zeros[{name!r}] at call {step}: {shown}, but only {right:.4g} of "
                                          "the output is exactly 0: values near 0, such as 1e-5, are not zeros; "
                                          "count (output == 0)")
                if field == "stds" and _close(value, expected["population"][name][step - 1]):
                    return Outcome(False, f"self.stds[{name!r}] at call {step}: {shown}, expected {right:.4g}: "
                                          "that is " + POPULATION)
                return Outcome(False, f"self.{field}[{name!r}] at call {step}: {shown}, expected {right:.4g} "
                                      "(of the layer's output)")
    return None


@exercise("02.3", "statistics of chosen layers at every step")
@_naming("'0' Linear → '1' ReLU → '2' Sequential('2.0' Linear, '2.1' ReLU) → '3' Linear")
def _step_stats(StepStats) -> Outcome:
    """``with StepStats(model, names) as stats:`` any forward passes;
    ``stats.stds[name]`` and ``stats.zeros[name]`` get one number per call of that layer."""
    model = _stats_model()
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(16, 5, generator=gen) * scale for scale in (1.0, 3.0, 0.1)]
    expected = _stats_expected(model, batches)
    try:
        stats, wrong = _entered(lambda m: StepStats(m, list(STATS_NAMES)), model,
                                lambda: [model(batch) for batch in batches], usage="StepStats(model, names) as stats")
    finally:
        left_on(model)
    if wrong:
        return wrong
    wrong = _stats_outcome(stats, expected)
    if wrong:
        return wrong
    broken = _stats_model()
    recorder = StepStats(broken, list(STATS_NAMES))
    failed = left_when_raising(lambda: _raise_inside(recorder, broken), broken)
    if failed:
        return failed
    return Outcome(True, "std and share of zeros of each named layer at each of 3 steps, as plain numbers; "
                         "no hook left after the with block")


# ----- 02.4: one record per call, its inputs copied before in-place layers run ---------------------------
def _plain_copy(model: nn.Module) -> nn.Module:
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    return plain


def _reference_calls(model: nn.Module, x: torch.Tensor) -> list[tuple]:
    """``(name, inputs, output)`` of every submodule call of ``model(x)``, in the order the calls end,
    computed on a copy without in-place operations."""
    plain = _plain_copy(model)
    records, handles = [], []
    for name, m in plain.named_modules():
        if name:
            handles.append(m.register_forward_hook(
                lambda m, args, out, name=name: records.append((name, tuple(a.detach().clone() for a in args),
                                                                out.detach().clone()))))
    try:
        with torch.no_grad():
            plain(x)
    finally:
        for handle in handles:
            handle.remove()
    return records


# the check's model: a ReLU called twice, a Tanh used in two places
class _Block(nn.Module):
    """A small residual block that calls its ReLU twice, like torchvision's BasicBlock, and uses a
    borrowed activation ``act`` inside ``extra``."""

    def __init__(self, act: nn.Module, inplace: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU(inplace=inplace)
        self.extra = nn.Sequential(nn.Linear(4, 4), act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.fc(x))
        return self.relu(self.extra(out) + x)


def _calls_model(inplace: bool = True) -> nn.Module:
    """Calls ``1`` (a Tanh) at the top and again inside ``2.extra``; ``2.relu`` twice per forward."""
    torch.manual_seed(2)  # on the checker's own random stream (see ``exercise``)
    act = nn.Tanh()
    return nn.Sequential(nn.Linear(3, 4), act, _Block(act, inplace=inplace))


CALLS_MODEL = ("'0' Linear → '1' Tanh → '2' a residual block: '2.fc' Linear → '2.relu' (in place) → '2.extra' "
               "= '2.extra.0' Linear + the Tanh '1' again, plus the block's input → '2.relu' again")


def _record_list(recorder, size: int) -> tuple[list | None, Outcome | None]:
    records = getattr(recorder, "records", None)
    if isinstance(records, dict):
        return None, Outcome(False, "records is a dict: keyed by name it keeps one record per layer, but a layer "
                                    "can run twice; append one entry per call to a list")
    if not isinstance(records, list):
        return None, Outcome(False, f"self.records should be a list, got {kind_of(records)}")
    bad = next((r for r in records if not (isinstance(r, tuple | list) and len(r) == size)), None)
    if bad is not None:
        return None, Outcome(False, f"each record should be one (name, inputs, output) triple, got {kind_of(bad)}")
    return records, None


def _names_outcome(names: list, expected: list[str]) -> Outcome | None:
    """What is wrong with the recorded names and their order, if anything."""
    if names and all(isinstance(n, nn.Module) for n in names):
        return Outcome(False, "the records hold modules where the names belong: use the names of "
                              "named_modules(), like '2.relu'")
    if "" in names:
        return Outcome(False, "leave out the root (name ''): record the submodules")
    if len(names) == len(expected) and len(set(names)) == 1 and len(set(expected)) > 1:
        return Outcome(False, f"every record is named {names[0]!r}, the last module hooked: {LATE_BINDING}")
    if sorted(map(str, names)) != sorted(expected):
        missing = sorted(set(expected) - set(map(str, names)))
        twice = sorted({n for n in expected if expected.count(n) == 2})
        extra = f" (missing {missing})" if missing else ""
        return Outcome(False, f"{len(names)} records for {len(expected)} calls{extra}: hook every submodule, "
                              f"containers too; {twice} run twice per forward and get two records each")
    if list(names) != expected:
        return Outcome(False, "the right records in the wrong order: append in the forward hook, when each call "
                              "ends (a container ends after its children)")
    return None


def _left_on_a_stack(recorder) -> bool:
    """Whether the recorder still holds inputs put aside (a list of tuples other than its records) after the
    forward pass: its forward hooks read them and never took them off."""
    return any(isinstance(v, list) and v and v is not getattr(recorder, "records", None)
               and all(isinstance(e, tuple) and all(isinstance(t, torch.Tensor) for t in e) for e in v)
               for v in vars(recorder).values())


def _still_waiting(recorder) -> str | None:
    """How many inputs a recorder's dict keyed by name still holds after the pass (no stack: those are
    ``_left_on_a_stack``'s), as the message says it, or None."""
    for value in vars(recorder).values():
        if isinstance(value, dict) and value and all(
                isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v) for v in value.values()):
            return f"{len(value)} {'copy' if len(value) == 1 else 'copies'}"
    return None


def _paired_outcome(where: str, inputs, expected: list, i: int, left: bool = False,
                    same_name: bool = False) -> Outcome | None:
    """Whether the inputs kept for record ``i`` are those of another call (``same_name``: of another call of
    the same module): the hooks were paired wrongly."""
    if not (isinstance(inputs, tuple | list) and len(inputs) == 1 and isinstance(inputs[0], torch.Tensor)):
        return None

    def same(want):
        return len(want) == 1 and want[0].shape == inputs[0].shape and torch.allclose(want[0], inputs[0].detach())

    if same(expected[i - 1][1]):
        return None
    other = next((j for j, (name, want, _) in enumerate(expected, start=1)
                  if same(want) and (not same_name or name == expected[i - 1][0])), None)
    if other is None:
        return None
    if left and other < i:  # the inputs of a call that had already ended: read, never taken off
        return Outcome(False, f"{where} holds the inputs of record {other} ({expected[other - 1][0]!r}), a call "
                              "that had already ended: take them off (pop) in the forward hook, so that an ended "
                              "call's inputs leave")
    if other < i and expected[other - 1][0] == expected[i - 1][0]:  # an earlier call's inputs, never taken back
        return Outcome(False, f"{where} holds the inputs of record {other}, an earlier call of the same module: "
                              "the pre-hook puts each call's inputs aside, and the forward hook of that same call "
                              "takes them back (waiting.pop(name))")
    return Outcome(False, f"{where} holds the inputs of another call (those of record {other}, "
                          f"{expected[other - 1][0]!r}): a forward hook must take the inputs its own call's pre-hook "
                          "copied: keep them under the module's name (waiting[name]) and take them back with "
                          "waiting.pop(name); on one list, take the inputs put aside last, not first (calls nest: "
                          "a container's call ends after its children's)")


@exercise("02.4", "a recorder with one record per call, inputs included")
@_naming(CALLS_MODEL)
def _call_recorder(CallRecorder) -> Outcome:
    """``with CallRecorder(model) as rec: model(x)`` fills ``rec.records`` with one ``(name, inputs, output)``
    per call of every submodule, in the order the calls end, the inputs as they were before the call."""
    model = _calls_model()
    x = torch.linspace(-2, 2, 6).reshape(2, 3).requires_grad_()
    expected = _reference_calls(model, x)
    pre_hooked = []
    try:  # a forward and a backward in the block: recording must leave training as it was
        recorder, wrong = _entered(CallRecorder, model, lambda: model(x).sum().backward(),
                                   lambda: pre_hooked.append(_pre_hooked(model)))
    except (KeyError, IndexError) as error:
        left_on(model)
        return Outcome(False, f"your code raised {type(error).__name__}: {error}: a forward hook found no inputs "
                              "waiting for its call; the pre-hook puts each call's inputs aside under the "
                              "module's name (waiting[name] = copies), and the forward hook of the same call "
                              "takes them back (waiting.pop(name))")
    finally:
        left_on(model)
    if wrong:
        return wrong
    records, wrong = _record_list(recorder, 3)
    if wrong:
        return wrong
    wrong = _names_outcome([name for name, _, _ in records], [name for name, _, _ in expected])
    if wrong:
        return wrong
    still = _still_waiting(recorder)
    if still:
        return Outcome(False, f"after the pass, {still} of inputs still wait although every call has ended: your "
                              "forward hook reads them and leaves them in place. Take them out (waiting.pop(name)): "
                              "then a call's inputs wait only while it runs, and a forward hook that finds none "
                              "for its call raises KeyError at once instead of pairing its output with the inputs "
                              "of an earlier call of that module")
    for i, ((name, inputs, out), (_, want_in, want_out)) in enumerate(zip(records, expected, strict=True), start=1):
        where = f"record {i} ({name!r})"  # the first wrong record is the one reported
        if inputs is None and any(other == name for other, _, _ in expected[:i - 1]):
            return Outcome(False, f"{where} has no inputs (None): the pre-hook puts each call's inputs aside under "
                                  "the module's name, and the forward hook of the same call takes them back "
                                  "(waiting.pop(name))")
        wrong = _inputs_outcome(where, inputs, want_in, pre_hooked[0])
        if wrong:  # inputs of another call: a pairing slip, whatever the values look like; where they look
            # overwritten by the in-place ReLU, only another call of the same module counts as a pairing slip
            wrong = _paired_outcome(where, inputs, expected, i, _left_on_a_stack(recorder),
                                    same_name="no negative values" in wrong.detail) or wrong
        if wrong:
            return wrong
        wrong = _output_outcome(where, out, want_out)
        if wrong:
            return wrong
    broken = _calls_model()
    recorder = CallRecorder(broken)
    failed = left_when_raising(lambda: _raise_inside(recorder, broken), broken)
    if failed:
        return failed
    return Outcome(True, f"{len(expected)} records in the order the calls end ('1' and '2.relu' twice each), "
                         "each with its inputs from before the call and its output, all detached copies; "
                         "backward ran; no hook left")


# ----- worked answers the lesson falls back on ------------------------------------------------------------
# A lesson cell uses the student's answer once its check passed, and one of these until then:
#     if not passed("02.1"):
#         from hooklab.exercises.nb02 import output_stds
def output_stds(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """02.1: ``{name: std of the output}`` of every leaf of ``model`` for one ``model(x)``."""
    stds, handles = {}, []
    try:
        for name, module in model.named_modules():
            if next(module.children(), None) is None:
                handles.append(module.register_forward_hook(
                    lambda module, args, output, name=name: stds.__setitem__(name, output.std().item())))
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return stds


def rescale_to_unit_std(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """02.2: each Conv2d and Linear weight divided in place by its output's std on ``x``, in one pass: each
    hook also returns ``output / std``, what the rescaled weight gives, so the layers after it measure
    the rescaled signal, in the order the layers run."""

    def unit_std(module, args, output):
        std = output.std()
        module.weight.div_(std)
        return output / std

    handles = [m.register_forward_hook(unit_std) for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return model


class StepStats:
    """02.3: ``with StepStats(model, names) as stats:``; ``stats.stds[name]``, ``zeros[name]``:
    one number per call of each named layer."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.model, self.names, self.handles = model, names, []
        self.stds, self.zeros = {name: [] for name in names}, {name: [] for name in names}

    def keep(self, name, output):
        out = output.detach()
        self.stds[name].append(out.std().item())
        self.zeros[name].append((out == 0).float().mean().item())

    def __enter__(self):
        for name in self.names:
            hook = lambda module, args, output, name=name: self.keep(name, output)  # noqa: E731
            self.handles.append(self.model.get_submodule(name).register_forward_hook(hook))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


class CallRecorder:
    """02.4: ``rec.records``: one ``(name, inputs, output)`` per call of every submodule, in the order the
    calls end."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.records, self.handles, self.waiting = model, [], [], {}

    def put_aside(self, name, args):
        self.waiting[name] = tuple(a.detach().clone() for a in args)

    def keep(self, name, output):
        self.records.append((name, self.waiting.pop(name), output.detach().clone()))

    def __enter__(self):
        for name, module in self.model.named_modules():
            if name:
                self.handles.append(module.register_forward_pre_hook(
                    lambda module, args, name=name: self.put_aside(name, args)))
                self.handles.append(module.register_forward_hook(
                    lambda module, args, output, name=name: self.keep(name, output)))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
