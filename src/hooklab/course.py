"""The setup every notebook runs first, and the course's pins.

``setup()`` makes a notebook repeatable: one thread, fixed seeds,
fixed print options, and a warnings policy under which a warning is shown every time, as one
line ``Category: message`` without file paths (so a re-run cell prints the same thing and
nothing depends on where the course was cloned). It also asks the C allocator to keep freed
memory for reuse (``reuse_freed_memory``), which makes recording activations cheap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

__all__ = ["setup"]

def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"{category.__name__}: {message}", file=file or sys.stderr)


def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory in the process instead of handing it back to the OS.

    Recording activations keeps many tensors alive at once; when the recording is dropped, glibc
    returns that memory to the operating system, and the next recording pays again for every
    page it touches (about 20 % of a resnet18 forward pass, measured by ``make bench``). With a
    high mmap threshold and trim threshold, freed memory is reused by the next pass instead.
    Returns False where this is not glibc (nothing changes there). Process-wide; cannot be undone.
    """
    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)) and bool(mallopt(m_trim_threshold, 512 * 2**20))


def setup(seed: int = 0, threads: int | None = None) -> None:
    """Seed every generator, fix the thread count, the print and warnings policy, reuse freed memory.

    ``threads`` defaults to the environment variable ``HOOKLAB_THREADS``, else 1. The printed
    numbers do not depend on it beyond their last printed digits (``make test`` runs the notebooks
    on 1 and on 2 threads).
    """
    reuse_freed_memory()
    torch.set_num_threads(threads or int(os.environ.get("HOOKLAB_THREADS", "1")))
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
