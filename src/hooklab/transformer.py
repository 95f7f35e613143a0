"""A small transformer with named places to hook, and the toy task it solves.

The task is **induction**: a run of 5 to ``HALF`` random tokens, all different, is repeated once, and
random tokens fill the sequence up to ``2·HALF``. In the repeat, each next token can be read off the
first run: find the earlier copy of the current token and say the token that followed it. The run's
length varies, so no fixed offset finds the copy. Two layers of attention are the classic way to do
it (Olsson et al., 2022, "In-context Learning and Induction Heads"): a head in layer 0 copies each
position's previous token into it, and a head in layer 1 looks for the position whose previous token
is the current one, and copies its token.

Every intermediate value passes through a ``HookPoint``, an ``nn.Identity`` with a name, so that a
forward hook can read or replace it: the token embedding (``hook_embed``) and the position embedding
(``hook_pos_embed``), the residual stream before and after each block, each
attention layer's pattern (``(N, heads, query, key)``) and its heads' outputs (``(N, pos, heads,
d_head)``), and each block's attention and MLP outputs. TransformerLens builds its models the same
way, with the same names.

``trained_transformer()`` loads the weights that ship with hooklab (``tools/train_transformer.py``
wrote them).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

__all__ = ["HALF", "VOCAB", "HookPoint", "TinyTransformer", "induction_accuracy", "induction_batch",
           "induction_mask", "trained_transformer"]

VOCAB = 24  # token 0 is never drawn: the tokens of a sequence are 1 … 23
HALF = 8  # a sequence is 2·HALF tokens: a run of 5 … HALF different tokens, the run again, random tokens
SHORTEST = 5


class HookPoint(nn.Identity):
    """Returns its input unchanged: a named place for a forward hook to read or replace a value. The model
    gives each its ``name``, its path in ``named_modules()`` (``"blocks.1.attn.hook_z"``)."""

    name: str = ""

    def layer(self) -> int:
        """The block this point belongs to (``blocks.1.…`` → 1); ``ValueError`` for points outside blocks."""
        parts = self.name.split(".")
        if len(parts) < 2 or parts[0] != "blocks":
            raise ValueError(f"{self.name!r} is not inside a block")
        return int(parts[1])


class Attention(nn.Module):
    """Causal multi-head self-attention whose pattern and per-head outputs pass through hook points."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d_head = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.hook_pattern = HookPoint()  # (N, heads, query position, key position), rows sum to 1
        self.hook_z = HookPoint()  # (N, position, heads, d_head): each head's output before `out`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, self.d_head).unbind(2)
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(self.d_head)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        pattern = self.hook_pattern(scores.masked_fill(future, float("-inf")).softmax(dim=-1))
        z = self.hook_z(torch.einsum("nhqk,nkhd->nqhd", pattern, v))
        return self.out(z.reshape(n, t, d))


class Block(nn.Module):
    """Pre-LayerNorm: x + attention(ln(x)), then + MLP(ln(x)); the residual stream through hook points."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1, self.attn = nn.LayerNorm(d_model), Attention(d_model, heads)
        self.hook_attn_out = HookPoint()
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.ln1(x)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))


class TinyTransformer(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and the unembedding: tokens
    ``(N, T)`` in, logits ``(N, T, VOCAB)`` out, the logits at position i predicting token i + 1."""

    def __init__(self, layers: int = 2, d_model: int = 64, heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = nn.Embedding(VOCAB, d_model)
            self.pos_embed = nn.Embedding(2 * HALF, d_model)
            self.hook_embed = HookPoint()  # the token embedding only, as in TransformerLens
            self.hook_pos_embed = HookPoint()  # the position embedding; their sum is blocks.0.hook_resid_pre
            self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
            self.ln_final = nn.LayerNorm(d_model)
            self.unembed = nn.Linear(d_model, VOCAB)
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
            got = f"{tuple(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"TinyTransformer expects tokens as a (N, T) tensor of int64, got {got}: "
                             "make them with induction_batch(n)")
        if tokens.shape[1] > 2 * HALF:
            raise ValueError(f"TinyTransformer reads at most {2 * HALF} tokens, got {tokens.shape[1]}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(positions))
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.ln_final(x))


def induction_batch(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` sequences ``(n, 2·HALF)`` of tokens 1 … VOCAB-1: a run of 5 … HALF different tokens, the same
    run again, then random tokens."""
    tokens = torch.randint(1, VOCAB, (n, 2 * HALF), generator=generator)
    lengths = torch.randint(SHORTEST, HALF + 1, (n,), generator=generator)
    runs = torch.rand(n, VOCAB - 1, generator=generator).argsort(dim=1)[:, :HALF] + 1
    for row, (run, length) in enumerate(zip(runs, lengths.tolist(), strict=True)):
        tokens[row, :length] = run[:length]
        tokens[row, length:2 * length] = run[:length]
    return tokens


def induction_mask(tokens: torch.Tensor) -> torch.Tensor:
    """Where the next token can be read off the run, ``(n, 2·HALF - 1)``: the positions of the repeat
    whose next token is still in the repeat (position i predicts token i + 1)."""
    t = tokens.shape[1]
    lengths = torch.tensor([next(length for length in range(SHORTEST, HALF + 1)
                                 if torch.equal(row[:length], row[length:2 * length])) for row in tokens])
    positions = torch.arange(t - 1)
    return (positions >= lengths[:, None]) & (positions < 2 * lengths[:, None] - 1)


def induction_accuracy(model: nn.Module, tokens: torch.Tensor) -> float:
    """The share of the predictable tokens (``induction_mask``) that the model predicts."""
    with torch.no_grad():
        predicted = model(tokens)[:, :-1].argmax(dim=-1)
    mask = induction_mask(tokens)
    return (predicted == tokens[:, 1:])[mask].float().mean().item()


def weights_path() -> Path:
    return Path(__file__).with_name("weights") / "tiny_transformer.pt"


def trained_transformer() -> TinyTransformer:
    """The ``TinyTransformer`` trained on the induction task by ``tools/train_transformer.py``, in eval mode."""
    model = TinyTransformer()
    model.load_state_dict(torch.load(weights_path(), weights_only=True))
    return model.eval()
