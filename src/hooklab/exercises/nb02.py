"""Predictions and exercises of notebook 02: module forward hooks.

The lesson's problem is a digits CNN whose weights are drawn with std 0.01: its loss does not
move. The predictions recompute what the lesson's next cell shows (``_fresh`` and ``_train`` are
the lesson's ``fresh`` and ``train``); the exercises are the hooks of each section: one hook per
layer (02.1), a hook that changes weights (02.2), the student's recorder growing (02.3, 02.4) and
statistics kept at every training step (02.5).
"""

from __future__ import annotations

import copy
import functools
import math

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
                if std is None:
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                else:
                    m.weight.normal_(0, std)
                m.bias.zero_()
    return model


def _train(model: nn.Module, steps: int = 100, lr: float = 0.1, batch: int = 64) -> list[float]:
    """The lesson's ``train``: SGD with momentum on random batches of digits; the loss of every step."""
    data = _digits()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    generator, losses = torch.Generator().manual_seed(0), []
    for _ in range(steps):
        idx = torch.randint(0, len(data.y_train), (batch,), generator=generator)
        loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ----- the predictions -----------------------------------------------------------------------------
SHRINK_CHOICES = (10, 1_000, 100_000)


@prediction("02.a", "how much smaller the logits' spread is than the input's",
            why="each Conv2d or Linear multiplies the spread by about 0.01·√(fan-in), 0.03 to 0.2 here, and each "
                "ReLU and the pooling shrink it more: four such layers make it about 80,000 times smaller",
            wrong=[(10, "far more: each of the four layers with weights shrinks the spread by 5 to 40 times, not "
                        "the whole network"),
                   (1_000, "more: four layers with weights each shrink it 5 to 40 times, and the ReLUs and the "
                           "average pool shrink it further")])
def _logit_shrink() -> int:
    x = _digits().x_train[:256]
    with torch.no_grad():
        ratio = (x.std() / _fresh(0.01)(x).std()).item()
    return min(SHRINK_CHOICES, key=lambda choice: abs(math.log10(choice) - math.log10(ratio)))


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


@prediction("02.c", "how many names a forward hook on every submodule of resnet18 appends",
            why="67 modules are hooked, but each of the 8 blocks calls its one ReLU twice (after bn1, and after "
                "the residual sum): 67 + 8 = 75 calls",
            wrong=[(67, "one name per call, and each of the 8 blocks calls its ReLU twice"),
                   (52, "containers (the blocks, layer1 …) are submodules too, and each block calls its ReLU "
                        "twice")])
def _resnet_calls() -> int:
    import torchvision

    resnet = torchvision.models.resnet18(weights=None).eval()
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


@prediction("02.d", "the smallest value of bn1's output kept with .detach()",
            why="the in-place ReLU after bn1 writes its result into bn1's output tensor, and a .detach() copy "
                "shares that memory: it holds the ReLU's result, whose smallest value is 0",
            wrong=[(-1.0, "bn1's output did hold negative values, but .detach() shares its memory, and the ReLU "
                          "after it works in place")])
def _detached_min() -> float:
    import torchvision

    resnet = torchvision.models.resnet18(weights=None).eval()
    kept = {}
    handle = resnet.bn1.register_forward_hook(lambda module, args, output: kept.update(bn1=output.detach()))
    try:
        with torch.no_grad():
            resnet(torch.randn(1, 3, 64, 64))
    finally:
        handle.remove()
    return kept["bn1"].min().item()


@prediction("02.e", "the share of zeros in features.6's output after 100 steps",
            why="every value is 0: the biases of features.5 drift below zero by about 0.001 while its weights "
                "give only about 0.0001, so the ReLU zeroes everything, and no gradient passes a ReLU that "
                "outputs zero: the layer never comes back",
            wrong=[(0.5, "that is where it starts (a ReLU zeroes about half of a centred input); watch what the "
                         "biases do while the weights stay tiny")])
def _dead_share() -> float:
    model, zeros = _fresh(0.01), []
    handle = model.features[6].register_forward_hook(
        lambda module, args, output: zeros.append((output == 0).float().mean().item()))
    try:
        _train(model)
    finally:
        handle.remove()
    return zeros[-1]


# ----- 02.1: the spread of every layer's output ------------------------------------------------------
class _Pair(nn.Module):
    """A module with children of its own: its leaves are ``first`` and ``second``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 5)
        self.second = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def _spread_model() -> nn.Module:
    torch.manual_seed(5)  # on the checker's own random stream (see ``exercise``)
    return nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.ReLU(), _Pair()), nn.Linear(5, 3))


def _leaves(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if name and next(m.children(), None) is None}


def _spreads(model: nn.Module, x: torch.Tensor, of: str = "output") -> dict[str, float]:
    stds, handles = {}, []

    def keep(name):
        def hook(module, args, output):
            stds[name] = (output if of == "output" else args[0]).std().item()

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
        return Outcome(False, f"no spread for {missing}: hook every leaf (every module without children), "
                              "whatever its type")
    return None


@exercise("02.1", "the spread of every layer's output")
def _output_stds(output_stds) -> Outcome:
    """``output_stds(model, x)`` hooks every leaf module, runs ``model(x)`` once and returns
    ``{name: std of the output}``."""
    model = _spread_model()
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    try:
        got = output_stds(model, x)
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
    values = {str(k): _number(v) for k, v in got.items()}
    if any(v is None for v in values.values()):
        name = next(k for k, v in values.items() if v is None)
        return Outcome(False, f"layer {name!r}: give one number (output.std().item()), got {kind_of(got[name])}")
    inputs = _spreads(model, x, of="input")
    if all(math.isclose(values[n], inputs[n], rel_tol=1e-4) for n in expected) and inputs != expected:
        return Outcome(False, "these are the spreads of the inputs: a forward hook's third argument is the output")
    for name, std in expected.items():
        if not math.isclose(values[name], std, rel_tol=1e-4):
            return Outcome(False, f"layer {name!r}: {values[name]:.4g}, expected {std:.4g} (output.std(), over "
                                  "every element of the output)")
    failed = left_when_raising(lambda: output_stds(model, torch.randn(2, 7)), model)
    if failed:
        return failed
    return Outcome(True, f"the spread of all {len(expected)} leaves, the ones inside containers too, and no hook "
                         "left behind (also when the forward raised)")


# ----- 02.2: weights rescaled from what a hook measures -----------------------------------------------
def _rescale_model() -> nn.Module:
    """Weights with std 0.01, biases 0, in nested containers: each layer shrinks the spread."""
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Flatten()),
        nn.Linear(8 * 6 * 6, 5),
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
    unchanged = [name for name, m in layers.items() if torch.equal(m.weight, before[name][1])]
    if len(unchanged) == len(layers):
        return Outcome(False, "no weight changed: divide each layer's weight in place by its output's std (a "
                              "returned output changes only that forward pass)")
    for name, m in layers.items():
        ratio = (m.weight.detach() / before[name][1]).flatten()
        if not torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4) or ratio[0] <= 0:
            return Outcome(False, f"layer {name!r}: its weight is not the old one divided by one number: divide "
                                  "the whole weight by the output's std")
        if not torch.equal(m.bias, before[name][2]):
            return Outcome(False, f"layer {name!r}: its bias changed; rescale the weight only")
    got = _stds_of(model, x)
    far = next((name for name, std in got.items() if abs(std - 1) > 1e-3), None)
    if far is not None:
        return Outcome(False, f"afterwards layer {far!r} gives std {got[far]:.4g} on x, not 1: it was measured "
                              "before the layers before it were rescaled; rescale one layer per forward pass, "
                              "in the order they run")
    return None


def _stds_of(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    stds, handles = {}, []
    for name, m in _weighted(model).items():
        handles.append(m.register_forward_hook(lambda m, a, out, name=name: stds.__setitem__(name, out.std().item())))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return stds


@exercise("02.2", "rescale each layer's weight to an output of std 1")
def _rescale(rescale_to_unit_std) -> Outcome:
    """``rescale_to_unit_std(model, x)`` divides each Conv2d / Linear weight in place by the std of its
    output on ``x``, so that afterwards every one of them gives std 1."""
    model = _rescale_model()
    x = torch.randn(16, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    before = {name: (m.weight, m.weight.detach().clone(), m.bias.detach().clone())
              for name, m in _weighted(model).items()}
    try:
        rescale_to_unit_std(model, x.clone())
    except RuntimeError as error:
        if "leaf Variable that requires grad" in str(error):
            left_on(model)
            return Outcome(False, "autograd refuses to change a parameter in place while it records: divide the "
                                  "weight under torch.no_grad()")
        raise
    finally:
        left = left_on(model)
    if left:
        return Outcome(False, f"{left[0]} after rescale_to_unit_std returned: remove each hook (in a finally "
                              "block)")
    wrong = _rescaled_outcome(model, before, x)
    if wrong:
        return wrong
    broken = _rescale_model()
    failed = left_when_raising(lambda: rescale_to_unit_std(broken, torch.randn(2, 3, 6, 6)), broken)
    if failed:
        return failed
    return Outcome(True, f"all {len(before)} layers give std 1 on x, each weight divided in place (the optimizer "
                         "keeps the same Parameters), no hook left behind")


# ----- 02.3 and 02.4: the recorder grows --------------------------------------------------------------
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


def _calls_model(inplace: bool = False) -> nn.Module:
    """Calls ``1`` (a Tanh) at the top and again inside ``2.extra``; ``2.relu`` twice per forward."""
    torch.manual_seed(2)  # on the checker's own random stream (see ``exercise``)
    act = nn.Tanh()
    return nn.Sequential(nn.Linear(3, 4), act, _Block(act, inplace=inplace), nn.Sequential(nn.Linear(4, 2)))


def _reference_calls(model: nn.Module, x: torch.Tensor) -> list[tuple[str, tuple, torch.Tensor]]:
    """``(name, inputs, output)`` of every submodule call of ``model(x)``, in the order the calls end,
    computed on a copy without in-place operations."""
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
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


def _entered(recorder_class, model: nn.Module, run) -> tuple[object, Outcome | None]:
    """Make the answer's recorder for ``model``, run ``run()`` inside its ``with`` block; the recorder,
    or what went wrong with the block itself."""
    recorder = recorder_class(model)
    with recorder as rec:
        if rec is not recorder:
            return None, Outcome(False, f"__enter__ returned {kind_of(rec)}: return self, so that `with "
                                        "Recorder(model) as rec:` gives the recorder")
        run()
    left = left_on(model)
    if left:
        return None, Outcome(False, f"after the with block {left[0]}: keep every handle in self.handles, "
                                    "__exit__ removes them")
    return recorder, None


def _record_list(recorder, size: int) -> tuple[list | None, Outcome | None]:
    records = getattr(recorder, "records", None)
    if isinstance(records, dict):
        return None, Outcome(False, "records is a dict: keyed by name it keeps one output per layer, but a layer "
                                    "can run twice; append one entry per call to a list")
    if not isinstance(records, list):
        return None, Outcome(False, f"self.records should be a list, got {kind_of(records)}")
    bad = next((r for r in records if not (isinstance(r, tuple | list) and len(r) == size)), None)
    if bad is not None:
        what = "(name, output) pair" if size == 2 else "(name, inputs, output) triple"
        return None, Outcome(False, f"each record should be one {what}, got {kind_of(bad)}")
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


def _tensor_outcome(what: str, got, want: torch.Tensor) -> Outcome | None:
    if not isinstance(got, torch.Tensor):
        return Outcome(False, f"{what}: keep a tensor, got {kind_of(got)}")
    if got.requires_grad or got.grad_fn is not None:
        return Outcome(False, f"{what} is still in the autograd graph: keep a .detach().clone() copy")
    outcome = compare_tensors(got, want)
    if not outcome.passed:
        return Outcome(False, f"{what} differs from that call's value: {outcome.detail}")
    return None


@exercise("02.3", "a recorder with one record per call")
def _call_recorder(CallRecorder) -> Outcome:
    """``with CallRecorder(model) as rec: model(x)`` fills ``rec.records`` with one ``(name, output)`` per
    call of every submodule, in the order the calls end."""
    model = _calls_model()
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(4), requires_grad=True)
    expected = _reference_calls(model, x)
    try:
        recorder, wrong = _entered(CallRecorder, model, lambda: model(x))
    finally:
        left_on(model)
    if wrong:
        return wrong
    records, wrong = _record_list(recorder, 2)
    if wrong:
        return wrong
    wrong = _names_outcome([name for name, _ in records], [name for name, _, _ in expected])
    if wrong:
        return wrong
    for i, ((name, out), (_, _, want)) in enumerate(zip(records, expected, strict=True), start=1):
        wrong = _tensor_outcome(f"the output of record {i} ({name!r})", out, want)
        if wrong:
            return wrong
    broken = _calls_model()
    recorder = CallRecorder(broken)
    failed = left_when_raising(lambda: _raise_inside(recorder, broken), broken)
    if failed:
        return failed
    return Outcome(True, f"{len(expected)} records in the order the calls end, '1' and '2.relu' twice each, "
                         "detached copies, no hook left after the with block")


def _raise_inside(recorder, model: nn.Module) -> None:
    """A forward pass that raises inside the recorder's with block: the first Linear refuses 7 features."""
    with recorder:
        model(torch.randn(2, 7))


def _kept_inputs_outcome(records: list, expected: list, pre_hooked: bool) -> Outcome | None:
    """What is wrong with the inputs kept per call, if anything."""
    for i, ((name, inputs, _), (_, want, _)) in enumerate(zip(records, expected, strict=True), start=1):
        if not isinstance(inputs, tuple | list) or len(inputs) != len(want):
            return Outcome(False, f"record {i} ({name!r}): inputs should be a tuple of the {len(want)} positional "
                                  f"inputs (args), got {kind_of(inputs)}")
        for got, right in zip(inputs, want, strict=True):
            if isinstance(got, torch.Tensor) and got.shape == right.shape and (right < 0).any() and (got >= 0).all():
                if not pre_hooked:
                    return Outcome(False, f"the input kept for record {i} ({name!r}) has no negative values: a "
                                          "forward hook runs after the in-place ReLU overwrote it; copy the inputs "
                                          "in a forward pre-hook")
                return Outcome(False, f"the input kept for record {i} ({name!r}) has no negative values: it "
                                      "shares memory with the tensor the in-place ReLU overwrote; .clone() it")
            wrong = _tensor_outcome(f"the input of record {i} ({name!r})", got, right)
            if wrong:
                return wrong
    return None


def _kept_outputs_outcome(records: list, expected: list) -> Outcome | None:
    for i, ((name, _, out), (_, _, want)) in enumerate(zip(records, expected, strict=True), start=1):
        if isinstance(out, torch.Tensor) and out.shape == want.shape and (want < 0).any() and (out >= 0).all():
            return Outcome(False, f"the output kept for record {i} ({name!r}) has no negative values although that "
                                  "call gave some: the in-place ReLU after it overwrote the memory your copy "
                                  "shares; keep output.detach().clone()")
        wrong = _tensor_outcome(f"the output of record {i} ({name!r})", out, want)
        if wrong:
            return wrong
    return None


@exercise("02.4", "a recorder that keeps each call's inputs, safe from in-place layers")
def _recorder(Recorder) -> Outcome:
    """``with Recorder(model) as rec: model(x)`` fills ``rec.records`` with one ``(name, inputs, output)``
    per call of every submodule, the inputs as they were before the call, all detached copies."""
    model = _calls_model(inplace=True)
    x = torch.linspace(-2, 2, 6).reshape(2, 3).requires_grad_()
    expected = _reference_calls(model, x)
    pre_hooked = []

    def run():
        pre_hooked.append(any(module_hooks(m, "_forward_pre_hooks") for m in model.modules()))
        model(x).sum().backward()

    try:
        recorder, wrong = _entered(Recorder, model, run)
    finally:
        left_on(model)
    if wrong:
        return wrong
    records, wrong = _record_list(recorder, 3)
    if wrong:
        return wrong
    wrong = (_names_outcome([name for name, _, _ in records], [name for name, _, _ in expected])
             or _kept_inputs_outcome(records, expected, pre_hooked[0]) or _kept_outputs_outcome(records, expected))
    if wrong:
        return wrong
    broken = _calls_model(inplace=True)
    recorder = Recorder(broken)
    failed = left_when_raising(lambda: _raise_inside(recorder, broken), broken)
    if failed:
        return failed
    return Outcome(True, f"{len(expected)} records, each with its inputs from before the call (the in-place "
                         "ReLU's negative inputs too) and its output, all detached copies; no hook left")


# ----- 02.5: statistics at every step --------------------------------------------------------------------
def _stats_model() -> nn.Module:
    torch.manual_seed(9)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 3))


STATS_NAMES = ["1", "2.1", "3"]


def _stats_expected(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, dict[str, list[float]]]:
    rows = {"means": {n: [] for n in STATS_NAMES}, "stds": {n: [] for n in STATS_NAMES},
            "zeros": {n: [] for n in STATS_NAMES}}
    handles = []
    for name in STATS_NAMES:
        def hook(m, args, out, name=name):
            rows["means"][name].append(out.mean().item())
            rows["stds"][name].append(out.std().item())
            rows["zeros"][name].append((out == 0).float().mean().item())

        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
    return rows


def _stats_outcome(stats, expected: dict) -> Outcome | None:
    """What is wrong with the lists the answer kept, if anything."""
    for field in ("means", "stds", "zeros"):
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
                if not isinstance(value, int | float) or not math.isclose(value, right, rel_tol=1e-4, abs_tol=1e-7):
                    shown = f"{value:.4g}" if isinstance(value, int | float) else kind_of(value)
                    return Outcome(False, f"self.{field}[{name!r}] at call {step}: {shown}, expected {right:.4g} "
                                          "(of the layer's output)")
    return None


@exercise("02.5", "statistics of chosen layers at every step")
def _step_stats(StepStats) -> Outcome:
    """``with StepStats(model, names) as stats:`` any forward passes; ``stats.means[name]``,
    ``stats.stds[name]`` and ``stats.zeros[name]`` get one number per call of that layer."""
    model = _stats_model()
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(16, 5, generator=gen) * scale for scale in (1.0, 3.0, 0.1)]
    expected = _stats_expected(model, batches)
    try:
        stats, wrong = _entered(lambda m: StepStats(m, list(STATS_NAMES)), model,
                                lambda: [model(batch) for batch in batches])
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
    return Outcome(True, "mean, std and share of zeros of each named layer at each of 3 steps, as plain numbers; "
                         "no hook left after the with block")
