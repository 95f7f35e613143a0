"""hooklab: the helper package of the Hook Lab course on PyTorch hooks."""

from .course import setup
from .hooks import Hooks
from .layers import UnknownLayerError, get_layer, layer_names, leaf_names, select_layers
from .recording import NoGradientError, Record, Recording, TrainModeWarning, record

__version__ = "0.1.0"

__all__ = [
    "Hooks",
    "NoGradientError",
    "Record",
    "Recording",
    "TrainModeWarning",
    "UnknownLayerError",
    "get_layer",
    "layer_names",
    "leaf_names",
    "record",
    "select_layers",
    "setup",
]
