"""Notebook 03's checkers accept a correct answer and reject wrong ones."""

from __future__ import annotations

import warnings

import torch
from answers import failed, run_then_remove

import hooklab
from hooklab.exercises import grade


def answer_with(attach, names=None, cleanup_in_finally=True):
    """An answer to 03.3 or 03.4: ``attach(module, name, found, handles)`` hooks each chosen child
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


# ----- 03.3 ------------------------------------------------------------------------------------
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


def test_03_3_accepts_right_answer():
    outcome = grade("03.3", gains_right)
    assert outcome.passed and "layer '2'" in outcome.detail, outcome.detail


def test_03_3_rejects_gains_upside_down():
    outcome = grade("03.3", lambda model, x: {name: 1 / g for name, g in gains_right(model, x).items()})
    assert not outcome.passed and "upside down" in outcome.detail


def test_03_3_rejects_forward_order():
    outcome = grade("03.3", lambda model, x: dict(reversed(gains_right(model, x).items())))
    assert not outcome.passed and "order the hooks ran" in outcome.detail


def test_03_3_rejects_a_layer_without_input_gradient():
    outcome = grade("03.3", lambda model, x: {**gains_right(model, x), "0": 0.0})
    assert not outcome.passed and "(None,)" in outcome.detail


def test_03_3_names_what_was_returned_instead_of_a_dict():
    def forgets_return(model, x):
        gains_right(model, x)

    failed("03.3", forgets_return, "return a dict {layer name: gain}, not None (missing return?)")
    failed("03.3", lambda model, x: list(gains_right(model, x).items()), "return a dict {layer name: gain}, not list")


def test_03_3_rejects_a_wrong_gain():
    outcome = grade("03.3", lambda model, x: {**gains_right(model, x), "4": 1.0})
    assert not outcome.passed and "layer '4'" in outcome.detail


def test_03_3_explains_hooks_that_return_a_value():
    returns = (
        lambda gi, go: (gi, go),
        lambda gi, go: gi[0].norm() / go[0].norm(),
        lambda gi, go: 1.0,
        lambda gi, go: go,
    )
    for returned in returns:
        failed("03.3", answer_with(gain_hook(returned=returned)), "return None")


def test_03_3_rejects_hooks_left_behind():
    def leaves_hooks(model, x):
        for m in model.children():
            m.register_full_backward_hook(lambda m, gi, go: None)
        return gains_right(model, x)

    outcome = grade("03.3", leaves_hooks)
    assert not outcome.passed and "still registered" in outcome.detail


def test_03_3_rejects_hooks_left_behind_when_forward_raises():
    outcome = grade("03.3", answer_with(gain_hook(), cleanup_in_finally=False))
    assert not outcome.passed and "finally" in outcome.detail


def test_03_3_rejects_the_legacy_backward_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecation warning of the student's own call
        outcome = grade("03.3", answer_with(gain_hook("register_backward_hook")))
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


# ----- 03.4 ------------------------------------------------------------------------------------
RELUS = ("relu1", "relu2")


def input_grad_hook(kind="pre_hook", as_lambda=False):
    """Attach a forward pre-hook (or, wrong, a forward hook) that puts a tensor hook on the input;
    ``as_lambda``: a pre-hook lambda that returns the tensor hook's handle."""

    def attach(module, name, grads, handles):
        if as_lambda:
            return module.register_forward_pre_hook(
                lambda m, args: args[0].register_hook(lambda g: grads.__setitem__(name, g))
            )

        def register(m, args, *output):
            handles.append(args[0].register_hook(lambda g: grads.__setitem__(name, g)))

        return getattr(module, f"register_forward_{kind}")(register)

    return attach


def grad_input_hook(register):
    """Attach a backward hook of the given kind that keeps grad_input[0]."""
    return lambda module, name, grads, handles: getattr(module, register)(
        lambda m, gi, go: grads.__setitem__(name, gi[0])
    )


relu_grads_right = answer_with(input_grad_hook(), names=RELUS)


def test_03_4_accepts_pre_hooks_rejects_forward_hooks():
    assert grade("03.4", relu_grads_right).passed
    outcome = grade("03.4", answer_with(input_grad_hook("hook"), names=RELUS))
    assert not outcome.passed and "dL/d(ReLU output)" in outcome.detail and "pre-hook" in outcome.detail


def test_03_4_explains_a_pre_hook_that_returns_the_handle():
    outcome = grade("03.4", answer_with(input_grad_hook(as_lambda=True), names=RELUS))
    assert not outcome.passed and "return None" in outcome.detail


def test_03_4_explains_why_full_backward_hooks_fail():
    outcome = grade("03.4", answer_with(grad_input_hook("register_full_backward_hook"), names=RELUS))
    assert not outcome.passed and "in place" in outcome.detail


def test_03_4_rejects_wrong_keys():
    outcome = grade("03.4", lambda model, x: {"relu1": torch.zeros(1)})
    assert not outcome.passed and "keys" in outcome.detail


def test_03_4_rejects_zeros_of_the_right_shape():
    outcome = grade(
        "03.4", lambda model, x: {name: torch.zeros_like(g) for name, g in relu_grads_right(model, x).items()}
    )
    assert not outcome.passed and "relu1" in outcome.detail


def test_03_4_rejects_the_legacy_backward_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        outcome = grade("03.4", answer_with(grad_input_hook("register_backward_hook"), names=RELUS))
    assert not outcome.passed and "deprecated" in outcome.detail


def test_03_4_rejects_hooks_left_behind_when_forward_raises():
    outcome = grade("03.4", answer_with(input_grad_hook(), names=RELUS, cleanup_in_finally=False))
    assert not outcome.passed and "finally" in outcome.detail


def test_03_2_says_when_no_handle_was_returned():
    for returned in (True, None):
        failed("03.2", lambda module, limit, r=returned: module.register_full_backward_pre_hook(lambda m, go: None)
               and r, "must return the handle")


def test_legacy_hook_advice_fits_each_exercise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        gains = grade("03.3", answer_with(gain_hook("register_backward_hook")))
        clip = grade("03.2", lambda module, limit: module.register_backward_hook(lambda m, gi, go: None))
        relus = grade("03.4", answer_with(grad_input_hook("register_backward_hook"), names=RELUS))
    assert "use register_full_backward_hook" in gains.detail, gains.detail
    assert "register_full_backward_pre_hook" in clip.detail and "use register_full_backward_hook" not in clip.detail
    assert "tensor hook" in relus.detail and "use register_full_backward_hook" not in relus.detail, relus.detail


def test_03_2_accepts_an_in_place_change_and_explains_a_reassigned_name():
    def in_place(module, limit):
        def hook(m, grad_output):
            g = grad_output[0]
            g.mul_((limit / g.flatten(1).norm(dim=1)).clamp(max=1).view(-1, *[1] * (g.dim() - 1)))

        return module.register_full_backward_pre_hook(hook)

    outcome = grade("03.2", in_place)
    assert outcome.passed, outcome.detail

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


# ----- 03.5 ------------------------------------------------------------------------------------
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


def test_03_5_accepts_a_forward_hook_with_a_tensor_hook_and_a_list_of_handles():
    for answer in (tracker(), tracker(as_list=True)):
        result = grade("03.5", answer)
        assert result.passed, result.detail


def test_03_5_rejects_full_backward_hooks_returned_handles_and_output_stds():
    failed("03.5", tracker(kind="full backward hook"), "in-place", "tensor hook")
    failed("03.5", tracker(returns_handle=True), "returned the tensor hook's handle")
    failed("03.5", tracker(kind="output std"), "expected", "gradient")


def test_03_5_explains_a_tensor_hook_on_an_evaluation_output():
    failed("03.5", tracker(skip_no_grad=False), "torch.no_grad()", "output.requires_grad")


def test_03_5_rejects_a_tracker_that_keeps_going_after_removal():
    def never_stops(model, names):
        stds, _ = tracker()(model, names)
        return stds, []  # nothing to remove: the hooks stay and keep adding values

    failed("03.5", never_stops, "removing the returned hooks left a hook")


# ----- 03.1 ------------------------------------------------------------------------------------
def halver(returned):
    """An answer to 03.1 whose full backward hook returns ``returned(grad_input)``."""
    def halve_grad_input(module):
        return module.register_full_backward_hook(lambda m, gi, go: returned(gi))

    return halve_grad_input


def test_03_1_accepts_halved_tensors_with_the_nones_kept():
    result = grade("03.1", halver(lambda gi: tuple(None if g is None else g / 2 for g in gi)))
    assert result.passed, result.detail


def test_03_1_rejects_multiplied_nones_a_bare_tensor_a_short_tuple_and_a_pre_hook():
    failed("03.1", halver(lambda gi: tuple(g * 0.5 for g in gi)), "keep those entries None")
    failed("03.1", halver(lambda gi: gi[0] / 2), "not a bare tensor")
    failed("03.1", halver(lambda gi: (gi[0] / 2, *gi[1:])), "b.grad is not half")
    failed("03.1", lambda m: m.register_full_backward_pre_hook(lambda mm, go: (go[0] / 2,)), "weight's gradient")
    failed("03.1", lambda m: None, "handle", "None (missing return?)")
