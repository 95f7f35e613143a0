"""The notebooks themselves (every one under notebooks/: the lessons, the field guide in guide/ and
the worked answers in solutions/): stored fully executed, with few unchecked cells, each
explained, errors only where a cell says it expects one, and an nbval run that really catches a
wrong digit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
UNCHECKED_MARKERS = re.compile(r"^\s*#\s*NBVAL_(IGNORE_OUTPUT|SKIP)\s*$", re.MULTILINE)
UNCHECKED_TAGS = {"nbval-ignore-output", "nbval-skip"}
#: Most cells a notebook may leave unchecked. Each such cell explains itself in a comment line
#: "# why unchecked: ..." right after the marker (widgets store their output inside the widget).
MAX_UNCHECKED_PER_NOTEBOOK = 3
ID = {p: str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS}


def code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def test_there_are_notebooks():
    assert (ROOT / "notebooks" / "00_start_here.ipynb") in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ID.get)
def test_every_code_cell_is_executed_in_order(path):
    counts = [c["execution_count"] for c in code_cells(path)]
    assert None not in counts, f"{counts.count(None)} cell(s) never executed: nbval would not compare them"
    assert counts == list(range(1, len(counts) + 1)), "re-run it: `make notebooks NB=...` (fresh kernel, in order)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ID.get)
def test_unchecked_cells_are_few_and_explained(path):
    unchecked = []
    for cell in code_cells(path):
        source = "".join(cell["source"])
        if UNCHECKED_MARKERS.search(source) or UNCHECKED_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            unchecked.append(source)
            assert re.search(r"NBVAL_(IGNORE_OUTPUT|SKIP)\s*\n\s*# why unchecked: \S", source), (
                "an unchecked cell needs a '# why unchecked: <reason>' line right after its marker:\n" + source
            )
    assert len(unchecked) <= MAX_UNCHECKED_PER_NOTEBOOK


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ID.get)
def test_errors_only_in_cells_tagged_raises_exception(path):
    for cell in code_cells(path):
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        tags = set(cell.get("metadata", {}).get("tags", []))
        if errors:
            assert "raises-exception" in tags, (
                "a cell that shows an error must carry the 'raises-exception' tag, or Run All in "
                "JupyterLab stops there:\n" + "".join(cell["source"])
            )
        elif "raises-exception" in tags:
            pytest.fail("tagged raises-exception but raised nothing:\n" + "".join(cell["source"]))


#: A lesson shows its problem within its first five cells, before its setup cell (test_notebook_shape.py).
PROBLEM_WITHIN = 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ID.get)
def test_setup_cell_comes_first_and_no_machine_paths(path):
    """The first code cell calls hooklab.setup(); only a lesson may show its problem first."""
    cells = json.loads(path.read_text())["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    setup = next((i for i in code if "hooklab.setup()" in "".join(cells[i]["source"])), None)
    assert setup is not None, "no code cell calls hooklab.setup()"
    problem = [i for i in code if i < setup]  # a lesson's problem, shown before its setup cell
    lesson = path.parent == ROOT / "notebooks"
    assert not problem or (lesson and problem[-1] < PROBLEM_WITHIN), \
        "the first code cell must call hooklab.setup() (a lesson may show its problem first, in its first five cells)"
    text = path.read_text()
    for pattern in (r"/work/", r"/root/", r"/home/", r"/tmp/[A-Za-z0-9_.-]+/"):
        assert not re.search(pattern, text), f"machine path matching {pattern!r}"


def _nbval(path: Path) -> subprocess.CompletedProcess:
    """nbval on one notebook as `make check` runs it: the repository's conftest.py beside it loads
    the number comparator from tools/, as it does for the course's notebooks."""
    shutil.copy(ROOT / "conftest.py", path.parent / "conftest.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval",
         "--nbval-kernel-name", "hooklab", "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"),
         str(path)],
        capture_output=True, text=True, cwd=path.parent, timeout=600, env=env,
    )  # fmt: skip


#: a small notebook of real torch results, and for each cell how a tamper changes its stored output
TAMPERED = [
    ("import torch\ntorch.manual_seed(0)\nx = torch.randn(4, 3)", None),
    ('print(f"sum of squares {x.pow(2).sum():.4f}")', ("a digit off", r"(\d)(\d\.\d{4})", r"\g<1>9\2")),
    ('print(f"minus the norm {-x.norm():.4f}")', ("a flipped sign", r"-(\d)", r"\1")),
    ('print("positives:", int((x > 0).sum()))', ("a changed integer", r"(\d+)$", lambda m: str(int(m[1]) + 1))),
    ('print("activation:", torch.nn.ReLU())', ("a changed word", r"ReLU", "GELU")),
    ("x.shape", ("a changed shape", r"4, 3", "4, 4")),
    ('print(f"mean {x.mean():.4f}")', ("last digit: within tolerance", r"(\d)$", lambda m: str((int(m[1]) + 1) % 10))),
]  # fmt: skip


def test_nbval_fails_on_each_kind_of_tampered_output_and_passes_the_rest(tmp_path):
    """Proof that stored outputs are really compared, numbers to their printed precision: a notebook
    of real torch results is saved by running it, then five of its outputs are changed, one kind
    of change each, and one is changed in its last digit. Exactly the five cells fail (each named
    with the number that differs), and the last-digit change passes like the untouched cells."""
    import nbformat
    from run_notebooks import execute

    path = tmp_path / "tampered.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source, _ in TAMPERED])
    execute(nb, path, timeout=120)
    must_fail = set()
    for index, (cell, (_, tamper)) in enumerate(zip(nb.cells, TAMPERED, strict=True)):
        if tamper is None:
            continue
        kind, pattern, change = tamper
        [output] = cell.outputs
        box, key = (output, "text") if "text" in output else (output.data, "text/plain")
        box[key], count = re.subn(pattern, change, box[key], count=1, flags=re.M)
        assert count == 1, f"{kind}: nothing to change in {box[key]!r}"
        if "within tolerance" not in kind:
            must_fail.add(str(index))
    nbformat.write(nb, path)
    result = _nbval(path)
    failed = set(re.findall(r"^FAILED \S+::Cell (\d+)", result.stdout, re.M))
    assert failed == must_fail, result.stdout[-4000:]
    assert re.search(r"^5 failed, 2 passed", result.stdout, re.M), result.stdout[-4000:]
    stored = "".join(nb.cells[1].outputs[0]["text"]).split()[-1]
    assert re.search(rf"Cell 1: expected {stored} \(±0\.\d+\), got \d+\.\d{{4}}", result.stdout), result.stdout[-4000:]


def test_saving_merges_stream_chunks_and_gives_widgets_steady_ids():
    import nbformat
    from run_notebooks import steady
    view = "application/vnd.jupyter.widget-view+json"

    def notebook(random_id: str):
        out = nbformat.v4
        cell = out.new_code_cell(
            "print(1)",
            outputs=[
                out.new_output("stream", name="stdout", text="a\n"),
                out.new_output("stream", name="stdout", text="b\n"),
                out.new_output("stream", name="stderr", text="warning\n"),
                out.new_output("stream", name="stdout", text="c\n"),
                out.new_output("display_data", data={view: {"model_id": random_id}, "text/plain": "w"}),
            ],
        )
        return out.new_notebook(cells=[out.new_markdown_cell("x"), cell])

    first, second = notebook("1b8a"), notebook("6a2d")
    steady(first, "00_start_here.ipynb")
    steady(second, "00_start_here.ipynb")
    outputs = first.cells[1].outputs
    assert [(o.output_type, o.get("name"), o.get("text")) for o in outputs[:3]] == [
        ("stream", "stdout", "a\nb\n"), ("stream", "stderr", "warning\n"), ("stream", "stdout", "c\n")
    ]  # fmt: skip
    assert outputs[3].data[view]["model_id"] == second.cells[1].outputs[3].data[view]["model_id"] != "1b8a"
    other = notebook("1b8a")
    steady(other, "05_explorers.ipynb")
    assert other.cells[1].outputs[3].data[view]["model_id"] != outputs[3].data[view]["model_id"]
