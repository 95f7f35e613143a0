"""Re-execute notebooks top to bottom in a fresh kernel and save them: the only way outputs
are written. Run through ``make notebooks`` (all) or ``make notebooks NB=path.ipynb`` (one),
so that the kernel gets the same environment (threads, warnings) as ``make test``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
from install_kernel import DISPLAY_NAME, KERNEL_ENV, NAME
from nbclient import NotebookClient
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]


def course_environment() -> dict[str, str]:
    """The environment of the course's kernel (``tools/install_kernel.py``): one thread, a fixed
    hash seed. Tests and ``make bench`` give it to their own process too."""
    return dict(KERNEL_ENV)


def execute(nb, path: Path, timeout: int, **options) -> None:
    """Run ``nb`` (read from ``path``) top to bottom in a fresh course kernel (``hooklab``) started
    in the notebook's folder. The kernel talks over local sockets in a
    temporary folder (not TCP, which makes it print a warning about unencrypted traffic)."""
    with tempfile.TemporaryDirectory(prefix="hooklab-kernel-") as sockets:
        ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        NotebookClient(nb, timeout=timeout, kernel_name=NAME, config=ipc,
                       resources={"metadata": {"path": str(path.parent)}}, **options).execute()  # fmt: skip


def run(path: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = {"name": NAME, "display_name": DISPLAY_NAME, "language": "python"}
    for cell in nb.cells:  # outputs and counts: the client replaces them in every cell it runs
        cell.metadata.pop("execution", None)
    start = time.perf_counter()
    execute(nb, path, timeout, record_timing=False)
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)  # widget state has random model ids; nbval ignores it anyway
    steady(nb, path.name)
    nbformat.write(nb, path)
    return elapsed


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def steady(nb, name: str) -> None:
    """Make a re-run with the same results save the same file, so that `git diff` after
    `make notebooks` shows only real changes: a cell's consecutive chunks of one stream (split
    wherever the kernel happened to flush) become one output, and widget views get an id made
    from the notebook's name and the output's place instead of a random one (their state is not
    saved, so nothing else refers to it)."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        merged = []
        for output in cell.outputs:
            last = merged[-1] if merged else None
            if output.output_type == "stream" and last is not None and last.output_type == "stream" \
                    and last.name == output.name:  # fmt: skip
                last.text += output.text
            else:
                merged.append(output)
        cell.outputs = merged
        for place, output in enumerate(merged):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None:
                view["model_id"] = uuid.uuid5(uuid.NAMESPACE_URL, f"hooklab/{name}/{index}/{place}").hex


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook under notebooks/")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").rglob("*.ipynb"))
    paths = [p for p in paths if ".ipynb_checkpoints" not in p.parts]
    for path in paths:
        print(f"executing {path.relative_to(ROOT) if path.is_absolute() else path} ...", flush=True)
        elapsed = run(path.resolve(), args.timeout)
        print(f"  saved ({elapsed:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
