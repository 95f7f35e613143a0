"""Exercise checkers of notebook 01 accept a right answer and reject wrong ones."""

from __future__ import annotations

import fnmatch
import re

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


# ----- 01.4 -------------------------------------------------------------------------------------
def clamp_matching_with(count=lambda g, limit: int((g.abs() > limit).sum()),
                        clamp=lambda g, limit: g.clamp(-limit, limit), matches=fnmatch.fnmatch):
    """A right answer to 01.4, or a wrong one with one of its parts replaced."""

    def clamp_matching(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if matches(name, pattern):
                clamped[name] = 0

                def hook(grad, name=name):
                    clamped[name] += count(grad, limit)
                    return clamp(grad, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    return clamp_matching


def test_01_4_accepts_a_clamping_and_counting_hook_per_matching_parameter():
    assert grade("01.4", clamp_matching_with()).passed


def test_01_4_wants_counts_as_python_ints_as_01_2_wants_floats():
    # clamped[name] becomes a 0-d tensor that the second backward's += changes in place
    failed("01.4", clamp_matching_with(count=lambda g, limit: (g.abs() > limit).sum()),
           "holds a tensor", "Python int", "as 01.2 keeps each norm a float")
    failed("01.2", grad_norms_with(keep=lambda grad: grad.norm()), "Python floats")


def test_01_4_rejects_a_substring_test_with_a_hint_to_use_fnmatch():
    substring = clamp_matching_with(matches=lambda name, pattern: pattern.strip("*") in name)
    result = grade("01.4", substring)
    assert not result.passed and "'?.bias'" in result.detail and "fnmatch.fnmatch" in result.detail, result.detail


def test_01_4_rejects_wrong_clamps():
    for clamp, words in [
        (lambda g, limit: g.clamp(min=-limit), "instead of the clamped gradient"),
        (lambda g, limit: None, "instead of the clamped gradient"),
        (lambda g, limit: g.clamp(-1, 1), "limit 0.5"),
        (lambda g, limit: g.clamp_(-limit, limit), "in place"),
    ]:
        failed("01.4", clamp_matching_with(clamp=clamp), words)


def test_01_4_rejects_hooks_on_parameters_the_pattern_does_not_name():
    failed("01.4", clamp_matching_with(matches=lambda name, pattern: True), "also went on ['0.bias'",
           "does not match")
    failed("01.4", clamp_matching_with(matches=lambda name, pattern: pattern in name),  # not a pattern
           "no hook went on ['0.weight'", "not a substring test")


def test_01_4_rejects_a_glob_turned_into_an_unanchored_regex():
    def escaped(name, pattern):
        return re.search(pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name)

    def unescaped(name, pattern):
        return re.search(pattern.replace("?", ".").replace("*", ".*"), name)

    for matches in (escaped, unescaped):
        outcome = failed("01.4", clamp_matching_with(matches=matches), "also went on ['10.bias']", "without ^ and $")
        assert "_" + "backward_hooks" not in outcome.detail  # no private names
    assert grade("01.4", clamp_matching_with(matches=lambda name, pattern: re.fullmatch(
        pattern.replace(".", r"\.").replace("?", ".").replace("*", ".*"), name))).passed


def test_01_4_wants_every_count_at_0_before_the_first_backward():
    def counted_on_first_use(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                def hook(grad, name=name):
                    clamped[name] = clamped.get(name, 0) + int((grad.abs() > limit).sum())
                    return grad.clamp(-limit, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    failed("01.4", counted_on_first_use, "before the first backward clamped is {}", "clamped[name] = 0")
    starting_at_none = clamp_matching_with()

    def none_first(model, pattern, limit):
        handles, clamped = starting_at_none(model, pattern, limit)
        return handles, dict.fromkeys(clamped)

    failed("01.4", none_first, "before the first backward", "'0.weight': None")


def test_01_4_rejects_wrong_counts():
    def late_binding(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                clamped[name] = 0

                def hook(grad):
                    clamped[name] += int((grad.abs() > limit).sum())  # noqa: B023 (the bug, on purpose)
                    return grad.clamp(-limit, limit)

                handles.append(p.register_hook(hook))
        return handles, clamped

    def only_the_last(model, pattern, limit):
        handles, _ = clamp_matching_with(count=lambda g, limit: 0)(model, pattern, limit)
        return handles, {}

    for wrong, words in [
        (late_binding, "name=name"),
        (clamp_matching_with(count=lambda g, limit: int((g.abs() >= 0).sum())), "entries were outside"),
        (only_the_last, "before the first backward clamped is {}"),
        (clamp_matching_with(count=lambda g, limit: int((g.abs() >= limit).sum())), "exactly at the limit"),
        (lambda model, pattern, limit: (clamp_matching_with()(model, pattern, limit)[0], 3), "got int"),
    ]:
        failed("01.4", wrong, words)
    # doubled counts: the last name's count equals the total, but the others are not 0, so no late binding
    outcome = failed("01.4", clamp_matching_with(count=lambda g, limit: 2 * int((g.abs() > limit).sum())),
                     "entries were outside")
    assert "name=name" not in outcome.detail, outcome.detail


def test_01_4_rejects_clamping_the_accumulated_grad():
    def after_accumulation(model, pattern, limit):
        clamped, handles = {}, []
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, pattern):
                clamped[name] = 0

                def clamp(p, name=name):
                    clamped[name] += int((p.grad.abs() > limit).sum())
                    p.grad.clamp_(-limit, limit)

                handles.append(p.register_post_accumulate_grad_hook(clamp))
        return handles, clamped

    result = grade("01.4", after_accumulation)
    assert not result.passed and "second backward without zeroing" in result.detail


def test_01_4_says_what_is_wrong_with_the_returned_pair():
    right = clamp_matching_with()
    kept = []

    def fake_handles(model, pattern, limit):
        handles, clamped = right(model, pattern, limit)
        kept.extend(handles)

        class Fake:
            def remove(self):
                pass

        return [Fake() for _ in handles], clamped

    try:
        for wrong, words in [
            (lambda model, pattern, limit: right(model, pattern, limit)[0], "got only handles"),
            (lambda model, pattern, limit: (None, {}), "list of handles"),
            (fake_handles, "found Fake in it"),
        ]:
            failed("01.4", wrong, words)
    finally:
        for h in kept:
            h.remove()


def test_01_4_checks_that_the_handles_remove_the_hooks():
    def other_handles(model, pattern, limit):
        handles, clamped = clamp_matching_with()(model, pattern, limit)
        spare = torch.zeros(1, requires_grad=True)
        return [spare.register_hook(lambda g: g) for _ in handles], clamped

    result = grade("01.4", other_handles)
    assert not result.passed and "after removing your handles" in result.detail


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
        ("01.b", [[2, 4, 6], [2, 4, 6]], "receives its result"),
        ("01.c", [0.25, 0.0], "0 / 0 is NaN"),
        ("01.c", [1.0, 0.0], "that is v"),
        ("01.d", "h", "got it from a step after it"),
        ("01.d", "rms", "not NaN"),
        ("01.e", 1, "only because the padded input row is 0"),
        ("01.e", 1e6, "not by 1"),
    ]:
        failed(id, guess, words)
