"""Notebook 03's checkers accept a correct answer and reject wrong ones."""

from __future__ import annotations

import torch

from hooklab.exercises import exercises


def run(id_, answer):
    return exercises()[id_].checker(answer)


# ----- 03.1 ------------------------------------------------------------------------------------
def capture_right(module, x):
    seen = {}
    handle = module.register_full_backward_hook(lambda m, gi, go: seen.update(gi=gi, go=go))
    try:
        module(x).sum().backward()
    finally:
        handle.remove()
    return seen["gi"], seen["go"]


def capture_swapped(module, x):
    grad_input, grad_output = capture_right(module, x)
    return grad_output, grad_input


def capture_leaves_hook(module, x):
    seen = {}
    module.register_full_backward_hook(lambda m, gi, go: seen.update(gi=gi, go=go))
    module(x).sum().backward()
    return seen["gi"], seen["go"]


def test_03_1_accepts_right_rejects_swapped():
    assert run("03.1", capture_right).passed
    outcome = run("03.1", capture_swapped)
    assert not outcome.passed and "grad_output[0]" in outcome.detail


def test_03_1_rejects_a_hook_left_behind():
    # the checker's module (and the hook left on it) is freed when the checker returns
    outcome = run("03.1", capture_leaves_hook)
    assert not outcome.passed and "still registered" in outcome.detail


# ----- 03.2 ------------------------------------------------------------------------------------
def clip_right(module, limit):
    return module.register_full_backward_pre_hook(lambda m, go: tuple(g.clamp(-limit, limit) for g in go))


def clip_after(module, limit):  # a full backward hook returns grad_input: the weight gradient is not clipped
    return module.register_full_backward_hook(lambda m, gi, go: tuple(g.clamp(-limit, limit) for g in gi))


def test_03_2_accepts_pre_hook_rejects_post_hook():
    assert run("03.2", clip_right).passed
    outcome = run("03.2", clip_after)
    assert not outcome.passed and "weight.grad" in outcome.detail and "unclipped" in outcome.detail


def test_03_2_rejects_no_clipping():
    outcome = run("03.2", lambda module, limit: module.register_full_backward_pre_hook(lambda m, go: None))
    assert not outcome.passed


# ----- 03.3 ------------------------------------------------------------------------------------
def conv_grads_right(model, x):
    grads, handles = {}, []

    def keep(name):
        def forward_hook(module, args, output):
            output.register_hook(lambda g: grads.__setitem__(name, g))

        return forward_hook

    try:
        for name in ("conv1", "conv2"):
            handles.append(model.get_submodule(name).register_forward_hook(keep(name)))
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return grads


def conv_grads_after_relu(model, x):
    """Wrong: the gradient w.r.t. the ReLU outputs (hooks registered after the in-place op)."""
    grads, handles = {}, []
    try:
        for conv, relu in (("conv1", "relu1"), ("conv2", "relu2")):
            def hook(module, args, output, name=conv):
                output.register_hook(lambda g: grads.__setitem__(name, g))  # returns None: output kept

            handles.append(model.get_submodule(relu).register_forward_hook(hook))
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return grads


def test_03_3_accepts_right_rejects_after_relu():
    assert run("03.3", conv_grads_right).passed
    outcome = run("03.3", conv_grads_after_relu)
    assert not outcome.passed and "before the ReLU" in outcome.detail


def test_03_3_rejects_wrong_keys():
    outcome = run("03.3", lambda model, x: {"conv1": torch.zeros(1)})
    assert not outcome.passed and "keys" in outcome.detail


def test_03_3_rejects_zeros_of_the_right_shape():
    def zeros(model, x):
        right = conv_grads_right(model, x)
        return {name: torch.zeros_like(g) for name, g in right.items()}

    outcome = run("03.3", zeros)
    assert not outcome.passed and "conv1" in outcome.detail
