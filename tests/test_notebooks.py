"""The notebooks themselves: stored fully executed, with few unchecked cells, each explained,
errors only where a cell says it expects one, and an nbval run that really catches a wrong digit."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ID.get)
def test_setup_cell_comes_first_and_no_machine_paths(path):
    first = "".join(code_cells(path)[0]["source"])
    assert "hooklab.setup()" in first, "the first code cell must call hooklab.setup()"
    text = path.read_text()
    for pattern in (r"/work/", r"/root/", r"/home/", r"/tmp/[A-Za-z0-9_.-]+/"):
        assert not re.search(pattern, text), f"machine path matching {pattern!r}"


def _nbval(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), str(path)],
        capture_output=True, text=True, cwd=path.parent, timeout=600,
    )


def test_nbval_fails_when_one_printed_digit_changes(tmp_path):
    """Proof that the notebooks' stored outputs are really compared: change one digit, and exactly
    that cell fails (every other cell of the copy passes, so nothing else about the copy differs)."""
    source = ROOT / "notebooks" / "00_start_here.ipynb"
    copy = tmp_path / "copy.ipynb"
    shutil.copy(source, copy)

    nb = json.loads(copy.read_text())
    for cell in nb["cells"]:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("name") == "stdout")
        if cell["cell_type"] == "code" and "mean" in text and re.search(r"\d\.\d{4}", text):
            for output in cell["outputs"]:
                lines = "".join(output["text"])
                number = re.search(r"\d\.\d{4}", lines).group()
                changed = number[:-1] + str((int(number[-1]) + 1) % 10)
                output["text"] = lines.replace(number, changed, 1)
            break
    else:
        pytest.fail("no printed mean found to change")
    copy.write_text(json.dumps(nb))
    result = _nbval(copy)
    assert result.returncode != 0
    assert re.search(r"^1 failed, \d+ passed", result.stdout, re.M), result.stdout[-2000:]
    assert changed in result.stdout


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
