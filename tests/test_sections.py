"""Every numbered section of a lesson or guide notebook runs from the setup cells alone.

A student may open a notebook at any section: the cells before ``## 1.`` (title, the problem,
setup) and the section's own cells must be enough. For each section the test clears the
kernel's namespace (``%reset -f``, as a fresh kernel has it), runs the setup cells again, then
the section: a name defined only in another section fails here with ``NameError``. One kernel
per notebook, so that importing torch is paid once. Cells tagged ``raises-exception`` may raise.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from test_notebook_shape import GUIDES, LESSONS, sections

ROOT = Path(__file__).resolve().parents[1]


def _section_run(path: Path) -> tuple[nbformat.NotebookNode, list[tuple[str, int]]]:
    """One notebook that runs every section after a reset and the setup cells, and where each of
    its cells came from: (section heading, cell index in the original)."""
    nb = nbformat.read(path, as_version=4)
    setup, parts = sections(nb.cells)
    run = nbformat.v4.new_notebook(metadata=nb.metadata)
    origin = []
    for heading, indices in parts.items():
        run.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        origin.append((heading, -1))
        for i in setup + indices:
            if nb.cells[i].cell_type == "code":
                run.cells.append(nbformat.v4.new_code_cell(nb.cells[i].source, metadata=nb.cells[i].metadata))
                origin.append((heading, i))
    return run, origin


@pytest.mark.parametrize("path", LESSONS + GUIDES, ids=lambda p: p.stem)
def test_each_section_runs_from_the_setup_cells_alone(path):
    from run_notebooks import execute

    run, origin = _section_run(path)
    execute(run, path, timeout=600, allow_errors=True)
    failures = []
    for cell, (heading, index) in zip(run.cells, origin, strict=True):
        if "raises-exception" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                failures.append(f"{heading!r}, cell {index}: {out.ename}: {out.evalue}")
    assert not failures, "sections that need names from elsewhere (define them in the section, or in setup):\n" + \
        "\n".join(failures)


def test_04_sections_run_on_their_own_with_the_worked_answers(tmp_path):
    """Lesson 04's stored exercise cells raise NotImplementedError before they reach a name from an
    earlier section (04.11's body calls 04.4–04.9's functions), so the test above cannot see such a
    name missing. Here each exercise cell holds the worked answers instead, as a student's would
    once written: every check in a section run from setup alone must pass."""
    import re

    from run_notebooks import execute

    lesson = ROOT / "notebooks" / "04_backprop_by_hand.ipynb"
    worked, pending = {}, []  # exercise id -> the worked answers' code up to its check (not the demos after it)
    for cell in nbformat.read(ROOT / "notebooks" / "solutions" / "04_backprop_by_hand_solutions.ipynb", 4).cells:
        if cell.cell_type == "code":
            answer = re.match(r'(?s).*?check\("(04\.\d+)"[^\n]*', cell.source)
            if answer or re.search(r"^(def|class) ", cell.source, re.MULTILINE):  # not a demo cell after a check
                pending.append(answer.group() if answer else cell.source)
            if answer:
                worked[answer.group(1)], pending = pending, []
    nb = nbformat.read(lesson, as_version=4)
    for cell in nb.cells:
        ids = re.findall(r'check\("(04\.\d+)"', cell.source) if "NotImplementedError" in cell.source else []
        if ids:
            cell.source = "\n\n".join(source for ex in ids for source in worked[ex])
    path = tmp_path / lesson.name
    nbformat.write(nb, path)
    run, origin = _section_run(path)
    for cell in run.cells:  # a fresh kernel also forgets which checks passed
        if cell.source == "%reset -f":
            cell.source += "\nfrom hooklab.exercises import _CHECKED\n_CHECKED.clear()\ndel _CHECKED"
    execute(run, lesson, timeout=900, allow_errors=True)
    failures = []
    for cell, (heading, index) in zip(run.cells, origin, strict=True):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.output_type == "stream" else ""
            if out.output_type == "error" or any(line.startswith("Exercise 04.") and "): passed" not in line
                                                 for line in text.splitlines()):
                failures.append(f"{heading!r}, cell {index} {out.get('ename', '')} {out.get('evalue', '')}{text[:200]}")
    assert not failures, "with the worked answers, sections that fail on their own:\n" + "\n".join(failures)
