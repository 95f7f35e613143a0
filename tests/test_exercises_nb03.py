"""Notebook 03's checkers accept a correct answer and reject wrong ones."""

from __future__ import annotations

import warnings

import torch

from hooklab.exercises import grade


# ----- 03.1 ------------------------------------------------------------------------------------
def gains_right(model, x):
    gains, handles = {}, []

    def keep(name):
        def hook(module, grad_input, grad_output):
            if grad_input[0] is not None:
                gains[name] = (grad_input[0].norm() / grad_output[0].norm()).item()

        return hook

    try:
        for name, module in model.named_children():
            handles.append(module.register_full_backward_hook(keep(name)))
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return gains


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


def test_03_1_rejects_a_wrong_gain():
    outcome = grade("03.1", lambda model, x: {**gains_right(model, x), "4": 1.0})
    assert not outcome.passed and "layer '4'" in outcome.detail


def test_03_1_explains_a_hook_that_returns_a_value():
    def lambda_hooks(model, x):
        handles = [m.register_full_backward_hook(lambda m, gi, go: (gi, go)) for m in model.children()]
        try:
            model(x).sum().backward()
        finally:
            for h in handles:
                h.remove()

    outcome = grade("03.1", lambda_hooks)
    assert not outcome.passed and "return None" in outcome.detail


def test_03_1_rejects_hooks_left_behind():
    def leaves_hooks(model, x):
        for m in model.children():
            m.register_full_backward_hook(lambda m, gi, go: None)
        return gains_right(model, x)

    outcome = grade("03.1", leaves_hooks)
    assert not outcome.passed and "still registered" in outcome.detail


def test_03_1_explains_hooks_that_return_a_scalar_or_grad_output():
    for returned in (lambda gi, go: gi[0].norm() / go[0].norm(), lambda gi, go: 1.0, lambda gi, go: go):
        def answer(model, x, returned=returned):
            handles = [m.register_full_backward_hook(lambda m, gi, go: returned(gi, go)) for m in model.children()]
            try:
                model(x).sum().backward()
            finally:
                for h in handles:
                    h.remove()

        outcome = grade("03.1", answer)
        assert not outcome.passed and "return None" in outcome.detail, outcome.detail


def test_03_1_rejects_hooks_left_behind_when_forward_raises():
    def no_finally(model, x):
        gains, handles = {}, []
        for name, module in model.named_children():
            def hook(module, gi, go, name=name):
                if gi[0] is not None:
                    gains[name] = (gi[0].norm() / go[0].norm()).item()

            handles.append(module.register_full_backward_hook(hook))
        model(x).sum().backward()
        for h in handles:
            h.remove()
        return gains

    outcome = grade("03.1", no_finally)
    assert not outcome.passed and "finally" in outcome.detail


def test_03_1_rejects_the_legacy_backward_hook():
    def legacy(model, x):
        gains, handles = {}, []
        try:
            for name, module in model.named_children():
                def hook(module, gi, go, name=name):
                    if gi[0] is not None:
                        gains[name] = (gi[0].norm() / go[0].norm()).item()

                handles.append(module.register_backward_hook(hook))
            model(x).sum().backward()
        finally:
            for h in handles:
                h.remove()
        return gains

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecation warning of the student's own call
        outcome = grade("03.1", legacy)
    assert not outcome.passed and "deprecated" in outcome.detail


# ----- 03.2 ------------------------------------------------------------------------------------
def clip_right(module, limit):
    return module.register_full_backward_pre_hook(lambda m, go: tuple(g.clamp(-limit, limit) for g in go))


def clip_after(module, limit):  # a full backward hook returns grad_input: the weight gradient is not clipped
    return module.register_full_backward_hook(lambda m, gi, go: tuple(g.clamp(-limit, limit) for g in gi))


def test_03_2_accepts_pre_hook_rejects_post_hook():
    assert grade("03.2", clip_right).passed
    outcome = grade("03.2", clip_after)
    assert not outcome.passed and "weight.grad" in outcome.detail and "unclipped" in outcome.detail


def test_03_2_rejects_no_clipping():
    outcome = grade("03.2", lambda module, limit: module.register_full_backward_pre_hook(lambda m, go: None))
    assert not outcome.passed


# ----- 03.3 ------------------------------------------------------------------------------------
def relu_grads(model, x, hook_kind):
    """Tensor hooks on each ReLU's input, registered in a forward pre-hook or (wrong) a forward hook."""
    grads, handles = {}, []

    def keep(name):
        def register(module, args, *output):
            handles.append(args[0].register_hook(lambda g: grads.__setitem__(name, g)))

        return register

    try:
        for name in ("relu1", "relu2"):
            module = model.get_submodule(name)
            register = getattr(module, f"register_forward_{hook_kind}")
            handles.append(register(keep(name)))
        model(x).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return grads


def test_03_3_accepts_pre_hooks_rejects_forward_hooks():
    assert grade("03.3", lambda model, x: relu_grads(model, x, "pre_hook")).passed
    outcome = grade("03.3", lambda model, x: relu_grads(model, x, "hook"))
    assert not outcome.passed and "dL/d(ReLU output)" in outcome.detail and "pre-hook" in outcome.detail


def test_03_3_explains_a_pre_hook_that_returns_the_handle():
    def lambda_pre_hooks(model, x):
        grads, handles = {}, []
        try:
            for name in ("relu1", "relu2"):
                handles.append(model.get_submodule(name).register_forward_pre_hook(
                    lambda m, args, name=name: args[0].register_hook(lambda g: grads.__setitem__(name, g))))
            model(x).sum().backward()
        finally:
            for h in handles:
                h.remove()
        return grads

    outcome = grade("03.3", lambda_pre_hooks)
    assert not outcome.passed and "return None" in outcome.detail


def test_03_3_explains_why_full_backward_hooks_fail():
    def full_hooks(model, x):
        grads, handles = {}, []
        try:
            for name in ("relu1", "relu2"):
                handles.append(model.get_submodule(name).register_full_backward_hook(
                    lambda m, gi, go, name=name: grads.__setitem__(name, gi[0])))
            model(x).sum().backward()
        finally:
            for h in handles:
                h.remove()
        return grads

    outcome = grade("03.3", full_hooks)
    assert not outcome.passed and "in place" in outcome.detail


def test_03_3_rejects_wrong_keys():
    outcome = grade("03.3", lambda model, x: {"relu1": torch.zeros(1)})
    assert not outcome.passed and "keys" in outcome.detail


def test_03_3_rejects_zeros_of_the_right_shape():
    def zeros(model, x):
        right = relu_grads(model, x, "pre_hook")
        return {name: torch.zeros_like(g) for name, g in right.items()}

    outcome = grade("03.3", zeros)
    assert not outcome.passed and "relu1" in outcome.detail


def test_03_3_rejects_the_legacy_backward_hook():
    def legacy(model, x):
        grads, handles = {}, []
        try:
            for name in ("relu1", "relu2"):
                handles.append(model.get_submodule(name).register_backward_hook(
                    lambda m, gi, go, name=name: grads.__setitem__(name, gi[0])))
            model(x).sum().backward()
        finally:
            for h in handles:
                h.remove()
        return grads

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        outcome = grade("03.3", legacy)
    assert not outcome.passed and "deprecated" in outcome.detail


def test_03_3_rejects_hooks_left_behind_when_forward_raises():
    def no_finally(model, x):
        grads, handles = {}, []

        def keep(name):
            def pre_hook(module, args):
                handles.append(args[0].register_hook(lambda g: grads.__setitem__(name, g)))

            return pre_hook

        for name in ("relu1", "relu2"):
            handles.append(model.get_submodule(name).register_forward_pre_hook(keep(name)))
        model(x).sum().backward()
        for h in handles:
            h.remove()
        return grads

    outcome = grade("03.3", no_finally)
    assert not outcome.passed and "finally" in outcome.detail
