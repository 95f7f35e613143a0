"""Backpropagation by hand (notebook 04): the formulas, the table that picks them, and the check.

* ``hooklab.backprop.layers``: one plain function per layer type, ``linear_backward(x, w, dout)
  -> (dx, dw, db)`` and so on, each beside its local derivative (all importable from here).
* ``hooklab.backprop.losses``: MSE and softmax cross-entropy, and their gradients.
* ``hooklab.backprop.table``: ``BACKWARD``, from layer type to its formula; add a type there to
  support it.
* ``hooklab.backprop.draw``: ``draw_222(net)``, the 2-2-2 network of notebook 04 as a graph.
* ``hooklab.backprop.verify``: ``verify(model, x, loss=...)`` recomputes every layer's gradients
  by hand from one ``hooklab.record`` pass and prints one exact / allclose / max-difference row per
  tensor; ``compare`` is one such row.
"""

from . import losses
from .draw import draw_222
from .layers import (
    adaptive_avg_pool2d_backward,
    avg_pool2d_backward,
    batch_norm_backward,
    conv2d_backward,
    dropout_backward,
    flatten_backward,
    layer_norm_backward,
    leaky_relu_backward,
    linear_backward,
    max_pool2d_backward,
    relu_backward,
    sigmoid_backward,
    tanh_backward,
)
from .table import BACKWARD, UnsupportedLayerError
from .verify import compare, verify

__all__ = [
    "BACKWARD",
    "UnsupportedLayerError",
    "adaptive_avg_pool2d_backward",
    "avg_pool2d_backward",
    "batch_norm_backward",
    "compare",
    "conv2d_backward",
    "draw_222",
    "dropout_backward",
    "flatten_backward",
    "layer_norm_backward",
    "leaky_relu_backward",
    "linear_backward",
    "losses",
    "max_pool2d_backward",
    "relu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "verify",
]
