"""How much memory a student's kernel needs: run each notebook top to bottom in a fresh course
kernel (as ``make notebooks`` does, without saving) and print the kernel's peak resident size.

    .venv/bin/python tools/kernel_memory.py notebooks/*.ipynb notebooks/guide/*.ipynb

A folder stands for every notebook below it (``notebooks``: the lessons, ``guide/`` and
``solutions/``).

Each notebook runs in a child process of its own, whose only child is the kernel: the child's
``RUSAGE_CHILDREN`` peak is the kernel's (and that of any process the kernel started and waited
for). README.md and BENCHMARKS.md quote the largest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ONE = """
import resource, sys, time
from pathlib import Path
import nbformat
from run_notebooks import execute
path = Path(sys.argv[1]).resolve()
start = time.perf_counter()
execute(nbformat.read(path, as_version=4), path, 600)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def measure(path: Path) -> dict:
    tools = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", ONE, str(path)], capture_output=True, text=True, cwd=tools)
    if done.returncode != 0:
        raise SystemExit(f"{path} did not run to the end:\n{done.stderr[-2000:]}")
    wall, kilobytes = done.stdout.split()[-2:]
    return {"notebook": str(path), "wall_s": round(float(wall), 1), "peak_rss_mb": round(int(kilobytes) / 1024)}


def notebooks(given: list[Path]) -> list[Path]:
    """The notebooks given, each folder replaced by every notebook below it, in order."""
    found = []
    for path in given:
        found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts) if path.is_dir() \
            else [path]  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks (.ipynb), or folders of them")
    args = parser.parse_args(argv)
    rows = []
    for path in notebooks(args.notebooks):
        rows.append(measure(path.resolve()))
        print(json.dumps(rows[-1]), flush=True)
    heaviest = max(rows, key=lambda row: row["peak_rss_mb"])
    print(f"heaviest: {heaviest['notebook']}, {heaviest['peak_rss_mb']} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
