"""``make grade`` (tools/grade.py): a student's notebook is run in a fresh kernel and every
exercise of that notebook gets a verdict, including the ones whose check never ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import grade  # noqa: E402

STUDENT = [
    "from hooklab.exercises import check",
    # 00.1: a counter that never registers its hook
    "def make_counter(module):\n    return [], None\n\ncheck('00.1', make_counter)",
    "raise ValueError('a typo in the student notebook')",
    # 00.2: the stub, untouched
    "def run_with_hook(module, hook, x):\n    raise NotImplementedError\n\ncheck('00.2', run_with_hook)",
    # 00.3: the cell was deleted
]


def test_a_student_notebook_and_the_worked_answers_are_graded(tmp_path, capsys):
    student = tmp_path / "00_start_here.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in STUDENT])
    nbformat.write(nb, student)
    before = student.read_text()
    answers = ROOT / "notebooks" / "solutions" / "00_start_here_solutions.ipynb"
    out = tmp_path / "grades.json"

    assert grade.main([str(student), str(answers), "--json", str(out)]) == 0

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    verdicts = {id: r["verdict"] for id, r in results[str(student)]["exercises"].items()}
    assert verdicts == {"00.1": "failed", "00.2": "not solved yet", "00.3": "not checked"}
    assert results[str(student)]["passed"] == 0
    assert results[str(student)]["errors"] == ["cell 3: ValueError: a typo in the student notebook"]
    assert f"{student}: 0 of 3 passed" in printed
    assert "its check(...) line did not run" in printed
    assert results[str(answers)]["passed"] == 3, results[str(answers)]
    assert results[str(answers)]["errors"] == []
    assert student.read_text() == before  # the student's file is not changed
