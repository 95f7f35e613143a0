"""The setup every notebook runs first, and the environment report of notebook 00.

``setup()`` makes a notebook repeatable to the last printed digit: one thread, fixed seeds,
fixed print options, and a warnings policy under which a warning is shown every time, as one
line ``Category: message`` without file paths (so a re-run cell prints the same thing and
nothing depends on where the course was cloned).
"""

from __future__ import annotations

import importlib.metadata
import platform
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

__all__ = ["environment_report", "pinned_versions", "setup"]

#: packages whose versions notebook 00 reports and checks against requirements.txt
REPORTED = ("torch", "torchvision", "numpy", "matplotlib", "ipywidgets", "jupyterlab", "nbval")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"{category.__name__}: {message}", file=file or sys.stderr)


def setup(seed: int = 0, threads: int = 1) -> None:
    """Seed every generator, fix the thread count and the print and warnings policy."""
    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    warnings.resetwarnings()
    warnings.simplefilter("always")
    # Noise from the notebook machinery itself, not from the course's code.
    warnings.filterwarnings("ignore", module="jupyter_client")
    warnings.filterwarnings("ignore", module="ipykernel")
    warnings.showwarning = _show_warning
    try:
        import matplotlib

        matplotlib.rcParams.update({"figure.dpi": 80, "image.cmap": "viridis", "figure.max_open_warning": 0})
    except ImportError:  # pragma: no cover - matplotlib is a pinned dependency
        pass


def pinned_versions(requirements: Path | None = None) -> dict[str, str]:
    """The ``name==version`` pins of requirements.txt (the course's single list of pins)."""
    if requirements is None:
        requirements = Path(__file__).resolve().parents[2] / "requirements.txt"
    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def environment_report() -> dict[str, str]:
    """Installed versions of the packages the course leans on most, Python's minor version, threads."""
    report = {"python": ".".join(platform.python_version_tuple()[:2])}
    for name in REPORTED:
        report[name] = importlib.metadata.version(name)
    report["torch threads"] = str(torch.get_num_threads())
    return report
