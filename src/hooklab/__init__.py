"""hooklab: the helper package of the Hook Lab course on PyTorch hooks."""

from .course import environment_report, setup
from .layers import UnknownLayerError, get_layer, layer_names, leaf_names, select_layers
from .record import NoGradientError, Record, Recording, StaleRecordError, record

__version__ = "0.1.0"

__all__ = [
    "NoGradientError",
    "Record",
    "Recording",
    "StaleRecordError",
    "UnknownLayerError",
    "environment_report",
    "get_layer",
    "layer_names",
    "leaf_names",
    "record",
    "select_layers",
    "setup",
]
