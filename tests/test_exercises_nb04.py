"""Exercises and predictions of notebook 04: each checker accepts a right backward pass, rejects a wrong
one naming the slip (the first wrong step, for the chains), and the predictions' truths are what the
lesson says. The watch shared with the guide's exercises is tested in ``test_exercises_g4.py``."""

from __future__ import annotations

import ast
import json
import re
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from answers import failed
from torch import nn

import hooklab
from hooklab import backprop as bp
from hooklab.audit import leftover_hooks
from hooklab.exercises import check, exercises, grade, nb04

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "04_backprop_by_hand.ipynb"
SOLUTIONS = ROOT / "notebooks" / "solutions" / "04_backprop_by_hand_solutions.ipynb"


def worked_answers() -> dict:
    """Each exercise's worked answer from the solutions notebook, by id: every code cell runs, without
    its check() lines, in one namespace (04.11 uses the answers before it)."""
    namespace, answers = {}, {}
    for cell in json.loads(SOLUTIONS.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        checks = [re.fullmatch(r'check\("(04\.\d+)", (\w+)\)', line) for line in lines]
        exec("\n".join(line for line, found in zip(lines, checks, strict=True) if not found), namespace)
        answers.update((found[1], namespace[found[2]]) for found in checks if found)
    return answers


ANSWERS = worked_answers()


def test_the_worked_answers_of_the_solutions_notebook_pass():
    assert list(ANSWERS) == [f"04.{k}" for k in range(1, 12)]  # in the order the notebook asks them
    for id, answer in ANSWERS.items():
        outcome = grade(id, answer)
        assert outcome.passed, f"{id}: {outcome.detail}"
        if id != "04.10":  # 04.10 names a layer, no difference
            assert "max |difference| < 1e-12" in outcome.detail, outcome.detail


# ----- the lesson's code is the checkers' -----------------------------------------------------------------
def lesson_functions(*names: str) -> dict:
    """The named top-level functions of the lesson's code cells, defined from their source alone."""
    namespace = {"torch": torch, "nn": nn, "F": F}
    for cell in json.loads(LESSON.read_text())["cells"]:
        if cell["cell_type"] == "code":
            for node in ast.parse("".join(cell["source"])).body:
                if isinstance(node, ast.FunctionDef) and node.name in names:
                    exec(ast.unparse(node), namespace)
    return {name: namespace[name] for name in names}


def test_the_lesson_defines_the_network_and_the_steps_the_checkers_use():
    lesson = lesson_functions("digits_cnn", "ce_steps", "bn_steps")
    assert repr(lesson["digits_cnn"]()) == repr(nb04.digits_cnn())
    for mine, theirs in zip(lesson["digits_cnn"]().state_dict().values(), nb04.digits_cnn().state_dict().values(),
                            strict=True):
        assert torch.equal(mine, theirs)
    logits, target = torch.randn(6, 5, dtype=torch.float64), torch.tensor([0, 4, 2, 2, 1, 3])
    for name, value in nb04.ce_steps(logits, target).items():
        assert torch.equal(lesson["ce_steps"](logits, target)[name], value), name
    x, gamma, beta = torch.randn(7, 3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), torch.randn(3)
    for name, value in nb04.bn_steps(x, gamma, beta).items():
        assert torch.equal(lesson["bn_steps"](x, gamma, beta)[name], value), name
    assert list(nb04.ce_steps(logits, target)) == [*reversed(nb04.CE_CHAIN), "loss"]  # the chain, forward


# ----- predictions ---------------------------------------------------------------------------------------
def truth(id):
    return exercises()[id].checker.truth()


def test_the_predictions_truths():
    assert truth("04.a") == pytest.approx(0.1656, abs=1e-4)
    assert truth("04.b") == 0.0
    assert truth("04.c") == {"x_hat", "x"}
    assert truth("04.d") == [[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]]
    assert truth("04.e") == {"1", "5"}


@pytest.mark.parametrize(("id", "guess", "words"), [
    ("04.a", 0.0827, "also sums over the batch's rows"),
    ("04.a", 0.0414, "the sum, not the mean"),
    ("04.a", [0.0786, 0.0870], "its gradient is one number too"),
    ("04.a", 1, "times the gradient arriving"),
    ("04.b", 1, "does any probability change"),
    ("04.c", ["x_hat", "inv_std", "var", "diff2", "diff", "mean", "x"], "autograd's own gradients"),
    ("04.c", ["x_hat", "inv_std", "x"], "they agree"),
    ("04.c", ["x_hat"], "not the only one"),
    ("04.c", ["x"], "dout·γ"),
    ("04.c", ["x_hat", "mean", "x"], "its row agrees"),
    ("04.a", torch.tensor([0.1656]), "a number, not a tensor"),
    ("04.a", [0.17], "a number, not a list"),
    ("04.d", [[9] * 4] * 4, "falls on the padding"),
    ("04.b", 1 / 32, "scaling 0 gives 0"),
    ("04.b", 1e-3, "close, but the sum is exactly 0"),
    ("04.b", -0.01, "close, but the sum is exactly 0"),
    ("04.b", "0", "write a number, not a string"),
    ("04.c", [], "dout·γ"),
    ("04.e", {"4"}, "the question supposes batch norm's formula slips"),
    ("04.e", {"0", "4"}, "the other suspect, the conv formula"),
    ("04.e", {"4", "5"}, "conv '4''s hook records the gradient that really reached it"),
    ("04.e", {"1", "4", "5"}, "the conv formula is right, so conv '4' agrees"),
    ("04.e", {"4", "5", "6", "7"}, "their formulas are right"),
    ("04.e", {"5"}, "which other layer uses batch norm's"),
    ("04.e", {"1"}, "which other layer uses batch norm's"),
    ("04.e", {"0", "1", "4", "5"}, "and so does conv '0'"),
    ("04.e", {"0", "1", "2", "3", "4", "5"}, "a backward chained through the formulas"),
    ("04.e", set(), "the slip is there"),
    ("04.e", {1, 5}, "write layer names as strings"),
    ("04.e", ["5"], "which other layer uses batch norm's"),
    ("04.c", ("x_hat", "gamma", "beta"), "leaves them right"),
])  # fmt: skip
def test_wrong_guesses_get_their_own_hint(id, guess, words):
    outcome = grade(id, guess)
    assert not outcome.passed and words in outcome.detail, outcome.detail


def test_04_e_asks_what_the_hooks_name_under_one_suspect():
    """The problem's table leaves two suspects (batch norm's dx, or a conv formula wrong in both dx and dw) and
    cannot decide; 04.e supposes one of them and asks what the student's 04.10 hooks then name, so the run
    decides. Nothing before 04.e runs the problem's formulas on a layer's own records."""
    nb_cells = json.loads(LESSON.read_text())["cells"]
    cells = ["".join(c["source"]) for c in nb_cells if c["cell_type"] == "markdown"]
    plain = [re.sub(r"\s+", " ", text.replace("`", "")) for text in cells]
    after_table = next(text for text in plain if text.startswith("The slip costs"))
    prompt = next(text for text in plain if "disagreeing_layers name?" in text)
    assert "4–7" not in after_table and "either batch norm's formula passes back a wrong dx" in after_table
    assert "wrong in both dx and dw" in after_table
    assert "Say batch norm's formula is the one that slips" in prompt and truth("04.e") == {"1", "5"}
    sources = ["".join(c["source"]) for c in nb_cells]
    asked = next(i for i, text in enumerate(sources) if "disagreeing_layers name?" in text.replace("`", ""))
    assert not any("slipped_formulas[" in text for text in sources[:asked]), "a formula is judged before 04.e"
    for guess in ({"4"}, {"4", "5"}, {"4", "5", "6", "7"}):
        hint = grade("04.e", guess).detail
        assert "really reached it" in hint, hint


@pytest.mark.parametrize(("id", "guess"), [("04.a", 0.1656), ("04.a", 0.166), ("04.a", 0.16), ("04.b", 0),
                                           ("04.b", 1e-7), ("04.b", -1.5e-8), ("04.b", 0.0),
                                           ("04.c", ["X_hat", "x"]),
                                           ("04.d", [[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]]),
                                           ("04.c", ["x", "x_hat"]), ("04.c", ("x_hat", "x")),
                                           ("04.e", {"5", "1"}), ("04.e", ["5", "1"]), ("04.e", ("1", "5"))])
def test_right_guesses_pass(id, guess):
    assert grade(id, guess).passed


# ----- 04.1: a linear layer of the 2-2-2 network ------------------------------------------------------
def layer(slip=None):
    def linear_backward(a, w, dz):
        da = dz @ w.T if slip == "da transposed" else dz @ w
        dw = a.T @ dz if slip == "transposed" else dz.T @ a
        db = {"per unit": dz.sum(0), "first row": dz[:1].sum().reshape(1), "scalar": dz.sum(),
               "keepdim": dz.sum((0, 1), keepdim=True)}.get(
            slip, dz.sum().reshape(1))
        return (da, dw, db) if slip != "two" else (da, dw)
    return linear_backward


@pytest.mark.parametrize(("slip", "words"), [
    ("da transposed", "layer 2 of the 2-2-2 network: da: max |difference|"),
    ("transposed", "da ok; dw: max |difference| 7.4e-03 (it is the transpose of the right dw"),
    ("per unit", "dw ok; db: shape (2,), expected (1,) (your db has one entry per unit, as an nn.Linear's would"),
    ("first row", "a batch of 3 rows: da ok; dw ok; db: max |difference|"),
    ("scalar", "db: shape (), expected (1,) (the shared bias is a tensor of shape (1,), and its gradient keeps that "
               "shape: sum, then reshape(1))"),
    ("two", "returned 2 tensor(s), expected 3: (da, dw, db)"),
    ("keepdim", "db: shape (1, 1), expected (1,): the right number, but keepdim=True keeps both summed dimensions"),
])  # fmt: skip
def test_04_1_names_each_gradient_and_the_slip(slip, words):
    failed("04.1", layer(slip), words)


def test_04_1_tries_layer_1_from_what_layer_2_passes_back():
    def right_on_one_row_only(a, w, dz):  # dw from the first row alone
        return dz @ w, dz[:1].T @ a[:1], dz.sum().reshape(1)

    failed("04.1", right_on_one_row_only, "with a batch of 3 rows: da ok; dw: max |difference|")


# ----- 04.2: keep_grads -----------------------------------------------------------------------------------
def _late_binding(steps):  # every hook looks `name` up when it runs: after the loop, the last name
    grads = {}
    for name, value in steps.items():
        value.register_hook(lambda grad: grads.__setitem__(name, grad))  # noqa: B023
    return grads


def _read_grad_now(steps):  # .grad before backward: None everywhere
    for value in steps.values():
        if not value.is_leaf:
            value.retain_grad()
    return {name: value.grad for name, value in steps.items()}


def _keeps_values(steps):
    grads = {}
    for name, value in steps.items():
        value.register_hook(lambda grad, name=name, value=value: grads.__setitem__(name, value))
    return grads


def _replaces(steps):
    grads = {}
    for name, value in steps.items():
        value.register_hook(lambda grad, name=name: grads.__setitem__(name, grad) or 2 * grad)
    return grads


@pytest.mark.parametrize(("answer", "words"), [
    (_late_binding, ["only 'loss' was kept", "name=name"]),
    (_read_grad_now, ["None for every step", "before backward ran"]),
    (_keeps_values, ["not its gradient", "the step's value"]),
    (_replaces, ["replaces the gradient", "return None"]),
    (lambda steps: {}, ["still empty", "register_hook"]),
    (lambda steps: steps, ["the steps you were given"]),
    (lambda steps: None, ["return the dict", "not NoneType"]),
])
def test_04_2_names_the_slip(answer, words):
    failed("04.2", answer, *words)


def test_04_2_a_hook_left_on_some_steps_only_is_named():
    def some(steps):
        kept = nb04.keep_grads({name: value for name, value in steps.items() if name != "probs"})
        return kept
    failed("04.2", some, "no gradient kept for ['probs']")


# ----- 04.3 and 04.5 (G4.6): the chains -------------------------------------------------------------------------
def ce_chain(slip=None, keys=lambda k: k):
    right = ANSWERS["04.3"]

    def ce_backward_steps(t, target):
        d = right(t, target)
        if slip == "unsummed":
            d["counts_sum_inv"] = t["counts"] * d["probs"]
        elif slip == "one use":
            d["counts"] = t["counts_sum_inv"] * d["probs"]
        elif slip == "no mean":
            d["logprobs"] = d["logprobs"] * len(target)
        elif slip == "missing":
            del d["counts_sum"]
        elif slip == "no max path":  # the max's gradient is 0 up to rounding: the chain still matches
            d["logits"] = d["norm_logits"]
        return {keys(k): v for k, v in d.items()}
    return ce_backward_steps


@pytest.mark.parametrize(("slip", "words"), [
    ("unsummed", ["dlogprobs, dprobs right; first wrong: dcounts_sum_inv (the step probs = counts * counts_sum_inv)",
                  "shape (8, 10), expected (8, 1)", "its gradient sums over the row"]),
    ("one use", ["dlogprobs … dcounts_sum (4 steps) right; first wrong: dcounts", "counts is used twice"]),
    ("no mean", ["first wrong: dlogprobs", "each target entry gets −1/N"]),
    ("missing", ["dlogprobs, dprobs, dcounts_sum_inv right; no entry for 'counts_sum'"]),
])  # fmt: skip
def test_04_2_names_the_first_wrong_step(slip, words):
    failed("04.3", ce_chain(slip), *words)


def test_04_2_names_dcounts_sum_computed_from_counts():
    def from_counts(t, target):
        d = ANSWERS["04.3"](t, target)
        d["counts_sum"] = -(t["counts"].sum(1, keepdim=True)) ** -2 * d["counts_sum_inv"]
        d["counts"] = t["counts_sum_inv"] * d["probs"] + d["counts_sum"]
        return d

    failed("04.3", from_counts, "where counts_sum = counts.sum(1) + 1", "first wrong: dcounts_sum",
           "computed from t['counts'] rather than t['counts_sum']", "read every value from t")


def test_04_2_pass_message_says_what_the_third_case_is():
    assert "counts_sum = counts.sum(1) + 1 (a softmax with one more class" in grade("04.3", ANSWERS["04.3"]).detail


def test_04_2_accepts_d_prefixed_keys_but_not_a_missing_max_path():
    assert grade("04.3", ce_chain(keys=lambda k: f"d{k}")).passed
    failed("04.3", ce_chain("no max path"), "with 6 rows of 5 classes, where counts_sum = counts.sum(1) + 1",
           "logit_maxes")


def bn_chain(slip):
    right = nb04.bn_backward_steps

    def bn_backward_steps(t, gamma, dout):
        d, n = right(t, gamma, dout), len(dout)
        if slip == "diff2 without 1/N":
            d["diff2"] = d["var"].expand_as(t["diff2"])
        elif slip == "diff2 by 1/(N - 1)":  # the unbiased variance's divisor
            d["diff2"] = (d["var"] / (n - 1)).expand_as(t["diff2"])
        elif slip == "diff one use":
            d["diff"] = t["inv_std"] * d["x_hat"]
        elif slip == "x without 1/N":
            d["x"] = d["diff"] + d["mean"]
        elif slip == "inv_std unsummed":
            d["inv_std"] = t["diff"] * d["x_hat"]
        elif slip == "dvar without eps":  # eps is not passed in: (var + eps)^(-3/2) is inv_std ** 3
            d["var"] = -0.5 * t["var"] ** -1.5 * d["inv_std"]
        elif slip == "gamma and beta swapped":
            d["gamma"], d["beta"] = d["beta"], d["gamma"]
        assert n
        return d
    return bn_backward_steps


@pytest.mark.parametrize(("slip", "words"), [
    ("diff2 without 1/N", ["dx_hat … dvar (5 steps) right; first wrong: ddiff2", "each row of diff2 counts 1/N"]),
    ("diff2 by 1/(N - 1)", ["dx_hat … dvar (5 steps) right; first wrong: ddiff2", "Bessel's correction",
                            "divides by N"]),
    ("diff one use", ["first wrong: ddiff (the step x_hat = diff * inv_std, and diff2 = diff ** 2)",
                      "diff is used twice"]),
    ("x without 1/N", ["dx_hat … dmean (8 steps) right; first wrong: dx", "so dx gets dmean/N"]),
    ("inv_std unsummed", ["dx_hat, dgamma, dbeta right; first wrong: dinv_std", "shape (6, 4), expected (1, 4)"]),
    ("gamma and beta swapped", ["dx_hat right; first wrong: dgamma", "that is dbeta"]),
    ("dvar without eps", ["first wrong: dvar", "your dvar drops eps", "inv_std ** 3"]),
])  # fmt: skip
def test_04_4_names_the_first_wrong_step(slip, words):
    failed("04.5", bn_chain(slip), *words)


def test_04_2_and_04_4_want_a_dict():
    failed("04.3", lambda t, target: [t["probs"]], "return a dict with one gradient per step", "not list")
    failed("04.5", lambda t, gamma, dout: None, "return a dict", "not NoneType")


@pytest.mark.parametrize(("how", "words"), [
    ("dropped", "lacks the path through logit_maxes"),
    ("zeroed", "dlogit_maxes is −Σ dnorm_logits over the row, not zeros"),
    ("spread", "route dlogit_maxes to each row's maximum only"),
])  # fmt: skip
def test_04_2_needs_dlogit_maxes_routed_to_the_maximum(how, words):
    def answer(t, target):
        d = nb04.ce_backward_steps(t, target)
        if how == "zeroed":
            d["logit_maxes"] = torch.zeros_like(d["logit_maxes"])
            d["logits"] = d["norm_logits"] + F.one_hot(t["logits"].argmax(1), t["logits"].shape[1]) * d["logit_maxes"]
        elif how == "dropped":
            d["logits"] = d["norm_logits"]
        else:
            d["logits"] = d["norm_logits"] + d["logit_maxes"] / t["logits"].shape[1]
        return d

    failed("04.3", answer, "counts_sum = counts.sum(1) + 1", words)


# ----- 04.4 and 04.6: the fused forms ----------------------------------------------------------------------
@pytest.mark.parametrize(("answer", "words"), [
    (lambda logits, target: logits.softmax(1) - F.one_hot(target, logits.shape[1]), "divide by N"),
    (lambda logits, target: -ANSWERS["04.4"](logits, target), "every entry has the wrong sign"),
    (lambda logits, target: logits.softmax(1) / len(target), "subtract the one-hot target"),
    (lambda logits, target: (logits.softmax(1) - 1) / len(target), "subtract 1 only at each row's correct class"),
    (lambda logits, target: (logits.softmax(1) - F.one_hot(target)) / len(target),
     "F.one_hot infers the number of classes from the largest target: pass num_classes=logits.shape[1]"),
])  # fmt: skip
def test_04_3_names_the_slip(answer, words):
    failed("04.4", answer, words)


def test_04_3_says_it_equals_the_chain():
    detail = grade("04.4", lambda logits, target: (logits.log_softmax(1).exp() - F.one_hot(
        target, logits.shape[1])) / len(target)).detail
    assert detail == ("with 8 rows of 10 classes and 5 of 4: dlogits equals the chain of eight steps, as computed by "
                      "autograd; max |difference| < 1e-12")


def fused_bn(var=lambda x: x.var(0, unbiased=False), mean_n=True, var_n=True, frozen=False, paths=("mean", "var")):
    def batch_norm_backward(x, gamma, dout, eps):
        n, inv_std = len(x), (var(x) + eps) ** -0.5
        x_hat, g = (x - x.mean(0)) * inv_std, dout * gamma
        if frozen:
            return g * inv_std, (dout * x_hat).sum(0), dout.sum(0)
        through_mean = g.sum(0) / (n if mean_n else 1) if "mean" in paths else 0
        through_var = x_hat * (g * x_hat).sum(0) / (n if var_n else 1) if "var" in paths else 0
        return inv_std * (g - through_mean - through_var), (dout * x_hat).sum(0), dout.sum(0)
    return batch_norm_backward


def by_three_paths(mean_n=True, var_n=True, paths=("mean", "var")):
    """04.6 written as the sum of its three paths, with a 1/N lost on one of them, or a path dropped."""
    def batch_norm_backward(x, gamma, dout, eps):
        n, mean, var = len(x), x.mean(0), x.var(0, unbiased=False)
        inv_std, dx_hat = (var + eps) ** -0.5, dout * gamma
        dvar = (dx_hat * (x - mean)).sum(0) * -0.5 * inv_std**3
        dmean = -(dx_hat * inv_std).sum(0)
        dx = dx_hat * inv_std
        if "var" in paths:
            dx = dx + dvar * 2 * (x - mean) / (n if var_n else 1)
        if "mean" in paths:
            dx = dx + dmean / (n if mean_n else 1)
        return dx, (dout * (x - mean) * inv_std).sum(0), dout.sum(0)
    return batch_norm_backward


def bn_unbiased_throughout(x, gamma, dout, eps):  # the exact gradient of a batch norm with the N − 1 variance
    n, var = len(x), x.var(0)
    inv_std, g = (var + eps) ** -0.5, dout * gamma
    x_hat = (x - x.mean(0)) * inv_std
    dx = inv_std * (g - g.mean(0) - x_hat * (g * x_hat).sum(0) / (n - 1))
    return dx, (dout * x_hat).sum(0), dout.sum(0)


BESSEL = "x.var(0) divides by N − 1 (Bessel's correction); batch norm's v = mean((x − μ)²) divides by N = 6"


@pytest.mark.parametrize(("answer", "words"), [
    (fused_bn(var=lambda x: x.var(0)), BESSEL),
    (bn_unbiased_throughout, BESSEL),
    (fused_bn(mean_n=False), "the path through μ lost its 1/N: μ = mean(x) over the N rows, so ∂μ/∂x = 1/N"),
    (by_three_paths(mean_n=False), "the path through μ lost its 1/N"),
    (fused_bn(var_n=False), "the path through v lost its 1/N: v = mean((x − μ)²) over the N rows"),
    (by_three_paths(var_n=False), "the path through v lost its 1/N"),
    (fused_bn(mean_n=False, var_n=False), "the paths through μ and v both lost their 1/N"),
    (fused_bn(paths=("var",)), "dx lacks the path through the mean μ"),
    (by_three_paths(paths=("var",)), "adds −γ·inv_std·mean(dout) to each row"),
    (fused_bn(paths=("mean",)), "dx lacks the path through the variance v"),
    (by_three_paths(paths=("mean",)), "adds −γ·inv_std·x̂·mean(dout·x̂) to each row"),
    (fused_bn(frozen=True), "with x of shape (6, 4): dx: max |difference| 6.1e-01 (the mean and the variance depend "
                            "on x too"),
    (lambda x, gamma, dout, eps: [g / len(x) if i else g for i, g in enumerate(fused_bn()(x, gamma, dout, eps))],
     "dgamma: max |difference| 3.2e+00 (every entry is 0.167 × the right value, 1/6"),
])  # fmt: skip
def test_04_5_names_the_usual_slips(answer, words):
    failed("04.6", answer, words)


@pytest.mark.parametrize("answer", [by_three_paths(), fused_bn()], ids=["three paths", "closed form"])
def test_04_5_accepts_both_forms_and_says_it_equals_the_chain(answer):
    outcome = grade("04.6", answer)
    assert outcome.passed and "equal the chain of the seven steps" in outcome.detail, outcome.detail


def test_04_5_refuses_the_course_formula():
    failed("04.6", lambda x, gamma, dout, eps: bp.batch_norm_backward(x, gamma, dout, eps),
           "your answer called hooklab.backprop.batch_norm_backward, the course's own backward formula")


def test_hooklab_batch_norm_backward_takes_the_exercises_argument_order():
    x, gamma, dout = torch.randn(5, 3, dtype=torch.float64), torch.rand(3, dtype=torch.float64), torch.randn(5, 3)
    for mine, theirs in zip(bp.batch_norm_backward(x, gamma, dout.double(), 1e-5),
                            ANSWERS["04.6"](x, gamma, dout.double(), 1e-5), strict=True):
        assert torch.allclose(mine, theirs)


# ----- 04.8 and 04.9: convolution and pooling ---------------------------------------------------------
def conv_by_loops(x, w, dout, padding):  # one kernel offset at a time, on the padded input
    xp = F.pad(x, [padding] * 4)
    kh, kw = w.shape[-2:]
    oh, ow = dout.shape[-2:]
    dxp, dw = torch.zeros_like(xp), torch.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            dw[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, xp[:, :, i:i + oh, j:j + ow])
            dxp[:, :, i:i + oh, j:j + ow] += torch.einsum("nohw,oc->nchw", dout, w[:, :, i, j])
    return dxp[:, :, padding:padding + x.shape[2], padding:padding + x.shape[3]], dw


def max_pool_by_indices(x, dout):
    _, idx = F.max_pool2d(x, 2, return_indices=True)
    return torch.zeros_like(x).flatten(2).scatter_add(2, idx.flatten(2), dout.flatten(2)).reshape(x.shape)


@pytest.mark.parametrize(("id", "answer"), [
    ("04.8", conv_by_loops),
    ("04.8", lambda x, w, dout, padding: (F.conv_transpose2d(dout, w, padding=padding),
                                          conv_by_loops(x, w, dout, padding)[1])),
])  # fmt: skip
def test_other_right_conv_and_pool_answers_pass(id, answer):
    outcome = grade(id, answer)
    assert outcome.passed, outcome.detail


def test_04_8_explains_a_flipped_kernel_in_conv_transpose2d():
    def flipped(x, w, dout, padding):
        return F.conv_transpose2d(dout, w.flip(-2, -1), padding=padding), conv_by_loops(x, w, dout, padding)[1]

    failed("04.8", flipped, "already flips the kernel")


def test_04_6_explains_a_dx_with_the_padding_left_on():
    def padding_kept(x, w, dout, padding):
        kernel, d = w.shape[-2:], dout.flatten(2)
        size = tuple(s + 2 * padding for s in x.shape[-2:])
        return F.fold(torch.einsum("ok,nol->nkl", w.flatten(1), d), size, kernel), conv_by_loops(x, w, dout, padding)[1]

    failed("04.8", padding_kept, "with padding=1: dx: shape (2, 2, 7, 7), expected (2, 2, 5, 5)",
           "cut the padding off")


@pytest.mark.parametrize(("answer", "words"), [
    (lambda x, dout: dout.repeat_interleave(2, -2).repeat_interleave(2, -1) / 4, "as average pooling does"),
    (lambda x, dout: dout.repeat_interleave(2, -2).repeat_interleave(2, -1), "only its largest input should"),
])  # fmt: skip
def test_04_8_names_the_slip(answer, words):
    failed("04.9", answer, words)


def test_04_8_refuses_pytorchs_routing():
    def by_unpooling(x, dout):
        _, idx = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(dout, idx, 2, output_size=x.shape[-2:])

    failed("04.9", max_pool_by_indices, "max_pool2d with return_indices=True", "write that routing")
    failed("04.9", by_unpooling, "called max_unpool2d", "find each window's maximum yourself")


def test_04_5_needs_eps():
    def no_eps(x, gamma, dout, eps):
        return ANSWERS["04.6"](x, gamma, dout, 0.0)

    failed("04.6", no_eps, "with x of shape (6, 4)", "eps = 0", "use it")


def test_04_5_names_parameter_gradients_kept_as_rows():
    def keepdim(x, gamma, dout, eps):
        dx, dgamma, dbeta = ANSWERS["04.6"](x, gamma, dout, eps)
        return dx, dgamma.reshape(1, -1), dbeta.reshape(1, -1)

    failed("04.6", keepdim, "dgamma: shape (1, 4), expected (4,)", "are (C,)", "without keepdim=True")


def test_the_lessons_worked_answers_pass():
    for id, answer in (("04.1", nb04.linear_backward), ("04.2", nb04.keep_grads), ("04.3", nb04.ce_backward_steps),
                       ("04.4", nb04.ce_backward),
                       ("04.5", nb04.bn_backward_steps), ("G4.6", nb04.bn_backward_steps),
                       ("04.6", nb04.batch_norm_backward),
                       ("04.8", nb04.conv2d_backward), ("04.9", nb04.max_pool_backward),
                       ("04.10", nb04.disagreeing_layers)):
        assert grade(id, answer).passed, id


def test_04_9_names_the_ties_when_a_max_pool_is_blamed():
    outcome = grade("04.10", lambda model, x, y, formulas: {"9", "7"})
    assert not outcome.passed and "tied maxima" in outcome.detail, outcome.detail


def test_04_6_and_04_7_refuse_the_course_formulas():
    failed("04.8", lambda x, w, dout, padding: bp.conv2d_backward(x, w, dout, padding=padding)[:2],
           "your answer called hooklab.backprop.conv2d_backward")
    failed("04.9", lambda x, dout: bp.max_pool2d_backward(x, dout, 2),
           "your answer called hooklab.backprop.max_pool2d_backward")


# ----- 04.11: one epoch ----------------------------------------------------------------------------------------
def with_replaced(name, replacement):
    """04.11's worked answer, with one of the functions it uses replaced."""
    answer = ANSWERS["04.11"]

    def model_backward(model, x, y):
        saved = answer.__globals__[name]
        answer.__globals__[name] = replacement
        try:
            return answer(model, x, y)
        finally:
            answer.__globals__[name] = saved
    return model_backward


def test_04_9_passes_the_worked_answer_with_both_accuracies():
    detail = grade("04.11", ANSWERS["04.11"]).detail
    assert re.fullmatch(r"43 steps, and at every one your gradients match autograd's \(max \|difference\| < 1e-12\); "
                        r"test accuracy after one epoch (0\.\d\d) with yours, \1 with autograd's", detail), detail


@pytest.mark.parametrize(("name", "replacement", "words"), [
    ("batch_norm_backward", fused_bn(frozen=True),
     "at step 1: every gradient from the loss back to 5.weight right; first wrong: 4.weight (Conv2d weight)"
     ": max |difference| 2.0e-01. The slip is in what layer 5 (BatchNorm2d) passes back to its input, or in the "
     "backward of layer 4 (Conv2d)"),
    ("max_pool_backward", lambda x, dout: dout.repeat_interleave(2, -2).repeat_interleave(2, -1) / 4,
     "first wrong: 5.bias (BatchNorm2d bias): max |difference| 2.6e-02. The slip is in what layer 9 (Linear) passes "
     "back to its input, or in the backward of layer 8 (Flatten), layer 7 (MaxPool2d), layer 6 (ReLU), layer 5 "
     "(BatchNorm2d)"),
    ("ce_backward", lambda logits, target: logits.softmax(1) - F.one_hot(target, 10),
     "first wrong: 9.bias (Linear bias)"),
])  # fmt: skip
def test_04_9_names_the_first_wrong_gradient_and_where_the_slip_is(name, replacement, words):
    failed("04.11", with_replaced(name, replacement), words)


def test_04_11_names_batch_norms_eps_left_out():
    eps_left_out = with_replaced("batch_norm_backward", lambda x, g, d, eps: ANSWERS["04.6"](x, g, d, 0.0))
    outcome = failed("04.11", eps_left_out, "first wrong: 5.weight", "did you pass batch norm's eps, layer.eps")
    assert "integer tensor" not in outcome.detail, outcome.detail


def test_04_9_names_bessels_correction_in_batch_norm():
    failed("04.11", with_replaced("batch_norm_backward", fused_bn(var=lambda x: x.var(0))),
           "first wrong: 5.weight (BatchNorm2d weight), every entry 0.9990 × the right value", "Bessel's correction",
           "x.var(0, unbiased=False)")


def test_04_2_names_the_input_when_ten_classes_are_written_in():
    def ten_classes(t, target):
        d = nb04.ce_backward_steps(t, target)
        d["logprobs"] = -F.one_hot(target, 10) / len(target)
        d["probs"] = d["logprobs"] / t["probs"]
        return d
    failed("04.3", ten_classes, "with 5 rows of 4 classes: your code raised RuntimeError",
           "other numbers of classes than 10")


def test_04_9_explains_missing_names_float32_and_the_course_formulas():
    def without_a_bias(model, x, y):
        grads = ANSWERS["04.11"](model, x, y)
        del grads["9.bias"]
        return grads

    failed("04.11", without_a_bias, "at step 1: no gradient for 9.bias (Linear bias): return one entry per name")
    failed("04.11", lambda model, x, y: {k: v.float() for k, v in ANSWERS["04.11"](model, x, y).items()},
           "is float32, the inputs are float64")
    failed("04.11", lambda model, x, y: list(ANSWERS["04.11"](model, x, y).values()),
           "return a dict {parameter name: gradient}")

    def with_the_course_formulas(model, x, y):
        with hooklab.record(model) as rec:
            logits = model(x)
        d, grads = bp.losses.softmax_cross_entropy_backward(logits, y), {}
        for r in reversed(rec.records):
            layer = model.get_submodule(r.name)
            d, params = bp.BACKWARD[type(layer)](layer, r.inputs[0], r.output, d)
            grads.update({f"{r.name}.{k}": g for k, g in params.items() if g is not None})
        return grads

    failed("04.11", with_the_course_formulas, "write the formula yourself: your answer called hooklab.backprop.")


def test_04_9_names_a_hook_left_registered():
    def leaves_a_hook(model, x, y):
        model[0].register_forward_hook(lambda *args: None)
        return ANSWERS["04.11"](model, x, y)

    failed("04.11", leaves_a_hook, "at step 1: a hook is still registered", "layer '0'", "with hooklab.Hooks()")


def test_04_9_names_a_recorder_whose_hooks_share_the_last_name():
    def late_binding(model, x, y):
        saved = ANSWERS["04.11"].__globals__["record_forward"]

        def record_forward(model, x):
            records = []
            with hooklab.Hooks() as handles:
                for name, layer in model.named_children():
                    handles.add(layer.register_forward_hook(
                        lambda layer, args, out: records.append((name, layer, args[0], out))))  # noqa: B023
                return model(x), records
        ANSWERS["04.11"].__globals__["record_forward"] = record_forward
        try:
            return ANSWERS["04.11"](model, x, y)
        finally:
            ANSWERS["04.11"].__globals__["record_forward"] = saved

    failed("04.11", late_binding, "at step 1: every gradient you returned is named after layer '9'", "name=name")


def test_04_9_refuses_autograd_on_the_model():
    def by_autograd(model, x, y):
        with torch.enable_grad():
            model.requires_grad_(True)
            try:
                grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
            finally:
                model.requires_grad_(False)
        return dict(zip([n for n, _ in model.named_parameters()], grads, strict=True))

    failed("04.11", by_autograd, "write the formula yourself: your answer called a backward op")


def test_the_stubs_print_not_solved_yet(capsys):
    def model_backward(model, x, y):
        raise NotImplementedError

    check("04.11", model_backward)
    expected = "Exercise 04.11 (one epoch on the digits with your own backward pass): not solved yet\n"
    assert capsys.readouterr().out == expected


def test_04_c_and_04_e_accept_a_set_answer_in_any_container_and_order():
    for guess in (["x", "x_hat"], ("x_hat", "x"), {"x_hat", "x"}, frozenset(["'x_hat'", "X"])):
        assert grade("04.c", guess).passed, guess
    for guess in ({"1", "5"}, ["5", "1"], ("1", "5"), ["1", "5"]):
        assert grade("04.e", guess).passed, guess


def test_the_2_2_2_network_gives_the_worked_example_forward_numbers():
    from hooklab.models import TinySigmoidNet

    net = TinySigmoidNet()
    h = net.fc1(torch.tensor([[0.05, 0.1]]))
    assert h[0, 0].item() == pytest.approx(0.3775, abs=1e-6)  # net_h1
    assert torch.sigmoid(h)[0, 0].item() == pytest.approx(0.593269992, abs=1e-6)  # out_h1
    assert net(torch.tensor([[0.05, 0.1]]))[0, 0].item() == pytest.approx(0.75136507, abs=1e-6)  # out_o1


def test_04_6_names_the_shapes_when_a_fixed_3x3_kernel_raises():
    def three_by_three(x, w, dout, padding):
        cols = F.unfold(x, 3, padding=padding)
        dw = (dout.flatten(2) @ cols.transpose(1, 2)).sum(0).reshape(w.shape)
        dcols = w.reshape(w.shape[0], -1).T @ dout.flatten(2)
        return F.fold(dcols, x.shape[-2:], 3, padding=padding), dw

    failed("04.8", three_by_three, "RuntimeError", "w of shape (4, 3, 3, 2), a 3×2 kernel", "any")


def test_04_6_names_the_shapes_of_a_wrong_shape_only():
    failed("04.8", lambda x, w, dout, padding: (conv_by_loops(x, w, dout, padding)[0], torch.zeros(4, 3, 3, 3)),
           "[the case: x of shape (2, 3, 6, 5), w of shape (4, 3, 3, 2): a 3×2 kernel, and any size must work]")
    outcome = failed("04.8", lambda x, w, dout, padding: (torch.zeros_like(x), torch.zeros_like(w)), "dx")
    assert "any size must work" not in outcome.detail, outcome.detail  # a wrong value is not the kernel size's fault


@pytest.mark.parametrize("per_image", [True, False])
def test_04_6_names_a_dw_not_summed_over_the_images(per_image):
    def unsummed(x, w, dout, padding):
        dx = conv_by_loops(x, w, dout, padding)[0]
        each = torch.stack([conv_by_loops(x[i:i + 1], w, dout[i:i + 1], padding)[1] for i in range(len(x))])
        return dx, each if per_image else each[0]

    outcome = failed("04.8", unsummed, "sums the contributions of all N images")
    assert "any size must work" not in outcome.detail, outcome.detail


def max_pool_every_tie(x, dout):
    at_max = x == F.max_pool2d(x, 2).repeat_interleave(2, -2).repeat_interleave(2, -1)
    return at_max * dout.repeat_interleave(2, -2).repeat_interleave(2, -1)


def test_04_8_names_the_ties():
    outcome = failed("04.9", max_pool_every_tie, "with tied maxima", "a mask x == the window's maximum",
                     "two or more times", "the first maximum in row-major order", "measured on CPU with torch 2.14.1")
    assert "splitting" not in outcome.detail and "last maximum" not in outcome.detail, outcome.detail
    failed("04.9", lambda x, dout: nb04._last_max_takes_it(x, dout), "with tied maxima", "first maximum")


def test_max_pool2d_gives_a_tie_to_the_first_maximum():  # what 04.9 and the lesson say, measured
    x = torch.tensor([[[[0.0, 2.0], [2.0, 1.0]], [[0.4, 0.4], [0.4, 0.4]]]], requires_grad=True)
    F.max_pool2d(x, 2).backward(torch.ones(1, 2, 1, 1))
    assert x.grad.flatten().tolist() == [0, 1, 0, 0, 1, 0, 0, 0]


# ----- 04.10: where is the slip? -------------------------------------------------------------------------
def disagreement(close=lambda a, b: torch.allclose(a, b, atol=1e-5), skip_none=True, leave_hook=False,
                 params_only=False, table=None, chained=False, first_only=False, skip_bias=True, dx_only=False):
    """04.10's worked answer, with one slip: ``torch.equal`` (or no comparison at all), layer 0's None
    grad_input compared, a hook left behind, the parameters' gradients alone, another table than the
    formulas given, each formula's dx passed on instead of the recorded grad_output, a stop at the
    first disagreement from the loss back, or ``getattr(layer, name).grad`` on the conv's None bias."""
    def disagreeing_layers(model, x, y, formulas):
        formulas = table or formulas
        with hooklab.record(model, backward=True) as rec:
            F.cross_entropy(model(x), y).backward()
        if leave_hook:
            model[0].register_forward_hook(lambda *args: None)
        found, passed_on = set(), rec.records[-1].grad_output[0]
        for r in reversed(rec.records):
            layer = model.get_submodule(r.name)
            with torch.no_grad():
                d, params = formulas[type(layer)](layer, r.inputs[0], r.output,
                                                  passed_on if chained else r.grad_output[0])
            passed_on = d
            pairs = [] if params_only else [(d, r.grad_input[0])]
            pairs += [] if dx_only else [(g, getattr(layer, k).grad) for k, g in params.items()
                                         if g is not None or not skip_bias]
            if any((b is not None or not skip_none) and not close(a, b) for a, b in pairs):
                found.add(r.name)
                if first_only:
                    break
        model.zero_grad()
        return found
    return disagreeing_layers


def test_04_10_passes_the_worked_answer_and_lists_and_modules_of_names():
    outcome = grade("04.10", ANSWERS["04.10"])
    assert outcome.passed and "the problem's slip" in outcome.detail, outcome.detail
    assert grade("04.10", lambda *args: sorted(ANSWERS["04.10"](*args))).passed


def _called_twice():
    """A forward that calls the same two children twice (Sequential keeps one child per module: '0' and '1')."""
    torch.manual_seed(0)
    fc, act = nn.Linear(6, 6), nn.Tanh()
    return nn.Sequential(fc, act, fc, act).double(), torch.randn(8, 6, dtype=torch.float64), torch.arange(8) % 6


def _linear_bias_by_the_mean(layer, x, out, dout):
    dx, params = bp.BACKWARD[nn.Linear](layer, x, out, dout)
    return dx, {**params, "bias": dout.mean(0)}


@pytest.mark.parametrize("answer", [ANSWERS["04.10"], nb04.disagreeing_layers])
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_04_10_worked_answers_judge_each_call_of_a_layer_called_twice(answer):
    model, x, y = _called_twice()
    assert [name for name, _ in model.named_children()] == ["0", "1"]
    assert answer(model, x, y, bp.BACKWARD) == set()  # no false alarm
    assert answer(model, x, y, {**bp.BACKWARD, nn.Linear: _linear_bias_by_the_mean}) == {"0"}
    assert answer(model, x, y, {**bp.BACKWARD, nn.Tanh: lambda layer, x, out, d: (d, {})}) == {"1"}
    assert leftover_hooks(model) == []


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_a_one_slot_recorder_on_a_layer_called_twice_pairs_the_last_forward_with_the_first_backward():
    """What lesson 04 §5 says of its Hook: each hook fires once per call; kept in one slot, the forward is the
    last call's and the gradient the first call's (backward runs in reverse), so right formulas disagree."""
    model, x, y = _called_twice()
    fired, kept = [], {}

    def forward(layer, args, out, name):
        fired.append(("forward", name))
        kept[name] = [args[0].detach(), out.detach()]  # one slot: the last call's

    def backward(layer, grad_input, grad_output, name):
        fired.append(("backward", name))
        kept[name][2:] = [grad_input[0], grad_output[0]]  # one slot: the last backward's, the first call's

    with hooklab.Hooks() as handles:
        for name, layer in model.named_children():
            handles.add(layer.register_forward_hook(partial(forward, name=name)))
            handles.add(layer.register_full_backward_hook(partial(backward, name=name)))
        F.cross_entropy(model(x), y).backward()
    assert fired == [("forward", "0"), ("forward", "1")] * 2 + [("backward", "1"), ("backward", "0")] * 2
    judged = set()
    for name, (inp, out, grad_input, grad_output) in kept.items():
        layer = model.get_submodule(name)
        dx, params = bp.BACKWARD[type(layer)](layer, inp, out, grad_output)
        pairs = [(dx, grad_input)] + [(g, getattr(layer, k).grad) for k, g in params.items() if g is not None]
        judged |= {name} if any(b is not None and not torch.allclose(a, b) for a, b in pairs) else set()
    assert judged == {"0", "1"}  # right formulas, and a false alarm on both layers


def one_slot(model, x, y, formulas):
    """04.10 as its instructions once read: the lesson's one-slot Hook on each child, right on a chain, wrong
    on a module called twice (the last call's input, the first call's gradient)."""
    class Hook:
        def __init__(self, module, handles):
            handles.add(module.register_forward_hook(self.forward))
            handles.add(module.register_full_backward_hook(self.backward))

        def forward(self, module, args, output):
            self.input, self.output = args[0].detach(), output.detach()

        def backward(self, module, grad_input, grad_output):
            self.grad_input, self.grad_output = grad_input[0], grad_output[0]

    with hooklab.Hooks() as handles:
        hooks = {name: Hook(layer, handles) for name, layer in model.named_children()}
        F.cross_entropy(model(x), y).backward()
    records = {name: [(h.input, h.output, h.grad_input, h.grad_output)] for name, h in hooks.items()}
    return _disagreeing(model, records, formulas)


def _disagreeing(model, records, formulas):
    """The layers where a formula, tried on one recorded call at a time, disagrees with what arrived or with
    the parameter's .grad (each call compared with .grad on its own); then the model's gradients cleared."""
    found = set()
    for name, calls in records.items():
        layer = model.get_submodule(name)
        for inp, out, grad_input, grad_output in calls:
            with torch.no_grad():
                dx, params = formulas[type(layer)](layer, inp, out, grad_output)
            pairs = [(dx, grad_input)] + [(g, getattr(layer, k).grad) for k, g in params.items() if g is not None]
            if any(b is not None and not torch.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in pairs):
                found.add(name)
    model.zero_grad()
    return found


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_04_10_refuses_a_one_slot_record_on_a_module_called_twice():
    cases, x, y = nb04._reused_cases()
    for _, model, formulas, expected in cases:  # the worked answers pass there, the one-slot Hook does not
        assert ANSWERS["04.10"](model, x, y, formulas) == nb04.disagreeing_layers(model, x, y, formulas) == expected
    failed("04.10", one_slot, "calls the same Linear '0' and Tanh '1' twice", "you named ['0', '1']",
           "no formula disagrees", "fires each hook twice", "Keep one record per call")


def each_call_alone(model, x, y, formulas):
    """04.10 with one record per call, paired rightly, but each call's parameter gradient compared with .grad
    on its own instead of summed over the calls."""
    calls = {name: [] for name, _ in model.named_children()}
    backwards = dict.fromkeys(calls, 0)

    def forward(layer, args, out, name):
        calls[name].append([args[0].detach(), out.detach()])

    def backward(layer, grad_input, grad_output, name):
        backwards[name] += 1
        calls[name][-backwards[name]] += [grad_input[0], grad_output[0]]

    with hooklab.Hooks() as handles:
        for name, layer in model.named_children():
            handles.add(layer.register_forward_hook(partial(forward, name=name)))
            handles.add(layer.register_full_backward_hook(partial(backward, name=name)))
        F.cross_entropy(model(x), y).backward()
    return _disagreeing(model, calls, formulas)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_04_10_names_parameter_gradients_not_summed_over_the_calls():
    failed("04.10", each_call_alone, "calls the same Linear '0' and Tanh '1' twice", "you named ['0']",
           "only that call's share", "Sum each parameter's gradient over the calls")


def test_04_10_rejects_layer_names_as_ints():
    outcome = grade("04.10", lambda *args: {int(name) for name in ANSWERS["04.10"](*args)})
    assert not outcome.passed and "a layer's name is a string" in outcome.detail, outcome.detail


@pytest.mark.parametrize(("answer", "words"), [
    (disagreement(chained=True), "you passed your formula's dx on instead of what the hooks recorded"),
    (disagreement(first_only=True), "check every layer, not only up to the first disagreement"),
    (disagreement(close=torch.equal), "torch.allclose, not =="),
    (disagreement(close=lambda a, b: True), "you named no layer"),
    (disagreement(skip_none=False), "its grad_input is (None,)"),
    (disagreement(skip_bias=False), "a convolution without bias gives {'bias': None}"),
    (disagreement(leave_hook=True), "a hook is still registered"),
    (disagreement(table=bp.BACKWARD), "formulas[type(layer)]"),
    (lambda model, x, y, formulas: "5", "return a set (or list) of layer names"),
    (lambda model, x, y, formulas: {"12"}, "not a child of the model"),
    (lambda model, x, y, formulas: {"1", "5"}, "a fixed answer, not a comparison"),
])  # fmt: skip
def test_04_10_names_the_slip(answer, words):
    outcome = grade("04.10", answer)
    assert not outcome.passed and words in outcome.detail, outcome.detail


def test_04_10_names_a_chained_backward_even_without_the_grad_input_of_layer_0():
    failed("04.10", disagreement(chained=True), "with the problem's formulas", "{'0', '1', '2', '3', '4', '5'}",
           "judged on what that layer recorded")


def test_04_10_wants_a_float32_tolerance():  # plain allclose blames layer 4 of the right formulas in float32
    failed("04.10", disagreement(close=torch.allclose), "in float32", "'4'", "float32 rounding",
           "relative tolerance (e.g. rtol=1e-3")


def test_04_10_blames_a_too_loose_tolerance_before_the_loop():  # layer 5's slip: < 1e-3 per entry, 6 % relative
    outcome = failed("04.10", disagreement(close=lambda a, b: torch.allclose(a, b, atol=1e-3)), "you named {'1'}",
                     "the dx of another layer", "6% of its size", "too loose", "rtol=1e-3, atol=1e-5")
    assert "'5'" not in outcome.detail  # the problem's answer is prediction 04.e's


@pytest.mark.parametrize("answer", [
    disagreement(chained=True, params_only=True), disagreement(first_only=True), disagreement(params_only=True),
    disagreement(close=lambda a, b: torch.allclose(a, b, atol=1e-3))])
def test_04_10_never_names_the_answer_of_the_problems_formulas(answer):
    outcome = grade("04.10", answer)
    assert not outcome.passed and "the problem's formulas" in outcome.detail, outcome.detail
    assert "'5'" not in outcome.detail.partition("you named")[2].partition("}")[2], outcome.detail


def test_04_10_says_when_the_hand_chained_gradient_fed_the_formulas():  # {'0', '1', '4'}: upstream of the slip
    failed("04.10", disagreement(chained=True, params_only=True), "you named {'0', '1', '4'}",
           "judge each layer on the grad_output its own hook recorded, not on the gradient your formulas passed down")


def test_04_10_says_parameter_gradients_cannot_see_grad_input():
    outcome = failed("04.10", disagreement(params_only=True), "you named no layer", "parameters' gradients alone",
                     "Compare each layer's grad_input")
    assert "reversed(rec.records)" not in outcome.detail


def test_04_10_names_the_parameter_gradients_a_grad_input_comparison_skips():
    outcome = failed("04.10", disagreement(dx_only=True), "formulas whose Linear bias gradient", "you named no layer",
                     "grad_input alone", "skips the parameters' gradients", "with its .grad too")
    assert "compare with torch.allclose" not in outcome.detail


def test_04_10_a_comparison_of_nothing_is_not_told_it_compares_grad_input():
    outcome = failed("04.10", disagreement(close=lambda a, b: True), "you named no layer")
    assert "grad_input alone" not in outcome.detail


def test_the_problems_formulas_train_worse_and_only_batch_norm_slips():
    from hooklab.data import digits

    data = digits()
    x, y = data.x_train[:32].double(), data.y_train[:32]
    model = nb04.digits_cnn().double()
    right, slipped = nb04.autograd_grads(model, x, y), nb04.hand_backward(nb04.formulas_with_a_slip())(model, x, y)
    fine = nb04.hand_backward(bp.BACKWARD)(model, x, y)
    assert all(torch.allclose(fine[n], right[n]) for n in right)
    assert [n for n in right if not torch.allclose(slipped[n], right[n])] == ["0.weight", "1.weight", "1.bias",
                                                                             "4.weight"]


def test_04_2_names_a_forward_recomputed_from_the_logits():
    def recomputed(t, target):
        return ANSWERS["04.3"](nb04.ce_steps(t["logits"], target), target)

    failed("04.3", recomputed, "counts_sum = counts.sum(1) + 1", "Use the values in t, not a recomputed forward",
           "the check feeds in a changed forward")


def test_04_5_names_the_bessel_factor_of_the_fused_formula():
    def with_bessel_factor(x, gamma, dout, eps):  # makemore part 4's fused form on a variance divided by N
        n, inv_std = len(x), (x.var(0, unbiased=False) + eps) ** -0.5
        x_hat = (x - x.mean(0)) * inv_std
        dx = gamma * inv_std / n * (n * dout - dout.sum(0) - n / (n - 1) * x_hat * (dout * x_hat).sum(0))
        return dx, (dout * x_hat).sum(0), dout.sum(0)

    failed("04.6", with_bessel_factor, "the factor n/(n − 1)", "Bessel's correction", "divides by N = 6")


def test_the_lessons_04_8_skeleton_completed_with_the_other_four_layers_passes():
    cell = next("".join(c["source"]) for c in json.loads(LESSON.read_text())["cells"]
                if c["cell_type"] == "code" and "def model_backward" in "".join(c["source"]))
    rest = '''        elif isinstance(layer, nn.Flatten):
            d = d.reshape(a.shape)
        elif isinstance(layer, nn.MaxPool2d):
            d = max_pool_backward(a, d)
        elif isinstance(layer, nn.BatchNorm2d):
            n, c, h, w = a.shape
            dx, grads[f"{name}.weight"], grads[f"{name}.bias"] = batch_norm_backward(
                a.permute(0, 2, 3, 1).reshape(-1, c), layer.weight, d.permute(0, 2, 3, 1).reshape(-1, c), layer.eps)
            d = dx.reshape(n, h, w, c).permute(0, 3, 1, 2)
        elif isinstance(layer, nn.Conv2d):
            d, grads[f"{name}.weight"] = conv2d_backward(a, layer.weight, d, layer.padding[0])
'''
    recorder = """        for name, layer in model.named_children():
            handles.add(layer.register_forward_hook(
                lambda layer, args, out, name=name: records.append((name, layer, args[0], out))))
"""
    stub = next(line + "\n" for line in cell.splitlines() if line.strip().startswith("raise NotImplementedError  #"))
    assert "        else:  # your code here" in cell and "handles.add" in stub
    source = cell.replace("        else:  # your code here", rest + "        else:  # your code here")
    source = source.replace(stub, recorder)
    source = "\n".join(line for line in source.splitlines() if not line.startswith("check("))
    namespace = {"torch": torch, "nn": nn, "F": F, "hooklab": hooklab, "ce_backward": ANSWERS["04.4"],
                 "batch_norm_backward": ANSWERS["04.6"], "conv2d_backward": ANSWERS["04.8"],
                 "max_pool_backward": ANSWERS["04.9"]}
    exec(source, namespace)
    outcome = grade("04.11", namespace["model_backward"])
    assert outcome.passed, outcome.detail
    skeleton = {"torch": torch, "nn": nn, "F": F, "hooklab": hooklab, "ce_backward": ANSWERS["04.4"]}
    exec("\n".join(line for line in cell.splitlines() if not line.startswith("check(")), skeleton)
    with pytest.raises(NotImplementedError):  # the stub as the lesson stores it: not solved yet, no hook left
        skeleton["model_backward"](model := nb04.digits_cnn(), torch.randn(2, 1, 8, 8), torch.tensor([0, 1]))
    assert not leftover_hooks(model)


def test_04_9_names_the_padding_pair_when_an_int_was_expected():
    def padding_as_given(model, x, y):  # F.pad(x, (padding,) * 4) in a conv2d_backward, handed layer.padding
        return {"0.weight": F.pad(x, (model[0].padding,) * 4)}

    failed("04.11", padding_as_given, "layer.padding is a pair", "pass layer.padding[0]")


def test_04_10_refuses_an_identity_test_of_the_formulas():
    def by_identity(model, x, y, formulas):
        from hooklab import backprop as bp
        return {n for n, layer in model.named_children() if formulas[type(layer)] is not bp.BACKWARD[type(layer)]}

    failed("04.10", by_identity, "each wrapped in a new function", "not which function they are")


def test_04_10_and_04_e_print_no_full_backward_hook_warning(recwarn):
    assert grade("04.10", ANSWERS["04.10"]).passed
    grade("04.e", {"1", "5"})
    assert not [w for w in recwarn if "Full backward hook is firing" in str(w.message)]


def test_04_8_refuses_torch_nn_grad_and_says_conv_transpose2d_is_allowed():
    def by_library(x, w, dout, padding):
        return (torch.nn.grad.conv2d_input(x.shape, w, dout, padding=padding),
                torch.nn.grad.conv2d_weight(x, w.shape, dout, padding=padding))

    failed("04.8", by_library, "autograd's own backward", "F.conv_transpose2d is allowed")


def test_04_e_says_the_convolutions_are_the_other_suspects_answer():
    failed("04.e", {"0", "4"}, "the other suspect, the conv formula", "supposes batch norm's formula slips")


# ----- more plausible slips, each named --------------------------------------------------------------------
def _fused_bn_with(dx_from=None, dgamma=None, dbeta=None):
    """04.6's worked answer with one of its three gradients replaced: ``dx_from(x, gamma, dout, inv_std, x_hat)``."""
    def answer(x, gamma, dout, eps):
        inv_std = (x.var(0, unbiased=False) + eps) ** -0.5
        x_hat = (x - x.mean(0)) * inv_std
        dx, dg, db = ANSWERS["04.6"](x, gamma, dout, eps)
        dx = dx if dx_from is None else dx_from(x, gamma, dout, inv_std, x_hat)
        return dx, dg if dgamma is None else dgamma(x, dout, x_hat), db if dbeta is None else dbeta(x, dout, x_hat)
    return answer


def _three_terms(g, inv_std, x_hat, gamma=1.0, sign=-1.0):
    return inv_std * (gamma * g - g.mean(0) + sign * x_hat * (g * x_hat).mean(0))


@pytest.mark.parametrize(("answer", "words"), [
    (_fused_bn_with(lambda x, gamma, dout, inv_std, x_hat: _three_terms(dout, inv_std, x_hat)), "your dx has no γ"),
    (_fused_bn_with(lambda x, gamma, dout, inv_std, x_hat: _three_terms(dout, inv_std, x_hat, gamma=gamma)),
     "γ multiplies all three paths, not only the direct one"),
    (_fused_bn_with(lambda x, gamma, dout, inv_std, x_hat: _three_terms(dout * gamma, inv_std, x_hat, sign=1.0)),
     "a sign slip in the variance's term"),
    (_fused_bn_with(dgamma=lambda x, dout, x_hat: dout.sum(0)), ("dgamma: max |difference|", "that is dbeta")),
    (_fused_bn_with(dbeta=lambda x, dout, x_hat: (dout * x_hat).sum(0)), ("dbeta: max |difference|", "that is dgamma")),
    (_fused_bn_with(dgamma=lambda x, dout, x_hat: (dout * x).sum(0)), "γ multiplies the normalised x̂, not x"),
])  # fmt: skip
def test_04_5_names_gamma_sign_and_parameter_slips(answer, words):
    failed("04.6", answer, *([words] if isinstance(words, str) else words))


def test_04_4_names_a_dx_hat_without_gamma():
    def answer(t, gamma, dout):
        d = nb04.bn_backward_steps(t, torch.ones_like(gamma), dout)
        return {**d, "gamma": (dout * t["x_hat"]).sum(0)}
    failed("G4.6", answer, "first wrong: dx_hat", "your dx_hat has no γ")


@pytest.mark.parametrize(("answer", "words"), [
    (lambda a, w, dz: (dz @ w, dz.T @ a, dz.mean().reshape(1)), "the sum of dz, not the mean"),
    (lambda a, w, dz: (dz @ w.T, dz.T @ a, dz.sum().reshape(1)), ("da: max |difference|", "not dz @ w.T")),
])  # fmt: skip
def test_04_1_names_a_mean_bias_and_a_transposed_weight_in_da(answer, words):
    failed("04.1", answer, *([words] if isinstance(words, str) else words))


def _ce_only_target(logits, target):
    d = torch.zeros_like(logits)
    rows = torch.arange(len(target))
    d[rows, target] = logits.softmax(1)[rows, target] - 1
    return d / len(target)


@pytest.mark.parametrize(("answer", "words"), [
    (lambda logits, target: (logits.softmax(1) + F.one_hot(target, logits.shape[1])) / len(target),
     "a sign slip at the correct class"),
    (_ce_only_target, "the wrong classes get p_j/N too"),
])  # fmt: skip
def test_04_3_names_a_plus_one_and_a_target_column_alone(answer, words):
    failed("04.4", answer, words)


def _steps_with(id, step, value):
    """04.3's or G4.6's worked answer with one step's gradient replaced: ``value(t, d)``."""
    def answer(t, *rest):
        d = (nb04.bn_backward_steps if id == "G4.6" else ANSWERS[id])(t, *rest)
        return {**d, step: value(t, d, *rest)}
    return answer


@pytest.mark.parametrize(("id", "step", "value", "words"), [
    ("04.3", "norm_logits", lambda t, d, target: d["counts"], "d/dz exp(z) = exp(z): multiply dcounts by counts"),
    ("G4.6", "var", lambda t, d, gamma, dout: -0.5 * t["inv_std"] * d["inv_std"], "that is inv_std ** 3, not inv_std"),
    ("G4.6", "diff", lambda t, d, gamma, dout: t["inv_std"] * d["x_hat"] + t["diff"] * d["diff2"],
     "the path through diff2 lost its 2"),
    ("G4.6", "gamma", lambda t, d, gamma, dout: (dout * t["diff"]).sum(0), "γ multiplies x_hat, not diff"),
])  # fmt: skip
def test_04_2_and_04_4_name_more_step_slips(id, step, value, words):
    failed(id, _steps_with(id, step, value), f"first wrong: d{step}", words)


def test_04_6_names_a_flipped_dw():
    def answer(x, w, dout, padding):
        dx, dw = ANSWERS["04.8"](x, w, dout, padding)
        return dx, dw.flip(-2, -1)
    failed("04.8", answer, "your dw is the right one flipped")


def test_04_3_names_probs_recomputed_instead_of_read_from_t():
    def with_probs(t, target):  # probs recomputed from counts, as if counts_sum were counts.sum(1)
        return ANSWERS["04.3"]({**t, "probs": t["counts"] / t["counts"].sum(1, keepdim=True)}, target)

    failed("04.3", with_probs, "first wrong: dprobs", "you divided by a probs you recomputed",
           "Read every forward value from t")


# ----- 04.10 and 04.11 need hooks: a loop over the children holds only while forward is a chain ---------------
def test_04_10_refuses_a_retain_grad_loop_over_the_children():
    def looped(model, x, y, formulas):  # each child called on the last one's output, every output's .grad kept
        seen, a = {}, x
        for name, layer in model.named_children():
            out = layer(a)
            out.retain_grad()
            seen[name], a = (a, out), out
        F.cross_entropy(a, y).backward()
        found = set()
        for name, (a, out) in seen.items():
            layer = model.get_submodule(name)
            with torch.no_grad():
                dx, params = formulas[type(layer)](layer, a.detach(), out.detach(), out.grad)
            pairs = [(dx, a.grad)] + [(g, getattr(layer, k).grad) for k, g in params.items() if g is not None]
            if any(b is not None and not torch.allclose(p, b, rtol=1e-3, atol=1e-5) for p, b in pairs):
                found.add(name)
        model.zero_grad()
        return found

    failed("04.10", looped, "your answer registered no hook and never called model(x)",
           "it only works while forward is a chain", "a skip connection")


def test_04_10_checks_a_forward_that_is_not_a_chain():
    _, model, _, expected = next(case for case in nb04._slipped_cases() if "skip connection" in case[0])
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    assert expected == {"2", "6"} and not torch.allclose(model(x), nn.Sequential.forward(model, x))


def _recording(record_forward):
    """04.11's worked answer with its recorder replaced."""
    def answer(model, x, y):
        saved = ANSWERS["04.11"].__globals__["record_forward"]
        ANSWERS["04.11"].__globals__["record_forward"] = record_forward
        try:
            return ANSWERS["04.11"](model, x, y)
        finally:
            ANSWERS["04.11"].__globals__["record_forward"] = saved
    return answer


def _run_the_children(model, x):
    records, a = [], x
    for name, layer in model.named_children():
        out = layer(a)
        records.append((name, layer, a, out))
        a = out
    return a, records


def test_04_11_refuses_a_forward_loop_over_the_children():
    failed("04.11", _recording(_run_the_children), "at step 1: your answer registered no hook and never called "
           "model(x)", "it only works while forward is a chain")


def test_04_11_refuses_model_x_run_beside_an_unhooked_loop():
    def beside(model, x):
        model(x)
        return _run_the_children(model, x)

    failed("04.11", _recording(beside), "at step 1: your answer registered no hook while model(x) ran",
           "it only works while forward is a chain")


def test_04_e_names_as_ints_are_not_in_the_form_asked():
    outcome = grade("04.e", {1, 5})
    assert not outcome.passed and outcome.form, "a slip of form prints 'not in the form asked', not 'not quite'"
    assert "'1'" not in outcome.detail and "'5'" not in outcome.detail, outcome.detail  # the answer not given away
    assert not grade("04.e", {"4"}).form  # a wrong guess in the form asked: not quite


def in_forward_order(model, x, y, formulas):
    """04.10's worked answer with one slip: a record per call, but each backward paired with the calls in
    forward order (the first backward, which belongs to the last call, goes with the first call)."""
    calls = {name: [] for name, _ in model.named_children()}
    backwards = dict.fromkeys(calls, 0)

    def forward(layer, args, output, name):
        calls[name].append({"input": args[0].detach(), "output": output.detach()})

    def backward(layer, grad_input, grad_output, name):
        calls[name][backwards[name]].update(grad_input=grad_input[0], grad_output=grad_output[0])
        backwards[name] += 1

    with hooklab.Hooks() as handles:
        for name, layer in model.named_children():
            handles.add(layer.register_forward_hook(partial(forward, name=name)))
            handles.add(layer.register_full_backward_hook(partial(backward, name=name)))
        F.cross_entropy(model(x), y).backward()
    found = set()
    for name, layer_calls in calls.items():
        layer, summed = model.get_submodule(name), {}
        for call in layer_calls:
            with torch.no_grad():
                dx, params = formulas[type(layer)](layer, call["input"], call["output"], call["grad_output"])
            if call["grad_input"] is not None and not torch.allclose(dx, call["grad_input"], rtol=1e-3, atol=1e-5):
                found.add(name)
            for k, g in params.items():
                if g is not None:
                    summed[k] = summed.get(k, 0) + g
        if any(not torch.allclose(g, getattr(layer, k).grad, rtol=1e-3, atol=1e-5) for k, g in summed.items()):
            found.add(name)
    model.zero_grad()
    return found


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_04_10_names_backwards_paired_with_the_calls_in_forward_order():
    outcome = failed("04.10", in_forward_order, "calls the same Linear '0' and Tanh '1' twice",
                     "backward meets the calls in reverse order")
    assert "Kept in one slot" not in outcome.detail, outcome.detail
    failed("04.10", one_slot, "Kept in one slot")  # a one-slot record keeps its own message


# ----- 04.7: a second hook hands each step your own gradient --------------------------------------------
def _hands_on(returns, keep_first=True, handles_kept=True):
    """A judged_alone whose hook returns ``returns(d, name)``, keep_grads registered first or after, the
    handles removed or left on the steps."""
    def judged_alone(steps, d, dout):
        with hooklab.Hooks() as handles:
            arrived = nb04.keep_grads(steps) if keep_first else None
            for name in d:
                handle = steps[name].register_hook(lambda grad, name=name: returns(d, name))
                if handles_kept:
                    handles.add(handle)
            arrived = arrived if keep_first else nb04.keep_grads(steps)
            steps["y"].backward(dout)
        return arrived
    return judged_alone


def test_04_7_passes_the_worked_answer():
    assert grade("04.7", nb04.judged_alone).passed


@pytest.mark.parametrize(("answer", "words"), [
    (_hands_on(lambda d, name: None), ("returns nothing", "replaces the gradient")),
    (_hands_on(lambda d, name: d[name], keep_first=False), ("ran before keep_grads's", "order they were registered")),
    (_hands_on(lambda d, name: d[name], handles_kept=False), ("still hands on your gradient", "handles.add")),
    (_hands_on(lambda d, name: d["x"]), ("name=name",)),
])  # fmt: skip
def test_04_7_names_the_slip(answer, words):
    failed("04.7", answer, *words)
