"""The field guide G5's checkers (the deconvnet ReLU hook, G5.1; Layer-CAM from recorded hooks, G5.2; the
deletion test's loop, G5.3; the cascade of re-drawn copies, G5.4) accept a correct answer and reject wrong ones."""

from __future__ import annotations

import copy

import pytest
import torch
from answers import failed
from test_exercises_nb05 import recorder

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


# ----- G5.2: Layer-CAM from recorded hooks ----------------------------------------------------------------
def layer_cam_from(maps):
    def layer_cam(model, layer, images, classes):
        activation, gradient = recorder()(model, layer, images, classes)
        return maps(activation, gradient)

    return layer_cam


def right_layer_cam(a, g):
    return (g.clamp(min=0) * a).sum(dim=1).clamp(min=0)


def test_g5_2_layer_cam():
    outcome = grade("G5.2", layer_cam_from(right_layer_cam))
    assert outcome.passed and "(4, 4, 4), (3, 6, 6), (2, 5, 5)" in outcome.detail
    assert "flatten-head network, 0 of 50 of your Layer-CAM maps" in outcome.detail and "Grad-CAM: 35" in outcome.detail


def test_g5_2_near_misses_get_a_hint():
    failed("G5.2", layer_cam_from(lambda a, g: (g.mean(dim=(2, 3), keepdim=True) * a).sum(1).clamp(min=0)),
           "that is Grad-CAM")
    failed("G5.2", layer_cam_from(lambda a, g: (g * a).sum(1).clamp(min=0)), "positive part of its gradient")
    failed("G5.2", layer_cam_from(lambda a, g: (g.clamp(min=0) * a).sum(1)), "after summing")
    failed("G5.2", layer_cam_from(lambda a, g: (g.clamp(min=0) * a).mean(1).clamp(min=0)), "not mean")
    failed("G5.2", layer_cam_from(lambda a, g: (g.clamp(min=0) * a.clamp(min=0)).sum(1).clamp(min=0)),
           "keep their sign")
    failed("G5.2", layer_cam_from(lambda a, g: right_layer_cam(a, g)[:, None]), "channel dimension (dim 1)")
    failed("G5.2", layer_cam_from(lambda a, g: right_layer_cam(a, g)[0]), "one map per image")
    failed("G5.2", layer_cam_from(lambda a, g: right_layer_cam(a, g).tolist()), "as a tensor, got list")


def test_g5_2_hooks_and_gradients_are_checked():
    def leaves_grad(model, layer, images, classes):
        activation, gradient = recorder(grads="backward")(model, layer, images, classes)
        return right_layer_cam(activation, gradient)

    def leaves_hook(model, layer, images, classes):
        activation, gradient = recorder(remove=False)(model, layer, images, classes)
        return right_layer_cam(activation, gradient)

    failed("G5.2", leaves_grad, ".grad")
    failed("G5.2", leaves_hook, "a hook stayed on the model")


# ----- G5.4: cascading randomisation, on properties --------------------------------------------------
def _cascade(model, names, *, cumulative=True, deep=True, init="reset", seed=None):
    """A right answer to G5.4 (any random numbers); the keyword arguments plant the usual mistakes."""
    if seed is not None:
        torch.manual_seed(seed)
    copies, current = [], model
    for name in names:
        current = (copy.deepcopy(current if cumulative else model)) if deep else current
        layer = current.get_submodule(name)
        if init == "reset":
            layer.reset_parameters()
        elif init == "normal":
            with torch.no_grad():
                for p in layer.parameters():
                    p.normal_()
        copies.append(current)
    return copies


@pytest.mark.parametrize("seed", [None, 0, 7])
def test_g5_3_cascade_passes_whatever_the_random_numbers(seed):
    outcome = grade("G5.4", lambda m, names: _cascade(m, names, seed=seed))
    assert outcome.passed and "head.2, features.5, features.2" in outcome.detail


def test_g5_3_the_packaged_cascade_passes():
    from hooklab.saliency import randomised_cascade

    assert grade("G5.4", randomised_cascade).passed


def test_g5_3_typical_mistakes_get_a_hint():
    failed("G5.4", lambda m, names: _cascade(m, names, cumulative=False), "keeps the layers above it random")
    failed("G5.4", lambda m, names: _cascade(m, names, deep=False), "the model you were given changed")
    failed("G5.4", lambda m, names: _cascade(m, names, init="normal"), "reset_parameters()")
    failed("G5.4", lambda m, names: _cascade(m, names, init="none"), "still holds the trained values")
    failed("G5.4", lambda m, names: _cascade(m, names[:2]), "3 names, 2 models")
    failed("G5.4", lambda m, names: _cascade(m, names)[-1], "a list of models")
    failed("G5.4", lambda m, names: _cascade(m, ["features.0", *names[1:]]), "should have layer 'head.2' re-drawn")
    failed("G5.4", lambda m, names: [m] * len(names), "its own copy")


def test_g5_3_each_copy_from_the_one_before():
    def every_copy_from_the_model(model, names):
        copies = []
        for k in range(len(names)):
            current = copy.deepcopy(model)
            for name in names[: k + 1]:
                current.get_submodule(name).reset_parameters()
            copies.append(current)
        return copies

    def shallow(model, names):
        copies, current = [], model
        for name in names:
            current = copy.copy(current)
            current.get_submodule(name).reset_parameters()
            copies.append(current)
        return copies

    failed("G5.4", every_copy_from_the_model, "re-drew 'head.2' again", "copy of model 0")
    failed("G5.4", shallow, "changed")


def _deletion_answer(fill="mean", cumulative=True, fixed=True, sign=1, in_finally=True, in_place=False):
    """A G5.3 answer: the worked loop with one slip switched on."""
    from hooklab.exercises.nb05 import pixels_under

    def deletion(model, x, targets, order, k=8):
        means = x.mean(dim=(1, 2, 3), keepdim=True) if fill == "mean" else x.mean() if fill == "batch" else 0.0
        with torch.no_grad():
            start = model(x).gather(1, targets[:, None])[:, 0]
        falls = []
        for n in range(1, k + 1):
            patch = pixels_under(order[:, :n] if cumulative else order[:, n - 1:n])
            if in_place:
                x[patch.expand_as(x)] = 0.0
            handle = model.register_forward_pre_hook(
                lambda m, args, patch=patch: (torch.where(patch, torch.as_tensor(means), args[0]),))
            if in_finally:
                try:
                    with torch.no_grad():
                        scores = model(x)
                finally:
                    handle.remove()
            else:
                with torch.no_grad():
                    scores = model(x)
                handle.remove()
            now = scores.gather(1, (targets if fixed else scores.argmax(dim=1))[:, None])[:, 0]
            falls.append(sign * (start - now).mean())
        return torch.stack(falls)

    return deletion


def test_g5_4_the_deletion_loop_passes_and_each_slip_is_named():
    from hooklab.exercises.g5 import worked_deletion

    assert grade("G5.3", worked_deletion).passed
    assert grade("G5.3", _deletion_answer()).passed
    failed("G5.3", _deletion_answer(fill="zero"), "filled the patches with 0")
    failed("G5.3", _deletion_answer(fill="batch"), "one mean for the whole batch")
    failed("G5.3", _deletion_answer(cumulative=False), "cumulative")
    failed("G5.3", _deletion_answer(fixed=False), "keep the targets")
    failed("G5.3", _deletion_answer(sign=-1), "wrong sign")
    failed("G5.3", _deletion_answer(in_finally=False), "finally")
    failed("G5.3", _deletion_answer(in_place=True), "changed the digits")
    failed("G5.3", lambda model, x, targets, order, k=8: [0.0] * k, "return a tensor")
