"""Notebook 03's checkers accept a correct answer and reject wrong ones; its predictions compute the truth the
lesson shows and answer the common wrong guesses with their own hint."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from answers import failed, run_then_remove
from torch import nn

import hooklab
from hooklab.exercises import exercises, grade


def answer_with(attach, names=None, cleanup_in_finally=True):
    """An answer to 03.1 (or G3.2): ``attach(module, name, found, handles)`` hooks each chosen child
    (default: every child) and returns the handle; then ``model(x).sum().backward()`` runs, every
    handle is removed (in a ``finally``, unless told otherwise) and ``found`` is returned."""

    def answer(model, x):
        found, handles = {}, []

        def run():
            for name in names or [n for n, _ in model.named_children()]:
                handles.append(attach(model.get_submodule(name), name, found, handles))
            model(x).sum().backward()

        run_then_remove(run, handles, in_finally=cleanup_in_finally)
        return found

    return answer




# ----- predictions ------------------------------------------------------------------------------
PREDICTIONS = {  # what the lesson's next cell shows, and a wrong guess that gets its own hint
    "03.a": (["s2", "fc2", "s1", "fc1"], ["fc1", "s1", "fc2", "s2"], "order of the forward pass"),
    "03.b": ([0, 0, 0], None, "not tensors"),
    "03.c": ([0.5, 1], [0.5, 10], "reaches only the earlier layers"),
    "03.d": ("forward", "backward", "when it happens"),
    "03.e": (0.25, 0.5, "σ(0)"),
}


@pytest.mark.parametrize("id", PREDICTIONS)
def test_prediction_truth_right_guess_and_hint_for_a_wrong_one(id):
    right, wrong, hint = PREDICTIONS[id]
    assert exercises()[id].kind == "prediction"
    assert grade(id, right).passed
    outcome = grade(id, wrong)
    assert not outcome.passed and hint in outcome.detail, outcome.detail


def test_prediction_03_b_tells_the_true_gradient_from_the_slot():
    outcome = grade("03.b", [1, 1, 1])
    assert not outcome.passed and "true dL/db" in outcome.detail and "zeros" in outcome.detail
    assert "zeros" in grade("03.b", [0.0, 0.0, 0.0]).detail  # why is shown to a right guess too


# ----- 03.1 ------------------------------------------------------------------------------------
def gain_hook(register="register_full_backward_hook", returned=None):
    """Attach a backward hook keeping |grad_input[0]| / |grad_output[0]|, or returning ``returned(gi, go)``."""

    def attach(module, name, gains, handles):
        def hook(m, grad_input, grad_output):
            if returned is not None:
                return returned(grad_input, grad_output)
            if grad_input[0] is not None:
                gains[name] = (grad_input[0].norm() / grad_output[0].norm()).item()
            return None

        return getattr(module, register)(hook)

    return attach


gains_right = answer_with(gain_hook())


def test_03_1_accepts_right_answer():
    outcome = grade("03.1", gains_right)
    assert outcome.passed and "layer '2'" in outcome.detail, outcome.detail


def test_03_1_rejects_gains_upside_down():
    outcome = grade("03.1", lambda model, x: {name: 1 / g for name, g in gains_right(model, x).items()})
    assert not outcome.passed and "upside down" in outcome.detail


def test_03_1_rejects_forward_order():
    outcome = grade("03.1", lambda model, x: dict(reversed(gains_right(model, x).items())))
    assert not outcome.passed and "order the hooks ran" in outcome.detail


def test_03_1_rejects_a_layer_without_input_gradient():
    outcome = grade("03.1", lambda model, x: {**gains_right(model, x), "0": 0.0})
    assert not outcome.passed and "(None,)" in outcome.detail


def test_03_1_names_what_was_returned_instead_of_a_dict():
    def forgets_return(model, x):
        gains_right(model, x)

    failed("03.1", forgets_return, "return a dict {layer name: gain}, not None (missing return?)")
    failed("03.1", lambda model, x: list(gains_right(model, x).items()), "return a dict {layer name: gain}, not list")


def test_03_1_rejects_a_wrong_gain():
    outcome = grade("03.1", lambda model, x: {**gains_right(model, x), "4": 1.0})
    assert not outcome.passed and "layer '4'" in outcome.detail


def test_03_1_explains_hooks_that_return_a_value():
    returns = (
        lambda gi, go: (gi, go),
        lambda gi, go: gi[0].norm() / go[0].norm(),
        lambda gi, go: 1.0,
        lambda gi, go: go,
    )
    for returned in returns:
        failed("03.1", answer_with(gain_hook(returned=returned)), "return None")


def test_03_1_rejects_hooks_left_behind():
    def leaves_hooks(model, x):
        for m in model.children():
            m.register_full_backward_hook(lambda m, gi, go: None)
        return gains_right(model, x)

    outcome = grade("03.1", leaves_hooks)
    assert not outcome.passed and "still registered" in outcome.detail


def test_03_1_rejects_hooks_left_behind_when_forward_raises():
    outcome = grade("03.1", answer_with(gain_hook(), cleanup_in_finally=False))
    assert not outcome.passed and "finally" in outcome.detail


def test_03_1_rejects_the_legacy_backward_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecation warning of the student's own call
        outcome = grade("03.1", answer_with(gain_hook("register_backward_hook")))
    assert not outcome.passed and "deprecated" in outcome.detail


# ----- 03.2 ------------------------------------------------------------------------------------
def per_sample(factor):
    """A backward pre-hook answer that multiplies sample n of grad_output[0] by factor(norms, max_norm)[n]."""

    def answer(module, max_norm):
        def hook(m, grad_output):
            g = grad_output[0]
            norms = g.flatten(1).norm(dim=1)
            return (g * factor(norms, max_norm).view(-1, *[1] * (g.dim() - 1)),)

        return module.register_full_backward_pre_hook(hook)

    return answer


clip_right = per_sample(lambda norms, limit: (limit / norms).clamp(max=1))


def test_03_2_accepts_per_sample_clipping():
    outcome = grade("03.2", clip_right)
    assert outcome.passed, outcome.detail


def test_03_2_rejects_a_full_backward_hook():  # it returns grad_input: the weight gradient is not clipped
    def clip_after(module, limit):
        def hook(m, grad_input, grad_output):
            g = grad_input[0]
            return (g * (limit / g.flatten(1).norm(dim=1)).clamp(max=1).view(-1, *[1] * (g.dim() - 1)),)

        return module.register_full_backward_hook(hook)

    outcome = grade("03.2", clip_after)
    assert not outcome.passed and "weight.grad" in outcome.detail and "unclipped" in outcome.detail, outcome.detail


def test_03_2_explains_the_legacy_backward_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecation warning of the student's own call
        outcome = grade("03.2", lambda module, limit: module.register_backward_hook(lambda m, gi, go: None))
    assert not outcome.passed and "deprecated" in outcome.detail and "ran after" not in outcome.detail, outcome.detail


def test_03_2_rejects_clamping_each_element():
    answer = lambda module, limit: module.register_full_backward_pre_hook(  # noqa: E731
        lambda m, go: tuple(g.clamp(-limit, limit) for g in go)
    )
    outcome = grade("03.2", answer)
    assert not outcome.passed and "each element" in outcome.detail, outcome.detail


def test_03_2_rejects_one_factor_for_the_batch():
    answer = lambda module, limit: module.register_full_backward_pre_hook(  # noqa: E731
        lambda m, go: (go[0] * min(1.0, limit / go[0].norm().item()),)
    )
    outcome = grade("03.2", answer)
    assert not outcome.passed and "one factor" in outcome.detail, outcome.detail


def test_03_2_rejects_scaling_samples_within_the_limit():
    outcome = grade("03.2", per_sample(lambda norms, limit: limit / norms))
    assert not outcome.passed and "unchanged" in outcome.detail, outcome.detail


def test_03_2_rejects_clipping_each_row_of_a_sequence():
    def per_row(module, limit):
        return module.register_full_backward_pre_hook(
            lambda m, go: (go[0] * (limit / go[0].norm(dim=-1, keepdim=True)).clamp(max=1),)
        )

    outcome = grade("03.2", per_row)
    assert not outcome.passed and "(2, 3, 3)" in outcome.detail and "all of its elements" in outcome.detail, (
        outcome.detail
    )


def test_03_2_rejects_no_clipping():
    outcome = grade("03.2", lambda module, limit: module.register_full_backward_pre_hook(lambda m, go: None))
    assert not outcome.passed


def test_03_2_says_when_no_handle_was_returned():
    for returned in (True, None):
        failed("03.2", lambda module, limit, r=returned: module.register_full_backward_pre_hook(lambda m, go: None)
               and r, "must return the handle")


def test_03_2_rejects_an_in_place_change_and_explains_a_reassigned_name():
    def in_place(module, limit):  # right numbers, but the docs say a hook should not modify its arguments
        def hook(m, grad_output):
            g = grad_output[0]
            g.mul_((limit / g.flatten(1).norm(dim=1)).clamp(max=1).view(-1, *[1] * (g.dim() - 1)))

        return module.register_full_backward_pre_hook(hook)

    failed("03.2", in_place, "in place", "should not modify its arguments", "return the new tuple")

    def reassigns(module, limit):
        def hook(m, grad_output):
            grad_output = (grad_output[0] * 0.5,)  # a new local name, never returned

        return module.register_full_backward_pre_hook(hook)

    outcome = grade("03.2", reassigns)
    assert not outcome.passed and "return the new tuple" in outcome.detail, outcome.detail


def norm_over(dim):
    return lambda module, limit: module.register_full_backward_pre_hook(
        lambda m, go: (go[0] * (limit / go[0].norm(dim=dim, keepdim=True)).clamp(max=1),)
    )


def test_03_2_names_a_norm_over_the_wrong_axis():
    batch = grade("03.2", norm_over(0))
    assert not batch.passed and "dim=0" in batch.detail and "(5, 3)" in batch.detail, batch.detail
    tokens = grade("03.2", norm_over(1))  # right for 2-D gradients, wrong for (batch, tokens, features)
    assert not tokens.passed and "tokens axis" in tokens.detail and "(2, 3, 3)" in tokens.detail, tokens.detail


def test_03_2_explains_a_bare_tensor_returned():
    outcome = grade("03.2", lambda module, limit: module.register_full_backward_pre_hook(
        lambda m, go: go[0] * (limit / go[0].flatten(1).norm(dim=1)).clamp(max=1).view(-1, *[1] * (go[0].dim() - 1))
    ))
    assert not outcome.passed and "(new_grad,)" in outcome.detail and "raised" not in outcome.detail, outcome.detail


def test_legacy_hook_advice_fits_each_exercise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        gains = grade("03.1", answer_with(gain_hook("register_backward_hook")))
        clip = grade("03.2", lambda module, limit: module.register_backward_hook(lambda m, gi, go: None))
    assert "use register_full_backward_hook" in gains.detail, gains.detail
    assert "register_full_backward_pre_hook" in clip.detail and "use register_full_backward_hook" not in clip.detail
    assert "section 1" not in gains.detail and "guide" in gains.detail, gains.detail


# ----- 03.3 ------------------------------------------------------------------------------------
def output_grads_with(catch="tensor hook", as_lambda=False, in_finally=True):
    """An answer to 03.3. ``catch``: "tensor hook" (registered in a forward hook: right), "retain_grad" (in a
    forward hook, read after backward), "hook after forward" (tensor hooks on the kept outputs once the forward
    ran), "full backward hook" or "legacy hook" (keeping grad_output[0])."""

    def output_grads(model, names, x):
        grads, kept, handles = {}, {}, []

        def run():
            for name in names:
                module = model.get_submodule(name)
                if catch in ("full backward hook", "legacy hook"):
                    register = {"full backward hook": module.register_full_backward_hook,
                                "legacy hook": module.register_backward_hook}[catch]  # fmt: skip
                    handles.append(register(lambda m, gi, go, name=name: grads.__setitem__(name, go[0])))
                elif as_lambda:
                    handles.append(module.register_forward_hook(
                        lambda m, a, out, name=name: out.register_hook(lambda g: grads.__setitem__(name, g))))
                else:
                    def forward_hook(m, args, output, name=name):
                        kept[name] = output
                        if catch == "tensor hook":
                            output.register_hook(lambda g: grads.__setitem__(name, g))
                        elif catch == "retain_grad":
                            output.retain_grad()

                    handles.append(module.register_forward_hook(forward_hook))
            out = model(x)
            if catch == "hook after forward":
                for name, output in kept.items():
                    output.register_hook(lambda g, name=name: grads.__setitem__(name, g))
            out.sum().backward()
            if catch == "retain_grad":
                grads.update({name: output.grad for name, output in kept.items()})

        run_then_remove(run, handles, in_finally=in_finally)
        return grads

    return output_grads


def test_03_3_accepts_a_tensor_hook_registered_from_a_forward_hook():
    outcome = grade("03.3", output_grads_with())
    assert outcome.passed, outcome.detail


def test_03_3_explains_full_backward_hooks_and_a_forward_hook_that_returns_the_handle():
    failed("03.3", output_grads_with("full backward hook"), "TinyConvNet", "view", "tensor hook on the output")
    failed("03.3", output_grads_with(as_lambda=True), "returned the tensor hook's handle", "returns None")


def test_03_3_names_a_gradient_caught_after_the_in_place_change():
    failed("03.3", output_grads_with("hook after forward"), "conv1", "after that change", "forward hook")
    failed("03.3", output_grads_with("retain_grad"), "after that change")


def test_03_3_rejects_the_legacy_hook_hooks_left_behind_and_wrong_keys():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        failed("03.3", output_grads_with("legacy hook"), "deprecated", "forward hook")
    failed("03.3", output_grads_with(in_finally=False), "finally")
    failed("03.3", lambda model, names, x: {"conv1": torch.zeros(1)}, "keys ['conv1', 'conv2']")

    def leaves_a_hook(model, names, x):
        model.get_submodule(names[0]).register_forward_hook(lambda m, a, out: None)
        return output_grads_with()(model, names, x)

    failed("03.3", leaves_a_hook, "remove your hooks", "forward hook is still registered")


def test_03_3_names_the_model_and_layer_of_a_wrong_gradient():
    def doubled(model, names, x):
        return {name: 2 * g for name, g in output_grads_with()(model, names, x).items()}

    failed("03.3", doubled, "on TinyConvNet(inplace=True): conv1: max |difference|")

    def right_on_the_conv_net_only(model, names, x):
        grads = output_grads_with()(model, names, x)
        return grads if "conv1" in grads else {name: torch.zeros_like(g) for name, g in grads.items()}

    failed("03.3", right_on_the_conv_net_only, "on resnet18's block", "bn1")


# ----- 03.4 ------------------------------------------------------------------------------------
def tracker(kind="tensor hook", returns_handle=False, as_list=False, skip_no_grad=True):
    """An answer to 03.5: a forward hook per module registers a tensor hook on the output when it requires
    grad (variations: a full backward hook, the output's own std, a lambda returning the tensor hook's handle,
    a hook registered under no_grad too)."""
    def track_grad_std(model, names):
        stds, handles = {name: [] for name in names}, []
        for name in names:
            module = model.get_submodule(name)
            if kind == "full backward hook":
                hook = lambda m, gi, go, name=name: stds[name].append(go[0].std().item())  # noqa: E731
                handles.append(module.register_full_backward_hook(hook))
                continue

            def forward_hook(m, args, output, name=name):
                if skip_no_grad and not output.requires_grad:
                    return None
                if kind == "output std":
                    stds[name].append(output.std().item())
                    return None
                handle = output.register_hook(lambda g: stds[name].append(g.std().item()))
                return handle if returns_handle else None

            handles.append(module.register_forward_hook(forward_hook))
        if as_list:
            return stds, handles
        hooks = hooklab.Hooks()
        for handle in handles:
            hooks.add(handle)
        return stds, hooks

    return track_grad_std


def test_03_4_accepts_a_forward_hook_with_a_tensor_hook_and_a_list_of_handles():
    for answer in (tracker(), tracker(as_list=True)):
        result = grade("03.4", answer)
        assert result.passed, result.detail


def test_03_4_rejects_full_backward_hooks_returned_handles_and_output_stds():
    failed("03.4", tracker(kind="full backward hook"), "in-place", "tensor hook")
    failed("03.4", tracker(returns_handle=True), "returned the tensor hook's handle")
    failed("03.4", tracker(kind="output std"), "expected", "gradient")


def test_03_4_explains_a_tensor_hook_on_an_evaluation_output():
    failed("03.4", tracker(skip_no_grad=False), "torch.no_grad()", "output.requires_grad")


def test_03_4_rejects_a_tracker_that_keeps_going_after_removal():
    def never_stops(model, names):
        stds, _ = tracker()(model, names)
        return stds, []  # nothing to remove: the hooks stay and keep adding values

    failed("03.4", never_stops, "removing the returned hooks left a hook")


# ----- 03.5 ------------------------------------------------------------------------------------
def vanishing_with(pick="first in backward order", kind="tensor hook", in_finally=True, fixed_limit=None):
    """An answer to 03.5: a tensor hook (registered in a forward hook) on every Linear's output appends
    (name, std) in the order backward reaches them; ``pick`` chooses from them (variations: a full backward
    hook, a limit of its own, the hooks removed only when nothing raised)."""

    def vanishing_point(model, x, y, limit=1e-5):
        limit = fixed_limit or limit
        seen, handles = [], []

        def run():
            for name, module in model.named_modules():
                if not isinstance(module, nn.Linear):
                    continue
                if kind == "full backward hook":
                    handles.append(module.register_full_backward_hook(
                        lambda m, gi, go, name=name: seen.append((name, go[0].std().item()))))
                    continue

                def forward_hook(m, args, output, name=name):
                    output.register_hook(lambda g: seen.append((name, g.std().item())))

                handles.append(module.register_forward_hook(forward_hook))
            F.cross_entropy(model(x), y).backward()

        run_then_remove(run, handles, in_finally=in_finally)
        stds = dict(seen)
        backward_order = [name for name, _ in seen]
        order = {"first in backward order": backward_order, "first in forward order": backward_order[::-1],
                 "sorted as strings": sorted(stds, reverse=True)}.get(pick)  # fmt: skip
        if pick == "smallest":
            name = min(stds, key=stds.get)
            return name if stds[name] < limit else None
        return next((name for name in order if stds[name] < limit), None)

    return vanishing_point


def test_03_5_accepts_the_first_layer_below_the_limit_in_backward_order():
    outcome = grade("03.5", vanishing_with())
    assert outcome.passed, outcome.detail


def test_03_5_names_each_wrong_order():
    failed("03.5", vanishing_with("first in forward order"), "deep sigmoid network", "expected '10', got '0'",
           "counted from the input")
    failed("03.5", vanishing_with("sorted as strings"), "expected '10', got '8'", "sorted as strings")
    failed("03.5", vanishing_with("smallest"), "counted from the input and it has the smallest gradient std")

    def smallest_unless_right_elsewhere(model, x, y, limit=1e-5):  # wrong only where the smallest is not the first
        return vanishing_with("first in backward order" if len(model) == 19 else "smallest")(model, x, y, limit)

    failed("03.5", smallest_unless_right_elsewhere, "layers '6' and '4' large", "expected '10', got '6'",
           "it has the smallest gradient std;")


def test_03_5_rejects_a_limit_of_its_own_full_backward_hooks_and_hooks_left_behind():
    failed("03.5", vanishing_with(fixed_limit=1e-5), "limit=1e-3", "use the limit you are given")
    with warnings.catch_warnings():  # layer '0' of the sigmoid network: no input requires grad
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        failed("03.5", vanishing_with(kind="full backward hook"), "in-place ReLUs", "tensor hook on the output")
    failed("03.5", vanishing_with(in_finally=False), "finally")


def test_03_5_says_what_to_return():
    failed("03.5", lambda model, x, y, limit=1e-5: None, "'10'", "you returned None")
    failed("03.5", lambda model, x, y, limit=1e-5: 10, "a str", "not int")

    def always_a_name(model, x, y, limit=1e-5):
        return vanishing_with()(model, x, y, limit) or "0"

    failed("03.5", always_a_name, "He-initialised", "return None")
