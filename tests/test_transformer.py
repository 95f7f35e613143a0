"""The small transformer of lesson 08, its hook points, and the script that trained its shipped weights."""

from __future__ import annotations

import pytest
import torch
from train_transformer import held_out_tokens, train  # tools/

from hooklab.transformer import (
    HALF,
    HookPoint,
    TinyTransformer,
    induction_accuracy,
    induction_batch,
    trained_transformer,
)


def test_shipped_weights_solve_the_induction_task():
    model = trained_transformer()
    assert not model.training
    assert induction_accuracy(model, held_out_tokens()) > 0.99


def test_the_training_script_still_trains_as_well_as_what_ships():
    """Retraining on another CPU need not give the same bits, but must solve the task as well."""
    retrained = train()
    shipped = induction_accuracy(trained_transformer(), held_out_tokens())
    assert induction_accuracy(retrained, held_out_tokens()) >= shipped - 0.01


def test_every_value_passes_through_a_hook_point_and_patching_the_last_residual_restores_the_logits():
    model = trained_transformer()
    clean, corrupt = induction_batch(4), induction_batch(4, torch.Generator().manual_seed(5))
    names = [name for name, m in model.named_modules() if isinstance(m, HookPoint)]
    assert "blocks.1.hook_resid_post" in names and "blocks.0.attn.hook_pattern" in names
    kept = {}
    last = model.blocks[-1].hook_resid_post
    with last.register_forward_hook(lambda m, args, out: kept.update(out=out)):
        want = model(clean)
    with last.register_forward_hook(lambda m, args, out: kept["out"]):
        got = model(corrupt)
    assert torch.equal(got, want)


def test_an_attention_pattern_is_causal_and_sums_to_one():
    model, seen = trained_transformer(), {}
    with model.blocks[0].attn.hook_pattern.register_forward_hook(lambda m, args, out: seen.update(p=out)):
        model(induction_batch(2))
    pattern = seen["p"]
    assert pattern.shape == (2, 4, 2 * HALF, 2 * HALF)
    assert torch.allclose(pattern.sum(-1), torch.ones(2, 4, 2 * HALF))
    assert pattern.triu(1).abs().max() == 0


@pytest.mark.parametrize(("tokens", "words"), [
    (torch.zeros(2, 3), "int64"), (torch.zeros(3, dtype=torch.long), "(N, T)"),
    (torch.zeros(1, 2 * HALF + 1, dtype=torch.long), "at most"),
])  # fmt: skip
def test_bad_tokens_are_named(tokens, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TinyTransformer()(tokens)
