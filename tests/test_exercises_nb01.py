"""Exercise checkers of notebook 01 accept a right answer and reject wrong ones."""

from __future__ import annotations

import torch

from hooklab.exercises import grade


# ----- 01.1 -------------------------------------------------------------------------------------
def clamp_right(t, limit):
    return t.register_hook(lambda g: g.clamp(-limit, limit))


def test_01_1_accepts_a_clamping_hook():
    assert grade("01.1", clamp_right).passed


def test_01_1_rejects_wrong_answers():
    assert not grade("01.1", lambda t, limit: t.register_hook(lambda g: g.clamp(min=-limit))).passed
    assert not grade("01.1", lambda t, limit: t.register_hook(lambda g: None)).passed
    assert not grade("01.1", lambda t, limit: None).passed  # no handle returned
    kept = []

    def no_remove(t, limit):
        kept.append(t.register_hook(lambda g: g.clamp(-limit, limit)))

        class Fake:
            def remove(self):
                pass

        return Fake()

    try:
        result = grade("01.1", no_remove)
    finally:
        for h in kept:
            h.remove()
    assert not result.passed and "remove" in result.detail


# ----- 01.2 -------------------------------------------------------------------------------------
def test_01_2_accepts_a_doubling_prehook():
    assert grade("01.2", lambda node: node.register_prehook(lambda go: (go[0] * 2,))).passed


def test_01_2_rejects_wrong_answers():
    assert not grade("01.2", lambda node: node.register_prehook(lambda go: (go[0] * 3,))).passed
    assert not grade("01.2", lambda node: node.register_prehook(lambda go: None)).passed
    # a post-hook replacing grad_inputs with twice grad_outputs skips exp's derivative
    assert not grade("01.2", lambda node: node.register_hook(lambda gi, go: (go[0] * 2,))).passed


# ----- 01.3 -------------------------------------------------------------------------------------
def fuse_right(model, lr):
    def step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-lr)
        p.grad = None

    return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]


def test_01_3_accepts_a_fused_sgd_step():
    assert grade("01.3", fuse_right).passed


def test_01_3_rejects_wrong_answers():
    def keeps_grad(model, lr):
        def step(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-lr)

        return [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    def wrong_sign(model, lr):
        return fuse_right(model, -lr)

    def only_weights(model, lr):
        return fuse_right(model, lr)[::2]

    for wrong in (keeps_grad, wrong_sign, only_weights):
        assert not grade("01.3", wrong).passed, wrong.__name__


# ----- 01.4 -------------------------------------------------------------------------------------
def saved_right(fn, x):
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        fn(x)
    return shapes


def test_01_4_accepts_the_saved_shapes():
    assert grade("01.4", saved_right).passed


def test_01_4_rejects_wrong_answers():
    assert not grade("01.4", lambda fn, x: [tuple(x.shape)]).passed
    assert not grade("01.4", lambda fn, x: saved_right(fn, x)[::-1]).passed
    assert not grade("01.4", lambda fn, x: [*saved_right(fn, x), (1,)]).passed


def test_01_1_rejects_a_hook_that_clamps_in_place():
    result = grade("01.1", lambda t, limit: t.register_hook(lambda g: g.clamp_(-limit, limit)))
    assert not result.passed and "in place" in result.detail


def test_01_2_says_when_a_post_hook_doubled_the_result_instead():
    result = grade("01.2", lambda node: node.register_hook(lambda gi, go: (gi[0] * 2,)))
    assert not result.passed and "register_prehook" in result.detail


def test_01_4_says_to_return_shapes_not_tensors():
    def tensors(fn, x):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            fn(x)
        return kept

    result = grade("01.4", tensors)
    assert not result.passed and "tuple(t.shape)" in result.detail
