"""Exercises and predictions of notebook 08: hooks for interpretability on a small transformer.

The lesson's problem is one pair of runs of ``hooklab.transformer.trained_transformer()``: a clean
sequence (a run of seven tokens, repeated, then two random ones) whose query position ``Q`` predicts
``A`` = 19, and a corrupted copy with the 19 of the first run (position ``CHANGED``) replaced by ``B`` =
17, which predicts 17. ``logit_diff`` is logit[A] − logit[B] at the query. Predictions 08.a-08.d compute
their truth with torch. Exercises: record the attention patterns with forward hooks (08.1), a hook that
patches one position of a clean activation into the corrupted run (08.2), a hook that zero- or
mean-ablates one head (08.3), and a hook that adds a steering direction (08.4). ``record_patterns``,
``patch_hook``, ``ablation_hook`` and ``steering_hook`` are worked answers: the lesson goes on with them
while the student's own has not passed.
"""

from __future__ import annotations

import torch
from torch import nn

from . import Outcome, exercise, kind_of, prediction

RUN = [5, 12, 3, 19, 8, 14, 2]
Q, A, B, CHANGED = 9, 19, 17, 3  # the query position, the clean answer, the corrupted one, the changed position
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


def patch_hook(clean_value: torch.Tensor, position: int):
    """A forward hook that returns the output with ``clean_value`` at ``position`` (all else unchanged)."""
    def hook(module, args, output):
        output = output.clone()
        output[:, position] = clean_value[:, position]
        return output

    return hook


def ablation_hook(head: int, mean: torch.Tensor | None = None):
    """A forward hook for ``hook_z`` ``(N, pos, heads, d_head)`` that sets head ``head`` to 0, or to
    ``mean[:, head]`` (``mean``: ``(pos, heads, d_head)``, the average over a batch)."""
    def hook(module, args, output):
        output = output.clone()
        output[:, :, head] = 0.0 if mean is None else mean[:, head]
        return output

    return hook


def steering_hook(direction: torch.Tensor, position: int, scale: float):
    """A forward hook that adds ``scale · direction`` (``(d_model,)``) to the output at ``position``."""
    def hook(module, args, output):
        output = output.clone()
        output[:, position] += scale * direction
        return output

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


def clean_cache(model: nn.Module, points=POINTS) -> dict[str, torch.Tensor]:
    """The clean run's output of each module in ``points``."""
    from ..recording import record

    with record(model, list(points)) as rec, torch.no_grad():
        model(clean_and_corrupted()[0])
    return {point: rec[point].output for point in points}


def patched_diff(model: nn.Module, point: str, position: int, cache: dict | None = None) -> float:
    """The corrupted run's logit difference with the clean ``point`` patched in at ``position``."""
    clean = (cache or clean_cache(model, [point]))[point]
    return logit_diff(run_hooked(model, clean_and_corrupted()[1], point, patch_hook(clean, position)))


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
@prediction("08.a", "the key position that layer 1's head 0 attends to most from the query (position 9)",
            why="the token at 9 is a 3, whose earlier copy is at 2; the induction head attends to the position "
                "after that copy, 3, whose token (19) is the answer",
            wrong=[(2, "2 holds the earlier copy of the 3 itself; the head attends to the position after it, whose "
                       "token is the next one"),
                   (8, "attending to the previous token is layer 0's job; layer 1's head looks up the earlier copy"),
                   (9, "the query position itself holds 3, which tells nothing about what follows")])
def _induction_key() -> int:
    return record_patterns(_model(), clean_and_corrupted()[0])[1][0, 0, Q].argmax().item()


@prediction("08.b", "the position whose clean blocks.1.hook_resid_post restores the clean answer",
            why="the logits at 9 read only the last residual at 9, so only it can restore the answer; patching "
                "measures effect, not presence (the last residuals at 3 still differ, but nothing later reads them)",
            wrong=[(3, "that is where the change is, and where layer 0's residual holds it; by the end of layer 1 "
                       "the attention has moved it to the query")])
def _late_position() -> int:
    model = _model()
    cache = clean_cache(model, ["blocks.1.hook_resid_post"])
    diffs = [patched_diff(model, "blocks.1.hook_resid_post", p, cache) for p in range(Q + 1)]
    return max(range(Q + 1), key=diffs.__getitem__)


@prediction("08.c", "how many of layer 1's four heads, each zeroed on its own, leave the answer 19",
            why="each of the four heads is an induction head: with any one of them zeroed, the other three "
                "still copy the 19 (the heads are redundant)",
            wrong=[(0, "each head alone attends to position 3; zeroing one leaves three that do the same"),
                   (3, "none of them is needed alone: the other three make up for any one")])
def _heads_to_spare() -> int:
    model = _model()
    clean = clean_and_corrupted()[0]
    return sum(run_hooked(model, clean, "blocks.1.attn.hook_z", ablation_hook(h))[0, Q].argmax().item() == A
               for h in range(4))


STEER_SCALES = [0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4]


@prediction("08.d", "the first of the scales 0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4 at which the steered corrupted "
                    "run's logit difference is positive",
            why="at scale 0 it is the corrupted run (-10.9), at scale 1 section 2's patch (+9.3); even a straight "
                "line between them crosses zero near 0.54, so 0.5 is still negative and 0.75 the first positive",
            wrong=[(0.5, "a straight line from -10.9 at scale 0 to +9.3 at scale 1 is still just below zero at 0.5 "
                         "(-0.8), and the model is below it there"),
                   (1, "scale 1 is section 2's patch (+9.3), but the sign turns earlier: a straight line from -10.9 "
                       "crosses zero near 0.54")])
def _first_positive_scale() -> float:
    model = _model()
    direction = steering_direction(model)
    for scale in STEER_SCALES:
        hook = steering_hook(direction, CHANGED, scale)
        if logit_diff(run_hooked(model, clean_and_corrupted()[1], "blocks.0.hook_resid_post", hook)) > 0:
            return scale
    return float("nan")


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


def _watch(hook, edited: list):
    """``hook``, wrapped to note in ``edited`` when it changes the ``output`` it receives in place."""
    def wrapper(module, args, output):
        before = output.clone()
        result = hook(module, args, output)
        if not torch.equal(output, before):
            edited.append(True)
        return result

    return wrapper


def _compare_runs(answer, what: str, cases) -> Outcome | None:
    """``cases``: (args for answer, point, tokens, worked hook, description)."""
    model = _model()
    for args, point, tokens, worked, where in cases:
        hook = _hook_or_outcome(answer, what, *args)
        if isinstance(hook, Outcome):
            return hook
        edited: list[bool] = []
        got = run_hooked(model, tokens, point, _watch(hook, edited))
        if edited:
            return Outcome(False, f"{where}: your hook changed `output` in place; start from a copy "
                                  "(`output = output.clone()`) and return it. An in-place edit returning None "
                                  "works only when nothing else holds the tensor; it also changes every other "
                                  "holder: a cache recorded from the same run that shares its storage (a "
                                  "detach(), not a clone), or another hook on the module. This exercise asks "
                                  "for the safe form")
        if (leftover := [n for n, m in model.named_modules() if m._forward_hooks]):
            return Outcome(False, f"a forward hook is still registered on {leftover[0]!r}: the hook should not "
                                  "register hooks")
        want = run_hooked(model, tokens, point, worked)
        if torch.allclose(got, want, atol=1e-5):
            continue
        plain = run_hooked(model, tokens, point, lambda m, a, o: None)
        if torch.allclose(got, plain, atol=1e-5):
            return Outcome(False, f"{where}: the output is unchanged; your hook returned None, so the model "
                                  "kept its own output: a forward hook replaces it by returning the new value "
                                  "(return output at the end)")
        return Outcome(False, f"{where}: the logit difference is {logit_diff(got):+.2f}, want "
                              f"{logit_diff(want):+.2f}")
    return None


@exercise("08.1", "record the attention patterns with forward hooks")
def _check_patterns(answer) -> Outcome:
    if not callable(answer):
        return Outcome(False, f"pass your function itself (`record_patterns`), not {kind_of(answer)}")
    model = _model()
    tokens = torch.cat(clean_and_corrupted())
    got = answer(model, tokens)
    if (leftover := [n for n, m in model.named_modules() if m._forward_hooks]):
        return Outcome(False, f"a forward hook is still registered on {leftover[0]!r}: remove each handle "
                              "after the forward pass (in a finally block)")
    if not isinstance(got, list | tuple) or not all(isinstance(t, torch.Tensor) for t in got):
        return Outcome(False, f"record_patterns returned {kind_of(got)}: return a list of tensors, one a layer")
    want = record_patterns(model, tokens)
    if len(got) != len(want):
        return Outcome(False, f"{len(got)} patterns for a model of {len(want)} layers: register a hook on each "
                              "block's attn.hook_pattern")
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return Outcome(False, f"layer {layer}'s pattern has shape {tuple(g.shape)}, want {tuple(w.shape)} "
                                  "(N, heads, query, key): the hook's output, as it is")
        if g.requires_grad:
            return Outcome(False, f"layer {layer}'s pattern still requires grad: keep output.detach()")
        if not torch.allclose(g, w, atol=1e-6):
            return Outcome(False, f"layer {layer}'s pattern differs from the model's: record hook_pattern's output "
                                  "in order of the blocks")
    return Outcome(True, "both layers' patterns, (N, heads, query, key), and no hook left behind")


@exercise("08.2", "patch one position of a clean activation into the corrupted run")
def _check_patch(answer) -> Outcome:
    model = _model()
    cache = clean_cache(model)
    corrupted = clean_and_corrupted()[1]
    cases = [((cache[point], position), point, corrupted, patch_hook(cache[point], position),
              f"patching {point} at position {position}")
             for point, position in [("hook_embed", CHANGED), ("blocks.0.hook_resid_post", 5),
                                     ("blocks.1.hook_resid_post", Q), ("blocks.0.hook_resid_post", CHANGED)]]
    two = torch.cat([cache["blocks.0.hook_resid_post"]] * 2)  # a batch of two: every item must be patched
    cases.append(((two, CHANGED), "blocks.0.hook_resid_post", torch.cat([corrupted] * 2),
                  patch_hook(two, CHANGED), f"patching blocks.0.hook_resid_post at position {CHANGED} in a batch of 2"))
    if (failed := _compare_runs(answer, "patch_hook", cases)) is not None:
        out = _probe(answer, (cache["hook_embed"], 5), torch.zeros(1, 16, 64))
        both = _probe(answer, (torch.ones(2, 16, 64), 5), torch.zeros(2, 16, 64))
        if isinstance(both, torch.Tensor) and both.shape == (2, 16, 64) and (both[1] == 0).all() \
                and (both[0] != 0).any():
            return Outcome(False, "in a batch of 2, your hook patched only the first sequence: index "
                                  "output[:, position], every item of the batch, not output[0, position]")
        if isinstance(out, torch.Tensor) and out.shape == (1, 16, 64):
            changed = (out != 0).any(-1)[0].nonzero().flatten().tolist()
            if len(changed) > 1:
                return Outcome(False, f"your hook changed positions {changed}, not only position 5: set "
                                      "output[:, position], the positions are the second axis")
        return failed
    return Outcome(True, "the same logits as a clean value patched at one position, for four hook points "
                         "and a batch of 2")


@exercise("08.3", "zero- or mean-ablate one attention head")
def _check_ablation(answer) -> Outcome:
    clean = clean_and_corrupted()[0]
    mean = mean_z(_model(), 64)
    cases = [((h, m), "blocks.1.attn.hook_z", clean, ablation_hook(h, m), f"{'mean' if m is not None else 'zero'}-"
              f"ablating head {h}") for h, m in [(0, None), (2, None), (0, mean), (3, mean)]]
    if (failed := _compare_runs(answer, "ablation_hook", cases)) is not None:
        out = _probe(answer, (1, None), torch.ones(1, 16, 4, 16))
        if isinstance(out, torch.Tensor) and out.shape == (1, 16, 4, 16):
            heads = (out == 0).all(-1).all(1)[0].nonzero().flatten().tolist()
            if heads != [1] and (out == 0).any():
                return Outcome(False, f"zero-ablating head 1 zeroed {'heads ' + str(heads) if heads else 'positions'}"
                                      ": hook_z is (N, position, head, d_head), so set output[:, :, head]")
        return failed
    return Outcome(True, "zero and mean ablation of single heads give the same logits as the worked hook")


@exercise("08.4", "steer with a direction added in a forward hook")
def _check_steering(answer) -> Outcome:
    model = _model()
    direction = steering_direction(model)
    corrupted = clean_and_corrupted()[1]
    cases = [((direction, p, s), "blocks.0.hook_resid_post", corrupted, steering_hook(direction, p, s),
              f"scale {s} at position {p}") for p, s in [(CHANGED, 1.0), (CHANGED, 0.5), (CHANGED, 2.0), (Q, -1.0)]]
    if (failed := _compare_runs(answer, "steering_hook", cases)) is not None:
        out = _probe(answer, (torch.ones(64), 2, 1.0), torch.ones(1, 16, 64))
        if isinstance(out, torch.Tensor) and out.shape == (1, 16, 64):
            if (out[0, 2] == 2).all() and (out[0] == 2).all(-1).sum() > 1:
                return Outcome(False, "your hook added the direction at every position: add it only at "
                                      "output[:, position]")
            if not (out[0, 2] == 2).all():
                return Outcome(False, "at the position asked, the output is not output + scale * direction: add "
                                      "to the output there (replacing or multiplying it is not steering)")
        return failed
    return Outcome(True, "the same logits as the direction added at the scale and position asked, four cases")


__all__ = [
    "CHANGED",
    "POINTS",
    "STEER_SCALES",
    "A",
    "B",
    "Q",
    "ablation_hook",
    "clean_and_corrupted",
    "clean_cache",
    "logit_diff",
    "mean_z",
    "patch_hook",
    "patched_diff",
    "problem",
    "record_patterns",
    "run_hooked",
    "steering_direction",
    "steering_hook",
]
