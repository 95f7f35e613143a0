"""Losses and their gradients by hand: where the gradient of a training step starts (notebook 04).

``backward()`` on a scalar loss starts from ``dloss = 1``; the loss's own local derivative
turns that into ``dpred``, the gradient that arrives at the model's output (and that a full
backward hook on the last layer receives as ``grad_output``).

* MSE, ``mean((pred − target)²)``: ``dpred = 2·(pred − target)/n`` (``n`` elements; ``sum``
  reduction drops the ``/n``).
* softmax + cross-entropy on logits ``z`` with target probabilities ``y`` (one-hot rows for
  class indices): ``dz = (softmax(z)·Σy − y)/N`` for a batch of ``N``, where ``Σy`` sums each
  row of ``y``. ``F.cross_entropy`` accepts any probabilities; when each row sums to 1 (class
  indices, proper distributions) this is the familiar ``(softmax(z) − y)/N``.
"""

from __future__ import annotations

import torch

__all__ = ["mse_backward", "mse_loss", "softmax_cross_entropy", "softmax_cross_entropy_backward"]


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")


def mse_loss(pred, target, reduction="mean"):
    """``mean`` (or ``sum``) of ``(pred − target)²``, written out."""
    _check_reduction(reduction)
    sq = (pred - target) ** 2
    return sq.mean() if reduction == "mean" else sq.sum()


def mse_backward(pred, target, dloss=1.0, reduction="mean"):
    """Gradient of ``mse_loss`` with respect to ``pred``."""
    _check_reduction(reduction)
    d = 2 * (pred - target) * dloss
    return d / pred.numel() if reduction == "mean" else d


def _target_probs(logits, target):
    if target.dtype in (torch.int64, torch.int32):
        return torch.zeros_like(logits).scatter_(1, target.reshape(-1, 1), 1.0)
    return target


def softmax_cross_entropy(logits, target, reduction="mean"):
    """Cross-entropy of ``softmax(logits)`` (N, classes) with class indices or probabilities."""
    _check_reduction(reduction)
    log_probs = logits - logits.logsumexp(dim=1, keepdim=True)
    per_row = -(_target_probs(logits, target) * log_probs).sum(dim=1)
    return per_row.mean() if reduction == "mean" else per_row.sum()


def softmax_cross_entropy_backward(logits, target, dloss=1.0, reduction="mean"):
    """Gradient of ``softmax_cross_entropy`` with respect to the logits:
    ``softmax·Σy − y`` for target probabilities ``y`` (``softmax − y`` when each row of ``y`` sums
    to 1, as for class indices), divided by the batch size for ``mean``."""
    _check_reduction(reduction)
    probs = _target_probs(logits, target)
    d = (logits.softmax(dim=1) * probs.sum(dim=1, keepdim=True) - probs) * dloss
    return d / logits.shape[0] if reduction == "mean" else d
