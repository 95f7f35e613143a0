"""Old name of ``hooklab.backprop.verify``, kept until the notebooks import from there."""

from .backprop import UnsupportedLayerError, compare, verify  # noqa: F401
