"""Exercises and predictions of notebook 08: hooks for interpretability on a small transformer.

The lesson's problem is one pair of runs of ``hooklab.transformer.trained_transformer()``: a clean
sequence (a run of seven tokens, repeated, then two random ones) whose query position ``Q`` predicts
``A`` = 19, and a corrupted copy with the 19 of the first run (position ``CHANGED``) replaced by ``B`` =
17, which predicts 17. ``logit_diff`` is logit[A] − logit[B] at the query. Predictions 08.a-08.e compute
their truth with torch. ``second_corruption()`` swaps positions 0 and ``CHANGED2`` = 2 instead, moving the
earlier 3 to position 0: the model then answers the 12 after it, ``B2``, as the induction mechanism predicts,
and patching layer 0's output finds where its previous-token records sit (08.b). Exercises:
record the attention patterns with forward hooks (08.1), the stripe score of a pattern (08.2),
TransformerLens's ``run_with_hooks`` by name (08.3),
the patching sweep over hook points × positions, normalised (08.4), the drop when one head is zeroed at
one position, for every head and position (08.5), a hook that holds a module's output at its value in
another run (08.6), resample ablation: heads' values from a run on other
tokens (08.7), and a hook that adds a steering direction (08.8).
``record_patterns``, ``run_with_hooks``, ``patching_sweep``, ``patch_hook``, ``ablation_scores``,
``hold_output``, ``resample_ablation`` and ``steering_hook`` are worked answers: the lesson goes
on with them while the student's own has not passed, as is ``stripe_score``.
"""

from __future__ import annotations

import functools
import traceback
import weakref

import torch
from torch import nn

from . import Outcome, exercise, kind_of, prediction

RUN = [5, 12, 3, 19, 8, 14, 2]
Q, A, B, CHANGED = 9, 19, 17, 3  # the query position, the clean answer, the corrupted one, the changed position
B2, CHANGED2 = 12, 2  # the second corruption: positions 0 and 2 swap, so the earlier 3 sits at 0, before a 12
POINTS = ["hook_embed", "blocks.0.hook_attn_out", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post",
          "blocks.1.hook_attn_out", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]


def _model():
    from ..transformer import trained_transformer

    return trained_transformer()


def clean_and_corrupted() -> tuple[torch.Tensor, torch.Tensor]:
    """The lesson's two runs, ``(1, 16)`` each: the corrupted one has ``B`` at position ``CHANGED``."""
    clean = torch.tensor([RUN + RUN + [7, 21]])
    corrupted = clean.clone()
    corrupted[0, CHANGED] = B
    return clean, corrupted


def second_corruption() -> torch.Tensor:
    """The clean run with positions 0 and ``CHANGED2`` swapped (3 12 5 19 …): the earlier 3 now sits at
    position 0, before a 12 (``B2``), ``(1, 16)``."""
    tokens = clean_and_corrupted()[0].clone()
    tokens[0, [0, CHANGED2]] = tokens[0, [CHANGED2, 0]]
    return tokens


def logit_diff_2(logits: torch.Tensor) -> float:
    """logit[A] − logit[B2] at the query: the second corruption's measure."""
    return (logits[0, Q, A] - logits[0, Q, B2]).item()


def logit_diff(logits: torch.Tensor) -> float:
    """logit[A] − logit[B] at the query position of the first sequence: > 0 means the clean answer wins."""
    return (logits[0, Q, A] - logits[0, Q, B]).item()


def problem() -> None:
    """The corrupted run's answer, beside the clean one."""
    model = _model()
    with torch.no_grad():
        for name, tokens in zip(("clean", "corrupted"), clean_and_corrupted(), strict=True):
            logits = model(tokens)
            print(f"{name:9}: {' '.join(f'{t:2d}' for t in tokens[0, :Q + 1].tolist())} → predicts "
                  f"{logits[0, Q].argmax().item():2d}   logit[{A}] − logit[{B}] = {logit_diff(logits):+.1f}")


# ----- worked answers ---------------------------------------------------------------------------------
def record_patterns(model: nn.Module, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's attention pattern ``(N, heads, query, key)``, kept by forward hooks on ``hook_pattern``."""
    patterns, handles = [], []
    try:
        for block in model.blocks:
            handles.append(block.attn.hook_pattern.register_forward_hook(
                lambda module, args, output: patterns.append(output.detach().clone())))
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return patterns


def stripe_score(pattern: torch.Tensor, k: int) -> torch.Tensor:
    """``(heads,)``: each head's attention on the key ``k`` tokens back, ``pattern[n, h, q, q - k]``, averaged
    over the sequences ``n`` and the queries ``q >= k`` (``pattern``: ``(N, heads, query, key)``)."""
    return pattern.diagonal(offset=-k, dim1=-2, dim2=-1).mean((0, -1))


def run_with_hooks(model: nn.Module, tokens: torch.Tensor, fwd_hooks) -> torch.Tensor:
    """TransformerLens's call, on our model: ``fwd_hooks`` lists ``(name, fn)``; ``fn(activation, hook)``
    gets the named module's output and the module, and returns a replacement (or None). The logits."""
    handles = []
    try:
        for name, fn in fwd_hooks:
            module = model.get_submodule(name)
            handles.append(module.register_forward_hook(lambda module, args, output, fn=fn: fn(output, module)))
        with torch.no_grad():
            return model(tokens)
    finally:
        for handle in handles:
            handle.remove()


def patch_hook(clean_value: torch.Tensor, position: int):
    """A forward hook that returns the output with ``clean_value`` at ``position`` (all else unchanged)."""
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = clean_value[:, position]
        return output

    return hook


def patching_sweep(model: nn.Module, clean: torch.Tensor, corrupted: torch.Tensor, points: list[str],
                   metric) -> torch.Tensor:
    """``(len(points), positions)``: the corrupted run's ``metric(logits)`` with the clean output of one
    hook point put back at one position (by ``run_with_hooks``), normalised: 0 is the corrupted run, 1 the clean
    one."""
    from ..recording import record

    with record(model, points) as rec, torch.no_grad():
        high = metric(model(clean))
    with torch.no_grad():
        low = metric(model(corrupted))
    sweep = torch.zeros(len(points), corrupted.shape[1])
    for row, point in enumerate(points):
        for position in range(corrupted.shape[1]):
            def fn(activation, hook, value=rec[point].output, position=position):  # TransformerLens-style
                activation = activation.clone()
                activation[:, position] = value[:, position]
                return activation

            sweep[row, position] = metric(run_with_hooks(model, corrupted, [(point, fn)]))
    return (sweep - low) / (high - low)


def ablation_hook(head: int, position: int | None = None, mean: torch.Tensor | None = None):
    """A forward hook for ``hook_z`` ``(N, pos, heads, d_head)`` that sets head ``head`` to 0 (or to ``mean``,
    ``(pos, heads, d_head)``, the average over a batch), at ``position`` only, or at every position if None."""
    where = slice(None) if position is None else position

    def hook(module, args, output):
        output = output.clone()
        output[:, where, head] = 0.0 if mean is None else mean[where, head]
        return output

    return hook


def ablation_scores(model: nn.Module, tokens: torch.Tensor, layer: int, metric,
                    mean: torch.Tensor | None = None, positions: list[int | None] | None = None) -> torch.Tensor:
    """``(heads, positions)``: how much ``metric(logits)`` drops when one head of ``layer`` is ablated at one
    position (zeroed, or set to ``mean[position, head]``) by a forward hook on its ``hook_z``, one at a time.
    ``positions`` defaults to every position; ``None`` in it ablates the head at every position at once."""
    def edit(output, head, position):
        where = slice(None) if position is None else position
        output[:, where, head] = 0.0 if mean is None else mean[where, head]

    return _scores_with(model, tokens, layer, metric, edit, positions=positions)


def head_scores(model: nn.Module, tokens: torch.Tensor, layer: int, metric) -> torch.Tensor:
    """``(heads,)``: the drop when one head of ``layer`` is zeroed at every position."""
    return ablation_scores(model, tokens, layer, metric, positions=[None])[:, 0]


def resample_ablation(model: nn.Module, tokens: torch.Tensor, source: torch.Tensor, layer: int, heads: list[int],
                      position: int) -> torch.Tensor:
    """The logits of ``tokens`` with these ``heads`` of ``layer`` at ``position`` (their ``hook_z``) replaced by
    their values in a run on ``source`` (as many sequences as ``tokens``): resample ablation."""
    z = model.blocks[layer].attn.hook_z
    kept = {}
    handle = z.register_forward_hook(lambda module, args, output: kept.update(z=output.detach().clone()))
    try:
        with torch.no_grad():
            model(source)
    finally:
        handle.remove()

    def hook(module, args, output):
        output = output.clone()
        output[:, position, heads] = kept["z"][:, position, heads]
        return output

    handle = z.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


def steering_hook(direction: torch.Tensor, position: int, scale: float):
    """A forward hook that adds ``scale · direction`` (``(d_model,)``) to the output at ``position``."""
    def hook(module, args, output):
        output = output.clone()
        output[:, position] += scale * direction
        return output

    return hook


def hold_output(value: torch.Tensor):
    """A forward hook that returns ``value`` (the module's output in another run) in place of the output."""
    def hook(module, args, output):
        return value

    return hook


def hold_ln_scale(model: nn.Module, tokens: torch.Tensor):
    """A forward hook for ``model.ln_final`` that redoes its LayerNorm dividing by the scale (standard deviation)
    it computes in a run on ``tokens``, not by the scale of the run it sits in."""
    ln, seen = model.ln_final, []
    handle = ln.register_forward_hook(lambda module, args, output: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    scale = (seen[0].var(-1, correction=0, keepdim=True) + ln.eps).sqrt()

    def hook(module, args, output):
        centred = args[0] - args[0].mean(-1, keepdim=True)
        return centred / scale * module.weight + module.bias

    return hook


# ----- measurements -------------------------------------------------------------------------------------
def run_hooked(model: nn.Module, tokens: torch.Tensor, point: str, hook) -> torch.Tensor:
    """The logits of ``model(tokens)`` with ``hook`` on the module ``point`` (removed afterwards)."""
    handle = model.get_submodule(point).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


def clean_cache_of(model: nn.Module, tokens: torch.Tensor, points=POINTS) -> dict[str, torch.Tensor]:
    """The output of each module in ``points`` on ``tokens``."""
    from ..recording import record

    with record(model, list(points)) as rec, torch.no_grad():
        model(tokens)
    return {point: rec[point].output for point in points}


def clean_cache(model: nn.Module, points=POINTS) -> dict[str, torch.Tensor]:
    """The clean run's output of each module in ``points``."""
    return clean_cache_of(model, clean_and_corrupted()[0], points)


def patched_diff(model: nn.Module, point: str, position: int, cache: dict | None = None) -> float:
    """The corrupted run's logit difference with the clean ``point`` patched in at ``position``."""
    clean = (cache or clean_cache(model, [point]))[point]
    return logit_diff(run_hooked(model, clean_and_corrupted()[1], point, patch_hook(clean, position)))


def resid_norms(n: int = 1000) -> tuple[float, float]:
    """The smallest and largest norm of ``blocks.0.hook_resid_post``, over every position of ``n`` sequences
    like the clean one (``induction_batch``, seed 0): the range the model meets."""
    from ..recording import record
    from ..transformer import induction_batch

    model = _model()
    with record(model, ["blocks.0.hook_resid_post"]) as rec, torch.no_grad():
        model(induction_batch(n, torch.Generator().manual_seed(0)))
    norms = rec["blocks.0.hook_resid_post"].output.norm(dim=-1)
    return norms.min().item(), norms.max().item()


def steering_direction(model: nn.Module) -> torch.Tensor:
    """Clean − corrupted ``blocks.0.hook_resid_post`` at the changed position, ``(d_model,)``."""
    from ..recording import record

    outs = []
    for tokens in clean_and_corrupted():
        with record(model, ["blocks.0.hook_resid_post"]) as rec, torch.no_grad():
            model(tokens)
        outs.append(rec["blocks.0.hook_resid_post"].output[0, CHANGED])
    return outs[0] - outs[1]


def mean_z(model: nn.Module, n: int = 256) -> torch.Tensor:
    """Layer 1's ``hook_z`` averaged over ``n`` induction sequences: ``(pos, heads, d_head)``."""
    from ..recording import record
    from ..transformer import induction_batch

    with record(model, ["blocks.1.attn.hook_z"]) as rec, torch.no_grad():
        model(induction_batch(n, torch.Generator().manual_seed(1)))
    return rec["blocks.1.attn.hook_z"].output.mean(0)


# ----- predictions ----------------------------------------------------------------------------------------
_WHOLE = "write one whole number, like 0, without quotes or brackets"


def _one_whole(guess: object) -> str | None:
    """The form hint for a guess that is not one whole number (a bool is not one), else None."""
    return None if isinstance(guess, int) and not isinstance(guess, bool) else _WHOLE


def _two_whole(guess: object) -> bool:
    return isinstance(guess, list | tuple) and len(guess) == 2 and all(
        isinstance(g, int) and not isinstance(g, bool) for g in guess)


_TWO = ("write a list of two whole numbers, like [0, 0], without quotes: the token the model predicts, then "
        "the key most of layer 1's heads attend to")


def _two_keys(guess: object) -> str | None:
    """The form hint for a guess that is not a list of two whole numbers, else None."""
    return None if _two_whole(guess) else _TWO


def repeat_score(pattern: torch.Tensor, run: int, k: int) -> torch.Tensor:
    """The stripe score restricted to the repeat: the mean attention on the key k back, over the repeat's
    queries only (``max(run, k)`` to ``2 * run - 1``) and the sequences, per head ``(heads,)``."""
    return pattern.diagonal(offset=-k, dim1=-2, dim2=-1)[..., max(run - k, 0): 2 * run - k].mean((0, -1))


def _stripe_peak(length: int) -> int:
    """The k at which layer 1's stripe score, on the patterns cut to the run and its repeat (positions 0 to
    2 · length − 1) and averaged over the heads, is highest, over the runs of ``length``."""
    from ..transformer import induction_batch, induction_mask

    tokens = induction_batch(1000, torch.Generator().manual_seed(0))
    runs = tokens[induction_mask(tokens).float().argmax(1) == length]
    pattern = record_patterns(_model(), runs)[1][:, :, :2 * length, :2 * length]
    return max(range(2 * length), key=lambda k: stripe_score(pattern, k).mean().item())


@prediction("08.a", "the offset k at which layer 1's stripe score, on the runs of 5 and their repeats, is highest",
            why="an induction head at a repeated token attends to the position after the token's earlier copy: in a "
                "run of 5 the copy is 5 back (the run's length), the position after it 4 back, so k = 4",
            wrong=[(5, "5 back is the earlier copy of the query's own token; the head attends to the position after "
                       "it, whose token comes next"),
                   (6, "6 back fits the figure's run of 7; in a run of 5 the earlier copy is 5 back, and the head "
                       "attends to the position after it"),
                   (7, "7 back fits a run of 7; in a run of 5 the earlier copy is 5 back, and the head attends to the "
                       "position after it"),
                   (1, "the previous token is 1 back: a previous-token head's stripe, not an induction head's")],
            form=_one_whole)
def _induction_offset() -> int:
    return _stripe_peak(5)


def _positions(guess: object) -> str | None:
    """The form hint for a guess that is not a list of whole numbers, smallest first, else None."""
    if isinstance(guess, list | tuple) and all(isinstance(g, int) and not isinstance(g, bool) for g in guess):
        if len(guess) != 2 or len(set(guess)) != 2:
            return "write two different positions, like [0, 1]"
        if not all(0 <= g < len(RUN) * 2 + 2 for g in guess):
            return f"write positions of the sequence, from 0 to {len(RUN) * 2 + 1}"
        return None if list(guess) == sorted(guess) else "write the positions smallest first, like [0, 1]"
    return "write a list of whole numbers, smallest first, like [0, 1], without quotes"


def _08b_hint(guess: list[int]) -> str:
    """A hint for a wrong 08.b guess, sorted positions: the slip it shows, then the rule as a question, never
    the positions asked."""
    if 0 in guess:
        slip = "position 0 holds the first token: nothing comes before it, so layer 0 writes no record there."
    elif max(guess) > Q:
        slip = "a position after the query cannot reach it: attention reads only the positions before it."
    elif Q in guess:
        slip = "the query's own record is the same in both runs: the token before it did not move."
    elif CHANGED2 in guess:
        slip = ("the tokens themselves sit in the embeddings, which this patch leaves swapped; layer 0 adds a "
                "record of the token before each position.")
    else:
        slip = ""
    count = "" if len(guess) == 2 else "The question asks for two positions. "
    slip = f"{slip[0].upper()}{slip[1:]} " if slip else ""
    return (f"{count}{slip}Layer 0's output at a position is a record of the token before "
            "it, and the query looks for the record \"a 3 before me\". At which positions does the swap change "
            "what that record says, in one run or the other?")


def _08b_hints() -> list[tuple[list[int], str]]:
    """Every sorted list of one to three positions of the sequence, each with its hint (the truth among them is
    never reached: a right guess is checked first)."""
    from itertools import combinations

    return [(list(guess), _08b_hint(list(guess)))
            for size in (1, 2, 3) for guess in combinations(range(len(RUN) * 2 + 2), size)]


def layer_0_restores() -> torch.Tensor:
    """The second corruption with the clean ``blocks.0.hook_attn_out`` patched in at one position at a time,
    0 to the query: the normalised logit[A] − logit[B2], ``(Q + 1,)``."""
    clean = clean_and_corrupted()[0]
    return patching_sweep(_model(), clean, second_corruption(), ["blocks.0.hook_attn_out"], logit_diff_2)[0, :Q + 1]


@prediction("08.b", "the two positions whose clean blocks.0.hook_attn_out, patched in alone, restore the most of "
                    "the second corruption's logit[19] − logit[12]",
            why="layer 0's output at a position is a record of the token before it. Patched in where the clean run "
                "holds \"a 3 before me\", the clean record gives the query its match back; patched in where the "
                "swapped run holds \"a 3 before me\", it removes the false match the query found",
            wrong=[([3], "two positions: 3 is one, the clean record there, \"a 3 before me\", is the match the query "
                         "looks for. In the swapped run, which position holds the record \"a 3 before me\"?"),
                   ([1], "two positions: 1 is one, the swapped run's record there, \"a 3 before me\", is what the "
                         "query matches now, and the clean one removes it. Where does the clean run's own record "
                         "\"a 3 before me\" sit?"),
                   ([0, 2], "the tokens sit in their embeddings, which the patch leaves swapped; layer 0's output at "
                            "a position records the token before it"),
                   ([0, 1], "position 0 holds the first token: nothing comes before it, so layer 0 writes no "
                            "record of a token before it there"),
                   ([9], "the query's own record is the same in both runs: its token before it, 12, did not move"),
                   *_08b_hints()],
            form=_positions)
def _layer0_positions() -> list[int]:
    return sorted(int(p) for p in layer_0_restores().topk(2).indices)


def layer_0_at_3(source: torch.Tensor | None = None, keep: bool = False) -> tuple[float, int, list[list[float]]]:
    """The clean run with layer 0's four heads at position 3 (their ``hook_z``) replaced: by zeros (zero
    ablation, ``source`` None) or by their values in ``source``'s run (resample ablation); with ``keep``,
    left intact. Returns logit[19] − logit[17], the token predicted, and layer 1's heads' attention from the
    query to key 3 and to key 4 (the 8 after the 19), ``[[4 weights], [4 weights]]``."""
    from ..recording import record

    model, clean = _model(), clean_and_corrupted()[0]
    z = model.blocks[0].attn.hook_z
    with record(model, ["blocks.0.attn.hook_z"]) as rec, torch.no_grad():
        model(clean if source is None else source)
    value = rec["blocks.0.attn.hook_z"].output * (0 if source is None and not keep else 1)
    with z.register_forward_hook(patch_hook(value, 3)), \
            record(model, ["blocks.1.attn.hook_pattern"]) as rec, torch.no_grad():
        logits = model(clean)
    pattern = rec["blocks.1.attn.hook_pattern"].output[0, :, Q]
    return logit_diff(logits), logits[0, Q].argmax().item(), [pattern[:, 3].tolist(), pattern[:, 4].tolist()]


def resid_post_0_restores(positions: list[int]) -> float:
    """The corrupted run with the clean ``blocks.0.hook_resid_post`` patched in at these positions together:
    the normalised logit difference."""
    from ..recording import record

    model, (clean, corrupted) = _model(), clean_and_corrupted()
    with record(model, ["blocks.0.hook_resid_post"]) as rec, torch.no_grad():
        low, high = logit_diff(model(corrupted)), logit_diff(model(clean))
    want = rec["blocks.0.hook_resid_post"].output

    def hook(module, args, output):
        output = output.clone()
        output[:, positions] = want[:, positions]
        return output

    with model.blocks[0].hook_resid_post.register_forward_hook(hook), torch.no_grad():
        return (logit_diff(model(corrupted)) - low) / (high - low)


def with_20_at_2() -> torch.Tensor:
    """The clean run with its position 2 (the first 3) made a 20: position 3 then follows a 20."""
    tokens = clean_and_corrupted()[0].clone()
    tokens[0, 2] = 20
    return tokens


def single_and_joint() -> tuple[float, float]:
    """Layer 1's four single-head drops summed, and the drop with all four heads zeroed at once."""
    model, clean = _model(), clean_and_corrupted()[0]
    single = head_scores(model, clean, 1, logit_diff).sum().item()
    with torch.no_grad():
        intact = logit_diff(model(clean))
    joint = intact - logit_diff(run_hooked(model, clean, "blocks.1.attn.hook_z", lambda m, a, o: o * 0))
    return single, joint


def random_runs(n: int = 100, length: int = 7) -> torch.Tensor:
    """``n`` random induction sequences whose run has ``length`` tokens, like the clean one: ``(n, 16)``."""
    from ..transformer import induction_batch, induction_mask

    tokens = induction_batch(1000, torch.Generator().manual_seed(1))
    return tokens[induction_mask(tokens).float().argmax(1) == length][:n]


def resampled_answers(n: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """The clean run with layer 0's four heads at position 3 resampled from each of ``random_runs(n)``: the
    token each copy predicts at the query ``(n,)``, and layer 1's heads' attention from the query to keys 3
    and 4, averaged over the copies and heads ``(2,)``."""
    from ..recording import record

    model, clean = _model(), clean_and_corrupted()[0]
    sources = random_runs(n)
    with record(model, ["blocks.1.attn.hook_pattern"]) as rec:
        logits = resample_ablation(model, clean.expand(len(sources), -1), sources, 0, [0, 1, 2, 3], CHANGED)
    pattern = rec["blocks.1.attn.hook_pattern"].output[:, :, Q]  # the last run: the one on the clean copies
    return logits[:, Q].argmax(-1), pattern[:, :, [3, 4]].mean((0, 1))


def held_drops(hold_mlp: bool) -> tuple[torch.Tensor, float]:
    """Layer 1's four single-head drops at the query ``(heads,)`` and the drop with all four zeroed there at
    once, with ln_final's scale (the std it divides by) and, with ``hold_mlp``, MLP1's output held at their
    values in the intact clean run: the lesson's 08.d reveal."""
    model, clean = _model(), clean_and_corrupted()[0]
    held = [model.ln_final] + ([model.blocks[1].mlp] if hold_mlp else [])
    kept = {}

    def hold(module, args, output):
        if module not in held:
            return None
        if module is model.ln_final:
            centred = args[0] - args[0].mean(-1, keepdim=True)
            scale = kept.setdefault(module, (centred.var(-1, correction=0, keepdim=True) + module.eps).sqrt())
            return centred / scale * module.weight + module.bias
        return kept.setdefault(module, output)

    with model.ln_final.register_forward_hook(hold), model.blocks[1].mlp.register_forward_hook(hold), \
            torch.no_grad():
        intact = logit_diff(model(clean))  # fills `kept`
        singles = ablation_scores(model, clean, 1, logit_diff)[:, Q]
        zeroed = run_hooked(model, clean, "blocks.1.attn.hook_z",
                            lambda m, a, o: o.index_fill(1, torch.tensor([Q]), 0.0))
    return singles, intact - logit_diff(zeroed)


_YES_NO = 'write a list of two answers, each "yes" or "no", like ["yes", "yes"]'


def _yes_no(guess: object) -> str | None:
    """The form hint for a guess that is not two answers "yes" or "no", else None."""
    ok = isinstance(guess, list | tuple) and len(guess) == 2 and all(
        isinstance(g, str) and g.strip().strip("'\"").lower() in ("yes", "no") for g in guess)
    return None if ok else _YES_NO


@prediction("08.d", "layer 1's four single drops at the query against the joint drop, with ln_final's scale held, "
                    "then with MLP1's output held too: do the singles add up to the joint drop?",
            why="[\"no\", \"yes\"]: with ln_final's scale held, MLP1 still reads the query through its own "
                "LayerNorm and a GELU, neither linear (singles 7.35, joint 9.45). With MLP1 held too, what follows "
                "the heads is a sum, a fixed centring and scaling, and the unembedding: each linear plus a "
                "constant, and drops through such maps add up (5.56 both)",
            wrong=[(["yes", "yes"], "with only ln_final's scale held, MLP1 still reads the query's residual stream, "
                                    "through a LayerNorm and a GELU: is either linear?"),
                   (["no", "no"], "with both held, what is left between the heads and the logits: a sum into the "
                                  "residual stream, a fixed centring and scaling, the unembedding. Do drops through "
                                  "linear maps add up?"),
                   (["yes", "no"], "holding more of the model fixed leaves less that is not linear, never more")],
            form=_yes_no)
def _held_add_up() -> list[str]:
    return ["yes" if torch.isclose(singles.sum(), torch.tensor(joint), rtol=1e-4).item() else "no"
            for singles, joint in (held_drops(False), held_drops(True))]


def predicted(tokens: torch.Tensor) -> int:
    """The token the model predicts at the query."""
    with torch.no_grad():
        return _model()(tokens)[0, Q].argmax().item()


def says(tokens: torch.Tensor) -> list[int]:
    """``[the token the model predicts at the query, the key most of layer 1's heads attend to there]``."""
    return [predicted(tokens), layer_1_key(tokens)]


@prediction("08.c", "in the clean run with the query's 3 changed into an 8: the token predicted, and the key "
                    "most of layer 1's heads attend to",
            why="[14, 5]: the earlier 8 sits at position 4, so layer 0 writes \"an 8 before me\" at position 5; "
                "at the query, now an 8, three of layer 1's four heads attend key 5 and copy its 14",
            wrong=[([19, 3], "that is the unchanged run's answer: the query is now an 8, so its heads look for "
                             "a key with an 8 before it"),
                   ([8, 4], "position 4 holds the earlier copy of the 8; an induction head attends to the "
                            "position after it, and copies that token"),
                   ([14, 4], "key 4 holds the earlier 8 itself; the head attends to the key whose token it "
                             "copies"),
                   ([19, 5], "the head copies the token of the key it attends to: which token is at key 5?"),
],
            form=_two_keys)
def _query_into_8() -> list[int]:
    return says(third_corruption())


def steered_normalised(scale: float) -> float:
    """The corrupted run's normalised logit difference with the steering direction added at the changed
    position, at ``scale``."""
    model = _model()
    clean, corrupted = clean_and_corrupted()
    hook = steering_hook(steering_direction(model), CHANGED, scale)
    with torch.no_grad():
        ends = logit_diff(model(clean)), logit_diff(model(corrupted))
    steered = logit_diff(run_hooked(model, corrupted, "blocks.0.hook_resid_post", hook))
    return (steered - ends[1]) / (ends[0] - ends[1])


def steered_answer(scale: float) -> int:
    """The token the corrupted run predicts at the query with the steering direction added at the changed
    position after layer 0, at ``scale``."""
    model = _model()
    hook = steering_hook(steering_direction(model), CHANGED, scale)
    return run_hooked(model, clean_and_corrupted()[1], "blocks.0.hook_resid_post", hook)[0, Q].argmax().item()


def steered_at(scale: float) -> torch.Tensor:
    """The corrupted run's logits at the query, steered at ``scale`` (the direction added at the changed
    position after layer 0), ``(vocab,)``."""
    model = _model()
    hook = steering_hook(steering_direction(model), CHANGED, scale)
    return run_hooked(model, clean_and_corrupted()[1], "blocks.0.hook_resid_post", hook)[0, Q]


def steered_others(scale: float) -> torch.Tensor:
    """The token each of ``runs_with_17_at_3()`` predicts at the query with the steering direction (from the
    lesson's one pair) added at the changed position after layer 0, at ``scale``: ``(M,)``."""
    model = _model()
    hook = steering_hook(steering_direction(model), CHANGED, scale)
    return run_hooked(model, runs_with_17_at_3(), "blocks.0.hook_resid_post", hook)[:, Q].argmax(-1)


def _steered_logits(scale: float) -> torch.Tensor:
    """logit[A] − logit[B] at the query of each of ``runs_with_17_at_3()``, steered at ``scale``: ``(M,)``."""
    model = _model()
    hook = steering_hook(steering_direction(model), CHANGED, scale)
    logits = run_hooked(model, runs_with_17_at_3(), "blocks.0.hook_resid_post", hook)[:, Q]
    return logits[:, A] - logits[:, B]


HOW_MANY = ("none", "some", "about half", "all")  # 08.e: how many of the other runs predict 19


def how_many(count: int, total: int) -> str:
    """``count`` of ``total`` in 08.e's words: none, all, about half (40-60 %), or some."""
    if count in (0, total):
        return HOW_MANY[0] if count == 0 else HOW_MANY[3]
    return HOW_MANY[2] if 0.4 <= count / total <= 0.6 else HOW_MANY[1]


def _count(guess: object) -> str | None:
    """The form hint for a guess that is not one of 08.e's four choices, else None."""
    ok = isinstance(guess, str) and " ".join(guess.strip().strip("'\"").lower().split()) in HOW_MANY
    return None if ok else 'write one of "none", "some", "about half" or "all", in quotes'


@prediction("08.e", "the direction from one pair added at scale 0.75, not 0.5, to 233 other runs with a 17 at "
                    "position 3: how many of them predict 19",
            why="all 233 (next cell). Each quarter of scale adds more than the last (3.1, then 5.5, then 6.2), so the "
                "mean passes 0 by about 4; the runs sit close together (± 0.8 at 0.5) and the push differs little "
                "between them (0 to 0.75: 12.1 to 16.9), so all of them cross 0 together, between 0.5 and 0.75",
            wrong=[("none", "from scale 0 the push added 3.1, then 5.5 per quarter: if a quarter more of the scale "
                            "adds at least as much again, where does the mean −2.1 land?"),
                   ("some", "the runs sit close together (± 0.8 at 0.5), and each quarter adds more than the last "
                            "(3.1, then 5.5): when the mean moves a few units past 0, how many stay below?"),
                   ("about half", "the runs sit close together (± 0.8 at 0.5), and each quarter adds more than the "
                                  "last (3.1, then 5.5): when the mean moves a few units past 0, how many stay "
                                  "below?")],
            form=_count)
def _steered_others() -> str:
    said = steered_others(0.75)
    return how_many(int((said == A).sum()), len(said))


def induction_pair() -> torch.Tensor:
    """Two sequences, ``(2, 16)``: the clean run, and the clean run whose query token is 8 (it answers 14)."""
    clean = clean_and_corrupted()[0]
    other = clean.clone()
    other[0, Q] = 8
    return torch.cat([clean, other])


def first_metric(logits: torch.Tensor) -> float:
    """logit[12] − logit[17] at position 0 of the first sequence: what the model predicts after the first token,
    which only position 0's activations reach."""
    return (logits[0, 0, RUN[1]] - logits[0, 0, B]).item()


def pair_metric(logits: torch.Tensor) -> float:
    """On ``induction_pair()``: logit[19] − logit[17] of the first sequence plus logit[14] − logit[17] of the
    second, at the query."""
    return (logits[0, Q, A] - logits[0, Q, B] + logits[1, Q, 14] - logits[1, Q, B]).item()


def runs_with_17_at_3(n: int = 2000) -> torch.Tensor:
    """Other sequences like the corrupted one, ``(M, 16)``: from ``induction_batch(n)`` (seed 2), the runs of 7
    without a 19, with their run's fourth token (position 3, and 10 in the repeat) made a 17."""
    from ..transformer import induction_batch, induction_mask

    tokens = induction_batch(n, torch.Generator().manual_seed(2))
    keep = (induction_mask(tokens).float().argmax(1) == 7) & (tokens[:, :7] != A).all(1) & (tokens[:, :7] != B).all(1)
    tokens = tokens[keep]
    tokens[:, CHANGED], tokens[:, CHANGED + 7] = B, B
    return tokens


def layer_1_key(tokens: torch.Tensor, hooks=()) -> int:
    """The key most of layer 1's heads attend to from the query (each head's argmax, then the most common),
    with ``hooks`` ``[(point, forward hook)]`` registered."""
    from .. import record

    model = _model()
    handles = [model.get_submodule(point).register_forward_hook(hook) for point, hook in hooks]
    try:
        with record(model, ["blocks.1.attn.hook_pattern"]) as rec, torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return rec["blocks.1.attn.hook_pattern"].output[0, :, Q].argmax(-1).mode().values.item()


B3 = 14  # the third corruption's answer: the query's 3 becomes an 8, whose earlier copy (4) is followed by 14


def third_corruption() -> torch.Tensor:
    """The clean run with an 8 at the query, ``(1, 16)``: the model answers 14, the token after the earlier 8."""
    tokens = clean_and_corrupted()[0].clone()
    tokens[0, Q] = 8
    return tokens


def third_patched() -> tuple[int, int]:
    """The third corruption with the clean ``blocks.1.hook_attn_out`` patched in at the query: the predicted
    token, and the key most of layer 1's heads attend to from the query."""
    point = "blocks.1.hook_attn_out"
    hook = patch_hook(clean_cache(_model(), [point])[point], Q)
    said = run_hooked(_model(), third_corruption(), point, hook)[0, Q].argmax().item()
    return said, layer_1_key(third_corruption(), [(point, hook)])


# ----- exercises ----------------------------------------------------------------------------------------------
def _hook_or_outcome(answer, what: str, *args):
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`{what}`), not {kind_of(answer)}")
    hook = answer(*args)
    if not callable(hook):
        return Outcome(False, f"{what}(...) returned {kind_of(hook)}: return the hook function, "
                              "hook(module, args, output), that you define inside it")
    return hook


def _probe(answer, args: tuple, output: torch.Tensor):
    """What the answer's hook returns for ``output`` (a made-up value), or None when it cannot be called."""
    hook = answer(*args) if callable(answer) else None
    return hook(None, (), output) if callable(hook) else None


def _watch(hook, edited: list, idle: list | None = None):
    """``hook``, wrapped to note in ``edited`` when it changes the ``output`` it receives in place, and in
    ``idle``, one bool a call, whether it changed nothing (returned None and left ``output`` as it was)."""
    def wrapper(module, args, output):
        before = output.clone() if isinstance(output, torch.Tensor) else None
        result = hook(module, args, output)
        changed = before is not None and not torch.equal(output, before)
        if changed:
            edited.append(True)
        if idle is not None:
            idle.append(result is None and not changed)
        return result

    return wrapper


ABLATE_IN_PLACE = (" A note, not a slip: your hook changed `output` in place. Nothing else in this run holds "
                   "that tensor, so it works here; where something does (autograd's saved tensors, a hook that kept "
                   "it without copying), it changes there too: edit a copy, `output = output.clone()`, and return it.")
IN_PLACE = (" A note, not a slip: your hook changed `output` in place. That is safe here, because nothing else in "
            "the run holds that tensor (the clean values are copies from another run); where something does, such "
            "as autograd's saved tensors or a hook that kept it without copying, edit a copy "
            "(`output = output.clone()`) and return it.")
STEER_IN_PLACE = (" A note, not a slip: your hook added to `output` in place. Nothing else in this run holds "
                  "that tensor, so it works here; where something does (autograd's saved tensors, a "
                  "hook that kept it without copying), it changes there too: add to a copy, `output.clone()`.")
ROW_0 = "only the first sequence of the batch changed: edit `output[:, ...]`, every sequence, not `output[0, ...]`"


def _watched(model: nn.Module, edited: list, idle: list | None = None, hooked: list | None = None) -> nn.Module:
    """``model``, each of whose modules wraps the forward hooks registered on it in ``_watch``; ``hooked`` (if
    given) gets the name of each module a hook is registered on."""
    names = {id(module): name for name, module in model.named_modules()}

    def registering(module):
        owner = weakref.ref(module)  # weak: no reference cycle keeps the model alive

        def register(hook, *args, **kwargs):
            if hooked is not None:
                hooked.append(names.get(id(owner()), "?"))
            watched = hook if kwargs.get("with_kwargs") else _watch(hook, edited, idle)
            return type(owner()).register_forward_hook(owner(), watched, *args, **kwargs)

        return register

    for module in model.modules():
        module.register_forward_hook = registering(module)
    return model


def _compare_runs(answer, what: str, cases, edited: list) -> Outcome | None:
    """``cases``: (args for answer, point, tokens, worked hook, description)."""
    model = _model()
    for args, point, tokens, worked, where in cases:
        hook = _hook_or_outcome(answer, what, *args)
        if isinstance(hook, Outcome):
            return hook
        returned: list = []

        def noting(module, args, output, hook=hook, returned=returned):  # notes what the hook returned
            returned.append(hook(module, args, output))
            return returned[-1]

        got = run_hooked(model, tokens, point, _watch(noting, edited))
        if (leftover := [n for n, m in model.named_modules() if m._forward_hooks]):
            return Outcome(False, f"a forward hook is still registered on {leftover[0]!r}: the hook should not "
                                  "register hooks")
        want = run_hooked(model, tokens, point, worked)
        if torch.allclose(got, want, atol=1e-5):
            continue
        if len(got) > 1 and torch.allclose(got[0], want[0], atol=1e-5):
            return Outcome(False, f"{where}: {ROW_0}")
        plain = run_hooked(model, tokens, point, lambda m, a, o: None)
        if torch.allclose(got, plain, atol=1e-5) and all(r is None for r in returned):
            return Outcome(False, f"{where}: the output is unchanged; your hook returned None, so the model "
                                  "kept its own output: a forward hook replaces it by returning the new value "
                                  "(return output at the end)")
        if torch.allclose(got, plain, atol=1e-5):
            negative = ", a negative scale too" if "scale -" in where else ""
            return Outcome(False, f"{where}: the output is unchanged: your hook returned it as it was. Add "
                                  f"scale * direction at the position for every scale{negative}")
        return Outcome(False, f"{where}: the logit difference is {logit_diff(got):+.2f}, want "
                              f"{logit_diff(want):+.2f}")
    return None


@exercise("08.1", "record the attention patterns with forward hooks")
def _check_patterns(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`record_patterns`), not {kind_of(answer)}")
    model = _model()
    tokens = torch.cat(clean_and_corrupted())
    seen: list[torch.Tensor] = []  # the patterns themselves, as each hook_pattern hands them on
    ours = [block.attn.hook_pattern.register_forward_hook(lambda m, a, output: seen.append(output))
            for block in model.blocks]
    try:
        got = answer(model, tokens)
    finally:
        for handle in ours:
            handle.remove()
    if (leftover := [n for n, m in model.named_modules() if m._forward_hooks]):
        return Outcome(False, f"a forward hook is still registered on {leftover[0]!r}: remove each handle "
                              "after the forward pass (in a finally block)")
    if not isinstance(got, list | tuple) or not all(isinstance(t, torch.Tensor) for t in got):
        return Outcome(False, f"record_patterns returned {kind_of(got)}: return a list of tensors, one a layer")
    if any(t.requires_grad for t in got):
        return Outcome(False, "the patterns require grad, so each keeps autograd's graph of the run alive: keep "
                              "output.detach(), and run model(tokens) under torch.no_grad()")
    if any(g is o for g in got for o in seen):
        return Outcome(False, "you kept hook_pattern's output itself, not output.detach(): under torch.no_grad() "
                              "it has no graph, so it works here, but the same hook in a run that tracks "
                              "gradients keeps autograd's graph of the whole run alive with each pattern. Keep "
                              "output.detach()")
    want = record_patterns(model, tokens)
    if len(got) != len(want):
        return Outcome(False, f"{len(got)} patterns for a model of {len(want)} layers: register a hook on each "
                              "block's attn.hook_pattern")
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return Outcome(False, f"layer {layer}'s pattern has shape {tuple(g.shape)}, want {tuple(w.shape)} "
                                  "(N, heads, query, key): the hook's output, as it is")
        if not torch.allclose(g, w, atol=1e-6):
            return Outcome(False, f"layer {layer}'s pattern differs from the model's: record hook_pattern's output "
                                  "in order of the blocks")
    from . import hooks_left_when_raising

    too_long = torch.zeros(1, 64, dtype=torch.long)  # the model refuses it: the forward pass raises
    if (left := hooks_left_when_raising(lambda: answer(model, too_long), model)) is not None:
        return left
    return Outcome(True, "both layers' patterns, (N, heads, query, key), and no hook left behind, even when the "
                         "forward pass raises")


def _stripe_cases() -> list[tuple[torch.Tensor, int]]:
    """Causal patterns ``(3, 4, 10, 10)`` with random rows, and the offsets to score them at."""
    scores = torch.randn(3, 4, 10, 10, generator=torch.Generator().manual_seed(8))
    pattern = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return [(pattern, k) for k in (1, 6, 0, 9)]


@exercise("08.2", "the stripe score: each head's attention on the key k tokens back")
def _check_stripe(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`stripe_score`), not {kind_of(answer)}")
    for pattern, k in _stripe_cases():
        got, want = answer(pattern.clone(), k), stripe_score(pattern, k)
        if isinstance(got, list | tuple) and all(isinstance(v, int | float) for v in got):
            got = torch.tensor(got)
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"stripe_score returned {kind_of(got)}: return a tensor, one score a head")
        got = got.float()
        if got.shape == want.shape and torch.allclose(got, want, atol=1e-5):
            continue
        stripe = pattern.diagonal(offset=-k, dim1=-2, dim2=-1)  # (N, heads, T - k)
        slips = [(want.mean(), "you averaged the heads too: keep one score a head, averaging over the sequences "
                               "and the queries only"),
                 (pattern.diagonal(offset=k, dim1=-2, dim2=-1).mean((0, -1)),
                  "that is the key k tokens *ahead*, which a causal pattern sets to 0: the key k back is "
                  "pattern[..., q, q - k], offset=-k"),
                 (stripe.sum((0, -1)), "that is a sum: average over the sequences and the queries"),
                 (stripe.sum(-1).mean(0) / pattern.shape[-2], f"you divided by all {pattern.shape[-2]} queries: "
                  "only the queries q >= k have a key k back, so average over those"),
                 (stripe.mean(-1), "one score per sequence and head: average over the sequences too"),
                 (stripe[..., 1:].mean((0, -1)), "you started one query late, at q = k + 1: the first query with a "
                  "key k back is q = k itself (its key is position 0), so average over the queries q >= k"),
                 (pattern.diagonal(offset=-k).mean((0, -1)), "torch.diagonal took the diagonal of its default dims "
                  "0 and 1 (sequences and heads): name the query and key axes, dim1=-2, dim2=-1")]
        for value, slip in slips:
            if value.shape == got.shape and torch.allclose(got, value, atol=1e-5):
                return Outcome(False, f"at k = {k}: {slip}")
        if got.shape != want.shape:
            return Outcome(False, f"at k = {k}: shape {tuple(got.shape)}, want {tuple(want.shape)}, one score a "
                                  "head")
        return Outcome(False, f"at k = {k}: {[round(v, 3) for v in got.tolist()]}, want "
                              f"{[round(v, 3) for v in want.tolist()]}")
    return Outcome(True, "each head's mean attention on the key k back, at k = 0, 1, 6 and 9, over three sequences")


RUN2 = [11, 4, 16, 6, 20, 1, 13]  # another run: its query (16) answers 6; a 22 at position 3 makes it 22


def other_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """Another clean run ``(1, 16)`` and its corrupted copy (the 6 at position 3 changed into a 22)."""
    clean = torch.tensor([RUN2 + RUN2 + [7, 21]])
    corrupted = clean.clone()
    corrupted[0, CHANGED] = 22
    return clean, corrupted


def _tl_patch(clean_z: torch.Tensor, head: int):
    """A TransformerLens-style hook, fn(activation, hook): the clean ``head`` of ``hook_z`` at the query."""
    def fn(z, hook):
        z = z.clone()
        z[:, Q, head] = clean_z[:, Q, head]
        return z

    return fn


def _tl_half(activation, hook):
    return activation * 0.5


def _tl_steer(scale: float):
    def fn(resid, hook):
        return resid + scale

    return fn


@exercise("08.3", "TransformerLens's run_with_hooks: forward hooks by name")
def _check_run_with_hooks(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`run_with_hooks`), not {kind_of(answer)}")
    from ..audit import clear_hooks
    from . import hooks_left_when_raising

    model = _model()
    corrupted = clean_and_corrupted()[1]
    clean_z = clean_cache(model, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"]
    seen = {}

    def keep(resid, hook):  # a hook that only reads: it returns None
        seen["hook"], seen["resid"] = hook, resid.detach().clone()

    cases = [([("blocks.1.attn.hook_z", _tl_patch(clean_z, 0))], "head 0's clean output patched in at the query"),
             ([("blocks.1.attn.hook_z", _tl_patch(clean_z, 1)), ("blocks.0.hook_resid_post", _tl_steer(0.5))],
              "two hooks: head 1 patched, and 0.5 added to blocks.0.hook_resid_post"),
             ([("blocks.0.hook_resid_post", keep)], "a hook that reads blocks.0.hook_resid_post and returns None"),
             ([("blocks.1.mlp", _tl_half)], "a hook that halves the output of blocks.1.mlp, which is not an identity")]
    for hooks, what in cases:
        try:
            got = answer(model, corrupted, hooks)
        except TypeError as e:
            clear_hooks(model)
            return Outcome(False, f"{what}: TypeError: {e}. Call each function as fn(activation, hook), with the "
                                  "forward hook's output and the module, not fn(module, args, output)")
        if (left := [n for n, m in model.named_modules() if m._forward_hooks]):
            clear_hooks(model)
            return Outcome(False, f"a forward hook is still registered on {left[0]!r}: remove each handle "
                                  "after the run (in a finally block)")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"{what}: run_with_hooks returned {kind_of(got)}: return the logits")
        if got.requires_grad:
            return Outcome(False, f"{what}: the logits require grad, so autograd kept a graph of the run: call "
                                  "model(tokens) under torch.no_grad()")
        if "hook" in seen and seen["hook"] is not model.get_submodule("blocks.0.hook_resid_post"):
            return Outcome(False, f"fn's second argument was {kind_of(seen['hook'])}: pass the module the hook "
                                  "sits on, as TransformerLens passes the HookPoint")
        want = _raw_run(model, corrupted, hooks)
        if torch.allclose(got, want, atol=1e-5):
            continue
        if len(hooks) == 2 and torch.allclose(got, _raw_run(model, corrupted, [(n, hooks[-1][1]) for n, _ in hooks]),
                                              atol=1e-5):
            return Outcome(False, f"{what}: every hook ran the last function of the list. A function defined in a "
                                  "loop looks `fn` up when it runs, after the loop: bind it now (`fn=fn` in the "
                                  "signature)")
        if hooks[0][0] == "blocks.1.mlp" and torch.allclose(
                got, run_hooked(model, corrupted, "blocks.1.mlp", lambda m, a, o: a[0] * 0.5), atol=1e-5):
            return Outcome(False, f"{what}: fn got the module's input (args[0]), not its output. On a HookPoint, an "
                                  "identity, the two are equal; on blocks.1.mlp they differ: call fn(output, module)")
        with torch.no_grad():
            plain = model(corrupted)
        if torch.allclose(got, plain, atol=1e-5):
            return Outcome(False, f"{what}: the logits are the corrupted run's: your forward hook must return "
                                  "fn(output, module), the value that replaces the output")
        return Outcome(False, f"{what}: logit difference {logit_diff(got):+.2f}, want {logit_diff(want):+.2f}")
    def boom(z, hook):
        raise RuntimeError("a hook that fails")

    left = hooks_left_when_raising(lambda: answer(model, corrupted, [("blocks.1.attn.hook_z", boom)]), model)
    if left is not None:
        return left
    return Outcome(True, "the same logits as raw forward hooks, one hook or two, one that only reads, and no hook "
                         "left behind, even when a hook raises")


def _raw_run(model: nn.Module, tokens: torch.Tensor, hooks) -> torch.Tensor:
    """The worked ``run_with_hooks``, for the checker."""
    return run_with_hooks(model, tokens, hooks)


CHECK_POINTS = ["hook_embed", "blocks.0.hook_attn_out", "blocks.1.hook_attn_out", "blocks.1.hook_resid_post"]


def _sweep_cases():
    """(clean, corrupted, metric, what) for the lesson's two corruptions, and two different pairs in a batch, cut
    after the query (later positions cannot change it): fewer runs, the same slips."""
    clean, corrupted = clean_and_corrupted()
    clean2, corrupted2 = other_pair()

    def both(logits):  # each sequence's own logit difference, added
        return logit_diff(logits[:1]) + (logits[1, Q, 6] - logits[1, Q, 22]).item()

    cases = [(clean, corrupted, logit_diff, f"19 → {B} at position {CHANGED}"),
             (clean, second_corruption(), logit_diff_2, f"3 → {B2} at position {CHANGED2}"),
             (torch.cat([clean, clean2]), torch.cat([corrupted, corrupted2]), both,
              "two different runs in one batch")]
    return [(c[:, :Q + 1], x[:, :Q + 1], metric, what) for c, x, metric, what in cases]  # up to the query


def _raw_sweep(model, clean, corrupted, metric) -> torch.Tensor:
    """The un-normalised sweep: the clean values patched into ``corrupted``."""
    cache = clean_cache_of(model, clean, CHECK_POINTS)
    return torch.tensor([[metric(run_hooked(model, corrupted, point, patch_hook(cache[point], position)))
                          for position in range(corrupted.shape[1])] for point in CHECK_POINTS])


def _onward(model, clean, corrupted, metric, high, low) -> torch.Tensor:
    """The sweep patched from each position to the end of the sequence, normalised."""
    cache = clean_cache_of(model, clean, CHECK_POINTS)

    def onward(value, position):
        def hook(module, args, output):
            output = output.clone()
            output[:, position:] = value[:, position:]
            return output
        return hook

    raw = torch.tensor([[metric(run_hooked(model, corrupted, point, onward(cache[point], position)))
                         for position in range(corrupted.shape[1])] for point in CHECK_POINTS])
    return (raw - low) / (high - low)


NOTHING = ("your hook changed nothing: each run gives what the {} run gives. Did it return the edited copy? A "
           "forward hook that returns None leaves the output as it was")


def _sweep_slip(model, got, clean, corrupted, metric) -> str | None:
    """Name the slip when ``got`` is a plausible wrong sweep."""
    with torch.no_grad():
        high, low = metric(model(clean)), metric(model(corrupted))
    raw = _raw_sweep(model, clean, corrupted, metric)
    want = (raw - low) / (high - low)

    def near(x):
        return x.shape == got.shape and torch.allclose(got, x, atol=1e-3)

    if near(want.T):
        return f"your sweep has shape {tuple(got.shape)}: return one row per hook point, one column per position"
    if near(raw):
        return ("these are the raw logit differences (−11 … +11): normalise them, (patched − corrupted) / "
                "(clean − corrupted), so that 0 is the corrupted run and 1 the clean one")
    if near(1 - want):
        return ("upside down: 1 where the patch does nothing. Use (patched − corrupted) / (clean − corrupted): "
                "0 is the corrupted run, 1 the clean one")
    if near(raw / high) or near((raw - low) / high):
        return "divide by (clean − corrupted), the whole range, not by the clean run's value alone"
    if len(clean) > 1:
        def first_only(point, position, value=None):
            def hook(module, args, output):
                output = output.clone()
                output[0, position] = value[0, position]
                return output
            return hook

        cache = clean_cache_of(model, clean, CHECK_POINTS)
        row0 = torch.tensor([[metric(run_hooked(model, corrupted, point, first_only(point, position, cache[point])))
                              for position in range(corrupted.shape[1])] for point in CHECK_POINTS])
        if near((row0 - low) / (high - low)):
            return ROW_0

        def first_everywhere(point, position, value=None):
            def hook(module, args, output):
                output = output.clone()
                output[:, position] = value[0, position]
                return output
            return hook

        shared = torch.tensor([[metric(run_hooked(model, corrupted, point,
                                                  first_everywhere(point, position, cache[point])))
                                for position in range(corrupted.shape[1])] for point in CHECK_POINTS])
        if near((shared - low) / (high - low)):
            return ("every sequence got the first clean sequence's value (`clean_value[0, position]`): put back "
                    "each sequence's own, `clean_value[:, position]`")
    swapped = _raw_sweep(model, corrupted, clean, metric)  # the corrupted values patched into the clean run
    if near((swapped - low) / (high - low)) or near((swapped - high) / (low - high)):
        return ("the direction is swapped: you put the corrupted run's values into the clean run. Record the "
                "clean run, and patch its values into model(corrupted)")
    if near(_onward(model, clean, corrupted, metric, high, low)):
        return ("you patched from the position onward (`output[:, position:]`): put back the clean value at that "
                "one position only, `output[:, position]`")
    if near(torch.ones_like(want)):
        return ("every cell is the clean answer: you patched the clean run. Put the clean value into the "
                "corrupted run: model(corrupted) while the hook is registered")
    if near(torch.zeros_like(want)):
        return ("every cell is 0, the corrupted run's own answer: your recorded values are the corrupted run's. "
                "`record` keeps each point's last call: run only model(clean) inside the record block, and "
                "model(corrupted) outside it")
    if got.shape == want.shape and (got - got[:, :1]).abs().max() < 1e-3:
        return ("each row is the same at every position: the hook replaced the whole output. Put back only "
                "output[:, position], on a copy of the output")
    return None


def _map_verdict(got: torch.Tensor, want: torch.Tensor, what: str, *, nothing: bool, baseline: str, slip,
                 layout: str, cell) -> Outcome | None:
    """None when the student's map ``got`` matches ``want``; else the first slip found: nothing patched (the
    ``baseline`` run every time), a slip ``slip()`` names, a wrong shape (``layout`` says the right one), or the
    cell furthest off, described by ``cell(row, col)``."""
    if got.shape == want.shape and torch.allclose(got.float(), want, atol=1e-3):
        return None
    if nothing:
        return Outcome(False, f"{what}: " + NOTHING.format(baseline))
    if (named := slip()) is not None:
        return Outcome(False, f"{what}: {named}")
    if got.shape != want.shape:
        return Outcome(False, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}: {layout}")
    row, col = divmod((got.float() - want).abs().argmax().item(), want.shape[1])
    return Outcome(False, f"{what}: {cell(row, col)} {got[row, col]:.2f}, want {want[row, col]:.2f}")


@exercise("08.4", "the patching sweep over hook points × positions, normalised")
def _check_sweep(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`patching_sweep`), not {kind_of(answer)}")
    edited: list[bool] = []
    idle: list[bool] = []
    model = _watched(_model(), edited, idle)
    for clean, corrupted, metric, what in _sweep_cases():
        start = len(idle)
        try:
            got = answer(model, clean, corrupted, list(CHECK_POINTS), metric)
        except NotImplementedError as e:  # a stub the sweep calls, not the sweep itself
            frames = traceback.extract_tb(e.__traceback__)
            name = frames[-1].name if frames else ""
            if name and name != getattr(getattr(answer, "__code__", None), "co_name", name):
                which = "08.3" if name == "run_with_hooks" else "its exercise"
                return Outcome(False, f"your patching_sweep called {name}, which raised NotImplementedError: it is "
                                      f"still a stub. Solve {name} first ({which}), or run the cell that loads its "
                                      "worked answer, then check again")
            raise
        nothing = len(idle) > start and all(idle[start:])
        if (leftover := [n for n, m in model.named_modules() if m._forward_hooks]):
            return Outcome(False, f"a forward hook is still registered on {leftover[0]!r} after your sweep: "
                                  "remove each handle right after its run (in a finally block), or the next "
                                  "run is patched twice")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"patching_sweep returned {kind_of(got)}: return a tensor, (points, positions)")
        want = patching_sweep(model, clean, corrupted, list(CHECK_POINTS), metric)
        wrong = _map_verdict(got, want, f"corruption {what}", nothing=nothing, baseline="unpatched corrupted",
                             slip=functools.partial(_sweep_slip, model, got.float(), clean, corrupted, metric),
                             layout="one row per hook point, one column per position of the sequence",
                             cell=lambda row, col: f"{CHECK_POINTS[row]} at position {col} gives")
        if wrong:
            return wrong
    return Outcome(True, "the same map as the model's, for both corruptions, alone and in one batch, and no hook "
                         "left behind." + (IN_PLACE if edited else ""))


def _scores_with(model, tokens, layer, metric, edit, *, keep: bool = False, positions=None) -> torch.Tensor:
    """The map with ``edit(output, head, position)`` (on a copy) as the ablation, one column per entry of
    ``positions`` (default: every position); ``keep``: each hook stays."""
    attn = model.blocks[layer].attn
    positions = range(tokens.shape[1]) if positions is None else positions
    with torch.no_grad():
        intact = metric(model(tokens))
    handles, scores = [], torch.zeros(attn.heads, len(positions))

    def hook_for(head, position):
        def hook(module, args, output):
            output = output.clone()
            edit(output, head, position)
            return output
        return hook

    try:
        for head in range(attn.heads):
            for column, position in enumerate(positions):
                handles.append(attn.hook_z.register_forward_hook(hook_for(head, position)))
                with torch.no_grad():
                    scores[head, column] = intact - metric(model(tokens))
                if not keep:
                    handles.pop().remove()
    finally:
        for handle in handles:
            handle.remove()
    return scores


def _zero(output, head, position):
    output[:, position, head] = 0.0


def _scores_slip(model, got, tokens, layer, metric, hooked=()) -> str | None:
    point = f"blocks.{layer}.attn.hook_z"
    if (elsewhere := [name for name in hooked if not name.endswith("attn.hook_z")]):  # another layer's: below
        module, shapes = dict(model.named_modules()).get(elsewhere[0]), []
        if module is not None:  # its output's shape, from one run (the class's own register: not noted as hooked)
            handle = type(module).register_forward_hook(
                module, lambda m, a, o: shapes.append(getattr(o, "shape", None)))
            try:
                with torch.no_grad():
                    model(tokens)
            finally:
                handle.remove()
        names = "(N, position, d_model)" if elsewhere[0].endswith("attn") else "not (N, position, head, d_head)"
        shape = f"shape {tuple(shapes[0])}, {names}" if shapes and shapes[0] is not None else names
        mixed = ": the heads are already mixed by attn.out" if elsewhere[0].endswith("attn") else ""
        return (f"your hook is on {elsewhere[0]!r}, whose output has {shape}{mixed}. There, output[:, position, "
                f"head] is not one head at one position. Hook {point} (model.blocks[layer].attn.hook_z), shaped "
                "(N, position, head, d_head)")
    want = ablation_scores(model, tokens, layer, metric)
    with torch.no_grad():
        intact = metric(model(tokens))

    def near(x):
        return x.shape == got.shape and torch.allclose(got, x, atol=1e-3)

    def batch_mean(output, head, position):
        output[:, position, head] = output[:, position, head].mean(0)

    if near(_scores_with(model, tokens, layer, metric, batch_mean)):
        return ("you put in the head's mean over the batch (mean ablation): 08.5 asks for zero ablation, "
                "output[:, position, head] = 0. On one sequence, the batch's mean is the value itself, so nothing "
                "drops")
    if near(-want):
        return "the signs are reversed: a score is the drop, metric(intact) − metric(ablated), positive when it hurts"
    if near(want / intact) or near(1 - want / intact):
        return "leave the score unnormalised: metric(intact) − metric(ablated), in the metric's own units"
    if near(intact - want):
        return "these are the ablated runs' values: return the drop, metric(intact) − metric(ablated)"
    if near(want.T):
        return "rows and columns are swapped: one row per head, one column per position, (heads, positions)"
    every = head_scores(model, tokens, layer, metric)
    if near(every[:, None].expand_as(want)) or near(every):
        return ("you zeroed each head at every position at once (output[:, :, head]): zero it at one position "
                "at a time, output[:, position, head], one score per head and position")

    def all_heads(output, head, position):
        output[:, position] = 0.0

    if near(_scores_with(model, tokens, layer, metric, all_heads)):
        return ("you zeroed every head at that position (output[:, position]): zero one head there, "
                "output[:, position, head]")
    if near(_scores_with(model, tokens, layer, metric, _zero, keep=True)):
        return ("the earlier heads and positions were still ablated: remove each hook (handle.remove()) before "
                "the next run")

    def first_only(output, head, position):
        output[0, position, head] = 0.0

    if len(tokens) > 1 and near(_scores_with(model, tokens, layer, metric, first_only)):
        return ROW_0
    other = 1 - layer
    if near(ablation_scores(model, tokens, other, metric)):
        return (f"these are layer {other}'s heads, not layer {layer}'s: hook model.blocks[layer].attn.hook_z, the "
                "layer asked for")

    def last_axis(output, head, position):
        output[:, position, ..., head] = 0.0

    if near(_scores_with(model, tokens, layer, metric, last_axis)):
        return ("you set one entry of the last axis (d_head) in every head: hook_z is (N, position, head, d_head), "
                "so a head at one position is output[:, position, head]")
    return None


@exercise("08.5", "ablation scores: the metric's drop when one head is zeroed at one position")
def _check_scores(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`ablation_scores`), not {kind_of(answer)}")
    edited: list[bool] = []
    idle: list[bool] = []
    hooked: list[str] = []  # the modules the student's hooks are registered on
    model = _watched(_model(), edited, idle, hooked)
    clean = clean_and_corrupted()[0]
    batch = induction_pair()
    for tokens, metric, layer, what in [(clean, logit_diff, 1, "layer 1"),
                                        (clean, logit_diff, 0, "layer 0"),
                                        (batch, pair_metric, 1, "a batch of two, layer 1"),
                                        (clean, first_metric, 1, "layer 1, read at position 0")]:
        start = len(idle)
        hooked.clear()
        got = answer(model, tokens, layer, metric)
        nothing = len(idle) > start and all(idle[start:])
        if isinstance(got, list | tuple):
            try:
                got = torch.tensor(got, dtype=torch.float)  # nested lists of numbers are as good as a tensor
            except (TypeError, ValueError, RuntimeError):
                pass
        if (leftover := [n for n, mod in model.named_modules() if mod._forward_hooks]):
            return Outcome(False, f"a forward hook is still registered on {leftover[0]!r} after your scores: "
                                  "remove each handle after its run, in a finally block")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"ablation_scores returned {kind_of(got)}: return a tensor, one score per head "
                                  "and position (torch.zeros(heads, positions), filled in)")
        want = ablation_scores(model, tokens, layer, metric)
        wrong = _map_verdict(got, want, what, nothing=nothing, baseline="intact",
                             slip=functools.partial(_scores_slip, model, got.float(), tokens, layer, metric,
                                                    list(hooked)),
                             layout="one row per head, one column per position",
                             cell=lambda head, position: f"head {head} at position {position} scores")
        if wrong:
            return wrong
    return Outcome(True, "the same drops as the model's, every head at every position, layers 0 and 1, read at "
                         "the query and at position 0, on one run and a batch of two, and no hook left behind."
                   + (ABLATE_IN_PLACE if edited else ""))


def _resample_variant(model, tokens, source, layer, heads, position, *, where="one", which="given",
                      fill="source") -> torch.Tensor:
    """A wrong resample ablation, for naming a slip: ``where`` "every" (all positions), ``which`` "all" (every
    head), ``fill`` "zero" (zeros) or "swapped" (``source`` run with the values of ``tokens``)."""
    if fill == "swapped":
        return resample_ablation(model, source, tokens, layer, heads, position)
    z = model.blocks[layer].attn.hook_z
    kept = {}
    with z.register_forward_hook(lambda m, a, o: kept.update(z=o.detach().clone())), torch.no_grad():
        model(source)
    spot = slice(None) if where == "every" else position
    pick = slice(None) if which == "all" else heads

    def hook(module, args, output):
        output = output.clone()
        output[:, spot, pick] = 0.0 if fill == "zero" else kept["z"][:, spot, pick]
        return output

    with z.register_forward_hook(hook), torch.no_grad():
        return model(tokens)


def _resample_slip(model, got, tokens, source, layer, heads, position) -> str | None:
    def near(x):
        return x.shape == got.shape and torch.allclose(got, x, atol=1e-4)

    with torch.no_grad():
        intact = model(tokens)
    if near(intact):
        return ("the logits are those of the intact run on tokens: nothing was replaced. Record hook_z in a run on "
                "`source` (a run on `tokens` puts back the values already there), and return the edited copy from "
                "your hook")
    slips = [(dict(fill="zero"), "you put in zeros (zero ablation): put in the heads' values from the run on "
                                 "`source`, output[:, position, heads] = the source's hook_z[:, position, heads]"),
             (dict(fill="swapped"), "you ran `source` with the heads' values of `tokens`: record on `source`, and "
                                    "return the logits of `tokens`"),
             (dict(where="every"), "you replaced the heads at every position: replace them at `position` only, "
                                   "output[:, position, heads]"),
             (dict(which="all"), "you replaced every head of the layer: replace only the heads in `heads`, "
                                 "output[:, position, heads]")]
    for kwargs, message in slips:
        if near(_resample_variant(model, tokens, source, layer, heads, position, **kwargs)):
            return message
    if near(_resample_variant(model, tokens, source, 1 - layer, heads, position)):
        return (f"you replaced layer {1 - layer}'s heads, not layer {layer}'s: hook "
                "model.blocks[layer].attn.hook_z")
    return None


@exercise("08.6", "hold a module's output at its value in another run")
def _check_hold_output(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`hold_output`), not {kind_of(answer)}")
    model = _model()
    clean, corrupted = clean_and_corrupted()
    cache = clean_cache_of(model, clean, ["blocks.1.mlp"])
    cache.update(clean_cache_of(model, second_corruption(), ["blocks.0.hook_resid_post"]))
    mlp, resid = cache["blocks.1.mlp"], cache["blocks.0.hook_resid_post"]
    hooks = []
    for value in (mlp, resid):
        hook = answer(value)
        if not callable(hook):
            return Outcome(False, f"hold_output(value) returned {kind_of(hook)}: return a forward hook, a function "
                                  "of (module, args, output)")
        hooks.append(hook)

    def run(pairs):
        handles = [model.get_submodule(name).register_forward_hook(hook) for name, hook in pairs]
        try:
            with torch.no_grad():
                return model(corrupted)
        finally:
            for handle in handles:
                handle.remove()

    cases = [([("blocks.1.mlp", hooks[0])], "MLP1 held at the clean run's output, on the corrupted run"),
             ([("blocks.1.mlp", hooks[0]), ("blocks.0.hook_resid_post", hooks[1])],
              "MLP1 and blocks.0.hook_resid_post held together, at values from two different runs")]
    for pairs, what in cases:
        try:
            got = run(pairs)
        except Exception as e:  # the student's hook may raise anything
            return Outcome(False, f"{what}: your hook raised {type(e).__name__}: {e}")
        want = run([(name, hold_output(cache[name])) for name, _ in pairs])
        if torch.allclose(got, want, atol=1e-5):
            continue
        with torch.no_grad():
            plain = model(corrupted)
        if torch.allclose(got, plain, atol=1e-5):
            return Outcome(False, f"{what}: the logits are the corrupted run's own, as if nothing were held: your "
                                  "hook must return the value, which then replaces the module's output")
        if torch.allclose(got, run([(n, hold_output(resid)) for n, _ in pairs]), atol=1e-5):
            return Outcome(False, f"{what}: your hook returned the value of the last call to hold_output, not its "
                                  "own (the checker made two hooks, for two modules). Each hook must keep its own "
                                  "value: return a function defined inside hold_output, which sees that call's value")
        return Outcome(False, f"{what}: logit difference {logit_diff(got):+.2f}, want {logit_diff(want):+.2f}: "
                              "return the value itself, in place of the output")
    return Outcome(True, "the held module gives the value from the other run, one hook or two, each with its own value")


@exercise("08.7", "resample ablation: heads' outputs replaced by their values in a run on other tokens")
def _check_resample(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`resample_ablation`), not {kind_of(answer)}")
    model = _model()
    clean = clean_and_corrupted()[0]
    others = torch.cat([second_corruption(), other_pair()[0]])
    for tokens, source, layer, heads, position, what in [
            (clean, with_20_at_2(), 0, [0, 1, 2, 3], CHANGED, "layer 0's four heads at position 3"),
            (induction_pair(), others, 1, [0, 2], Q, "heads 0 and 2 of layer 1 at the query, a batch of two"),
            (clean, second_corruption(), 0, [1], 1, "layer 0's head 1 at position 1")]:
        try:
            got = answer(model, tokens, source, layer, heads, position)
        finally:
            leftover = [n for n, mod in model.named_modules() if mod._forward_hooks]
            for _, mod in model.named_modules():
                mod._forward_hooks.clear()
        if leftover:
            return Outcome(False, f"a forward hook is still registered on {leftover[0]!r} after your run: remove "
                                  "each handle in a finally block")
        if not isinstance(got, torch.Tensor):
            return Outcome(False, f"resample_ablation returned {kind_of(got)}: return the logits of the run on "
                                  "`tokens`, the tensor model(tokens) gives")
        want = resample_ablation(model, tokens, source, layer, heads, position)
        if got.shape != want.shape:
            return Outcome(False, f"{what}: your logits have shape {tuple(got.shape)}, the model's "
                                  f"{tuple(want.shape)}: return the logits of the run on `tokens`")
        if not torch.allclose(got.detach().float(), want, atol=1e-4):
            slip = _resample_slip(model, got.detach().float(), tokens, source, layer, heads, position)
            return Outcome(False, f"{what}: " + (slip or "your logits differ from the resampled run's: replace "
                                                 "output[:, position, heads] of hook_z by the same entries of its "
                                                 "output in a run on `source`"))
    return Outcome(True, "the same logits as the resampled run, for all heads and for some, at position 3, at the "
                         "query and at position 1, on one run and a batch of two, and no hook left behind.")


@exercise("08.8", "steer with a direction added in a forward hook")
def _check_steering(answer) -> Outcome:
    model = _model()
    direction = steering_direction(model)
    corrupted = torch.cat([clean_and_corrupted()[1], second_corruption()])  # a batch of two sequences
    cases = [((direction, p, s), "blocks.0.hook_resid_post", corrupted, steering_hook(direction, p, s),
              f"scale {s} at position {p}") for p, s in [(CHANGED, 1.0), (CHANGED, 0.5), (CHANGED, 2.0), (Q, -1.0)]]
    edited: list[bool] = []
    try:
        failed = _compare_runs(answer, "steering_hook", cases, edited)
    except IndexError as e:  # output[position]: the first axis is the batch
        return Outcome(False, f"your hook raised IndexError ({e}): the output is (batch, position, d_model); "
                              "index output[:, position], the position of every sequence")
    if failed is not None:
        out = _probe(answer, (torch.ones(64), 2, 1.0), torch.ones(1, 16, 64))
        if isinstance(out, torch.Tensor) and out.shape == (1, 16, 64):
            if (out[0, 2] == 2).all() and (out[0] == 2).all(-1).sum() > 1:
                where = "from the position onward" if (out[0, :2] == 1).all() else "at every position"
                return Outcome(False, f"your hook added the direction {where}: add it only at output[:, position]")
            if torch.allclose(out[0, 2], torch.full((64,), 1.125)):  # ones(64) / its norm 8, added
                return Outcome(False, "you normalised the direction: add it as given (scale × direction), without "
                                      "dividing by its norm")
            if not (out[0, 2] == 2).all():
                return Outcome(False, "at the position asked, the output is not output + scale * direction: add "
                                      "to the output there (replacing or multiplying it is not steering)")
        return failed
    return Outcome(True, "the same logits as the direction added at the scale and position asked, four cases, "
                         "on a batch of two." + (STEER_IN_PLACE if edited else ""))


__all__ = [
    "B2",
    "B3",
    "CHANGED",
    "CHANGED2",
    "POINTS",
    "A",
    "B",
    "Q",
    "ablation_hook",
    "ablation_scores",
    "clean_and_corrupted",
    "clean_cache",
    "clean_cache_of",
    "head_scores",
    "hold_ln_scale",
    "hold_output",
    "induction_pair",
    "layer_1_key",
    "logit_diff",
    "logit_diff_2",
    "mean_z",
    "other_pair",
    "pair_metric",
    "patch_hook",
    "patched_diff",
    "patching_sweep",
    "predicted",
    "problem",
    "random_runs",
    "record_patterns",
    "resample_ablation",
    "resampled_answers",
    "resid_post_0_restores",
    "run_hooked",
    "run_with_hooks",
    "runs_with_17_at_3",
    "second_corruption",
    "single_and_joint",
    "steered_answer",
    "steered_normalised",
    "steered_others",
    "steering_direction",
    "steering_hook",
    "stripe_score",
    "third_corruption",
    "third_patched",
]
