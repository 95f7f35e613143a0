"""Checkers of notebook 08: each accepts a worked answer and rejects the plausible wrong ones with a
message naming the slip; each prediction computes what the lesson shows; the lesson's measured facts
about the model hold."""

from __future__ import annotations

import contextlib

import pytest
import torch
from answers import failed

from hooklab import record
from hooklab.exercises import exercises, grade, nb08

IDS = sorted(id for id in exercises() if id.startswith("08."))


def test_notebook_08_has_five_predictions_and_eight_exercises():
    assert IDS == ["08.1", "08.2", "08.3", "08.4", "08.5", "08.6", "08.7", "08.8",
                   "08.a", "08.b", "08.c", "08.d", "08.e"]


# ----- predictions ------------------------------------------------------------------------------
@pytest.mark.parametrize(("id", "truth"), [("08.a", 4), ("08.b", [1, 3]), ("08.c", [14, 5]), ("08.d", ["no", "yes"]),
                                           ("08.e", "all")])
def test_each_prediction_computes_what_the_lesson_shows(id, truth):
    assert grade(id, truth).passed
    computed = exercises()[id].checker.__wrapped__.truth()
    assert computed == truth


@pytest.mark.parametrize(("id", "guess", "hint"), [
    ("08.a", 5, "position after it"), ("08.a", 6, "run of 7"), ("08.a", 1, "previous-token head"),
    ("08.b", [1], "own record"), ("08.b", [3], "holds the record"), ("08.b", [0, 2], "embeddings"),
    ("08.b", [9], "did not move"), ("08.b", [0, 1], "first token"),
    ("08.c", [8, 4], "position after it"), ("08.c", [19, 3], "unchanged run"), ("08.c", [14, 4], "earlier 8"),
    ("08.c", 10, "two whole"), ("08.d", ["yes", "yes"], "is either linear"), ("08.d", ["no", "no"], "linear maps"),
    ("08.d", ["YES", " no "], "never more"), ("08.d", "no", '"yes" or "no"'), ("08.d", [False, True], '"yes" or "no"'),
    ("08.d", ["no", "maybe"], '"yes" or "no"'), ("08.d", ["no", "yes", "yes"], '"yes" or "no"'),
    ("08.e", "none", "a quarter more of the scale"), ("08.e", "some", "close together"),
    ("08.e", "About  Half", "close together"), ("08.e", 233, '"about half"'), ("08.e", True, '"about half"'),
    ("08.e", ["all"], '"about half"'), ("08.e", "most", '"about half"'),
])  # fmt: skip
def test_wrong_guesses_get_their_hint(id, guess, hint):
    failed(id, guess, hint)


@pytest.mark.parametrize(("id", "guess"), [("08.d", "yes"), ("08.d", [True, True]), ("08.d", ["no"]), ("08.d", 5.56)])
def test_a_guess_outside_the_form_is_not_told_the_answer(id, guess):
    outcome = grade(id, guess)
    assert outcome.form and '"yes" or "no"' in outcome.detail and "5.56" not in outcome.detail
    assert "linear" not in outcome.detail


@pytest.mark.parametrize(("id", "guess"), [
    ("08.a", "four"), ("08.a", 4.5), ("08.a", [4]), ("08.a", True), ("08.b", "three"), ("08.b", 3),
    ("08.b", [3, 1]), ("08.b", False), ("08.c", ["3", "3"]), ("08.c", "3, 3"), ("08.c", [3]), ("08.c", 3),
    ("08.c", True), ("08.c", (3, "3")),
])  # fmt: skip
def test_a_guess_in_the_wrong_form_gets_a_format_hint_not_the_answer(id, guess):
    outcome = failed(id, guess, "write")
    detail = outcome.detail
    assert outcome.form, "a slip of form prints 'not in the form asked', not 'not quite'"
    truth = exercises()[id].checker.__wrapped__.truth()
    assert str(truth) not in detail and "back" not in detail and "record" not in detail


def test_resampled_from_100_random_runs_most_predict_8_and_layer_1_moves_to_key_4():
    said, (key_3, key_4) = nb08.resampled_answers()
    assert int((said == 8).sum()) == 78 and int((said == nb08.A).sum()) == 22
    assert abs(key_3 - 0.14) < 0.005 and abs(key_4 - 0.47) < 0.005
    runs = nb08.random_runs()
    assert runs.shape == (100, 16) and (runs[:, :7] == runs[:, 7:14]).all()


@pytest.mark.parametrize(("id", "guess"), [("08.a", 3), ("08.b", [5]), ("08.c", [3, 3]), ("08.d", ["no", "no"]),
                                           ("08.c", [0, 0]), ("08.e", "some")])
def test_a_wrong_guess_in_the_form_asked_is_not_quite(id, guess):
    outcome = grade(id, guess)
    assert not outcome.passed and not outcome.form


@pytest.mark.parametrize("guess", [[2, 3], [3, 4], [1, 2], [3, 9], [4, 5], [0, 3], [5, 6], [3, 12], [6], [0, 3, 9],
                                   [2, 3, 4]])
def test_08_b_a_wrong_guess_gets_a_hint_not_the_answer(guess):
    """Every wrong guess, listed with its own hint or not, gets a question, never the rule that names the two
    positions (the explanation a right guess gets)."""
    outcome = failed("08.b", guess, "3 before me", "which positions")
    detail, why = outcome.detail, grade("08.b", [1, 3]).detail
    assert not outcome.form and detail != why and "where the clean run holds" not in detail
    assert "[1, 3]" not in detail and "1" not in detail


@pytest.mark.parametrize(("guess", "words"), [([3, 3], "two different"), ([1, 2, 3, 4], "two different"),
                                              ([3, 20], "from 0 to 15"), ([-1, 3], "from 0 to 15")])
def test_08_b_a_guess_beyond_the_listed_ones_gets_a_form_hint_not_the_rule(guess, words):
    outcome = failed("08.b", guess, words)
    assert outcome.form and "record" not in outcome.detail and "3" not in outcome.detail.replace("[0, 1]", "")


def test_layer_1s_single_drops_add_up_to_far_less_than_the_joint_one():
    single, joint = nb08.single_and_joint()
    assert abs(single - 1.07) < 0.005 and abs(joint - 6.26) < 0.005


def test_08_d_held_ln_final_scale_makes_the_single_drops_positive_and_with_mlp1_they_add_up():
    """The reveal: ln_final's scale held, the negative single drops (heads 1, 2) turn positive and the singles
    still miss the joint drop (7.35 against 9.45); with MLP1's output held too, they add up exactly (5.56)."""
    singles, joint = nb08.held_drops(False)
    assert (singles > 0).all() and abs(singles[1] - 2.04) < 0.005 and abs(singles[2] - 0.51) < 0.005
    assert abs(singles.sum() - 7.35) < 0.005 and abs(joint - 9.45) < 0.005
    singles, joint = nb08.held_drops(True)
    assert abs(singles.sum() - 5.56) < 0.005 and abs(singles.sum() - joint) < 1e-4
    assert nb08._yes_no(["Yes", "no"]) is None and all(nb08._yes_no(g) for g in ("yes", ["yes"], [1, 0], ["y", "n"]))


def test_zeroing_layer_0_at_3_leaves_the_logit_difference_but_not_the_margin():
    """The zero-ablation reveal: logit[19] - logit[17] stays 10.79, both fall by 1.33, the margin over the runner-up
    (12, then 8) shrinks from 7.99 to 6.33."""
    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    with torch.no_grad():
        intact = model(clean)[0, nb08.Q]
    zeroed = nb08.run_hooked(model, clean, "blocks.0.attn.hook_z",
                             lambda m, a, o: o.index_fill(1, torch.tensor([3]), 0.0))[0, nb08.Q]
    for logits, top, margin, top_19 in [(intact, 12, 7.99, 9.82), (zeroed, 8, 6.33, 8.49)]:
        values, indices = logits.topk(2)
        assert indices.tolist() == [nb08.A, top] and abs(values[0] - values[1] - margin) < 0.005
        assert abs(logits[nb08.A] - top_19) < 0.005 and abs(logits[nb08.A] - logits[nb08.B] - 10.79) < 0.005


def test_08_b_position_1_restores_too_the_twist():
    restores = nb08.layer_0_restores()
    assert restores.argmax().item() == 3 and 0.4 < restores[1].item() < 0.5


def test_layer_0_is_needed_at_3_resampling_shows_it_zeroing_does_not():
    """Patching shows a part is enough; ablation shows it is needed; zero ablation can miss a need."""
    diff, said, (key_3, _) = nb08.layer_0_at_3(keep=True)
    assert said == nb08.A and min(key_3) > 0.8
    intact = diff
    diff, said, (key_3, _) = nb08.layer_0_at_3()  # layer 1's attention falls, the logit difference does not
    assert abs(diff - intact) < 0.01 and said == nb08.A and 0.2 < min(key_3) and max(key_3) < 0.55
    diff, said, (key_3, key_4) = nb08.layer_0_at_3(nb08.with_20_at_2())
    assert said == 8 and max(key_3) < 0.13 and min(key_4) > 0.3 and nb08.clean_and_corrupted()[0][0, 4] == 8
    model = nb08._model()
    with torch.no_grad():
        assert model(nb08.with_20_at_2())[0, nb08.Q].argmax().item() == 8


def test_resid_post_0_differs_at_3_and_at_the_query():
    assert abs(nb08.resid_post_0_restores([3]) - 0.93) < 0.005
    assert abs(nb08.resid_post_0_restores([9]) - 0.04) < 0.005
    assert abs(nb08.resid_post_0_restores([3, 9]) - 1.00) < 0.005


def test_the_form_hints_accept_only_the_form_asked():
    assert nb08._one_whole(3) is None and all(nb08._one_whole(g) for g in (True, 3.0, [3], "three"))
    assert nb08._two_keys([19, 5]) is None and all(nb08._two_keys(g) for g in ([19], (19, "5"), [True, 5], 19))


def test_08_e_asks_about_scale_4_where_the_difference_hides_a_third_token():
    assert nb08.steered_answer(1) == nb08.A and nb08.steered_answer(4) not in (nb08.A, nb08.B)
    logits = nb08.steered_at(4)
    assert logits[nb08.A] - logits[nb08.B] > 5


@pytest.mark.parametrize(("id", "guess"), [("08.a", "4"), ("08.a", " 4 ")])
def test_a_number_in_quotes_is_told_to_drop_them(id, guess):
    failed(id, guess, "not a string")


# ----- the problem and the lesson's measurements ---------------------------------------------------
def test_the_corruption_flips_the_answer_and_only_the_changed_position_or_the_query_restores_it():
    model = nb08._model()
    clean, corrupted = nb08.clean_and_corrupted()
    with torch.no_grad():
        assert nb08.logit_diff(model(clean)) > 10 and nb08.logit_diff(model(corrupted)) < -10
    cache = nb08.clean_cache(model)
    for point, where in [("hook_embed", 3), ("blocks.0.hook_resid_post", 3), ("blocks.1.hook_resid_post", 9)]:
        restored = [p for p in range(nb08.Q + 1) if nb08.patched_diff(model, point, p, cache) > 0]
        assert restored == [where], point


# ----- 08.1 -------------------------------------------------------------------------------------
def leaves_hooks(model, tokens):
    patterns = []
    for block in model.blocks:
        block.attn.hook_pattern.register_forward_hook(lambda m, a, o: patterns.append(o.detach()))
    model(tokens)
    return patterns


def removes_after(model, tokens):  # no finally: a forward pass that raises leaves the hooks
    patterns = []
    handles = [b.attn.hook_pattern.register_forward_hook(lambda m, a, o: patterns.append(o.detach()))
               for b in model.blocks]
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    return patterns


def keeps_the_graph(model, tokens):  # no detach, no no_grad: the patterns require grad
    patterns = []
    handles = [b.attn.hook_pattern.register_forward_hook(lambda m, a, o: patterns.append(o))
               for b in model.blocks]
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return patterns


def no_detach(model, tokens):  # under no_grad, but keeps the output itself: no graph here, one elsewhere
    patterns = []
    handles = [b.attn.hook_pattern.register_forward_hook(lambda m, a, o: patterns.append(o))
               for b in model.blocks]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return patterns


def last_layer_only(model, tokens):
    return nb08.record_patterns(model, tokens)[-1:]


@pytest.mark.parametrize(("answer", "words"), [
    (leaves_hooks, ["still registered", "finally"]),
    (last_layer_only, ["1 patterns", "each block"]), ("record_patterns", ["pass your function itself"]),
    (removes_after, ["raised", "finally"]), (keeps_the_graph, ["require grad", "detach", "no_grad"]),
    (no_detach, ["output itself", "output.detach()", "graph"]),
])  # fmt: skip
def test_08_1_rejects(answer, words):
    failed("08.1", answer, *words)


def test_08_1_accepts_the_worked_answer():
    assert grade("08.1", nb08.record_patterns).passed


# ----- 08.3 -------------------------------------------------------------------------------------
def run_with_hooks_like(*, bind=True, call="tl", remove="finally", no_grad=True):
    """run_with_hooks with one slip: ``bind=False``, the late-bound loop variable; ``call``: "tl" (right),
    "raw" (fn(module, args, output)), "ignore" (the return value dropped), "name" (the name, not the module);
    ``remove``: "finally", "after" (not when a hook raises) or "never"."""
    def run_with_hooks(model, tokens, fwd_hooks):
        handles = []

        def run():
            for name, fn in fwd_hooks:
                module = model.get_submodule(name)
                def bound(m, a, o, fn=fn, name=name):
                    return {"tl": lambda: fn(o, m), "raw": lambda: fn(m, a, o), "ignore": lambda: [fn(o, m), None][1],
                            "name": lambda: fn(o, name), "input": lambda: fn(a[0], m)}[call]()

                def late(m, a, o):
                    return fn(o, m)  # noqa: B023 (the slip under test)

                handles.append(module.register_forward_hook(bound if bind else late))
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                return model(tokens)

        try:
            out = run()
        finally:
            if remove == "finally":
                for handle in handles:
                    handle.remove()
        if remove == "after":
            for handle in handles:
                handle.remove()
        return out

    return run_with_hooks


@pytest.mark.parametrize(("answer", "words"), [
    (run_with_hooks_like(bind=False), ["last function", "fn=fn"]),
    (run_with_hooks_like(call="raw"), ["TypeError", "fn(activation, hook)"]),
    (run_with_hooks_like(call="ignore"), ["corrupted run's", "must return"]),
    (run_with_hooks_like(call="name"), ["second argument", "HookPoint"]),
    (run_with_hooks_like(call="input"), ["blocks.1.mlp", "input (args[0])", "fn(output, module)"]),
    (run_with_hooks_like(remove="after"), ["raised", "finally"]),
    (run_with_hooks_like(remove="never"), ["still registered", "finally"]),
    (run_with_hooks_like(no_grad=False), ["require grad", "torch.no_grad()"]),
    ("run_with_hooks", ["pass your function itself"]),
])  # fmt: skip
def test_08_3_rejects(answer, words):
    failed("08.3", answer, *words)


def test_08_3_accepts_the_worked_answer_and_it_equals_a_raw_forward_hook():
    assert grade("08.3", nb08.run_with_hooks).passed
    assert grade("08.3", run_with_hooks_like()).passed
    model, corrupted = nb08._model(), nb08.clean_and_corrupted()[1]
    clean_z = nb08.clean_cache(model, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"]
    raw = nb08.run_hooked(model, corrupted, "blocks.1.attn.hook_z", lambda m, a, z: nb08._tl_patch(clean_z, 0)(z, m))
    assert torch.equal(nb08.run_with_hooks(model, corrupted, [("blocks.1.attn.hook_z", nb08._tl_patch(clean_z, 0))]),
                       raw)


def test_stripe_score_reads_the_key_k_back():
    example = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert nb08.stripe_score(example, 1).tolist() == [9.0]  # (4 + 9 + 14) / 3


def test_08_2_accepts_the_worked_answer_and_a_loop():
    def by_loop(pattern, k):
        t = pattern.shape[-1]
        return torch.stack([pattern[:, :, q, q - k] for q in range(k, t)], -1).mean((0, -1))

    assert grade("08.2", nb08.stripe_score).passed
    assert grade("08.2", by_loop).passed


@pytest.mark.parametrize(("answer", "words"), [
    (lambda p, k: p.diagonal(offset=-k, dim1=-2, dim2=-1).mean(), ["averaged the heads too"]),
    (lambda p, k: p.diagonal(offset=k, dim1=-2, dim2=-1).mean((0, -1)), ["ahead", "offset=-k"]),
    (lambda p, k: p.diagonal(offset=-k, dim1=-2, dim2=-1).sum((0, -1)), ["a sum"]),
    (lambda p, k: p.diagonal(offset=-k, dim1=-2, dim2=-1).sum(-1).mean(0) / p.shape[-2], ["q >= k"]),
    (lambda p, k: p.diagonal(offset=-k, dim1=-2, dim2=-1).mean(-1), ["average over the sequences too"]),
    (lambda p, k: torch.stack([p[:, :, q, q - k] for q in range(k + 1, p.shape[-1])], -1).mean((0, -1)),
     ["one query late", "q = k itself"]),
    (lambda p, k: "0.5", ["return a tensor"]),
    ("stripe_score", ["pass your function itself"]),
    (lambda p, k: torch.diagonal(p, offset=-k).mean((0, -1)), ["default dims", "dim1=-2, dim2=-1"]),
])  # fmt: skip
def test_08_2_rejects(answer, words):
    failed("08.2", answer, *words)


# ----- 08.4 -------------------------------------------------------------------------------------
def forgets_return(value, position):
    """The commonest slip: the hook edits a copy of the output and never returns it."""
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = value[:, position]
    return hook


def sweep_like(*, normalise="right", run="corrupted", remove=True, whole=False, transpose=False, onward=False,
               first_everywhere=False, hook_for=None, swapped=False, both_recorded=False):
    """A patching sweep with one slip; ``hook_for(clean_value, position)``, if given, makes the patch hook."""
    def patching_sweep(model, clean, corrupted, points, metric):
        with record(model, points) as rec, torch.no_grad():
            high = metric(model(corrupted if swapped else clean))
            if both_recorded:  # both ends inside the record block: rec keeps the last run, the corrupted one
                low = metric(model(corrupted))
        with torch.no_grad():
            low = metric(model(clean if swapped else corrupted))
        if swapped:  # the corrupted values recorded, patched into the clean run
            high, low = low, high
        sweep = torch.zeros(len(points), corrupted.shape[1])
        for row, point in enumerate(points):
            for position in range(corrupted.shape[1]):
                value = rec[point].output
                hook = (lambda m, a, o, v=value: v) if whole else nb08.patch_hook(value, position)
                if onward:  # from the position to the end
                    hook = nb08.patch_hook(value, slice(position, None))
                if first_everywhere:  # the first clean sequence's value into every sequence
                    hook = nb08.patch_hook(value[:1].expand_as(value), position)
                if hook_for is not None:
                    hook = hook_for(value, position)
                handle = model.get_submodule(point).register_forward_hook(hook)
                with torch.no_grad():
                    sweep[row, position] = metric(model(clean if run == "clean" or swapped else corrupted))
                if remove:
                    handle.remove()
        sweep = {"right": (sweep - low) / (high - low), "raw": sweep, "upside down": (high - sweep) / (high - low),
                 "by clean": sweep / high}[normalise]
        return sweep.T if transpose else sweep

    return patching_sweep


@pytest.mark.parametrize(("answer", "words"), [
    (sweep_like(remove=False), ["still registered", "finally"]),
    (sweep_like(normalise="raw"), ["raw logit differences", "(patched − corrupted) / (clean − corrupted)"]),
    (sweep_like(normalise="upside down"), ["upside down", "0 is the corrupted run"]),
    (sweep_like(normalise="by clean"), ["the whole range"]),
    (sweep_like(run="clean"), ["patched the clean run", "model(corrupted)"]),
    (sweep_like(whole=True), ["whole output", "output[:, position]"]),
    (sweep_like(hook_for=forgets_return), ["changed nothing", "return the edited copy"]),
    (sweep_like(transpose=True), ["one row per hook point"]),
    (sweep_like(swapped=True), ["direction is swapped", "model(corrupted)"]),
    (sweep_like(both_recorded=True), ["recorded values are the corrupted run's", "only model(clean)"]),
    (sweep_like(onward=True), ["from the position onward", "output[:, position]"]),
    (sweep_like(first_everywhere=True), ["two different runs", "first clean sequence's value", "[:, position]"]),
    ("patching_sweep", ["pass your function itself"]),
])  # fmt: skip
def test_08_4_rejects(answer, words):
    failed("08.4", answer, *words)


def test_08_4_names_a_stub_run_with_hooks_instead_of_saying_not_solved_yet():
    def run_with_hooks(model, tokens, fwd_hooks):  # 08.3 still the stub
        raise NotImplementedError

    def patching_sweep(model, clean, corrupted, points, metric):  # right, but calls the stub
        return run_with_hooks(model, corrupted, [])

    failed("08.4", patching_sweep, "run_with_hooks", "08.3", "stub")


def test_08_4_accepts_the_worked_answer_and_its_map_finds_each_corruption():
    assert grade("08.4", nb08.patching_sweep).passed
    model, (clean, corrupted) = nb08._model(), nb08.clean_and_corrupted()
    first = nb08.patching_sweep(model, clean, corrupted, nb08.POINTS, nb08.logit_diff)
    second = nb08.patching_sweep(model, clean, nb08.second_corruption(), nb08.POINTS, nb08.logit_diff_2)
    attn0 = nb08.POINTS.index("blocks.0.hook_attn_out")
    assert first[attn0].max() < 0.1 and second[attn0, 3] > 0.5  # only the second corruption needs layer 0


# ----- 08.5 -------------------------------------------------------------------------------------
def scores_like(*, sign=1, keep=False, remove=True, where="one", ablated_values=False, returns=True,
                fixed_layer=None, transpose=False, module="hook_z"):
    """The ablation map with one slip."""
    def ablation_scores(model, tokens, layer, metric):
        attn = model.blocks[layer if fixed_layer is None else fixed_layer].attn
        z = attn.hook_z if module == "hook_z" else attn
        with torch.no_grad():
            intact = metric(model(tokens))
        scores, handles = torch.zeros(4, tokens.shape[1]), []
        for head in range(4):
            for position in range(tokens.shape[1]):
                def hook(module, args, output, head=head, position=position):
                    output = output.clone()
                    if where == "one":
                        output[:, position, head] = 0.0
                    elif where == "every position":
                        output[:, :, head] = 0.0
                    elif where == "every head":
                        output[:, position] = 0.0
                    elif where == "batch mean":
                        output[:, position, head] = output[:, position, head].mean(0)
                    else:  # d_head
                        output[:, position, ..., head] = 0.0
                    return output if returns else None

                handles.append(z.register_forward_hook(hook))
                with torch.no_grad():
                    after = metric(model(tokens))
                scores[head, position] = after if ablated_values else sign * (intact - after)
                if not keep and remove:
                    handles.pop().remove()
        if keep:
            for handle in handles:
                handle.remove()
        return scores.T if transpose else scores

    return ablation_scores


@pytest.mark.parametrize(("answer", "words"), [
    (scores_like(sign=-1), ["signs are reversed", "metric(intact) − metric(ablated)"]),
    (scores_like(keep=True), ["still ablated", "handle.remove()"]),
    (scores_like(remove=False), ["still registered", "finally"]),
    (scores_like(where="every position"), ["every position at once", "output[:, position, head]"]),
    (scores_like(where="every head"), ["every head at that position", "output[:, position, head]"]),
    (scores_like(where="d_head"), ["last axis (d_head)", "output[:, position, head]"]),
    (scores_like(returns=False), ["changed nothing", "return the edited copy"]),
    (scores_like(ablated_values=True), ["ablated runs' values", "drop"]),
    (scores_like(fixed_layer=1), ["layer 0", "layer 1's heads, not layer 0's", "model.blocks[layer]"]),
    (scores_like(transpose=True), ["swapped", "(heads, positions)"]),
    (scores_like(where="batch mean"), ["mean over the batch", "zero ablation", "output[:, position, head] = 0"]),
    (scores_like(module="attn"), ["your hook is on 'blocks.1.attn'", "shape (1, 16, 64), (N, position, d_model)",
                                  "already mixed", "not one head", "blocks.1.attn.hook_z",
                                  "(N, position, head, d_head)"]),
])  # fmt: skip
def test_08_5_rejects(answer, words):
    failed("08.5", answer, *words)


def test_08_5_accepts_the_worked_answer_and_nested_lists_and_its_map_reads_as_the_lesson_says():
    assert grade("08.5", nb08.ablation_scores).passed
    assert grade("08.5", lambda *args: nb08.ablation_scores(*args).tolist()).passed
    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    layer_1 = nb08.ablation_scores(model, clean, 1, nb08.logit_diff)
    assert layer_1[:, :nb08.Q].abs().max() < 1e-4 and layer_1[:, nb08.Q + 1:].abs().max() < 1e-4  # the query only
    assert torch.allclose(layer_1[:, nb08.Q], nb08.head_scores(model, clean, 1, nb08.logit_diff), atol=1e-4)


# ----- 08.6 -------------------------------------------------------------------------------------
HELD = []


def hold_in_a_global(value):  # every hook returns the last value given
    HELD[:] = [value]
    return lambda module, args, output: HELD[0]


@pytest.mark.parametrize(("answer", "words"), [
    (lambda value: (lambda module, args, output: None), ["corrupted run's own", "return the value"]),
    (lambda value: (lambda module, args, output: output), ["corrupted run's own", "return the value"]),
    (lambda value: (lambda module, args, output: output + value), ["logit difference", "in place of the output"]),
    (hold_in_a_global, ["last call", "its own"]),
    (lambda value: value, ["returned Tensor", "forward hook"]),
    (lambda value: (lambda module, args, output: value[5]), ["raised IndexError"]),
    ("hold_output", ["function itself"]),
])  # fmt: skip
def test_08_6_names_each_slip(answer, words):
    failed("08.6", answer, *words)


def test_08_6_accepts_the_worked_answer_and_with_the_scale_helper_gives_the_lesson_s_rows():
    assert grade("08.6", nb08.hold_output).passed
    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    mlp = nb08.clean_cache_of(model, clean, ["blocks.1.mlp"])["blocks.1.mlp"]
    for hold_mlp in (False, True):
        hooks = [(model.ln_final, nb08.hold_ln_scale(model, clean))]
        hooks += [(model.blocks[1].mlp, nb08.hold_output(mlp))] if hold_mlp else []
        handles = [m.register_forward_hook(h) for m, h in hooks]
        try:
            singles = nb08.ablation_scores(model, clean, 1, nb08.logit_diff)[:, nb08.Q]
        finally:
            for handle in handles:
                handle.remove()
        assert torch.allclose(singles, nb08.held_drops(hold_mlp)[0], atol=1e-5)


# ----- 08.7 -------------------------------------------------------------------------------------
def resample_with(**kwargs):
    return lambda model, tokens, source, layer, heads, position: nb08._resample_variant(
        model, tokens, source, layer, heads, position, **kwargs)


def from_tokens(model, tokens, source, layer, heads, position):  # resampled from the same sequence
    return nb08.resample_ablation(model, tokens, tokens, layer, heads, position)


def leaves_hook(model, tokens, source, layer, heads, position):
    model.blocks[layer].attn.hook_z.register_forward_hook(lambda module, args, output: None)
    return model(tokens)


@pytest.mark.parametrize(("answer", "words"), [
    (from_tokens, ["nothing was replaced", "run on `source`"]),
    (resample_with(fill="zero"), ["zeros", "zero ablation"]),
    (resample_with(fill="swapped"), ["you ran `source`"]),
    (resample_with(where="every"), ["every position", "`position` only"]),
    (resample_with(which="all"), ["every head", "`heads`"]),
    (lambda model, tokens, source, layer, heads, position: nb08.resample_ablation(
        model, tokens, source, 1 - layer, heads, position), ["layer 1's heads, not layer 0's"]),
    (leaves_hook, ["still registered", "blocks.0.attn.hook_z"]),
    (lambda model, tokens, source, layer, heads, position: None, ["returned None"]),
    ("resample_ablation", ["function itself"]),
])
def test_08_7_names_each_slip(answer, words):
    failed("08.7", answer, *words)


def test_08_7_accepts_the_worked_answer_and_resampling_moves_layer_1_to_key_4():
    assert grade("08.7", nb08.resample_ablation).passed
    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    logits = nb08.resample_ablation(model, clean, nb08.with_20_at_2(), 0, [0, 1, 2, 3], nb08.CHANGED)
    assert logits[0, nb08.Q].argmax().item() == 8  # the token at key 4


# ----- 08.8 -------------------------------------------------------------------------------------
def adds_everywhere(direction, position, scale):
    return lambda module, args, output: output + scale * direction


def replaces(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = scale * direction
        return output

    return hook


def adds_onward(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        output[:, position:] += scale * direction
        return output

    return hook


def adds_normalised(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        output[:, position] += scale * direction / direction.norm()
        return output

    return hook


def adds_in_place(direction, position, scale):
    def hook(module, args, output):
        output[:, position] += scale * direction

    return hook


def indexes_the_batch(direction, position, scale):
    def hook(module, args, output):
        output[position] += scale * direction

    return hook


def adds_in_place_returned(direction, position, scale):
    def hook(module, args, output):
        output[:, position] += scale * direction
        return output

    return hook


@pytest.mark.parametrize(("answer", "words"), [
    (adds_everywhere, ["every position"]), (replaces, ["output + scale * direction"]),
    (adds_onward, ["from the position onward"]),
    (indexes_the_batch, ["IndexError", "index output[:, position]"]),
    (adds_normalised, ["normalised", "scale × direction", "without"]),
])  # fmt: skip
def test_08_8_rejects(answer, words):
    failed("08.8", answer, *words)


def copies_for_negative_scales(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        if scale > 0:
            output[:, position] += scale * direction
        return output

    return hook


def test_08_8_an_unchanged_copy_is_not_called_none():
    outcome = failed("08.8", copies_for_negative_scales, "scale -1.0", "unchanged", "a negative scale too")
    assert "None" not in outcome.detail


def test_08_8_accepts_the_worked_answer():
    assert grade("08.8", nb08.steering_hook).passed


def test_the_measured_facts_the_lesson_states_about_the_heads_and_steering():
    """Each layer-1 head alone costs under 2 of the logit difference and leaves 19; all four zeroed change the
    answer; layer 1's MLP output at the query alone restores part of it; the steered run at scale 4 answers
    neither 19 nor 17."""
    model = nb08._model()
    clean = nb08.clean_and_corrupted()[0]
    assert nb08.head_scores(model, clean, 1, nb08.logit_diff).max() < 2
    assert nb08.ablation_scores(model, clean, 0, nb08.logit_diff).abs().max() < 0.5
    zeroed = nb08.run_hooked(model, clean, "blocks.1.attn.hook_z", lambda m, a, o: torch.zeros_like(o))
    assert zeroed[0, nb08.Q].argmax().item() != nb08.A
    cache = nb08.clean_cache(model)
    assert -3 < nb08.patched_diff(model, "blocks.1.hook_mlp_out", nb08.Q, cache) < 0
    resid0 = nb08.clean_cache(model, ["blocks.0.hook_resid_post"])["blocks.0.hook_resid_post"]
    both = nb08.run_hooked(model, nb08.clean_and_corrupted()[1], "blocks.0.hook_resid_post",
                           lambda m, a, o: torch.where(torch.isin(torch.arange(16), torch.tensor([3, 9]))[:, None],
                                                       resid0, o))
    assert abs(nb08.logit_diff(both) - nb08.logit_diff(model(clean).detach())) < 0.1  # 3 and 9 together: 1.00
    direction = nb08.steering_direction(model)
    embedding = model.embed.weight[nb08.A] - model.embed.weight[nb08.B]
    assert torch.cosine_similarity(direction, embedding, 0) > 0.85  # mostly the token-embedding difference
    fair = torch.tensor([[4, 9, 3, 17, 11, 0, 15, 4, 9, 3, 19, 11, 0, 15, 7, 21]])
    moved = nb08.run_hooked(model, fair, "blocks.0.hook_resid_post", nb08.steering_hook(direction, 3, 1))
    assert nb08.logit_diff(model(fair).detach()) < -5 and moved[0, nb08.Q].argmax().item() == nb08.A
    clean_z = nb08.clean_cache(model, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"]
    corrupted = nb08.clean_and_corrupted()[1]

    def patch_heads(heads):
        def hook(module, args, output):
            output = output.clone()
            output[:, nb08.Q, heads] = clean_z[:, nb08.Q, heads]
            return output
        return hook

    one = [nb08.logit_diff(nb08.run_hooked(model, corrupted, "blocks.1.attn.hook_z", patch_heads([h])))
           for h in range(4)]
    four = nb08.run_hooked(model, corrupted, "blocks.1.attn.hook_z", patch_heads([0, 1, 2, 3]))
    assert max(one) < -4 and four[0, nb08.Q].argmax().item() == nb08.A  # one head alone: under 0.3 of the way
    hook = nb08.steering_hook(direction, nb08.CHANGED, 4)
    steered = nb08.run_hooked(model, nb08.clean_and_corrupted()[1], "blocks.0.hook_resid_post", hook)
    assert steered[0, nb08.Q].argmax().item() not in (nb08.A, nb08.B) and nb08.logit_diff(steered) > 5


# ----- in-place and first-sequence-only edits, on a batch of two ----------------------------------
def sweep_with(edit):
    """The worked sweep, with ``edit(output, clean_value, position)`` as the patch hook's body."""
    return sweep_like(hook_for=lambda value, position: lambda m, a, o: edit(o, value, position))


def in_place_first(output, value, position):
    output[0, position] = value[0, position]


def copy_first(output, value, position):
    output = output.clone()
    output[0, position] = value[0, position]
    return output


def scores_with(edit, as_list=False):
    """The worked map, with ``edit(output, head, position)`` as the ablation hook's body."""
    def ablation_scores(model, tokens, layer, metric):
        z = model.blocks[layer].attn.hook_z
        with torch.no_grad():
            intact = metric(model(tokens))
        scores = []
        for head in range(4):
            row = []
            for position in range(tokens.shape[1]):
                handle = z.register_forward_hook(lambda m, a, o, h=head, p=position: edit(o, h, p))
                try:
                    with torch.no_grad():
                        row.append(intact - metric(model(tokens)))
                finally:
                    handle.remove()
            scores.append(row)
        return scores if as_list else torch.tensor(scores)

    return ablation_scores


def zero_in_place_first(output, head, position):
    output[0, position, head] = 0.0


def zero_copy_first(output, head, position):
    output = output.clone()
    output[0, position, head] = 0.0
    return output


def steer_copy_first(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        output[0, position] += scale * direction
        return output

    return hook


@pytest.mark.parametrize(("id", "answer", "words"), [
    ("08.4", sweep_with(in_place_first), ["only the first sequence"]),
    ("08.4", sweep_with(copy_first), ["two different runs in one batch", "only the first sequence", "output[:, ...]"]),
    ("08.5", scores_with(zero_in_place_first), ["only the first sequence"]),
    ("08.5", scores_with(zero_copy_first), ["a batch of two", "only the first sequence"]),
    ("08.8", steer_copy_first, ["only the first sequence", "output[:, ...]"]),
])  # fmt: skip
def test_first_sequence_only_edits_are_rejected(id, answer, words):
    failed(id, answer, *words)


def in_place_all(output, value, position):
    output[:, position] = value[:, position]


def zero_in_place_all(output, head, position):
    output[:, position, head] = 0.0


@pytest.mark.parametrize(("id", "answer"), [
    ("08.4", sweep_with(in_place_all)), ("08.5", scores_with(zero_in_place_all)), ("08.8", adds_in_place_returned),
    ("08.8", adds_in_place),
])  # fmt: skip
def test_a_right_in_place_edit_passes_with_a_note(id, answer):
    outcome = grade(id, answer)
    assert outcome.passed, outcome.detail
    assert "A note, not a slip" in outcome.detail and "output.clone()" in outcome.detail


def test_the_ablation_note_speaks_of_its_own_run_only():
    """An ablation patches in no values from another run: its in-place note does not say it does."""
    detail = grade("08.5", scores_with(zero_in_place_all)).detail
    assert "A note, not a slip" in detail and "another run" not in detail and "clean values" not in detail


def test_a_right_copy_passes_without_the_note():
    assert "A note" not in grade("08.4", sweep_with(lambda o, v, p: torch.where(
        torch.arange(o.shape[1])[:, None] == p, v, o))).detail


def test_the_pair_metric_reads_both_sequences():
    model = nb08._model()
    with torch.no_grad():
        logits = model(nb08.induction_pair())
    assert logits[1, nb08.Q].argmax().item() == 14
    assert nb08.pair_metric(logits) > nb08.logit_diff(logits) + 5


def test_the_measured_facts_the_lesson_states_about_matching_the_batch_and_the_norms():
    """A match wins (query 8: key 5, answer 14); with none, position (query 22: key 3, answer 19); without the
    run's 3, key 2 and the 10. Over 500 sequences one zeroed head keeps accuracy ≥ 0.993, all four of layer 1
    do not. Twice the steering direction is longer than any residual after layer 0."""
    from hooklab.transformer import induction_batch, induction_mask

    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]

    def answer_and_keys(tokens):
        with torch.no_grad():
            predicted = model(tokens)[0, nb08.Q].argmax().item()
        return predicted, nb08.record_patterns(model, tokens)[1][0, :, nb08.Q].argmax(-1).tolist()

    for position, token, answer, key, heads in [(9, 8, 14, 5, 3), (9, 22, 19, 3, 4), (2, 10, 10, 2, 3)]:
        tokens = clean.clone()
        tokens[0, position] = token
        predicted, keys = answer_and_keys(tokens)
        assert predicted == answer and keys.count(key) >= heads, (token, predicted, keys)
    batch = induction_batch(500, torch.Generator().manual_seed(2))
    mask = induction_mask(batch)

    def accuracy(logits):
        return (logits[:, :-1].argmax(-1) == batch[:, 1:])[mask].float().mean().item()

    for layer in (0, 1):
        assert (1 - nb08.head_scores(model, batch, layer, accuracy)).min() >= 0.993
    zeroed = nb08.run_hooked(model, batch, "blocks.1.attn.hook_z", lambda m, a, o: torch.zeros_like(o))
    assert accuracy(zeroed) < 0.4
    with record(model, ["blocks.0.hook_resid_post"]) as rec, torch.no_grad():
        model(induction_batch(500, torch.Generator().manual_seed(1)))
    assert 2 * nb08.steering_direction(model).norm() > rec["blocks.0.hook_resid_post"].output.norm(dim=-1).max()
    no_3 = nb08.clean_and_corrupted()[0].clone()
    no_3[0, 2] = 10  # no earlier 3: the model answers 10
    patched = nb08.run_hooked(model, no_3, "blocks.0.hook_resid_post",
                              nb08.patch_hook(nb08.clean_cache(model)["blocks.0.hook_resid_post"], 2))
    assert patched[0, nb08.Q].argmax().item() == 8 and (patched[0, nb08.Q, nb08.A] - patched[0, nb08.Q, 10]) > 0


def test_the_positional_prior_and_the_one_position_whose_difference_matters():
    """Every token absent from the run, as the query, sends layer 1's heads to keys 1-4 and is answered with
    the token at key 1, 2 or 3; after layer 0 the runs differ at position 4 as much as at 3, but patching 4
    restores nothing."""
    model, (clean, corrupted) = nb08._model(), nb08.clean_and_corrupted()
    for token in sorted(set(range(1, 24)) - set(nb08.RUN)):  # the task draws tokens 1-23
        tokens = clean.clone()
        tokens[0, nb08.Q] = token
        with torch.no_grad():
            assert model(tokens)[0, nb08.Q].argmax().item() in nb08.RUN[1:4], token
        assert set(nb08.record_patterns(model, tokens)[1][0, :, nb08.Q].argmax(-1).tolist()) <= {1, 2, 3, 4}
    after = {name: nb08.clean_cache_of(model, tokens, ["blocks.0.hook_resid_post"])["blocks.0.hook_resid_post"]
             for name, tokens in (("clean", clean), ("corrupted", corrupted))}
    norms = (after["clean"] - after["corrupted"])[0].norm(dim=-1)
    assert norms[4] > norms[3] > 7 and norms[:3].max() < 1e-5
    low = nb08.logit_diff(model(corrupted).detach())
    assert abs(nb08.patched_diff(model, "blocks.0.hook_resid_post", 4) - low) < 0.1


def test_each_hook_point_knows_its_name_and_block():
    from hooklab.transformer import HookPoint

    model = nb08._model()
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            assert module.name == name
    assert model.blocks[1].attn.hook_z.layer() == 1 and model.blocks[0].hook_resid_post.layer() == 0
    with pytest.raises(ValueError, match="not inside a block"):
        model.hook_embed.layer()


def test_the_steering_direction_transfers_to_other_runs_and_frozen_mlp_and_layernorm_make_drops_add():
    model = nb08._model()
    others = nb08.runs_with_17_at_3()
    direction = nb08.steering_direction(model)
    said = [nb08.run_hooked(model, others, "blocks.0.hook_resid_post",
                            nb08.steering_hook(direction, nb08.CHANGED, s))[:, nb08.Q].argmax(-1) for s in (0, 1)]
    assert (said[0] == nb08.A).float().mean() == 0 and (said[1] == nb08.A).float().mean() > 0.9
    assert len(others) > 200 and (others[:, 3] == nb08.B).all() and (others[:, 10] == nb08.B).all()


def test_with_layer_1s_mlp_and_the_final_layernorm_scale_frozen_head_drops_add_and_equal_direct_attribution():
    model = nb08._model()
    clean = nb08.clean_and_corrupted()[0]
    points = ["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post", "blocks.1.attn.hook_z"]
    with record(model, points) as rec, torch.no_grad():
        intact = nb08.logit_diff(model(clean))
    resid, z = rec["blocks.1.hook_resid_post"].output, rec["blocks.1.attn.hook_z"].output
    sd = (resid.var(-1, unbiased=False, keepdim=True) + model.ln_final.eps).sqrt()
    frozen = [("blocks.1.hook_mlp_out", lambda m, a, o: rec["blocks.1.hook_mlp_out"].output),
              ("ln_final", lambda m, a, o: (a[0] - a[0].mean(-1, keepdim=True)) / sd * m.weight + m.bias)]

    def drop(heads, hooks):
        zero = ("blocks.1.attn.hook_z", lambda m, a, o: o.index_fill(2, torch.tensor(heads), 0.0))
        with contextlib.ExitStack() as stack, torch.no_grad():
            for point, hook in [zero, *hooks]:
                stack.enter_context(model.get_submodule(point).register_forward_hook(hook))
            return intact - nb08.logit_diff(model(clean))

    singles = [drop([h], frozen) for h in range(4)]
    assert abs(sum(singles) - drop([0, 1, 2, 3], frozen)) < 1e-3  # they add
    assert abs(sum(drop([h], []) for h in range(4)) - drop([0, 1, 2, 3], [])) > 5  # unfrozen, they do not
    w_o, u = model.blocks[1].attn.out.weight, model.unembed.weight[nb08.A] - model.unembed.weight[nb08.B]
    d = z.shape[-1]
    for h, single in enumerate(singles):  # each is the head's direct logit attribution at the query
        c = w_o[:, h * d:(h + 1) * d] @ z[0, nb08.Q, h]
        assert abs(((c - c.mean()) / sd[0, nb08.Q, 0] * model.ln_final.weight) @ u - single) < 1e-3


def test_layer_0_attends_7_back_by_position_and_layer_1_falls_back_on_key_2_without_a_match():
    """Layer 0's stripe at k = 7 is there for runs of 5 as for runs of 7; from the query, its head 1 puts the
    same weight on key 2 whether key 2 holds the query's token or not; with no key recording the query's
    token before it, layer 1's heads attend key 2 and the model says the token there."""
    from hooklab.transformer import induction_batch, induction_mask

    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    tokens = induction_batch(1000, torch.Generator().manual_seed(0))
    length = induction_mask(tokens).float().argmax(1)
    for run in (5, 7):
        layer_0 = nb08.record_patterns(model, tokens[length == run])[0]
        scores = [nb08.stripe_score(layer_0, k).mean().item() for k in range(9)]
        assert max(range(2, 9), key=scores.__getitem__) == 7, run
    no_copy = clean.clone()
    no_copy[0, nb08.Q] = 20
    no_3 = clean.clone()
    no_3[0, 2] = 10
    for tokens, keys, said in [(clean, [3, 3, 3, 3], 19), (no_3, [2, 2, 2, 4], 10),
                               (no_copy, [2, 2, 2, 2], 3)]:
        layer_0, layer_1 = nb08.record_patterns(model, tokens)
        assert 0.385 <= layer_0[0, 1, nb08.Q, 2].item() < 0.405
        assert layer_1[0, :, nb08.Q].argmax(-1).tolist() == keys
        with torch.no_grad():
            assert model(tokens)[0, nb08.Q].argmax().item() == said


def test_the_steering_direction_is_mostly_a_token_swap_whose_rest_steers_nothing():
    """Cosine 0.88 with embedding(19) − embedding(17); that difference alone turns nearly every other run to 19,
    and the direction without it turns none."""
    model = nb08._model()
    direction = nb08.steering_direction(model)
    swap = model.embed.weight[nb08.A] - model.embed.weight[nb08.B]
    assert 0.87 < torch.cosine_similarity(direction, swap, 0).item() < 0.89
    rest = direction - (direction @ swap) / (swap @ swap) * swap
    others = nb08.runs_with_17_at_3()

    def share_19(added):
        hook = nb08.steering_hook(added.detach(), nb08.CHANGED, 1)
        said = nb08.run_hooked(model, others, "blocks.0.hook_resid_post", hook)[:, nb08.Q].argmax(-1)
        return (said == nb08.A).float().mean().item()

    assert share_19(swap) > 0.95 and share_19(rest) < 0.01


def test_the_third_corruption_answers_14_and_a_patch_after_the_heads_changes_the_answer_not_the_pattern():
    model, third = nb08._model(), nb08.third_corruption()
    with torch.no_grad():
        assert model(third)[0, nb08.Q].argmax().item() == nb08.B3
    assert nb08.layer_1_key(third) == 5 and nb08.third_patched() == (nb08.A, 5)


def test_the_lesson_does_not_ask_for_a_copy_where_the_checker_accepts_an_in_place_edit():
    """08.4, 08.5 and 08.8 accept a right in-place edit with a note: their instructions (before the hints) ask for
    the edited output, not for a copy."""
    import json
    from pathlib import Path

    lesson = Path(__file__).parents[1] / "notebooks" / "08_transformer_interpretability.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(lesson.read_text())["cells"] if c["cell_type"] == "markdown"]
    for id in ("08.4", "08.5", "08.8"):
        (text,) = [c for c in cells if f"### Exercise {id}" in c]
        assert "copy" not in text.split(f"### Exercise {id}")[1].split("<details>")[0], id


@pytest.mark.parametrize("guess", ["all", "All", " 'all' "])
def test_08_f_takes_its_choice_in_any_case(guess):
    assert grade("08.e", guess).passed


@pytest.mark.parametrize(("count", "words"), [(0, "none"), (1, "some"), (93, "some"), (94, "about half"),
                                              (139, "about half"), (140, "some"), (232, "some"), (233, "all")])
def test_08_f_words_a_count(count, words):
    assert nb08.how_many(count, 233) == words


def test_the_steered_runs_switch_together_between_scale_half_and_three_quarters():
    """08.e's reveal: none of the 233 runs predicts 19 at scale 0.5 but one, all at 0.75 and 1; at 4, fewer."""
    counts = {s: int((nb08.steered_others(s) == nb08.A).sum()) for s in (0.5, 0.75, 1, 4)}
    assert counts[0.5] == 1 and counts[0.75] == counts[1] == 233 and counts[4] < 200
    for scale, mean, spread in [(0, -10.72, 0.27), (0.25, -7.66, 0.45), (0.5, -2.13, 0.79), (0.75, 4.03, 0.99)]:
        diff = nb08._steered_logits(scale)
        assert abs(diff.mean() - mean) < 0.005 and abs(diff.std() - spread) < 0.005
    push = nb08._steered_logits(0.75) - nb08._steered_logits(0)  # 08.e's why: the push differs from run to run
    assert 12.1 < push.min() < 12.2 and 16.9 < push.max() < 17 and 0.9 < push.std() < 1
    said, others = nb08.steered_others(4), nb08.runs_with_17_at_3()
    assert int((said == nb08.A).sum()) == 107 and int((said == others[:, 4]).sum()) == 49  # the rest scatter


def test_08_key_4_is_not_drawn_by_a_second_3_before_me_record():
    """Section 3's open question: with position 2's 3 made a 20, resampling layer 0's heads at 3 still leaves
    0.50 of layer 1's attention on key 4; and zeroing all four keeps the 19, with 0.21-0.54 on key 3."""
    model, sources = nb08._model(), nb08.random_runs(100)
    tokens = nb08.with_20_at_2().expand(len(sources), -1)
    with record(model, ["blocks.1.attn.hook_pattern"]) as rec:
        nb08.resample_ablation(model, tokens, sources, 0, [0, 1, 2, 3], 3)
    assert abs(rec["blocks.1.attn.hook_pattern"].output[:, :, nb08.Q, 4].mean() - 0.50) < 0.005
    diff, said, (key_3, _) = nb08.layer_0_at_3()
    assert abs(diff - 10.79) < 0.005 and said == nb08.A
    assert round(min(key_3), 2) == 0.21 and round(max(key_3), 2) == 0.54


def test_08_zeroing_layer_1_at_the_query_loses_the_19():
    model, clean = nb08._model(), nb08.clean_and_corrupted()[0]
    zeroed = nb08.run_hooked(model, clean, "blocks.1.attn.hook_z",
                             lambda m, a, o: o.index_fill(1, torch.tensor([nb08.Q]), 0.0))[0, nb08.Q]
    assert zeroed.argmax().item() == 23 and abs(zeroed[nb08.A] - 1.13) < 0.005
