"""Exercise checkers of notebook 01 accept a right answer and reject wrong ones."""

from __future__ import annotations

import torch
from answers import failed

from hooklab.exercises import grade


# ----- 01.1 -------------------------------------------------------------------------------------
def scale_grad_right(t, factor):
    def scale(grad):
        return grad * factor

    return t.register_hook(scale)


def test_01_1_accepts_a_hook_returning_the_scaled_gradient():
    assert grade("01.1", scale_grad_right).passed


def test_01_1_rejects_wrong_answers():
    def in_place(t, factor):
        return t.register_hook(lambda grad: grad.mul_(factor))

    def returns_nothing(t, factor):
        return t.register_hook(lambda grad: None)

    def fixed_factor(t, factor):
        return t.register_hook(lambda grad: grad * 3)

    def no_handle(t, factor):
        scale_grad_right(t, factor)

    for wrong, words in [
        (in_place, "in place"),
        (returns_nothing, "must return the new gradient"),
        (fixed_factor, "factor -0.5"),
        (no_handle, "missing return?"),
    ]:
        failed("01.1", wrong, words)


# ----- 01.2 -------------------------------------------------------------------------------------
def grad_norms_with(keep=lambda grad: grad.norm().item(), result=lambda grad: None, bind=True):
    """A right answer to 01.2, or a wrong one: what it keeps, what its hook returns, or a late-bound name."""

    def grad_norms(named):
        norms, handles = {name: [] for name in named}, []
        for name, t in named.items():
            def hook(grad, bound=name):
                norms[bound if bind else name].append(keep(grad))  # noqa: B023 (the late-binding bug, on purpose)
                return result(grad)

            handles.append(t.register_hook(hook))
        return norms, handles

    return grad_norms


def test_01_2_accepts_one_norm_per_backward_under_each_name():
    assert grade("01.2", grad_norms_with()).passed


def test_01_2_rejects_wrong_answers():
    for wrong, words in [
        (grad_norms_with(bind=False), "name=name"),
        (grad_norms_with(keep=lambda grad: grad.norm()), "Python floats"),
        (grad_norms_with(keep=lambda grad: grad.abs().max().item()), "norms['h'] is"),
        (grad_norms_with(result=lambda grad: 2 * grad), "must return None"),
    ]:
        failed("01.2", wrong, words)


def test_01_2_wants_every_name_and_the_handles():
    def names_on_first_gradient(named):
        norms, handles = {}, []
        for name, t in named.items():
            def hook(grad, name=name):
                norms.setdefault(name, []).append(grad.norm().item())

            handles.append(t.register_hook(hook))
        return norms, handles

    failed("01.2", names_on_first_gradient, "expected every name")
    failed("01.2", lambda named: grad_norms_with()(named)[0], "(norms, handles)")


# ----- 01.3 -------------------------------------------------------------------------------------
def dms_right(dnormed, h, rms):
    drms = (dnormed * -h / (rms + 1e-6) ** 2).sum(dim=1, keepdim=True)
    return drms / (2 * rms)


def test_01_3_accepts_the_chain_rule_by_hand_and_prints_a_cmp_line():
    outcome = grade("01.3", dms_right)
    assert outcome.passed and "max diff" in outcome.detail and "NaN in both" in outcome.detail, outcome.detail


def test_01_3_rejects_wrong_derivations():
    for wrong, words in [
        (lambda dn, h, rms: -dms_right(dn, h, rms), "wrong sign"),
        (lambda dn, h, rms: dms_right(dn, h, rms) * 2 * rms, "the gradient at rms"),
        (lambda dn, h, rms: dn * -h / (rms + 1e-6) ** 2 / (2 * rms), "add up over the row"),
        (lambda dn, h, rms: torch.nan_to_num(dms_right(dn, h, rms)), "do not repair it"),
        (lambda dn, h, rms: (dn * -h / (rms + 1e-6)).sum(1, keepdim=True) / (2 * rms), "step by step"),
        (lambda dn, h, rms: None, "return a tensor"),
        (lambda dn, h, rms: (dn * -h / rms**2).sum(1, keepdim=True) / (2 * rms), "left out the 1e-6"),
    ]:
        failed("01.3", wrong, *words.split("|"))


def test_01_3_rejects_asking_autograd_for_the_answer():
    def by_autograd(dnormed, h, rms):
        ms = (rms**2).requires_grad_()
        return torch.autograd.grad(h / (ms.sqrt() + 1e-6), ms, dnormed)[0]

    def by_backward(dnormed, h, rms):
        ms = (rms**2).requires_grad_()
        (h / (ms.sqrt() + 1e-6) * dnormed).sum().backward()
        return ms.grad

    for wrong in (by_autograd, by_backward):
        failed("01.3", wrong, "asked autograd", "derive it yourself")


# ----- predictions ------------------------------------------------------------------------------
RIGHT_GUESSES = {
    "01.a": [0.2, 0.4],
    "01.b": [[4, 8, 12], [2, 4, 6]],
    "01.c": [0.25, float("nan")],
    "01.d": "ms",
    "01.e": 1000,
}


def test_the_predictions_are_right_about_torch():
    for id, guess in RIGHT_GUESSES.items():
        assert grade(id, guess).passed, id


def test_a_common_wrong_guess_gets_its_own_hint():
    for id, guess, words in [
        ("01.a", [0.2, 0.2], "multiplies b's gradient 0.2 by 2"),
        ("01.a", [0.4, 0.2], "swapped"),
        ("01.a", [1.0, 0.4], "the hook's entry is not"),
        ("01.b", [[2, 4, 6], [2, 4, 6]], "receives its result"),
        ("01.c", [0.25, 0.0], "0 / 0 is NaN"),
        ("01.c", [1.0, 0.0], "that is v"),
        ("01.d", "h", "got it from a step after it"),
        ("01.d", "rms", "not NaN"),
        ("01.e", 1, "only because the padded input row is 0"),
        ("01.e", 1e6, "not by 1"),
    ]:
        failed(id, guess, words)
