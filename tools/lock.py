"""The course's lock file and its two copies (``make lock``).

``requirements.txt`` names the direct dependencies, each at an exact version; ``requirements.lock``
pins every package they pull in too, so that an install in week 10 is the one of week 1. ``make
env`` installs the lock. This script regenerates it with uv (``uv pip compile --universal``: one
file for Linux, macOS and Windows, with environment markers where a package is only needed on one
of them, e.g. the CUDA libraries torch's Linux wheels depend on), then writes the same pins into
``environment.yml`` (conda users) and ``binder/requirements.txt`` (repo2docker: Binder and
JupyterHub images). ``tests/test_environment.py`` checks that the three agree.

    make lock                                   # after editing requirements.txt
    python tools/lock.py --uv /path/to/uv       # the same, with a uv you have
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
CONDA = ROOT / "environment.yml"
BINDER = ROOT / "binder" / "requirements.txt"
COMPILE = ["pip", "compile", "requirements.txt", "--universal", "--python-version", "3.11", "-o", LOCK.name]

CONDA_HEAD = """\
# For conda users: `conda env create -f environment.yml && conda activate hooklab`, then
# `pip install --no-deps -e .` and `python tools/install_kernel.py`. Written by `make lock` from
# requirements.lock (every package pinned); tests/test_environment.py keeps the two equal.
# Python 3.11 here; the same pins install on 3.12 and 3.13, which the course supports as well.
name: hooklab
channels:
  - conda-forge
dependencies:
  - python=3.11
  - pip
  - pip:
"""
BINDER_HEAD = """\
# repo2docker (Binder, JupyterHub images) installs these; binder/postBuild then installs hooklab
# and the "Hook Lab" kernel. Written by `make lock` from requirements.lock: do not edit. The image's
# Python is 3.11 (binder/runtime.txt); the same pins install on 3.12 and 3.13, supported as well.
"""


def pins(text: str) -> list[str]:
    """The requirement lines of a requirements file, comments and blank lines dropped."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def conda_pins(text: str) -> list[str]:
    """The entries of environment.yml's ``pip:`` list."""
    entries, inside = [], False
    for line in text.splitlines():
        if line.strip() == "- pip:":
            inside = True
        elif inside and line.strip().startswith("- "):
            entries.append(line.strip()[2:].strip().strip('"'))
        elif inside and line.strip() and not line.lstrip().startswith("#"):
            inside = False
    return entries


def write_copies() -> None:
    locked = pins(LOCK.read_text())
    CONDA.write_text(CONDA_HEAD + "".join(f'      - "{pin}"\n' for pin in locked))
    BINDER.parent.mkdir(exist_ok=True)
    BINDER.write_text(BINDER_HEAD + "".join(f"{pin}\n" for pin in locked))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uv", default="uv", help="the uv program to run (default: uv on PATH)")
    parser.add_argument("--copies-only", action="store_true", help="only rewrite the copies from the lock")
    args = parser.parse_args(argv)
    if not args.copies_only:
        try:
            subprocess.run([args.uv, *COMPILE], cwd=ROOT, check=True)
        except FileNotFoundError:
            parser.error(f"no uv at {args.uv!r}: run `make lock` (it installs uv in artifacts/) or pass --uv PATH")
        except subprocess.CalledProcessError as failed:
            print(f"uv could not resolve requirements.txt (exit {failed.returncode}); nothing was written")
            return 1
    write_copies()
    print(f"wrote {LOCK.name}, {CONDA.name} and {BINDER.relative_to(ROOT)} ({len(pins(LOCK.read_text()))} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
