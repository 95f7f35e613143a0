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

    def first_only(t, factor):
        seen = []

        def scale(grad):
            seen.append(1)
            return grad * factor if len(seen) == 1 else None

        return t.register_hook(scale)

    def post_accumulate(t, factor):
        def scale(p):
            p.grad.mul_(factor)

        return t.register_post_accumulate_grad_hook(scale)

    for wrong, words in [
        (in_place, "in place"),
        (returns_nothing, "must return the new gradient"),
        (fixed_factor, "factor -0.5"),
        (no_handle, "missing return?"),
        (first_only, "not only the first"),
        (post_accumulate, "the running sum"),
    ]:
        failed("01.1", wrong, words)


# ----- 01.3 -------------------------------------------------------------------------------------
def guard_with(bad=lambda grad: not grad.isfinite().all(), error=FloatingPointError, bind=True,
               result=lambda grad: None, message=lambda name: f"bad gradient at {name}"):
    """A right answer to 01.3, or a wrong one: what it counts as bad, what it raises, a late-bound name,
    or what its hook returns."""

    def guard(named):
        handles = []
        for name, t in named.items():
            def hook(grad, bound=name):
                if bad(grad):
                    raise error(message(bound if bind else name))  # noqa: B023 (late binding, on purpose)
                return result(grad)

            handles.append(t.register_hook(hook))
        return handles

    return guard


def test_01_3_accepts_a_guard_that_raises_naming_the_step():
    for message in (lambda name: f"bad gradient at {name}", lambda name: f"{name}.grad is bad",
                    lambda name: f"bad d{name}", lambda name: f"'{name}': not finite",
                    lambda name: f"gradient at {name}: check rms", lambda name: f"gradient at {name} (after ms)",
                    lambda name: f"a bad gradient arrived at {name}", lambda name: f"found a NaN or inf at {name}"):
        outcome = grade("01.3", guard_with(message=message))
        assert outcome.passed, outcome.detail
    for bad in (lambda grad: not torch.isfinite(grad).all(), lambda grad: grad.isnan().any() or grad.isinf().any(),
                lambda grad: not grad.sum().isfinite()):
        outcome = grade("01.3", guard_with(bad=bad))
        assert outcome.passed, outcome.detail


def test_01_3_rejects_wrong_answers():
    def prints(named):
        def hook(grad, name):
            if not grad.isfinite().all():
                print("bad gradient at", name)

        return [t.register_hook(lambda grad, name=name: hook(grad, name)) for name, t in named.items()]

    def after_backward(named):
        return [t.register_hook(lambda grad: None) for t in named.values()]

    for wrong, words in [
        (guard_with(bad=lambda grad: grad.norm() > 1e9), "comparison with NaN is always False"),
        (guard_with(bad=lambda grad: grad.abs().max() > 1e3), ("backward ran to the end", "isfinite")),
        (guard_with(bad=lambda grad: grad.isfinite().all()), "no padding"),
        (guard_with(bad=lambda grad: not grad.isfinite().all() or grad.norm() > 1e3),
         ("every gradient is finite", "NaN or ±inf only")),
        (guard_with(error=RuntimeError), "raise FloatingPointError"),
        (guard_with(bind=False), "name=name"),
        (guard_with(result=lambda grad: grad * 2), "must return None"),
        (prints, ("printed 'bad gradient at ms'", "instead of printing")),
        (after_backward, "backward ran to the end"),
        (lambda named: None, "list of handles"),
        (lambda named: guard_with()(named)[:2], "the 5 handles"),
        (names_every_tensor, "does not say which"),
        (guard_with(message=lambda name: "a bad gradient arrived at h"), ("it names 'h'", "whose hook raised")),
        (guard_with(message=lambda name: f"after logits, a NaN or inf at {name}"), ("before 'ms'",)),
        (guard_with(message=lambda name: f"on the way back from logits, the gradient at {name} is bad"),
         ("it names 'logits' before 'ms'", "Name that tensor first")),
        (guard_with(bad=lambda grad: grad.isnan().any()), ("the inf is made there", "isfinite")),
        (guard_with(bad=lambda grad: not torch.isfinite(grad.norm())), ("[1e20, 1e20]", "overflows", "not the norm")),
        (guard_with(bad=lambda grad: grad.isnan().any() or grad.abs().max() > 1e30),
         ("[1e35, -2]", "1e35 is finite", "size threshold")),
    ]:
        failed("01.3", wrong, *(words if isinstance(words, tuple) else (words,)))


def names_every_tensor(named):
    """A guard whose message lists every tensor it watches: it does not say which one failed."""
    def hook(grad):
        if not grad.isfinite().all():
            raise FloatingPointError(f"bad gradient in one of {', '.join(named)}")

    return [t.register_hook(hook) for t in named.values()]


# ----- 01.2 -------------------------------------------------------------------------------------
def kept_and_one_hot(logits, y):
    """The lesson's given lines: the mask of the rows the loss keeps (label -100 is left out), and the one-hot
    targets (-100 as class 0, masked afterwards)."""
    return (y != -100).unsqueeze(1), torch.nn.functional.one_hot(y.clamp(min=0), logits.shape[1])


def head_right(logits, y, w):
    """The right gradients at logits and normed: 0 in the padded row, the mean over the rows kept."""
    real, onehot = kept_and_one_hot(logits, y)
    dlogits = (logits.softmax(dim=1) - onehot) * real / real.sum()
    return dlogits, dlogits @ w


def by_hand_right(logits, y, w, h, rms, drms=None, dms=None, dh=None):
    """The right derivation, or a wrong one: a slip in one step, the steps after it built on it."""
    dlogits, dnormed = head_right(logits, y, w)
    drms = (dnormed * -h / (rms + 1e-6) ** 2).sum(dim=1, keepdim=True) if drms is None else drms(dnormed)
    dms = drms / (2 * rms) if dms is None else dms(drms)
    dh = dnormed / (rms + 1e-6) + dms * 2 * h / h.shape[1] if dh is None else dh(dms, dnormed)
    return {"logits": dlogits, "normed": dnormed, "rms": drms, "ms": dms, "h": dh}


def test_01_2_accepts_the_chain_rule_by_hand_and_prints_a_cmp_line_per_tensor():
    outcome = grade("01.2", by_hand_right)
    assert outcome.passed and outcome.detail.count("max diff") == 5, outcome.detail
    assert "the padded one included" in outcome.detail and "§4" not in outcome.detail, outcome.detail


def test_01_2_accepts_dh_fused_into_one_line():
    """The lesson's optional step: dh in closed form from dnormed, h and rms alone, NaN in the padded row."""
    fused = slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6)
                 - h * (dn * h).sum(dim=1, keepdim=True) / (h.shape[1] * rms * (rms + 1e-6) ** 2))
    outcome = grade("01.2", fused)
    assert outcome.passed, outcome.detail


def slip(drms=None, dms=None, dh=None):
    """An answer with a slip: each argument a function of (dnormed, h, rms) and the step before."""
    def answer(logits, y, w, h, rms):
        return by_hand_right(logits, y, w, h, rms, drms=drms and (lambda dn: drms(dn, h, rms)),
                             dms=dms and (lambda d: dms(d, rms)), dh=dh and (lambda d, dn: dh(d, dn, h, rms)))

    return answer


def head_slip(dlogits):
    """An answer with a slip at logits (a function of logits, the one-hot targets and the mask of kept rows);
    normed built on it."""
    def answer(logits, y, w, h, rms):
        right = by_hand_right(logits, y, w, h, rms)
        real, onehot = kept_and_one_hot(logits, y)
        d = dlogits(logits, onehot, real)
        return {**right, "logits": d, "normed": d @ w}

    return answer


def test_01_2_rejects_wrong_derivations():
    for wrong, words in [
        (head_slip(lambda z, t, m: z.softmax(dim=1) - t), "3 times too large"),
        (head_slip(lambda z, t, m: (t - z.softmax(dim=1)) * m / m.sum()), "wrong sign"),
        (head_slip(lambda z, t, m: (z.softmax(dim=0) - t) * m / m.sum()), "differs from what the hook caught"),
        (head_slip(lambda z, t, m: (z.softmax(dim=1) - t) * m / len(m)), "divided by len(y) = 4|(y != -100).sum()"),
        (head_slip(lambda z, t, m: (z.softmax(dim=1) - t) / len(m)), "divided by len(y) = 4"),
        (head_slip(lambda z, t, m: (z.softmax(dim=1) - t) / m.sum()), "not 0 in the padded row|y != -100"),
        (lambda z, y, w, h, rms: {**by_hand_right(z, y, w, h, rms), "normed": head_right(z, y, w)[1] * 2},
         "dnormed = dlogits @ w"),
        (slip(drms=lambda dn, h, rms: (dn * h / (rms + 1e-6) ** 2).sum(1, keepdim=True)), "wrong sign"),
        (slip(drms=lambda dn, h, rms: dn * -h / (rms + 1e-6) ** 2), "add up over the row|broadcast"),
        (slip(drms=lambda dn, h, rms: (dn * -h / rms**2).sum(1, keepdim=True)), "left out the 1e-6"),
        (slip(drms=lambda dn, h, rms: (dn * -h / (rms + 1e-6)).sum(1, keepdim=True)), "their sum"),
        (slip(dms=lambda d, rms: d), "the one at rms"),
        (slip(dms=lambda d, rms: d / (2 * (rms + 1e-6))), "wrong place|(2 · (rms + 1e-6))"),
        (slip(dms=lambda d, rms: d / (2 * (rms**2 + 1e-6).sqrt())), "wrong place|√(ms + 1e-6)"),
        (slip(dms=lambda d, rms: d / (2 * rms) * 1.5), "differs from what the hook caught by up to"),
        (slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6)), "only the path through normed"),
        (slip(dh=lambda d, dn, h, rms: d * 2 * h / h.shape[1]), "only the path through ms"),
        (slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6) + d * 2 * h), "two paths add up"),
        (slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6) + d * 2 * h / 8), "you divided by 8|divide by h.shape[1]"),
        (slip(dh=lambda d, dn, h, rms: torch.nan_to_num(dn / (rms + 1e-6) + d * 2 * h / h.shape[1])),
         "in the padded row|Derive that row"),
        (slip(dh=lambda d, dn, h, rms: torch.where(rms > 0, dn / (rms + 1e-6) + d * 2 * h / h.shape[1], 0.0)),
         "in the padded row|Derive that row"),
        (lambda z, y, w, h, rms: None, "return a dict"),
        (lambda z, y, w, h, rms: by_hand_right(z, y, w, h, rms)["ms"], "return a dict"),
        (lambda z, y, w, h, rms: {**by_hand_right(z, y, w, h, rms), "h": None}, '["h"] is'),
    ]:
        failed("01.2", wrong, *words.split("|"))


def test_01_2_prints_the_largest_difference_not_two_rounded_vectors():
    outcome = grade("01.2", slip(dms=lambda d, rms: d / (2 * rms) * 1.5))
    assert not outcome.passed and "differs from what the hook caught by up to" in outcome.detail, outcome.detail
    assert "[" not in outcome.detail, outcome.detail


def test_01_2_rejects_asking_autograd_for_the_answer():
    def by_autograd(logits, y, w, h, rms):
        ms = (rms**2).requires_grad_()
        dnormed = head_right(logits, y, w)[1]
        dms = torch.autograd.grad(h / (ms.sqrt() + 1e-6), ms, dnormed)[0]
        return by_hand_right(logits, y, w, h, rms, dms=lambda d: dms)

    def by_backward(logits, y, w, h, rms):
        z = logits.clone().requires_grad_()
        torch.nn.functional.cross_entropy(z, y).backward()
        return {**by_hand_right(logits, y, w, h, rms), "logits": z.grad}

    for wrong in (by_autograd, by_backward):
        failed("01.2", wrong, "asked autograd", "derive them yourself")


# ----- 01.4 -------------------------------------------------------------------------------------
def _hooked(fn):
    return lambda t: t.register_hook(fn)


def test_01_4_accepts_a_new_tensor_with_non_finite_entries_at_zero():
    assert grade("01.4", _hooked(lambda g: torch.where(g.isfinite(), g, torch.zeros_like(g)))).passed
    assert grade("01.4", _hooked(lambda g: torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0))).passed


def test_01_4_rejects_wrong_repairs():
    def in_place(g):
        g[~g.isfinite()] = 0.0
        return g

    def not_removable(t):
        t.register_hook(lambda g: torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0))
        return t.register_hook(lambda g: None)

    for wrong, words in [
        (_hooked(lambda g: torch.nan_to_num(g, nan=0.0)), "largest float"),
        (_hooked(lambda g: torch.where(g.isnan(), 0.0, g)), "±inf got through"),
        (_hooked(in_place), "in place"),
        (_hooked(lambda g: None), "a NaN got through"),
        (_hooked(lambda g: g * g.isfinite()), "NaN × 0"),
        (_hooked(lambda g: g.clamp(-10, 10).nan_to_num(0.0)), "only the non-finite"),
        (_hooked(lambda g: torch.zeros_like(g)), "only the non-finite"),
        (not_removable, "still repaired"),
        (lambda t: None, "handle"),
    ]:
        failed("01.4", wrong, words)


# ----- predictions ------------------------------------------------------------------------------
RIGHT_GUESSES = {
    "01.a": [0.2, 0.4],
    "01.b": [[4, 8, 12], [2, 4, 6]],
    "01.c": "x",
    "01.d": "ms",
    "01.e": ["numbers", "None"],
    "01.f": "zeros",
}


def test_the_predictions_are_right_about_torch():
    for id, guess in RIGHT_GUESSES.items():
        assert grade(id, guess).passed, id
    assert grade("01.e", ["numbers", None]).passed  # Python's None as well as "None"


def test_a_common_wrong_guess_gets_its_own_hint():
    for id, guess, words in [
        ("01.a", [0.2, 0.2], "what does the chain rule do"),
        ("01.a", [0.4, 0.2], "swapped"),
        ("01.a", [1.0, 0.4], "your hook's entry is not"),
        ("01.b", [[2, 4, 6], [2, 4, 6]], "receives its result"),
        ("01.c", "a", "infinite but not NaN|asks for the first NaN"),
        ("01.c", "r", "1 in every entry"),
        ("01.c", "none", "what is 0 × ∞"),
        ("01.d", "h", "got it from a tensor after it"),
        ("01.d", "rms", "not NaN"),
        ("01.e", ["numbers", "NaN"], "head.weight.grad: right|does backward go on"),
        ("01.e", ["numbers", "zeros"], "head.weight.grad: right|set it to None"),
        ("01.e", ["None", "None"], "head.weight.grad: wrong|backward reached it|embed.weight.grad: right"),
        ("01.e", [None, None], "head.weight.grad: wrong|backward reached it|embed.weight.grad: right"),
        ("01.e", ["numbers", "numbers"], "head.weight.grad: right|embed comes before ms"),
        ("01.e", ["NaN", "NaN"], "head.weight.grad: wrong|embed.weight.grad: wrong"),
        ("01.e", ["zeros", None], "head.weight.grad: wrong|embed.weight.grad: right"),
        ("01.e", "None", "a list of two"),
        ("01.f", "huge", "the loss ignores that row"),
        ("01.f", "NaN", "turns the NaN into 0"),
    ]:
        failed(id, guess, *words.split("|"))


def test_yours_or_worked_gives_the_worked_answer_until_yours_passes():
    from hooklab.exercises import check
    from hooklab.exercises.nb01 import guard as worked
    from hooklab.exercises.nb01 import yours_or_worked

    def mine(named):
        raise NotImplementedError

    check("01.3", mine)
    assert yours_or_worked({"guard": mine}, "guard") is worked
    right = guard_with()
    check("01.3", right)
    assert yours_or_worked({"guard": right}, "guard") is right
    assert yours_or_worked({}, "guard", "repair")[0] is worked  # a section run on its own: no name of yours


def test_01_3_gives_the_late_binding_hint_only_when_ms_is_not_named():
    message = lambda name: f"on the way back from logits, the gradient at {name} is bad"  # noqa: E731
    outcome = failed("01.3", guard_with(message=message), "before 'ms'")
    assert "name=name" not in outcome.detail, outcome.detail
    failed("01.3", guard_with(bind=False), "name=name")


def guarded_at_ms(z, y, w, h, rms):
    """A "safe" derivation: torch.where keeps the square root's line from dividing by 0 in the padded row."""
    dlogits, dnormed = head_right(z, y, w)
    drms = (dnormed * -h / (rms + 1e-6) ** 2).sum(dim=1, keepdim=True)
    dms = torch.where(rms > 0, drms / (2 * rms), torch.zeros_like(rms))
    dh = dnormed / (rms + 1e-6) + dms * 2 * h / h.shape[1]
    return {"logits": dlogits, "normed": dnormed, "rms": drms, "ms": dms, "h": dh}


GUARDED = [guarded_at_ms, slip(dms=lambda d, rms: torch.nan_to_num(d / (2 * rms))),
           slip(dms=lambda d, rms: d / (2 * rms.clamp_min(1e-30)))]


def test_01_2_compares_the_padded_row_too_whatever_form_computes_it():
    """The lesson's case: the padded row must be what autograd computes there. The chain rule line by line, the
    fused dh and an rsqrt form pass; a guard at the square root (torch.where, nan_to_num, a clamp) does not."""
    fused = slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6)
                 - h * (dn * h).sum(dim=1, keepdim=True) / (h.shape[1] * rms * (rms + 1e-6) ** 2))
    for right in (by_hand_right, fused, slip(dms=lambda d, rms: 0.5 * d * rms.rsqrt() ** 2)):
        outcome = grade("01.2", right)
        assert outcome.passed, outcome.detail
    for guarded in GUARDED:
        failed("01.2", guarded, "in the padded row", "gradient at ms", "no guard")


def test_01_2_never_gives_away_prediction_01_d():
    """01.d (which tensor's gradient is NaN first) comes after 01.2: no message of 01.2, right or wrong, says
    what autograd makes of the padded row."""
    answers = [by_hand_right, slip(dms=lambda d, rms: d / (2 * rms) * 1.5),
               slip(dh=lambda d, dn, h, rms: torch.nan_to_num(dn / (rms + 1e-6) + d * 2 * h / h.shape[1])),
               slip(dh=lambda d, dn, h, rms: dn / (rms + 1e-6)), slip(dms=lambda d, rms: d),
               slip(drms=lambda dn, h, rms: (dn * -h / (rms + 1e-6)).sum(1, keepdim=True)), *GUARDED]
    for answer in answers:
        detail = grade("01.2", answer).detail
        for word in ("NaN", "nan", "0 / 0", "inf", "∞", "first"):
            assert word not in detail, (word, detail)


def test_show_anomaly_names_the_backward_function_and_the_forward_line_without_paths(capsys):
    from hooklab.exercises.nb01 import _problem, _steps, show_anomaly

    embed, head, x, y = _problem()
    show_anomaly(lambda: torch.nn.functional.cross_entropy(_steps(embed, head, x)["logits"], y).backward())
    out = capsys.readouterr().out
    assert "raised RuntimeError: Function 'SqrtBackward0' returned nan values" in out, out
    assert out.rstrip().endswith("rms = ms.sqrt()") and "Error detected in SqrtBackward0" in out, out
    assert ".py" not in out and "line " not in out, out
