"""Old name of ``hooklab.backprop.losses``, kept until the notebooks import from there."""

from .backprop.losses import *  # noqa: F403
