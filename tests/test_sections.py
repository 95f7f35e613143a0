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
