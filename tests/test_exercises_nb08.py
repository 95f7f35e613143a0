"""Checkers of notebook 08: each accepts a worked answer and rejects the plausible wrong ones with a
message naming the slip; each prediction computes what the lesson shows; the lesson's measured facts
about the model hold."""

from __future__ import annotations

import pytest
import torch
from answers import failed

from hooklab.exercises import exercises, grade, nb08

IDS = sorted(id for id in exercises() if id.startswith("08."))


def test_notebook_08_has_four_predictions_and_four_exercises():
    assert IDS == ["08.1", "08.2", "08.3", "08.4", "08.a", "08.b", "08.c", "08.d"]


# ----- predictions ------------------------------------------------------------------------------
@pytest.mark.parametrize(("id", "truth"), [("08.a", 3), ("08.b", 9), ("08.c", 4), ("08.d", 0.75)])
def test_each_prediction_computes_what_the_lesson_shows(id, truth):
    assert grade(id, truth).passed
    assert exercises()[id].checker.__wrapped__.truth() == truth


@pytest.mark.parametrize(("id", "guess", "hint"), [
    ("08.a", 2, "position after it"), ("08.a", 8, "layer 0's job"), ("08.b", 3, "moved it to the query"),
    ("08.c", 0, "leaves three"), ("08.d", 0.5, "just below zero"), ("08.d", 1, "sign turns earlier"),
])  # fmt: skip
def test_wrong_guesses_get_their_hint(id, guess, hint):
    failed(id, guess, hint)


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


def keeps_the_graph(model, tokens):
    patterns, handles = [], [b.attn.hook_pattern.register_forward_hook(lambda m, a, o: patterns.append(o))
                             for b in model.blocks]
    model(tokens)
    for handle in handles:
        handle.remove()
    return patterns


def last_layer_only(model, tokens):
    return nb08.record_patterns(model, tokens)[-1:]


@pytest.mark.parametrize(("answer", "words"), [
    (leaves_hooks, ["still registered", "finally"]), (keeps_the_graph, ["requires grad", "detach"]),
    (last_layer_only, ["1 patterns", "each block"]), ("record_patterns", ["pass your function itself"]),
])  # fmt: skip
def test_08_1_rejects(answer, words):
    failed("08.1", answer, *words)


def test_08_1_accepts_the_worked_answer():
    assert grade("08.1", nb08.record_patterns).passed


# ----- 08.2 -------------------------------------------------------------------------------------
def patches_every_position(clean_value, position):
    return lambda module, args, output: clean_value


def forgets_to_return(clean_value, position):
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = clean_value[:, position]

    return hook


def returns_the_hook_call(clean_value, position):
    return None


@pytest.mark.parametrize(("answer", "words"), [
    (patches_every_position, ["changed positions", "not only position 5"]),
    (forgets_to_return, ["unchanged", "returning the new value"]),
    (returns_the_hook_call, ["returned None", "return the hook function"]),
])  # fmt: skip
def test_08_2_rejects(answer, words):
    failed("08.2", answer, *words)


def patches_in_place(clean_value, position):
    def hook(module, args, output):
        output[:, position] = clean_value[:, position]

    return hook


def patches_in_place_and_returns(clean_value, position):
    def hook(module, args, output):
        output[:, position] = clean_value[:, position]
        return output

    return hook


@pytest.mark.parametrize("answer", [patches_in_place, patches_in_place_and_returns])
def test_08_2_rejects_an_in_place_edit_and_says_why(answer):
    failed("08.2", answer, "in place", "output.clone()", "a cache recorded from the same run")


def patches_only_the_first_item(clean_value, position):
    def hook(module, args, output):
        output = output.clone()
        output[0, position] = clean_value[0, position]
        return output

    return hook


def test_08_2_rejects_patching_only_batch_item_0():
    failed("08.2", patches_only_the_first_item, "batch of 2", "only the first sequence", "output[:, position]")


def test_08_2_accepts_the_worked_answer():
    assert grade("08.2", nb08.patch_hook).passed


# ----- 08.3 -------------------------------------------------------------------------------------
def ablates_a_position(head, mean=None):
    def hook(module, args, output):
        output = output.clone()
        output[:, head] = 0.0 if mean is None else mean[head]
        return output

    return hook


def ignores_the_mean(head, mean=None):
    return nb08.ablation_hook(head)


@pytest.mark.parametrize(("answer", "words"), [
    (ablates_a_position, ["zeroed positions", "output[:, :, head]"]),
    (ignores_the_mean, ["mean-ablating head 0", "want"]),
])  # fmt: skip
def test_08_3_rejects(answer, words):
    failed("08.3", answer, *words)


def test_08_3_accepts_the_worked_answer():
    assert grade("08.3", nb08.ablation_hook).passed


# ----- 08.4 -------------------------------------------------------------------------------------
def adds_everywhere(direction, position, scale):
    return lambda module, args, output: output + scale * direction


def replaces(direction, position, scale):
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = scale * direction
        return output

    return hook


def adds_in_place(direction, position, scale):
    def hook(module, args, output):
        output[:, position] += scale * direction

    return hook


@pytest.mark.parametrize(("answer", "words"), [
    (adds_everywhere, ["every position"]), (replaces, ["output + scale * direction"]),
    (adds_in_place, ["in place", "output.clone()"]),
])  # fmt: skip
def test_08_4_rejects(answer, words):
    failed("08.4", answer, *words)


def test_08_4_accepts_the_worked_answer():
    assert grade("08.4", nb08.steering_hook).passed


def test_the_measured_facts_the_lesson_states_about_layer_0_and_the_mlps():
    """Zeroing layer 0's heads halves induction accuracy; layer 1's MLP output at the query carries part of the
    difference; the steered run at scale 4 answers neither 19 nor 17."""
    from hooklab.transformer import induction_batch, induction_mask

    model = nb08._model()
    tokens = induction_batch(1000, torch.Generator().manual_seed(2))
    mask = induction_mask(tokens)
    logits = nb08.run_hooked(model, tokens, "blocks.0.attn.hook_z",
                             lambda m, a, o: torch.zeros_like(o))
    assert 0.4 < (logits[:, :-1].argmax(-1) == tokens[:, 1:])[mask].float().mean().item() < 0.6
    cache = nb08.clean_cache(model)
    assert -3 < nb08.patched_diff(model, "blocks.1.hook_mlp_out", nb08.Q, cache) < 0
    hook = nb08.steering_hook(nb08.steering_direction(model), nb08.CHANGED, 4)
    steered = nb08.run_hooked(model, nb08.clean_and_corrupted()[1], "blocks.0.hook_resid_post", hook)
    assert steered[0, nb08.Q].argmax().item() not in (nb08.A, nb08.B) and nb08.logit_diff(steered) > 5
