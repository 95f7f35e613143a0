"""Exercises of the field guide G2 (module forward hooks): each goes with one guide section.

G2.1 reads the input of an in-place module in a pre-hook (section 2), G2.2 clips an output in
training mode only (section 5), G2.3 fills in a keyword argument (section 6), G2.4 lists every
call with its depth (section 8), G2.5 stops a forward pass early (section 10).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..pytorch_internals import module_hooks
from . import Outcome, compare_tensors, exercise, hint_for, kind_of, not_a_handle
from .nb02 import LATE_BINDING, left_on, left_when_raising


# ----- G2.1: how much each layer scales the spread (section 2) ---------------------------------------------
def _quiet_model() -> nn.Sequential:
    """Five children; the ReLUs work in place; the Linear '2' has weights and bias 100 times too small."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.ReLU(inplace=True),
                          nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight.mul_(0.01)
        model[2].bias.mul_(0.01)
    return model


def _gains_of(model: nn.Sequential, x: torch.Tensor) -> dict[str, float]:
    """std(output) / std(input) of every child, by running the children one after another."""
    gains, value = {}, x
    with torch.no_grad():
        for name, child in model.named_children():
            out = child(value.clone())  # the in-place ReLUs must not overwrite `value`
            gains[name] = (out.std() / value.std()).item()
            value = out
    return gains


def _gain_values(got, expected: dict[str, float]) -> tuple[dict[str, float] | None, Outcome | None]:
    """The answer's gains as floats, or why they cannot be read."""
    if not isinstance(got, dict):
        return None, Outcome(False, f"return a dict {{child name: gain}}, got {kind_of(got)}")
    if len(got) == 1 and str(next(iter(got))) == list(expected)[-1] != next(iter(expected)):
        return None, Outcome(False, f"only the last child, {list(expected)[-1]!r}, has a gain: every hook wrote under "
                                    f"its name; {LATE_BINDING}")
    if sorted(map(str, got)) != sorted(expected):
        return None, Outcome(False, f"expected the children {list(expected)}, got {list(got)}")
    try:
        return {str(k): float(v.detach() if isinstance(v, torch.Tensor) else v) for k, v in got.items()}, None
    except (TypeError, ValueError, RuntimeError):
        return None, Outcome(False, "every gain should be one number (a float or a one-element tensor)")


@exercise("G2.1", "how much each layer scales its input's spread")
def _activation_gains(activation_gains) -> Outcome:
    """``activation_gains(model, x)`` returns ``{name: output.std() / input.std()}`` per child; the input's std
    must be taken before an in-place child overwrites it."""
    model = _quiet_model()
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    try:
        got = activation_gains(model, x.clone())
    finally:
        left = left_on(model)
    if left:
        return Outcome(False, f"{left[0]} after activation_gains returned: remove every handle before returning")
    expected = _gains_of(model, x)
    values, wrong = _gain_values(got, expected)
    if wrong:
        return wrong
    if all(abs(values[n] * expected[n] - 1) < 1e-4 for n in expected):
        return Outcome(False, "every gain is upside down: divide the output's std by the input's (args[0])")
    relus = [n for n, child in model.named_children() if isinstance(child, nn.ReLU)]
    if all(abs(values[n] - 1) < 1e-6 < abs(expected[n] - 1) for n in relus):
        return Outcome(False, f"the ReLUs {relus} got gain 1: they work in place, so by the time a forward hook "
                              "runs, args[0] has been overwritten with the output; take the input's std in a "
                              "forward pre-hook")
    for name, gain in expected.items():
        if abs(values[name] - gain) > 1e-4 * max(1.0, abs(gain)):
            return Outcome(False, f"child {name!r}: gain {values[name]:.4g}, expected {gain:.4g} "
                                  "(output.std() / args[0].std(), the std over every element)")
    failed = left_when_raising(lambda: activation_gains(model, torch.randn(4, 7)), model)
    if failed is not None:
        return failed
    quiet = min(expected, key=expected.get)
    return Outcome(True, f"every gain right; child {quiet!r} shrinks the spread to {expected[quiet]:.3f} of its "
                         "input's")


# ----- G2.2: clip an output in training mode (section 5) -----------------------------------------
def _clipped_call(clip_output, module: nn.Module, x: torch.Tensor, limit: float, unhooked: nn.Module | None = None):
    """``module(x)`` (and ``unhooked(x)``) with the answer's hook on ``module``: ``(outputs, None)``, or
    ``(None, Outcome)`` when the answer did not return a handle."""
    handle = clip_output(module, limit)
    failed = not_a_handle(handle, "clip_output", module)
    if failed:
        return None, failed
    try:
        out = module(x)
        other = unhooked(x).detach() if unhooked is not None else None
    finally:
        handle.remove()
    return (out, other), None


def _grad_of(output_fn, leaf: torch.Tensor) -> torch.Tensor:
    leaf = leaf.detach().requires_grad_()
    output_fn(leaf).sum().backward()
    return leaf.grad


def _clipped_tanh_outcome(clip_output) -> Outcome | None:
    """The answer on a Tanh, whose backward needs its own output: values and gradient."""
    t = torch.tensor([-2.0, -0.3, 0.2, 1.0], requires_grad=True)
    outputs, failed = _clipped_call(clip_output, nn.Tanh(), t, 0.5)
    if failed:
        return failed
    clipped = outputs[0]
    outcome = compare_tensors(clipped, torch.tanh(t).clamp(-0.5, 0.5))
    if not outcome.passed:
        return Outcome(False, f"the clipped output of a Tanh is wrong: {outcome.detail}")
    try:
        clipped.sum().backward()
    except RuntimeError as exc:
        return hint_for(exc, {"inplace": "backward through a clipped Tanh failed: clamp a new tensor and return "
                                         "it; an in-place change breaks the layer's backward"})
    outcome = compare_tensors(t.grad, _grad_of(lambda v: torch.tanh(v).clamp(-0.5, 0.5), t))
    if not outcome.passed:
        return Outcome(False, f"the gradient through a clipped Tanh is wrong: {outcome.detail}")
    return None


def _eval_outcome(clip_output, layer: nn.Module, x: torch.Tensor, plain: torch.Tensor) -> Outcome | None:
    """In eval mode the hooked layer must give its plain output."""
    layer.eval()
    handle = clip_output(layer, 1.5)
    try:
        with torch.no_grad():
            out = layer(x)
    finally:
        handle.remove()
        layer.train()
    if not isinstance(out, torch.Tensor) or not torch.equal(out, plain):
        return Outcome(False, "in eval mode the output was changed: clip only while module.training is True "
                              "(model.eval() sets it to False on every submodule), else return None")
    return None


@exercise("G2.2", "clip a layer's output in training mode with a forward hook")
def _clip_output(clip_output) -> Outcome:
    """``clip_output(module, limit)`` registers a forward hook clamping the output to [-limit, limit] while
    the module is in training mode."""
    layer = nn.Linear(3, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 0, 0], [-3.0, 0, 0], [0.1, 0, 0], [0, 2.0, -2.0]]))
        layer.bias.zero_()
    other = nn.Linear(3, 4)
    other.load_state_dict(layer.state_dict())
    x = torch.tensor([[1.0, 1.0, -1.0]])
    plain = layer(x).detach()
    outputs, failed = _clipped_call(clip_output, layer, x, 1.5, unhooked=other)
    if failed:
        return failed
    clipped, unhooked = outputs
    if isinstance(clipped, torch.Tensor) and torch.equal(clipped.detach(), plain):
        return Outcome(False, "the output is unchanged: your hook must return the new output")
    outcome = compare_tensors(clipped, plain.clamp(-1.5, 1.5))
    if not outcome.passed:
        return Outcome(False, f"the clipped output is wrong: {outcome.detail}")
    if not torch.equal(unhooked, plain):
        return Outcome(False, "a module you did not hook was clipped too: register the hook on the given module only")
    if not torch.equal(layer(x).detach(), plain):
        return Outcome(False, "after handle.remove() the layer must give its plain output again")
    if not clipped.requires_grad:
        return Outcome(False, "the clipped output lost its gradient: clamp the tensor itself, not .detach() of it")
    clipped.sum().backward()
    if layer.weight.grad is None:
        return Outcome(False, "no gradient reached the weight: the clipped output must be computed from the "
                              "layer's output (no .detach(), no new tensor from its values)")
    expected = _grad_of(lambda w: F.linear(x, w, layer.bias.detach()).clamp(-1.5, 1.5), layer.weight)
    outcome = compare_tensors(layer.weight.grad, expected)
    if not outcome.passed:
        return Outcome(False, f"the weight's gradient is wrong ({outcome.detail}): change the output with a "
                              "tensor operation autograd sees, not through .data")
    wrong = _clipped_tanh_outcome(clip_output) or _eval_outcome(clip_output, other, x, plain)
    if wrong:
        return wrong
    return Outcome(True, "clipped to [-1.5, 1.5] in training mode on that layer only, right gradients (Linear "
                         "and Tanh), plain in eval mode and after remove()")


# ----- G2.3: a default for a keyword argument (section 6) ------------------------------------------
class _Scale(nn.Module):
    def forward(self, x: torch.Tensor, *, factor: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        return x * factor + offset


@exercise("G2.3", "a default for a keyword argument, from a with_kwargs pre-hook")
def _default_keyword(default_keyword) -> Outcome:
    """``default_keyword(module, name, value)``: calls without ``name`` run with ``name=value``, calls that
    pass ``name`` keep the caller's value; returns the handle."""
    module = _Scale()
    x = torch.tensor([1.0, -2.0])
    handle = default_keyword(module, "factor", 0.5)
    failed = not_a_handle(handle, "default_keyword", module)
    if failed:
        return failed
    if handle.id in module_hooks(module, "_forward_pre_hooks") and handle.id not in module_hooks(
            module, "_forward_pre_hooks_with_kwargs"):
        handle.remove()
        return Outcome(False, "register the pre-hook with with_kwargs=True: without it the hook gets no kwargs "
                              "and cannot change them")
    try:
        default = module(x)
        given = module(x, factor=3.0)
        other = module(x, offset=10.0)
    finally:
        handle.remove()
    outcome = compare_tensors(default, x * 0.5)
    if not outcome.passed:
        return Outcome(False, f"a call without factor did not run with factor=0.5: {outcome.detail}")
    if torch.equal(given, x * 0.5):
        return Outcome(False, "a call with factor=3.0 ran with factor=0.5: fill in the keyword only when the "
                              "caller left it out (the caller's own value wins)")
    outcome = compare_tensors(given, x * 3.0)
    if not outcome.passed:
        return Outcome(False, f"a call with factor=3.0 must keep factor=3.0: {outcome.detail}")
    outcome = compare_tensors(other, x * 0.5 + 10.0)
    if not outcome.passed:
        return Outcome(False, f"a call with offset=10.0 did not run with factor=0.5, offset=10.0 "
                              f"({outcome.detail}): keep the caller's other keyword arguments")
    if not torch.equal(module(x), x):
        return Outcome(False, "after handle.remove() the module must use its own default (factor=1.0) again")
    return Outcome(True, "factor=0.5 filled in when missing, the caller's factor kept, other keywords kept")


# ----- G2.4: every call, in order, with its depth (section 8) ---------------------------------------
class _Block(nn.Module):
    """A small residual block that calls its ReLU twice, like torchvision's BasicBlock, and uses a
    borrowed activation ``act`` inside ``extra``."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        self.extra = nn.Sequential(nn.Linear(4, 4), act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.fc(x))
        return self.relu(self.extra(out) + x)


def _order_model() -> nn.Module:
    """Calls ``1`` (a Tanh) at depth 0, then again at depth 2 inside ``2.extra``: ``named_modules()`` lists
    it once, as ``1``, so a depth read from the dots of a name is wrong there."""
    torch.manual_seed(2)  # on the checker's own random stream (see ``exercise``)
    act = nn.Tanh()
    return nn.Sequential(nn.Linear(3, 4), act, _Block(act), nn.Sequential(nn.Linear(4, 2)))


def _call_tree(model: nn.Module, x: torch.Tensor) -> list[tuple[int, str]]:
    """The checker's own answer to G2.4: ``(depth, name)`` per call, in the order the calls start."""
    calls, handles, depth = [], [], [0]

    def enter(name: str):
        def hook(module, args):
            calls.append((depth[0], name))
            depth[0] += 1

        return hook

    def leave(module, args, output):
        depth[0] -= 1

    try:
        for name, module in model.named_modules():
            if name:
                handles.append(module.register_forward_pre_hook(enter(name)))
                handles.append(module.register_forward_hook(leave))
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _is_pair(item: object) -> bool:
    return isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], int) and isinstance(item[1], str)


def _call_names_outcome(got: list, expected: list) -> Outcome | None:
    """What is wrong with the names of the calls and their order, if anything."""
    names = [name for _, name in got]
    want_names = [name for _, name in expected]
    if "" in names:
        return Outcome(False, "leave out the root (name ''): hook only the submodules")
    if not set(names) <= set(want_names):
        return Outcome(False, "use the names from named_modules(), like '1.fc'")
    if len(got) == len(expected) and len(set(names)) < len(set(want_names)):
        return Outcome(
            False,
            f"{len(got)} calls but only the names {sorted(set(names))}: each hook must keep its own name "
            "(a lambda in a loop sees the loop variable's last value; pin it with name=name)",
        )
    if sorted(names) != sorted(want_names):
        return Outcome(
            False, f"{len(got)} calls, expected {len(expected)} (containers count; a module called twice counts twice)"
        )
    if names != want_names:
        return Outcome(False, "the right calls in the wrong order: list a call when it starts (in a forward "
                              "pre-hook), not when it ends: a container starts before its children")
    return None


@exercise("G2.4", "every module call, in order, with its depth")
def _call_tree_checker(call_tree) -> Outcome:
    """``call_tree(model, x)`` returns ``(depth, name)`` for every submodule call (not the root), in the
    order the calls start; depth counts the hooked calls still running when it starts."""
    model = _order_model()
    x = torch.ones(2, 3)
    try:
        got = call_tree(model, x)
    finally:
        left = left_on(model)  # never leave a student's hook behind on the checker's model
    if left:
        return Outcome(False, f"{left[0]} after call_tree returned: remove the hooks in a finally block")
    expected = _call_tree(model, x)
    if not isinstance(got, list | tuple):
        return Outcome(False, f"return the list of (depth, name) pairs (got {kind_of(got)})")
    got = [tuple(item) if isinstance(item, list) else item for item in got]
    if not all(_is_pair(item) for item in got):
        example = next(item for item in got if not _is_pair(item))
        return Outcome(False, f"return one (depth, name) pair per call, like (1, '1.fc') (got {example!r})")
    wrong = _call_names_outcome(got, expected)
    if wrong:
        return wrong
    if got != expected:
        call, wrong, right = next((i, g[0], e[0]) for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e)
        name = expected[call][1]
        if all(depth == label.count(".") for depth, label in got):
            return Outcome(False, f"the depths are the dots in each name, but call {call + 1} ({name!r}) runs inside "
                                  f"other calls at depth {right}: a module can be called from anywhere in a "
                                  "forward, not only by its parent; count the calls still running, with the hooks")
        return Outcome(False, f"the right calls in the right order, but call {call + 1} ({name!r}) got depth {wrong} "
                              f"instead of {right}: count one level up in a pre-hook and one level down in a "
                              "forward hook, when the module returns")
    broken = nn.Sequential(nn.Linear(3, 4), nn.Linear(5, 2))  # its second layer gets the wrong width
    failed = left_when_raising(lambda: call_tree(broken, x), broken)
    if failed:
        return failed
    return Outcome(True, f"{len(expected)} calls in order with their depths, no hook left behind (also on an error)")


# ----- G2.5: stop a forward pass early (section 10) ---------------------------------------------------------------
class _Tripwire(nn.Module):
    """Identity that counts its calls: any call means the forward went on past the asked layer."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def _early_model() -> nn.Sequential:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), _Tripwire(), nn.Linear(8, 3), _Tripwire())


def _stopped_outcome(got, model: nn.Sequential, x: torch.Tensor, names: list[str], last: int) -> Outcome | None:
    """What is wrong with the outputs returned for ``names`` (the last of them to run is child ``last``)."""
    ran_after = sum(m.calls for i, m in enumerate(model) if isinstance(m, _Tripwire) and i > last)
    if ran_after:
        return Outcome(False, f"the forward went on after the last of {names} had run: raise an exception of your "
                              "own in a forward hook once every named layer has run, and catch it around model(x)")
    if not isinstance(got, dict):
        return Outcome(False, f"return a dict {{name: output}}, got {kind_of(got)}")
    missing = [name for name in names if name not in got]
    if missing:
        return Outcome(False, f"no output for {missing}: stop only once every named layer has run (they are "
                              "not listed in the order they run)")
    value = x
    with torch.no_grad():
        for i in range(last + 1):
            value = model[i](value)
            if str(i) in names:
                got_i = got[str(i)]
                if not isinstance(got_i, torch.Tensor):
                    return Outcome(False, f"{str(i)!r}: return the layer's output tensor, got {kind_of(got_i)}")
                if got_i.grad_fn is not None:
                    return Outcome(False, f"{str(i)!r}: the output is still in the autograd graph: return it "
                                          "detached (.detach())")
                outcome = compare_tensors(got_i, value)
                if not outcome.passed:
                    return Outcome(False, f"not the output of layer {str(i)!r} ({outcome.detail}): keep the "
                                          "forward hook's output")
    return None


def _other_errors_outcome(outputs_of) -> Outcome | None:
    """An error the model itself raises before the layers must reach the caller, with no hook left."""
    model = _early_model()
    try:
        outputs_of(model, ["1"], torch.randn(2, 5))  # Linear(4, 8) refuses 5 features
    except RuntimeError:
        pass
    except Exception as other:
        return Outcome(False, f"the model's own RuntimeError should reach the caller unchanged, got "
                              f"{type(other).__name__}")
    else:
        return Outcome(False, "the model raised a RuntimeError of its own and your function swallowed it: catch "
                              "only the exception your hook raises (a class of your own)")
    finally:
        left = left_on(model)
    if left:
        return Outcome(False, f"when the forward pass raised, {left[0]}: remove it in a `finally:` block")
    return None


@exercise("G2.5", "stop a forward pass once the named layers have run")
def _stop_early(outputs_of) -> Outcome:
    """``outputs_of(model, names, x)`` returns ``{name: detached output}`` and runs nothing after the last of
    the named layers to run."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    for names, last in ((["1", "0"], 1), (["3", "0"], 3)):
        model = _early_model()
        try:
            got = outputs_of(model, list(names), x.clone())
        finally:
            left = left_on(model)
        if left:
            return Outcome(False, f"{left[0]} after outputs_of returned: remove it before returning")
        wrong = _stopped_outcome(got, model, x, names, last)
        if wrong:
            return wrong
    wrong = _other_errors_outcome(outputs_of)
    if wrong:
        return wrong
    return Outcome(True, "the named outputs, detached, nothing run after the last of them, the model's own "
                         "errors pass through, no hook left")
