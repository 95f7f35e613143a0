"""The field guide G5's checker (the deconvnet ReLU hook, G5.1) accepts a correct answer and rejects wrong ones."""

from __future__ import annotations

import torch
from answers import failed

from hooklab.exercises import grade
from hooklab.saliency import GuidedBackprop


def test_g5_1_deconvnet_hook():
    passed = grade("G5.1", lambda m, gi, go: (go[0].clamp(min=0),))
    assert passed.passed and "deconvnet gradients of 3 digits match" in passed.detail
    assert grade("G5.1", lambda m, gi, go: [torch.relu(go[0])]).passed
    failed("G5.1", lambda m, gi, go: None, "returned None")
    failed("G5.1", lambda m, gi, go: gi, "grad_input unchanged")
    failed("G5.1", lambda m, gi, go: go, "negative gradient")
    failed("G5.1", lambda m, gi, go: (gi[0].abs(),), "off by")
    failed("G5.1", lambda m, gi, go: go[0].clamp(min=0), "tuple", "bare tensor")


def test_g5_1_the_guided_hook_shown_above_the_exercise_is_not_the_answer():
    failed("G5.1", lambda m, gi, go: (gi[0].clamp(min=0),), "guided backprop's rule")
    failed("G5.1", GuidedBackprop.hook, "guided backprop's rule")


def test_g5_1_a_hook_that_changes_its_arguments_in_place_fails():
    def clamp_grad_input_in_place(module, grad_input, grad_output):
        grad_input[0].clamp_(min=0)

    def clamp_grad_output_in_place(module, grad_input, grad_output):
        grad_output[0].clamp_(min=0)
        return grad_output

    failed("G5.1", clamp_grad_input_in_place, "changed grad_input in place")
    failed("G5.1", clamp_grad_output_in_place, "changed grad_output in place")


def test_g5_1_wrong_return_values_get_a_message_instead_of_a_pytorch_error():
    failed("G5.1", lambda m, gi, go: (None,), "one tensor", "its entry is None")
    failed("G5.1", lambda m, gi, go: go[0].clamp(min=0).numpy(), "one tensor", "got ndarray")
    failed("G5.1", lambda m, gi, go: 0, "one tensor", "got int")
    failed("G5.1", lambda m, gi, go: (t.clamp(min=0) for t in go), "one tensor", "got generator")
    failed("G5.1", lambda m, gi, go: (go[0].clamp(min=0), go[0]), "one input", "not 2 entries")
    failed("G5.1", lambda m, gi, go: (go[0].clamp(min=0).double(),), "float64, expected float32")
    failed("G5.1", lambda m, gi, go: (go[0].clamp(min=0).flatten(),), "shape (8,), expected (2, 4)")


def test_g5_1_the_hook_is_also_checked_on_a_model():
    def only_on_the_sample(module, grad_input, grad_output):
        return (grad_output[0].clamp(min=0),) if grad_output[0].dim() == 2 else None

    failed("G5.1", only_on_the_sample, "did not change the gradient")
