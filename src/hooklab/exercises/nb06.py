"""Exercises of notebook 06, numbered in the order the notebook asks them: state-dict hooks (06.1),
a registration hook that makes in-place modules safe for global hooks (06.2), optimizer hooks
(06.3), the firing order (06.4), and which layer created which autograd node (06.5)."""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from ..hooks import Hooks
from . import Outcome, compare_tensors, exercise, hint_for

#: the hooks of exercise 06.4, shuffled: one nn.Linear carries them, registered as the notebook shows
ORDER_KINDS = (
    "backward hook G",
    "pre-hook B (prepend)",
    "forward hook D",
    "tensor hook J",
    "global forward hook E",
    "backward pre-hook I (prepend)",
    "pre-hook A",
    "forward hook F (prepend)",
    "backward pre-hook H",
    "pre-hook C (prepend)",
)

#: the order in which they fire. A constant, so that the check registers no hook and works in any
#: kernel; a test runs the registration code of the notebook's exercise text and measures it again
_FIRING_ORDER = (
    "pre-hook C (prepend)",
    "pre-hook B (prepend)",
    "pre-hook A",
    "global forward hook E",
    "forward hook F (prepend)",
    "forward hook D",
    "backward pre-hook I (prepend)",
    "backward pre-hook H",
    "tensor hook J",
    "backward hook G",
)


def _checkpoint_model() -> nn.Sequential:
    """Two Linears, at ``0.`` and one level deeper at ``2.0.``, each with a ``batches`` buffer."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 1)))
    for linear in (model[0], model[2][0]):
        linear.register_buffer("batches", torch.zeros((), dtype=torch.long))
    return model


def _touched_other_keys(calls: list) -> Outcome | None:
    """Whether a hook call replaced, removed or added a key other than its Linear's W and b."""
    for _, _, touched, _ in calls:
        for key, before, after in touched:
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
                hint = f" (the hook left {left[0]!r}: build every key from prefix, {prefix!r} for that Linear)"
                break
    return Outcome(False, f"loading the old checkpoint failed: {' '.join(lines[1:]) or error}{hint}")


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

    def watched(*args):
        state_dict, prefix = args[1], args[2]
        own = {prefix + name for name in ("W", "b", "weight", "bias")}
        others = {key: value for key, value in state_dict.items() if key not in own}
        returned = upgrade(*args)
        touched = sorted(
            key for key in (set(others) | set(state_dict)) - own if state_dict.get(key) is not others.get(key)
        )
        left = [key for key in (prefix + "W", prefix + "b") if key in state_dict]
        calls.append((prefix, returned, [(key, key in others, key in state_dict) for key in touched], left))

    with Hooks() as hooks:
        hooks.add(model[0].register_load_state_dict_pre_hook(watched))
        hooks.add(model[2][0].register_load_state_dict_pre_hook(watched))
        try:
            model.load_state_dict(old)
            error = None
        except NotImplementedError:  # a subclass of RuntimeError: the stub, not a failed load
            raise
        except RuntimeError as caught:
            error = caught
        wrong = _touched_other_keys(calls)
        if wrong is not None:
            return wrong
        if error is not None:
            return _failed_load_outcome(error, calls)
        for key, value in source.state_dict().items():
            if not torch.equal(model.state_dict()[key], value):
                return Outcome(False, f"{key} was loaded with the wrong values")
        calls.clear()
        try:
            model.load_state_dict(fresh)
        except RuntimeError:
            return _touched_other_keys(calls) or Outcome(False, "a checkpoint with today's key names no longer loads")
        wrong = _touched_other_keys(calls)
        if wrong is not None:
            return wrong
    return Outcome(True, "old and new checkpoints both load, into both Linear layers (at 0. and 2.0.), other keys kept")


def _is_args_kwargs(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict)


def _unclipped_outcome(big: torch.Tensor, small: torch.Tensor) -> Outcome:
    """The step did not clip the gradient of norm 5: say where it moved the weight, and whether the
    answer clipped by the total norm."""
    scale_big = big.detach().norm().item() / 5
    scale_small = (torch.ones(3) - small.detach()).norm().item() / 0.3
    hint = ""
    if scale_big < 0.999 and abs(scale_big - scale_small) < 1e-4:
        hint = ": clip each parameter by its own norm, not the total norm"
    return Outcome(
        False, f"the large gradient (norm 5) was not clipped to norm 1: the step moved the weight from "
        f"[0, 0] to [{big[0]:.4g}, {big[1]:.4g}], not [-0.6, -0.8]{hint}"
    )


@exercise("06.3", "clip each gradient in an optimizer step pre-hook")
def _clip_in_pre_hook(clip) -> Outcome:
    """``clip(optimizer, args, kwargs)`` scales each parameter's gradient so its norm is at most 1."""
    big = nn.Parameter(torch.zeros(2))
    small = nn.Parameter(torch.ones(3))
    idle = nn.Parameter(torch.ones(2))  # no gradient: .grad is None
    wide = nn.Parameter(torch.zeros(4))
    big.grad = torch.tensor([3.0, 4.0])  # norm 5: must be scaled to norm 1
    small.grad = torch.tensor([0.2, -0.2, 0.1])  # norm 0.3: must stay as it is
    wide.grad = torch.tensor([0.0, 2.0, 0.0, 0.0])  # norm 2, in the second group: must be scaled to norm 1
    optimizer = torch.optim.SGD([{"params": [big, small]}, {"params": [idle, wide]}], lr=1.0)
    returned = []

    def watched(optimizer, args, kwargs):
        result = clip(optimizer, args, kwargs)
        if result is None or _is_args_kwargs(result):
            return result
        returned.append(type(result).__name__)
        return None

    handle = optimizer.register_step_pre_hook(watched)
    try:
        optimizer.step()
    except (AttributeError, TypeError) as error:
        return hint_for(error, {"NoneType": "the hook failed on a parameter without a gradient (its .grad is None): "
                                            "skip such parameters"})
    finally:
        handle.remove()
    if returned:
        return Outcome(False, f"the hook returned a {returned[0]}: a step pre-hook must return None (or (args, "
                              "kwargs))")
    expected_big = torch.tensor([-0.6, -0.8])
    expected_small = torch.ones(3) - torch.tensor([0.2, -0.2, 0.1])
    if not torch.allclose(big.detach(), expected_big, atol=1e-6):
        return _unclipped_outcome(big, small)
    if not torch.allclose(wide.detach(), torch.tensor([0.0, -1.0, 0.0, 0.0]), atol=1e-6):
        return Outcome(False, f"the large gradient (norm 2) in the second parameter group was not clipped to norm 1 "
                              f"(the step moved that weight by {wide.detach().norm():.4g}): clip the parameters of "
                              "every group in optimizer.param_groups")
    outcome = compare_tensors(small.detach(), expected_small)
    if not outcome.passed:
        return Outcome(False, f"a gradient already below norm 1 was changed ({outcome.detail})")
    if not torch.equal(idle.detach(), torch.ones(2)):
        return Outcome(False, "a parameter without a gradient was moved by the step: leave it alone")
    return Outcome(True, "gradients of norm 5 and 2 (in two parameter groups) clipped to 1; a gradient of norm 0.3 "
                         "and a missing one left alone")


def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"a {type(value).__name__}"


def _in_place_cases():
    """Modules with an ``inplace`` flag set, each with the settings a copy must keep."""
    return [
        (nn.ReLU(inplace=True), {}),
        (nn.LeakyReLU(0.2, inplace=True), {"negative_slope": 0.2}),
        (nn.Hardtanh(-2.0, 3.0, inplace=True), {"min_val": -2.0, "max_val": 3.0}),
        (nn.Dropout(0.3, inplace=True), {"p": 0.3}),
    ]


def _one_module(out_of_place, submodule: nn.Module, settings: dict) -> Outcome | None:
    """What the hook made of one in-place module, as a failed Outcome, or None when right."""
    kind = type(submodule).__name__
    answer = out_of_place(nn.Sequential(), "0", submodule)
    if isinstance(answer, type):
        return Outcome(False, f"for an nn.{kind} the hook returned the class {answer.__name__}: return a module "
                              "(or None to keep the one being registered)")
    result = submodule if answer is None else answer
    if not isinstance(result, nn.Module) or type(result) is not type(submodule):
        return Outcome(False, f"for an nn.{kind}(inplace=True) the hook returned {_describe(answer)}: keep the "
                              f"module's type, an nn.{kind} that is not in-place")
    if getattr(result, "inplace", None) is not False:
        return Outcome(False, f"for an nn.{kind}(inplace=True) the module that gets registered is still in-place: "
                              "set inplace = False on it (or on a copy you return)")
    for setting, value in settings.items():
        if getattr(result, setting, None) != value:
            return Outcome(False, f"the nn.{kind}'s {setting} was {value}, the registered one has "
                                  f"{getattr(result, setting, None)}: keep every other setting (copy.copy(submodule) "
                                  "copies them; a new module starts from the defaults)")
    return None


def _runs_with_a_global_backward_hook(out_of_place) -> Outcome | None:
    """Builds danger 1's kind of model under the hook, then runs it with a full backward hook on
    every module, as a global one would add."""
    handle = module_hooks.register_module_module_registration_hook(out_of_place)
    try:
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Sequential(nn.Linear(3, 3),
                              nn.LeakyReLU(0.1, inplace=True)), nn.Linear(3, 1))
    finally:
        handle.remove()
    left = [name for name, m in model.named_modules() if getattr(m, "inplace", False)]
    if left:
        return Outcome(False, f"built under the hook, the model still has in-place modules at {left}")
    with Hooks() as hooks:  # what a global full backward hook does, without touching the process's globals
        for module in model.modules():
            hooks.add(module.register_full_backward_hook(_no_change))
        try:
            model(torch.randn(4, 3, requires_grad=True)).sum().backward()
        except RuntimeError as error:
            return Outcome(False, f"with a full backward hook on every module the model failed: {error}")
    return None


def _no_change(module, grad_input, grad_output):
    return None


@exercise("06.2", "make in-place modules safe for global hooks with a registration hook")
def _out_of_place(out_of_place) -> Outcome:
    """``out_of_place(module, name, submodule)`` makes every module with ``inplace=True`` (ReLU,
    LeakyReLU, Hardtanh, Dropout, ...) a copy of itself that is not in-place, keeping its other
    settings, and returns None for every other module."""
    for submodule, settings in _in_place_cases():
        failed = _one_module(out_of_place, submodule, settings)
        if failed:
            return failed
    for other in (nn.ReLU(), nn.Linear(2, 2), nn.Tanh()):
        answer = out_of_place(nn.Sequential(), "0", other)
        if answer is not None:
            return Outcome(False, f"for an nn.{type(other).__name__} that is not in-place the hook returned "
                                  f"{_describe(answer)}: return None, which keeps it as it is")
    return _runs_with_a_global_backward_hook(out_of_place) or Outcome(
        True, "ReLU, LeakyReLU, Hardtanh and Dropout made out-of-place with their settings kept, other modules "
              "left alone; a model built under the hook runs backward with a full backward hook on every module")


def _quoted(items) -> str:
    return ", ".join(repr(item) if isinstance(item, str) else f"a {type(item).__name__}" for item in items)


@exercise("06.4", "predict the firing order for one layer")
def _predict_order(prediction) -> Outcome:
    """``prediction`` lists the hooks of ``ORDER_KINDS`` in the order they fire on the exercise's Linear.

    A wrong order is told how many hooks are in the right place and one neighbouring pair that is
    the wrong way round, never which hook belongs at a position.
    """
    n = len(ORDER_KINDS)
    if not isinstance(prediction, (list, tuple)):
        return Outcome(False, f"give a list of the {n} strings of ORDER_KINDS, not {_describe(prediction)}")
    prediction = list(prediction)
    unknown = [item for item in prediction if not isinstance(item, str) or item not in ORDER_KINDS]
    letters = {kind.removesuffix(" (prepend)")[-1] for kind in ORDER_KINDS}
    if any(isinstance(item, str) and item.strip().upper() in letters for item in unknown):
        return Outcome(False, "use the full strings of ORDER_KINDS, e.g. 'pre-hook A', not letters alone")
    by_case = {" ".join(kind.casefold().split()): kind for kind in ORDER_KINDS}
    near = [(item, by_case[" ".join(item.casefold().split())]) for item in unknown
            if isinstance(item, str) and " ".join(item.casefold().split()) in by_case]
    if near:
        return Outcome(False, f"use the strings of ORDER_KINDS exactly as they are written (case and spaces count), "
                              f"e.g. {near[0][1]!r}, not {near[0][0]!r}")
    missing = [kind for kind in ORDER_KINDS if kind not in prediction]
    twice = [kind for kind in ORDER_KINDS if prediction.count(kind) > 1]
    if unknown or missing or twice:
        problems = [
            f"{label}: {_quoted(items)}"
            for label, items in (("not a hook of the list", unknown), ("missing", missing), ("listed twice", twice))
            if items
        ]
        return Outcome(False, f"list each hook of ORDER_KINDS exactly once ({'; '.join(problems)})")
    if prediction == list(_FIRING_ORDER):
        return Outcome(True, f"all {n} hooks in the order they fire")
    right = sum(got == real for got, real in zip(prediction, _FIRING_ORDER, strict=True))
    rank = {kind: i for i, kind in enumerate(_FIRING_ORDER)}
    first, second = next((a, b) for a, b in itertools.pairwise(prediction) if rank[a] > rank[b])
    return Outcome(False, f"{right} of {n} hooks in the right place; for example, you put {first!r} right before "
                          f"{second!r}: which of the two fires first?")


def _leaf_modules(model: nn.Module) -> dict[nn.Module, str]:
    return {module: name for name, module in model.named_modules() if name and not list(module.children())}


def _nodes_by_layer_reference(model: nn.Module, x: torch.Tensor) -> dict[str, list[str]]:
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


def _node_models():
    torch.manual_seed(0)
    yield "nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))", nn.Sequential(
        nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), torch.randn(5, 3)
    frozen = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2), nn.Sigmoid()))
    frozen[0].requires_grad_(False)
    yield "a model whose first Linear is frozen, with a nested Sequential", frozen, torch.randn(5, 3)


@exercise("06.5", "which layer created which autograd node")
def _nodes_by_layer(nodes_by_layer) -> Outcome:
    """``nodes_by_layer(model, x) -> {leaf module name: [node.name(), ...]}``: the autograd nodes
    created while each leaf module's forward ran (in creation order), for one ``model(x)``, with
    every hook removed afterwards."""
    from ..audit import clear_hooks

    for label, model, x in _node_models():
        expected = _nodes_by_layer_reference(model, x)
        got = nodes_by_layer(model, x)
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
                return Outcome(False, f"on {label}, layer {name!r}: {list(got[name])}, expected {nodes} "
                                      "(node.name() of each node the hook saw while that layer ran, in order)")
    counts = {name: len(nodes) for name, nodes in expected.items()}
    return Outcome(True, f"both models right; the second's node counts per layer: {counts}")
