"""Install the course's Jupyter kernel, "Hook Lab" (name ``hooklab``), into this Python environment.

Every notebook names this kernel in its metadata, so JupyterLab, a hub, VS Code, nbval and
``make notebooks`` all start the same Python with the same settings (``KERNEL_ENV``): one
thread for the math libraries, a fixed hash seed (sets print in a fixed order), and no
debugger file-validation warning. ``hooklab.setup()``, the first cell of every notebook, sets
the rest (seeds, torch's thread count, print options, warnings policy).

    python tools/install_kernel.py             # into sys.prefix (the venv `make env` builds)
    python tools/install_kernel.py --user      # into the user's Jupyter folder instead
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

NAME = "hooklab"
DISPLAY_NAME = "Hook Lab"
#: the environment of every course kernel
KERNEL_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
}


#: seconds a kernel keeps cancelling queued cells after one raised (ipykernel's default, 0, is a race)
STOP_WAIT = 1.0


def kernel_json(python: str = sys.executable) -> dict:
    return {
        # Run All stops at an error only for requests that reach the kernel before it aborts its queue; under
        # load the next cells' requests can arrive later and run (ipykernel's stop_on_error_timeout docstring)
        "argv": [python, "-Xfrozen_modules=off", "-m", "ipykernel_launcher",
                 f"--Kernel.stop_on_error_timeout={STOP_WAIT}", "-f", "{connection_file}"],
        "display_name": DISPLAY_NAME,
        "language": "python",
        "env": dict(KERNEL_ENV),
        "metadata": {"debugger": True},
    }


def install(user: bool = False) -> str:
    """Write the kernelspec and return the folder it was installed to."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "kernel.json").write_text(json.dumps(kernel_json(), indent=1) + "\n")
        return KernelSpecManager().install_kernel_spec(
            folder, NAME, user=user, prefix=None if user else sys.prefix
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", action="store_true", help="install for this user instead of into sys.prefix")
    args = parser.parse_args(argv)
    print(f"installed the {DISPLAY_NAME!r} kernel ({NAME}) in {install(args.user)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
