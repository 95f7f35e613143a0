"""Re-execute notebooks top to bottom in a fresh kernel and save them: the only way outputs
are written. Run through ``make notebooks`` (all: every notebook under ``notebooks/``, the lessons,
the field guide in ``guide/`` and the worked answers in ``solutions/``) or
``make notebooks NB=path.ipynb`` (one), so that the kernel gets the same environment (threads,
warnings) as ``make test``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
from install_kernel import DISPLAY_NAME, NAME
from nbclient import NotebookClient
from traitlets.config import Config

ROOT = Path(__file__).resolve().parents[1]


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
    steady(nb, path.name)  # widget state included: a static viewer shows the widgets as they were
    nbformat.write(nb, path)
    return elapsed


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MODEL_REF = re.compile(r"^IPY_MODEL_(\w+)$")


def steady(nb, name: str) -> None:
    """Make a re-run with the same results save the same file, so that `git diff` after
    `make notebooks` shows only real changes: a cell's consecutive chunks of one stream (split
    wherever the kernel happened to flush) become one output, and widget views get an id made
    from the notebook's name and the output's place instead of a random one. The saved widget
    state (``nb.metadata.widgets``, what a static viewer such as nbconvert or GitHub draws in
    place of a live widget) follows: each model a view shows, and each model inside it (children,
    layout, style), is renamed from the view's id and its place in the view, in the order met;
    models no view shows are dropped."""
    renamed: dict[str, str] = {}
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
                new_id = uuid.uuid5(uuid.NAMESPACE_URL, f"hooklab/{name}/{index}/{place}").hex
                renamed.setdefault(view["model_id"], new_id)
                view["model_id"] = renamed[view["model_id"]]
    _steady_widget_state(nb, renamed)


def _steady_widget_state(nb, views: dict[str, str]) -> None:
    """Rename the models of ``nb``'s widget state as ``steady`` says; ``views``: old -> new view ids."""
    saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if saved is None:
        return
    state, renamed, waiting = saved["state"], {}, list(views.items())
    while waiting:  # depth first from each view, in the order of the notebook
        old, new = waiting.pop(0)
        if old in renamed or old not in state:
            continue
        renamed[old] = new
        inner = [m for m in _references(state[old]["state"]) if m not in renamed and m in state]
        waiting[:0] = [(m, uuid.uuid5(uuid.NAMESPACE_URL, f"{new}/{k}").hex) for k, m in enumerate(inner)]
    if not renamed:
        nb.metadata.pop("widgets")
        return
    saved["state"] = {renamed[old]: _renaming(state[old], renamed) for old in renamed}


def _references(value) -> list[str]:
    """Model ids that a widget's state refers to (``"IPY_MODEL_<id>"``), in order, each once."""
    if isinstance(value, str):
        found = MODEL_REF.match(value)
        return [found[1]] if found else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return list(dict.fromkeys(ref for item in items for ref in _references(item)))


def _renaming(value, renamed: dict[str, str]):
    if isinstance(value, str):
        found = MODEL_REF.match(value)
        return f"IPY_MODEL_{renamed.get(found[1], found[1])}" if found else value
    if isinstance(value, dict):
        return {key: _renaming(item, renamed) for key, item in value.items()}
    if isinstance(value, list):
        return [_renaming(item, renamed) for item in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="default: every notebook under notebooks/ (guide/ and solutions/ too)")
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
