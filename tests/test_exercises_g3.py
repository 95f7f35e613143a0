"""The field guide G3's checkers accept a correct answer and reject wrong ones."""

from __future__ import annotations

import warnings

import torch
from answers import failed
from test_exercises_nb03 import answer_with

from hooklab.exercises import grade


# ----- G3.1 ------------------------------------------------------------------------------------
def halver(returned):
    """An answer to G3.1 whose full backward hook returns ``returned(grad_input)``."""
    def halve_grad_input(module):
        return module.register_full_backward_hook(lambda m, gi, go: returned(gi))

    return halve_grad_input


def test_g3_1_accepts_halved_tensors_with_the_nones_kept():
    result = grade("G3.1", halver(lambda gi: tuple(None if g is None else g / 2 for g in gi)))
    assert result.passed, result.detail


def test_g3_1_rejects_multiplied_nones_a_bare_tensor_a_short_tuple_and_a_pre_hook():
    failed("G3.1", halver(lambda gi: tuple(g * 0.5 for g in gi)), "not a tensor (the number scale)",
           "keep those entries None")
    failed("G3.1", halver(lambda gi: gi[0] / 2), "not a bare tensor")
    failed("G3.1", halver(lambda gi: (gi[0] / 2, *gi[1:])), "b.grad is not half")
    failed("G3.1", lambda m: m.register_full_backward_pre_hook(lambda mm, go: (go[0] / 2,)), "weight's gradient")
    failed("G3.1", lambda m: None, "handle", "None (missing return?)")


def test_g3_1_names_the_no_input_case():
    def tensors_always(module):  # right while an input requires grad; returns tensors when none does
        def hook(m, gi, go):
            return tuple(None if g is None else g / 2 for g in gi) if any(g is not None for g in gi) else \
                (go[0], None, go[0])

        return module.register_full_backward_hook(hook)

    failed("G3.1", tensors_always, "no a and no b", "must return None")


# ----- G3.2 ------------------------------------------------------------------------------------
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


def test_g3_2_accepts_pre_hooks_rejects_forward_hooks():
    assert grade("G3.2", relu_grads_right).passed
    outcome = grade("G3.2", answer_with(input_grad_hook("hook"), names=RELUS))
    assert not outcome.passed and "dL/d(ReLU output)" in outcome.detail and "pre-hook" in outcome.detail


def test_g3_2_explains_a_pre_hook_that_returns_the_handle():
    outcome = grade("G3.2", answer_with(input_grad_hook(as_lambda=True), names=RELUS))
    assert not outcome.passed and "return None" in outcome.detail


def test_g3_2_explains_why_full_backward_hooks_fail():
    outcome = grade("G3.2", answer_with(grad_input_hook("register_full_backward_hook"), names=RELUS))
    assert not outcome.passed and "in place" in outcome.detail


def test_g3_2_rejects_wrong_keys():
    outcome = grade("G3.2", lambda model, x: {"relu1": torch.zeros(1)})
    assert not outcome.passed and "keys" in outcome.detail


def test_g3_2_rejects_zeros_of_the_right_shape():
    outcome = grade(
        "G3.2", lambda model, x: {name: torch.zeros_like(g) for name, g in relu_grads_right(model, x).items()}
    )
    assert not outcome.passed and "relu1" in outcome.detail


def test_g3_2_rejects_the_legacy_backward_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        outcome = grade("G3.2", answer_with(grad_input_hook("register_backward_hook"), names=RELUS))
    assert not outcome.passed and "deprecated" in outcome.detail


def test_g3_2_rejects_hooks_left_behind_when_forward_raises():
    outcome = grade("G3.2", answer_with(input_grad_hook(), names=RELUS, cleanup_in_finally=False))
    assert not outcome.passed and "finally" in outcome.detail

def test_g3_2_legacy_hook_advice_is_the_pre_hook():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        relus = grade("G3.2", answer_with(grad_input_hook("register_backward_hook"), names=RELUS))
    assert "forward pre-hook" in relus.detail and "use register_full_backward_hook" not in relus.detail, relus.detail
