"""Exercises and predictions of notebook 06: hooks around training, and ``resume``, the trainer the
lesson may not edit.

``resume(model, optimizer, path)`` stands for a trainer in someone else's package: it reads a
checkpoint file, loads it and trains one epoch in one call, so nothing of the student's runs between
loading and the first step, except a hook. Predictions 06.a-06.e compute their truth with torch. Exercises, in the
order the lesson asks them: a load_state_dict pre-hook that reads old checkpoints (06.1), optimizer
step hooks that measure the update:data ratio (06.2), an optimizer load pre-hook that keeps the
learning rate (06.3), a global forward hook that logs the gradient at every module (06.4),
and which layer created which autograd node (06.5). ``upgrade``, ``watch_updates``, ``keep_lr``,
``grad_logger`` and ``nodes_by_layer`` are worked answers: the lesson goes on with them while the
student's own has not passed. ``saved_by_the_old_code`` (the old code's checkpoint files),
``yours_or_worked`` and ``old_names_cnn`` are the lesson's plumbing, kept here so that its cells show
only what each section is about. The field guide's exercises on the
same hooks are in ``g6.py`` (the firing order) and ``g7.py``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import sys

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from ..hooks import Hooks
from . import Outcome, exercise, kind_of, prediction


# ----- predictions ---------------------------------------------------------------------------------
@prediction("06.a", "how many keys a load pre-hook on model.features finds in its state_dict",
            why="load_state_dict hands each module only the entries whose key starts with its own path, "
                "'features.': the weight and bias of its three convs (features.0, .2 and .5), 6 of the model's 8, "
                "spelled in full",
            wrong=[(8, "the model's state dict holds 8 entries, but a module's hook is handed only those whose key "
                       "starts with its own path, 'features.': head.2's two are not there"),
                   (0, "a module's hook gets its submodules' entries too, spelled in full: 'features.0.weight' "
                       "and the rest, though the Sequential has no tensor of its own"),
                   (2, "2 is what a single layer gets; the Sequential's path 'features.' holds three convs, each "
                       "with a weight and a bias")])
def _keys_seen() -> int:
    from ..models import DigitsCNN

    model, seen = DigitsCNN(), []
    handle = model.features.register_load_state_dict_pre_hook(lambda module, sd, prefix, *rest: seen.append(len(sd)))
    try:
        model.load_state_dict(DigitsCNN(seed=1).state_dict())
    finally:
        handle.remove()
    return seen[0]


def _resnet18() -> nn.Module:
    import torchvision

    with torch.random.fork_rng():  # random weights: only the module tree matters; the caller's stream stays
        return torchvision.models.resnet18()


@prediction("06.d", "how many gradients a global forward hook logs for layer1.0.relu",
            why="a global forward hook runs at every call of a module, and BasicBlock.forward calls self.relu twice: "
                "each call's output gets its own tensor hook, so layer1.0.relu's name is logged twice",
            wrong=[(1, "a hook runs per call, not per module: BasicBlock.forward calls self.relu twice, and each "
                       "call's output gets its own tensor hook"),
                   (0, "a forward hook that only registers tensor hooks wraps nothing: in-place code runs as written, "
                       "and every hooked output gets its gradient"),
                   (4, "each call's output gets one tensor hook, and backward runs it once: one gradient per call")])
def _relu_logged_on_resnet18() -> int:
    model, logged = _resnet18(), []
    with module_hooks.register_module_forward_hook(grad_logger({m: n for n, m in model.named_modules()}, logged)):
        model(torch.randn(1, 3, 64, 64)).sum().backward()
    return sum(name == "layer1.0.relu" for name, _ in logged)


def _lr_or_moments(guess) -> str | None:
    if str(guess).strip().strip("'\"").lower() not in {"lr", "moments", "both", "neither"}:
        return 'answer with one of four words: "lr", "moments", "both" or "neither"'
    return None


_MOMENTS_ARE_A_RATIO = ("Adam's step is lr times a ratio of its two moments, the running average of the "
                        "gradient over the square root of the running average of its square: at most about 1, "
                        "smaller when the gradient is noisy, so the lr bounds every step. The moments saved here "
                        "are one step old: they hold one gradient, as a fresh Adam's do after its first step, and "
                        "resume's gradients soon outweigh them")


@prediction("06.c", "which part of the loaded optimizer state changes the red run's median update:data ratio",
            why="load_state_dict loads the checkpoint's param_groups, and the old run's lr 5e-3 with them. "
                + _MOMENTS_ARE_A_RATIO + "; measured: the moments move head.2's "
                "median by about 0.02 decade, the lr by about 0.6",
            wrong=[("moments", _MOMENTS_ARE_A_RATIO + ". load_state_dict loads the checkpoint's lr with its "
                               "param_groups: that is what moved"),
                   ("both", _MOMENTS_ARE_A_RATIO + ": only one part of the state moved the median"),
                   ("neither", "load_state_dict loads the checkpoint's param_groups, the lr included: our Adam's "
                               "lr is replaced by the old run's")],
            form=_lr_or_moments)
def _cause_of_big_steps() -> str:
    return _measured_cause()


@functools.cache  # three epochs: measured once per process
def _measured_cause() -> str:
    """Resume the old checkpoint (weights and Adam state) at lr 1e-3, with and without keep_lr, against a fresh
    Adam at 1e-3: which part of the loaded state moved the median update:data ratio of head.2 by a tenth of a
    decade or more."""
    import tempfile

    weights, state = _old_run()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/old.pt"
        fresh = _median_head_ratio(1e-3, {"model": weights}, path)
        loaded = _median_head_ratio(1e-3, {"model": weights, "optimizer": state}, path)
        lr_kept = _median_head_ratio(1e-3, {"model": weights, "optimizer": state}, path, keep_lr)
    lr_counts, moments_count = abs(loaded - lr_kept) >= 0.1, abs(lr_kept - fresh) >= 0.1
    return {(True, True): "both", (True, False): "lr", (False, True): "moments"}.get((lr_counts, moments_count),
                                                                                   "neither")


def _old_run() -> tuple[dict, dict]:
    """The weights (under today's key names) and the Adam state the lesson's old training code saved, one
    Adam step at lr 5e-3 past the trained digits CNN."""
    from ..data import digits
    from ..models import trained_digits_cnn

    data, model = digits(), trained_digits_cnn().train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    nn.functional.cross_entropy(model(data.x_train[:32]), data.y_train[:32]).backward()
    optimizer.step()
    return {key: value.detach().clone() for key, value in model.state_dict().items()}, optimizer.state_dict()


def _median_head_ratio(lr: float, checkpoint: dict, path, hook=None) -> float:
    """The median log10 update:data of head.2.weight over resume's epoch from ``checkpoint``, an Adam built at
    ``lr`` carrying ``hook`` as its load pre-hook."""
    from ..models import DigitsCNN

    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    torch.save(checkpoint, path)
    ratios, hooks = watch_updates(model, optimizer)
    with hooks, optimizer.register_load_state_dict_pre_hook(hook or (lambda optimizer, state_dict: None)):
        resume(model, optimizer, path)
    return torch.tensor(ratios["head.2.weight"]).median().item()


@prediction("06.b", "how much higher a fresh Adam's update:data ratio sits at lr 5e-3 than at 1e-3",
            why="Adam divides each gradient by its own running size, so the lr scales its step whatever the "
                "gradient's scale: five times the lr, about five times the update, log10(5) ≈ 0.7 higher (measured: "
                "a little less; any guess within 0.15 of the measured rise passes)",
            wrong=[(5, "5 is the ratio of the steps; the plot's axis is log10, so the band rises by log10(5)"),
                   (4, "the lr is 5 times larger, not 4 larger: in log10, that is log10(5)"),
                   (0, "Adam divides by the gradient's running size, not by the lr: the lr scales every step"),
                   (-0.7, "a larger lr makes larger steps: the band rises, by log10(5)")],
            rel=0.23)  # about ±0.15 around the measured rise, 0.64: log10(5) and 0.75 pass, 0.45 does not
def _band_rise() -> float:
    return _measured_band_rise()


@functools.cache  # one epoch per lr: measured once per process
def _measured_band_rise() -> float:
    import tempfile

    weights, _ = _old_run()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/weights.pt"
        return _median_head_ratio(5e-3, {"model": weights}, path) - _median_head_ratio(1e-3, {"model": weights}, path)


class _AllRowsNorm(nn.Module):
    """Scales each row to length 1, all rows at once: lesson 06 §5's AllRowsNorm."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


@prediction("06.e", "how many autograd nodes AllRowsNorm creates for 32 rows",
            why="forward records one node per operation on tensors that need gradients, whatever their size: "
                "x.norm(dim=1, keepdim=True) is one operation on all 32 rows and the division another, so 2",
            wrong=[(64, "a node is made per operation, not per row: x.norm(dim=1, ...) is one operation on all 32 "
                        "rows, and the division one more"),
                   (32, "a node is made per operation, not per row: the norm of all rows is one operation, the "
                        "division another"),
                   (66, "that is the row-by-row loop's count; AllRowsNorm runs each operation once on all rows"),
                   (1, "two operations run on tensors that need gradients: the norm, then the division"),
                   (3, "keepdim=True only keeps the reduced dimension: no operation of its own, so norm and division"),
                   (0, "x comes from layers with parameters, so it needs gradients, and so does every result "
                       "computed from it: each operation records a node")])
def _nodes_of_all_rows_norm() -> int:
    hidden, created = nn.Linear(8, 8)(torch.randn(32, 8)), []
    with torch.autograd.graph.node_creation_hook(lambda node: created.append(node.name())):
        _AllRowsNorm()(hidden)
    return len(created)


# ----- 06.1: reading old checkpoints -----------------------------------------------------------------
def _checkpoint_model() -> nn.Sequential:
    """Two Linears, at ``0.`` and one level deeper at ``2.0.``, each with a ``batches`` buffer, and at
    ``3.`` a Linear without a bias. The first holds a submodule ``gate`` whose own parameter is named ``W``
    today: its key ``0.gate.W`` reaches the hook on ``0.`` (a module's hook sees its submodules' keys) and
    must stay as it is, so a hook that renames every key ending in ``.W`` fails."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 1)), nn.Linear(1, 2, bias=False))
    for linear in (model[0], model[2][0]):
        linear.register_buffer("batches", torch.zeros((), dtype=torch.long))
    model[0].gate = nn.Module()
    model[0].gate.W = nn.Parameter(torch.randn(3))
    return model


def _touched_other_keys(calls: list) -> Outcome | None:
    """Whether a hook call replaced, removed or added a key other than its Linear's W and b."""
    for prefix, _, touched, _ in calls:
        added = {key for key, before, after in touched if after and not before}
        for key, before, after in touched:
            place, _, name = key.rpartition(".")
            if before and not after and key.startswith(prefix) and name in ("W", "b"):
                verb = "renamed" if {f"{place}.weight", f"{place}.bias"} & added else "removed"
                return Outcome(False, f"the hook {verb} {key!r}, the {name} of a submodule inside the Linear at "
                                      f"{prefix!r}: a layer's state_dict holds its submodules' keys too, so a key "
                                      f"that merely ends in .{name} may not be the layer's own; rename "
                                      f"prefix + {name!r} only")
            verb = "replaced the value of" if before and after else "removed" if before else "added"
            return Outcome(False, f"the hook {verb} {key!r}, which is not its Linear's W or b: leave every "
                                  "other key as it is")
    return None


def _old_checkpoint(source: nn.Module) -> dict:
    """``source``'s state dict as an old checkpoint stored it: a Linear's tensors as ``W`` and ``b``
    (its counters set first, so that loading them is seen)."""
    source[0].batches.fill_(7)
    source[2][0].batches.fill_(9)
    old, old_names = {}, {"weight": "W", "bias": "b"}
    for key, value in source.state_dict().items():
        place, _, name = key.rpartition(".")
        old[f"{place}.{old_names.get(name, name)}"] = value.clone()
    return old


def _failed_load_outcome(error: RuntimeError, calls: list) -> Outcome:
    """Why loading the old checkpoint failed, from PyTorch's error and what each hook call did."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    hint = ""
    if any(returned is not None for _, returned, _, _ in calls):
        hint = " (the hook's return value is ignored: rename the keys of state_dict in place)"
    else:
        for prefix, _, _, left in calls:
            if left:
                key, copied = left[0]
                hint = (f" (the old key {key!r} is still there beside its copy: pop it, "
                        "state_dict[new] = state_dict.pop(old))" if copied else
                        f" (the hook left {key!r}: build every key from prefix, {prefix!r} for that Linear)")
                break
    return Outcome(False, f"loading the old checkpoint failed: {' '.join(lines[1:]) or error}{hint}")


def _call_noting_rebinding(hook, args) -> tuple[object, bool]:
    """Call ``hook(*args)``; also say whether, when it returned, its own name for the state dict (its second
    parameter) held another object than the dict it was handed: a hook that rebinds that name changes nothing
    the caller sees."""
    function = getattr(hook, "__func__", hook)
    code = getattr(function, "__code__", None)
    try:
        name = list(inspect.signature(hook).parameters)[1]
    except (TypeError, ValueError, IndexError):
        code = None
    if code is None:
        return hook(*args), False
    at_return = []

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is code:
            at_return.append(frame.f_locals.get(name, args[1]))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        returned = hook(*args)
    finally:
        sys.setprofile(previous)
    return returned, bool(at_return) and at_return[-1] is not args[1]


@exercise("06.1", "rename old checkpoint keys in a load_state_dict pre-hook")
def _rename_keys(upgrade) -> Outcome:
    """``upgrade`` is a load_state_dict pre-hook for one ``nn.Linear``.

    Old checkpoints stored a Linear's tensors as ``W`` and ``b``; it renames them to ``weight``
    and ``bias`` in place, using ``prefix`` (the Linear's place in the model), and leaves every
    other key alone.
    """
    torch.manual_seed(6)  # on the checker's own random stream (see ``exercise``)
    model, source, fresh = _checkpoint_model(), _checkpoint_model(), _checkpoint_model().state_dict()
    old = _old_checkpoint(source)
    calls = []  # per call: prefix, returned value, other keys it touched, old keys it left
    prefixes, invented, rebound = [], [], []  # every prefix; keys written with no old key; calls that rebound

    def watched(*args):
        state_dict, prefix = args[1], args[2]
        own = {prefix + name for name in ("W", "b", "weight", "bias")}
        others = {key: value for key, value in state_dict.items() if key not in own}
        had = {key for key in own if key in state_dict}
        prefixes.append(prefix)
        returned, rebinds = _call_noting_rebinding(upgrade, args)
        if rebinds:
            rebound.append(prefix)
        for old, new in (("W", "weight"), ("b", "bias")):
            if prefix + new in state_dict and not {prefix + old, prefix + new} & had:
                invented.append((prefix + new, prefix + old))
        touched = sorted(
            key for key in (set(others) | set(state_dict)) - own if state_dict.get(key) is not others.get(key)
        )
        left = [(key, prefix + new in state_dict)
                for key, new in ((prefix + "W", "weight"), (prefix + "b", "bias")) if key in state_dict]
        calls.append((prefix, returned, [(key, key in others, key in state_dict) for key in touched], left))

    with Hooks() as hooks:
        for linear in (model[0], model[2][0], model[3]):
            hooks.add(linear.register_load_state_dict_pre_hook(watched))
        try:
            model.load_state_dict(old)
            error = None
        except NotImplementedError:  # a subclass of RuntimeError: the stub, not a failed load
            raise
        except (RuntimeError, KeyError) as caught:
            error = caught
        wrong = _touched_other_keys(calls)
        if wrong is not None:
            return wrong
        if isinstance(error, KeyError):
            return Outcome(False, f"the hook raised KeyError: {error} for the Linear at {prefixes[-1]!r}: the "
                                  "checkpoint has no such key (a Linear made with bias=False has no b): rename "
                                  "a key only when it is there")
        if invented:
            new, old_key = invented[0]
            return Outcome(False, f"the hook added {new!r}, but the checkpoint has no {old_key!r} (a Linear made "
                                  "with bias=False has no b), so the load fails with Unexpected key: rename a key "
                                  "only when it is there")
        if error is not None and rebound:
            return Outcome(False, "the hook assigned a new dict to its own name state_dict: that rebinds a local "
                                  "variable of the hook and leaves the dict load_state_dict handed it unchanged, "
                                  f"so the Linear at {rebound[0]!r} keeps its old keys and the load fails. Change that "
                                  "dict in place: state_dict[prefix + 'weight'] = state_dict.pop(prefix + 'W')")
        if error is not None:
            return _failed_load_outcome(error, calls)
        for key, value in source.state_dict().items():
            if not torch.equal(model.state_dict()[key], value):
                return Outcome(False, f"{key} was loaded with the wrong values")
        calls.clear()
        try:
            model.load_state_dict(fresh)
        except KeyError as error:
            return Outcome(False, f"the old checkpoint loaded, but a checkpoint with today's names (weight and bias) "
                                  f"failed: the hook raised KeyError: {error} for the Linear at {prefixes[-1]!r}, "
                                  "where only today's names are: rename a key only when it is there")
        except RuntimeError:
            return _touched_other_keys(calls) or Outcome(False, "the old checkpoint loaded, but a checkpoint with "
                                                                "today's names (weight and bias) failed to load")
        wrong = _touched_other_keys(calls)
        if wrong is not None:
            return wrong
    return Outcome(True, "old and new checkpoints both load, into all three Linear layers (at 0., 2.0. and 3., "
                         "the last without a bias), other keys kept, 0.gate.W included")


# ----- 06.4: a global forward hook that logs the gradient at every module ------------------------------
class _AddsInPlace(nn.Module):
    """A block that adds its input to its layer's output in place, as a ResNet block's ``out += identity``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        out = self.linear(x)
        out += x
        return out


def _logging_model() -> nn.Sequential:
    """A frozen first layer (its output needs no grad), an in-place ReLU, an in-place residual add."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4), nn.ReLU(inplace=True), _AddsInPlace(), nn.Linear(4, 1))
    model[0].requires_grad_(False)
    return model


def _run_logged(make_hook, seed: int = 0):
    """Runs the checked model once under ``make_hook(names, logged)`` as a global forward hook, with a module
    outside ``names`` called first. Returns (logged, parameter gradients, what the forward hooks returned)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model, outside, x = _logging_model(), nn.Tanh(), torch.randn(5, 3)
    names, logged, returned = {module: name for name, module in model.named_modules()}, [], []
    hook = make_hook(names, logged)

    def hook_and_note(module, args, output):
        value = hook(module, args, output)
        if value is not None and value is not output:  # returning output itself changes nothing: accepted
            returned.append(value)

    with module_hooks.register_module_forward_hook(hook_and_note):
        outside(torch.zeros(2, 4, requires_grad=True)).sum().backward()  # another model's: the hook sees it too
        model(x).sum().backward()
    return logged, [p.grad for p in model.parameters() if p.requires_grad], returned


@exercise("06.4", "log the gradient reaching every module's output with a global forward hook")
def _grad_logger(grad_logger) -> Outcome:
    """``grad_logger(names, logged)`` returns a forward hook that, for a module in ``names`` whose output
    requires grad, registers a tensor hook on the output appending ``(name, grad.norm().item())``."""
    want, want_grads, _ = _run_logged(_reference_logger)
    try:
        got, grads, returned = _run_logged(grad_logger)
    except KeyError as error:
        return Outcome(False, f"your hook raised KeyError {error}: a global hook runs for every module in the "
                              "process, also those of other models; skip a module that is not in names")
    except NotImplementedError:
        raise  # the stub: reported as not solved yet
    except RuntimeError as error:
        if "does not require grad" in str(error) or "doesn't require grad" in str(error):
            return Outcome(False, "a tensor hook went on an output that does not require grad (layer '0' is frozen "
                                  f"and its input needs no grad): check output.requires_grad first ({error})")
        return Outcome(False, f"the model failed under your hook: {type(error).__name__}: {error}")
    if returned:
        what = (f"a new tensor ({_tensor_slip(returned[0])})" if isinstance(returned[0], torch.Tensor)
                else _describe(returned[0]))
        return Outcome(False, f"your forward hook returned {what}, which replaces the module's output: return None "
                              "(returning output itself, unchanged, passes too)")
    if not all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True)):
        return Outcome(False, "the parameters' gradients changed under your hook: the tensor hook must return "
                              "None (only read grad)")
    stranger = next((e for e in got if isinstance(e, tuple) and e and e[0] not in {n for n, _ in want}), None) \
        if isinstance(got, list) else None
    if stranger is not None:
        return Outcome(False, f"you logged {stranger[0]!r} for a module that is not in names (another model's): a "
                              "global hook sees every module in the process; skip one that is not in names")
    if not isinstance(got, list) or len(got) != len(want):
        return Outcome(False, f"logged {len(got) if isinstance(got, list) else got!r} entries, expected {len(want)}: "
                              f"one per call of a module in names whose output requires grad, {[n for n, _ in want]}")
    for (name, norm), entry in zip(want, got, strict=True):
        if not isinstance(entry, tuple) or len(entry) != 2 or entry[0] != name:
            return Outcome(False, f"logged {entry!r} where ({name!r}, norm) was expected, in the order backward "
                                  f"reaches the outputs: {[n for n, _ in want]}")
        if not isinstance(entry[1], float):
            return Outcome(False, f"for {name!r} you logged {kind_of(entry[1])}: append a float, grad.norm().item()")
        if not math.isclose(entry[1], norm, rel_tol=1e-5):
            return Outcome(False, f"for {name!r} you logged {entry[1]:.4f}, the norm of the gradient reaching its "
                                  f"output is {norm:.4f}: hook the output, not an input")
    return Outcome(True, f"every module's output logged in backward's order, {[n for n, _ in want]}, through an "
                         "in-place ReLU and an in-place add; a frozen layer and another model's module skipped")


def _tensor_slip(value: torch.Tensor) -> str:
    """What a forward hook that returned a tensor other than ``output`` may have done, in the student's words."""
    if not value.requires_grad:
        return "it needs no grad, as output.detach() does, so no gradient would flow back through that module"
    return "a copy such as output.clone(), not output itself"


def _describe(value) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"a {type(value).__name__}"


# ----- 06.2: the update:data ratio from step hooks ------------------------------------------------
_OPTIMIZERS = (
    ("Adam (lr 0.01)", lambda params: torch.optim.Adam(params, lr=0.01)),
    ("SGD with momentum 0.9 (lr 0.1)", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)),
)
_STEPS = 3


def _ratio_model() -> nn.Sequential:
    torch.manual_seed(63)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _log_ratio(after: torch.Tensor, before: torch.Tensor) -> float:
    return ((after - before).std() / before.std()).log10().item()


def _remove(hooks) -> None:
    """Remove what the answer handed back: a Hooks owner, a handle, or a list or tuple of handles."""
    if isinstance(hooks, (list, tuple)):
        for handle in hooks:
            handle.remove()
    else:
        hooks.remove()


def _train_and_measure(watch_updates, make_optimizer):
    """Runs _STEPS steps with the answer's hooks; returns (answer's result, expected ratios, lr·grad ratios,
    log10 of the norm ratios, model, optimizer, batch)."""
    model = _ratio_model()
    optimizer = make_optimizer(model.parameters())
    weights = {name: p for name, p in model.named_parameters() if p.ndim > 1}
    expected, formula, after, norms = ({name: [] for name in weights} for _ in range(4))
    lr = optimizer.param_groups[0]["lr"]
    result = watch_updates(model, optimizer)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    for _ in range(_STEPS):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        before = {name: p.detach().clone() for name, p in weights.items()}
        optimizer.step()
        for name, p in weights.items():
            expected[name].append(_log_ratio(p.detach(), before[name]))
            formula[name].append(((lr * p.grad).std() / before[name].std()).log10().item())
            after[name].append(((lr * p.grad).std() / p.detach().std()).log10().item())  # lr·grad over std(w after)
            norms[name].append(((p.detach() - before[name]).norm() / before[name].norm()).log10().item())
    return result, expected, (formula, after), norms, model, optimizer, (x, y)


def _close(got, want, tolerance: float = 1e-4) -> bool:
    return len(got) == len(want) and all(
        isinstance(g, (int, float)) and math.isfinite(g) and abs(g - w) <= tolerance * max(1.0, abs(w))
        for g, w in zip(got, want, strict=True))


_WITHIN = 0.01  # log10 units: dividing by std(w after the step) instead of before differs by less here


def _wrong_ratios(name: str, got: list, expected: list, formula: tuple, norms: list, label: str) -> Outcome:
    """Why ``got`` (the answer's ratios of one weight) is not ``expected``: the slip, in words. ``formula``
    holds lr·grad's ratios over std(w before) and over std(w after)."""
    if len(got) != len(expected):
        return Outcome(False, f"ratios[{name!r}] has {len(got)} entries after {_STEPS} steps of {label}: append one "
                              "per step, in the post-hook")
    if any(not isinstance(g, (int, float)) for g in got):
        return Outcome(False, f"ratios[{name!r}] holds {kind_of(got[0])} entries: append plain floats (.item())")
    if any(g == -math.inf or g != g for g in got):
        return Outcome(False, f"ratios[{name!r}] is {got}: the weights before and after the step looked equal. "
                              "p.detach() shares memory with p, and step() changes p in place: keep p.detach().clone()")
    if any(_close(got, f) for f in formula):
        return Outcome(False, f"with {label}, your ratios are those of lr · grad, the step of plain SGD: compare the "
                              "weights before and after step() instead")
    if _close(got, norms):
        return Outcome(False, f"ratios[{name!r}] looks like log10 of |Δw| / |w| as norms: use the stds, "
                              "log10(std(Δw) / std(w before)), as lesson 03 did")
    if _close([g / math.log(10) for g in got], expected, _WITHIN):
        return Outcome(False, f"ratios[{name!r}] holds natural logs, {[round(g, 4) for g in got]}, "
                              f"{math.log(10):.3f} times log10's: torch.log and math.log are ln; use "
                              "torch.log10 or math.log10, as the −3 rule of thumb is in log10")
    if _close([g / math.log(2) for g in got], expected, _WITHIN):
        return Outcome(False, f"ratios[{name!r}] holds log2 values: use torch.log10 or math.log10, as the −3 rule "
                              "of thumb is in log10")
    if all(g > 0 for g in got) and _close([math.log10(g) for g in got], expected):
        return Outcome(False, f"ratios[{name!r}] holds the ratios themselves: append their log10")
    return Outcome(False, f"with {label}, ratios[{name!r}] is {[round(g, 4) for g in got]}, expected "
                          f"{[round(e, 4) for e in expected]}: log10(std(w after − w before) / std(w before)) per step")


@exercise("06.2", "the update:data ratio of every step, from optimizer step hooks")
def _watch_updates(watch_updates) -> Outcome:
    """``watch_updates(model, optimizer) -> (ratios, hooks)``: ``ratios[name]`` gets log10(std(Δw) /
    std(w before)) of every weight (``p.ndim > 1``) at every ``optimizer.step()``, from a step pre-hook
    that copies the weights and a step post-hook that compares; removing ``hooks`` stops it."""
    for label, make_optimizer in _OPTIMIZERS:
        try:
            result, expected, formula, norms, model, optimizer, (x, y) = _train_and_measure(watch_updates,
                                                                                            make_optimizer)
        except ValueError as error:
            if "math domain error" not in str(error):
                raise
            return Outcome(False, f"with {label}, log10 got 0: the weights before and after the step looked equal. "
                                  "p.detach() shares memory with p, and step() changes p in place: keep "
                                  "p.detach().clone()")
        if not isinstance(result, tuple) or len(result) != 2:
            return Outcome(False, f"return (ratios, hooks), not {kind_of(result)}")
        ratios, hooks = result
        if not isinstance(ratios, dict):
            return Outcome(False, f"ratios must be a dict from weight name to a list, not {kind_of(ratios)}")
        extra = sorted(set(ratios) - set(expected))
        if extra:
            biases = [name for name in extra if name.endswith("bias")]
            what = "watch the weights only (p.ndim > 1)" if biases else "use the names of model.named_parameters()"
            return Outcome(False, f"ratios has {extra[0]!r}: {what}; expected {sorted(expected)}")
        missing = sorted(set(expected) - set(ratios))
        if missing:
            return Outcome(False, f"ratios has no {missing[0]!r}: one list per weight of model.named_parameters() "
                                  f"(p.ndim > 1), expected {sorted(expected)}")
        for name, want in expected.items():
            got = list(ratios[name])
            if _close(got, want):
                continue
            slip = _wrong_ratios(name, got, want, tuple(f[name] for f in formula), norms[name], label)
            if "expected" not in slip.detail or not _close(got, want, _WITHIN):
                return slip
        try:
            _remove(hooks)
        except (AttributeError, TypeError):
            return Outcome(False, f"hooks must be a hooklab.Hooks or a list of the handles, not {kind_of(hooks)}")
        pre_hooks_left = len(optimizer._optimizer_step_pre_hooks)
        if pre_hooks_left:
            return Outcome(False, f"after your hooks were removed, {pre_hooks_left} step pre-hook(s) still ran before "
                                  "every step (each cloning every weight): add the pre-hook's handle to hooks too")
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if any(len(ratios[name]) != _STEPS for name in expected):
            return Outcome(False, "after your hooks were removed, a step still added to ratios: hooks must hold both "
                                  "handles, the pre-hook's and the post-hook's")
    return Outcome(True, f"the ratio of both weights at each of {_STEPS} steps, with Adam and with SGD with momentum, "
                         f"measured from the weights themselves (within {_WITHIN} in log10, so std(w) before or after "
                         "the step both pass); removing the hooks stops it")


# ----- 06.3: keep the new learning rate when loading an optimizer's checkpoint ----------------------
def _sgd(lrs, momentum, seed):
    torch.manual_seed(seed)
    params = [nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2))]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, lrs, strict=True)]
    return params, torch.optim.SGD(groups, momentum=momentum, weight_decay=1e-3)


def _old_sgd_checkpoint() -> dict:
    """The state dict of an SGD with two groups (lr 0.1 and 0.05, momentum 0.8) after one step: it holds
    a momentum buffer per parameter."""
    params, old = _sgd((0.1, 0.05), 0.8, seed=64)
    for p in params:
        p.grad = torch.ones_like(p)
    old.step()
    return old.state_dict()


@exercise("06.3", "keep the new learning rate when loading an optimizer's checkpoint")
def _keep_lr(keep_lr) -> Outcome:
    """``keep_lr(optimizer, state_dict)`` is an optimizer load_state_dict pre-hook: everything of the
    checkpoint is loaded except each group's ``lr``, which stays the optimizer's own. Returning new groups
    passes; editing the checkpoint's groups in place fails: the hook's state_dict is a shallow copy, so the
    check loads the same checkpoint a second time, without the hook, and names the changed lr."""
    checkpoint = _old_sgd_checkpoint()
    untouched = copy.deepcopy(checkpoint)
    params, optimizer = _sgd((0.01, 0.002), 0.9, seed=65)
    returned = []

    def watched(optimizer, state_dict):
        result = keep_lr(optimizer, state_dict)
        returned.append(result)
        return result if result is None or isinstance(result, dict) else None

    with optimizer.register_load_state_dict_pre_hook(watched):
        optimizer.load_state_dict(checkpoint)
    if returned and returned[0] is not None and not isinstance(returned[0], dict):
        return Outcome(False, f"the hook returned {kind_of(returned[0])}: return None (having edited the state_dict "
                              "it got) or the state dict to load")
    for i, (group, want) in enumerate(zip(optimizer.param_groups, (0.01, 0.002), strict=True)):
        if group["lr"] != want:
            source = "the checkpoint's" if group["lr"] == untouched["param_groups"][i]["lr"] else "neither"
            return Outcome(False, f"after loading, group {i}'s lr is {group['lr']} ({source}): keep the optimizer's "
                                  f"own, {want}, in every group of optimizer.param_groups")
        if group["momentum"] != 0.8:
            return Outcome(False, f"after loading, group {i}'s momentum is {group['momentum']}, the optimizer's own: "
                                  "take everything but lr from the checkpoint (the checkpoint's momentum is 0.8)")
    for p, old_state in zip(params, untouched["state"].values(), strict=True):
        buffer = optimizer.state.get(p, {}).get("momentum_buffer")
        if buffer is None or not torch.equal(buffer, old_state["momentum_buffer"]):
            return Outcome(False, "the checkpoint's momentum buffers were not loaded: keep its 'state', and build "
                                  "each group from the checkpoint's group (its 'params' are numbers), changing only lr")
    again = _sgd((0.01, 0.002), 0.9, seed=65)[1]
    again.load_state_dict(checkpoint)  # the same dict once more, without the hook: it must load as saved
    for i, (group, saved) in enumerate(zip(again.param_groups, untouched["param_groups"], strict=True)):
        if group["lr"] != saved["lr"]:
            return Outcome(False, f"loading the same checkpoint again, without your hook, gave group {i} lr "
                                  f"{group['lr']}, not the saved {saved['lr']}: your hook changed the caller's "
                                  "checkpoint. The state_dict it gets is a shallow copy, so its groups are the "
                                  "caller's: build new groups instead of editing them in place")
    return Outcome(True, "both groups keep their own lr (0.01 and 0.002); the checkpoint's momentum 0.8 and its "
                         "momentum buffers are loaded, and the checkpoint itself is left as it was")


# ----- 06.5: which layer created which node ---------------------------------------------------------
def _leaf_modules(model: nn.Module) -> dict[nn.Module, str]:
    return {module: name for name, module in model.named_modules() if name and not list(module.children())}


def nodes_by_layer(model: nn.Module, x: torch.Tensor) -> dict[str, list[str]]:
    """What 06.5 asks for: a stack of running layers (forward pre-hooks push, forward hooks pop) and a
    node-creation hook that files each new node under the layer on top."""
    running, found = [], {name: [] for name in _leaf_modules(model).values()}

    def enter(module, args):
        running.append(_leaf_modules(model)[module])

    def leave(module, args, output):
        running.pop()

    def created(node):
        if running:
            found[running[-1]].append(node.name())

    with Hooks() as hooks, torch.autograd.graph.node_creation_hook(created):
        for module in _leaf_modules(model):
            hooks.add(module.register_forward_pre_hook(enter))
            hooks.add(module.register_forward_hook(leave, always_call=True))
        model(x)
    return found


class _Residual(nn.Module):
    """Operations between its layers: the add and the sum run in its own forward, after the ReLU has
    returned, so no layer created their nodes."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 3), nn.ReLU())

    def forward(self, x):
        return (x + self.body(x)).sum(1)


def _node_models():
    torch.manual_seed(0)
    yield "nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))", nn.Sequential(
        nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), torch.randn(5, 3)
    frozen = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2), nn.Sigmoid()))
    frozen[0].requires_grad_(False)
    yield "a model whose first Linear is frozen, with a nested Sequential", frozen, torch.randn(5, 3)
    yield "x + body(x) summed, a residual model that adds and sums after its last layer", _Residual(), torch.randn(5, 3)


@exercise("06.5", "which layer created which autograd node")
def _nodes_by_layer(nodes_by_layer) -> Outcome:
    """``nodes_by_layer(model, x) -> {leaf module name: [node.name(), ...]}``: the autograd nodes
    created while each leaf module's forward ran (in creation order), for one ``model(x)``, with
    every hook removed afterwards."""
    from ..audit import clear_hooks

    for label, model, x in _node_models():
        expected = _reference(model, x)
        try:
            got = nodes_by_layer(model, x)
        except TypeError as error:
            clear_hooks(model)
            if "must be Tensor" not in str(error):
                raise
            return Outcome(False, f"on {label}, a layer got a {str(error).rsplit('not ', 1)[-1]} instead of a tensor: "
                                  "your forward hook returned a value, and a forward hook's return value replaces the "
                                  "output; return None")
        left = clear_hooks(model)
        if left:
            return Outcome(False, f"on {label}, your hooks stayed registered ({left[0]}): remove them (a Hooks "
                                  "owner, a with block or a finally)")
        if not isinstance(got, dict):
            return Outcome(False, f"return a dict from layer name to a list of node names, not {type(got).__name__}")
        if set(got) != set(expected):
            return Outcome(False, f"on {label}: the keys are {sorted(got)}, expected every leaf module's name "
                                  f"{sorted(expected)} (named_modules(), modules without children)")
        for name, nodes in expected.items():
            if list(got[name]) != nodes:
                extra = list(got[name])[len(nodes):] if list(got[name])[:len(nodes)] == nodes else []
                why = (f": {extra} were created after that layer had returned; a forward hook marks where a layer "
                       "ends" if extra else "")
                return Outcome(False, f"on {label}, layer {name!r}: {list(got[name])}, expected {nodes} "
                                      f"(node.name() of each node the hook saw while that layer ran, in order){why}")
        if label.startswith("a model whose"):
            counts = {name: len(nodes) for name, nodes in expected.items()}
    return Outcome(True, f"all three models right; the frozen one's node counts per layer: {counts}")


_reference = nodes_by_layer  # the checker's own copy: its argument is called nodes_by_layer too


# ----- the trainer the lesson may not edit ------------------------------------------------------------
def resume(model: nn.Module, optimizer: torch.optim.Optimizer, path, seed: int = 0) -> list[float]:
    """Read the checkpoint file at ``path``; load its ``"model"`` into ``model`` and, when there is one,
    its ``"optimizer"`` into ``optimizer``; then train one epoch over the training digits, batches of 32
    in the order ``seed`` draws. Returns the loss of every step."""
    from ..data import digits

    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    if "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    data, losses = digits(), []
    order = torch.randperm(len(data.y_train), generator=torch.Generator().manual_seed(seed))
    model.train()
    for batch in order.split(32):
        loss = nn.functional.cross_entropy(model(data.x_train[batch]), data.y_train[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ----- worked answers: the lesson goes on with these while the student's own have not passed -----
def upgrade(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """A worked answer to 06.1."""
    for old, new in (("W", "weight"), ("b", "bias")):
        if prefix + old in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)


def watch_updates(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, list[float]], Hooks]:
    """A worked answer to 06.2."""
    weights = {name: p for name, p in model.named_parameters() if p.ndim > 1}
    ratios, before, hooks = {name: [] for name in weights}, {}, Hooks()

    def keep(optimizer, args, kwargs):
        before.update({name: p.detach().clone() for name, p in weights.items()})

    def compare(optimizer, args, kwargs):
        for name, p in weights.items():
            ratios[name].append(_log_ratio(p.detach(), before[name]))

    hooks.add(optimizer.register_step_pre_hook(keep))
    hooks.add(optimizer.register_step_post_hook(compare))
    return ratios, hooks


def keep_lr(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """A worked answer to 06.3."""
    pairs = zip(state_dict["param_groups"], optimizer.param_groups, strict=True)
    return {**state_dict, "param_groups": [{**saved, "lr": group["lr"]} for saved, group in pairs]}


def grad_logger(names: dict, logged: list):
    """A worked answer to 06.4."""

    def hook(module, args, output):
        if module in names and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad, name=names[module]: logged.append((name, grad.norm().item())))

    return hook


_reference_logger = grad_logger  # the checker's own copy: its argument is called grad_logger too


# ----- the lesson's plumbing: so that its cells show only what each section is about -------------------
_WORKED = {"06.1": upgrade, "06.2": watch_updates, "06.3": keep_lr, "06.4": grad_logger, "06.5": nodes_by_layer}


_IDS = {"upgrade": "06.1", "watch_updates": "06.2", "keep_lr": "06.3", "grad_logger": "06.4",
        "nodes_by_layer": "06.5"}


def yours_or_worked(names: dict, *wanted: str):
    """``hooklab.exercises.yours_or_worked`` for this lesson: ``"upgrade"``, ``"watch_updates"`` ... (06.1-06.5),
    the student's once passed, else the worked answers."""
    from . import yours_or_worked as pick

    return pick(names, {name: (id, _WORKED[id]) for name, id in _IDS.items()}, *wanted)


def saved_by_the_old_code(folder, new_head: bool = False) -> tuple[str, str]:
    """The old training code's two files, written in ``folder``: the trained digits CNN one Adam step (lr 5e-3)
    further on, its keys named ``W`` and ``b``; first the checkpoint (weights and Adam's state), then the
    weights alone. ``new_head=True``: head.2, the last Linear, freshly initialised (``DigitsCNN(seed=1)``'s)."""
    import os

    from ..data import digits
    from ..models import DigitsCNN, trained_digits_cnn

    data, model = digits(), trained_digits_cnn().train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    nn.functional.cross_entropy(model(data.x_train[:32]), data.y_train[:32]).backward()
    optimizer.step()
    weights, fresh = model.state_dict(), DigitsCNN(seed=1).state_dict()
    if new_head:
        weights = {key: fresh[key] if key.startswith("head.2.") else value for key, value in weights.items()}
    old_names = {"weight": "W", "bias": "b"}
    old = {}
    for key, value in weights.items():
        place, _, name = key.rpartition(".")
        old[f"{place}.{old_names[name]}"] = value.detach().clone()
    stem = os.path.join(folder, "new_head" if new_head else "old")
    torch.save({"model": old, "optimizer": optimizer.state_dict()}, f"{stem}.pt")
    torch.save({"model": old}, f"{stem}_weights.pt")
    return f"{stem}.pt", f"{stem}_weights.pt"


def upgrade_check_model() -> nn.Module:
    """The model 06.1's check builds (its three Linears get the student's hook): the first holds a submodule
    ``gate`` whose parameter is named ``W`` today. Leaves the global random stream as it was."""
    with torch.random.fork_rng():
        return _checkpoint_model()


def old_names_cnn(hook=upgrade) -> nn.Module:
    """A new digits CNN with the load pre-hook ``hook`` (06.1) on every conv and linear layer, so that it
    loads the old checkpoint's ``W`` and ``b``."""
    from ..models import DigitsCNN

    model = DigitsCNN()
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            layer.register_load_state_dict_pre_hook(hook)
    return model
