"""``make grade`` (tools/grade.py): a student's notebook is run in a fresh kernel and every
exercise of that notebook gets a verdict, including the ones whose check never ran; a notebook
that loops forever, kills its kernel or sabotages the collection does not stop the batch.

Each notebook run starts a kernel (a few seconds), so the cases are batched into two grade.main
calls: one with the default timeout, one with a short timeout whose notebooks import nothing heavy
(importing torch alone can take longer than 5 s on a busy machine)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import grade  # tools/, on pytest's path (pyproject.toml)
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

STUDENT = [
    "from hooklab.exercises import check",
    # 00.1: a counter that never registers its hook
    "def make_counter(module):\n    return [], None\n\ncheck('00.1', make_counter)",
    "raise ValueError('a typo in the student notebook')",
    # 00.2: the stub, untouched
    "def run_with_hook(module, hook, x):\n    raise NotImplementedError\n\ncheck('00.2', run_with_hook)",
    # 00.3: the cell was deleted
]

# Notebook 01, which checks an exercise of notebook 00, then sabotages what the collection could use
# and calls a check of its own.
SABOTEUR = [
    "from hooklab.exercises import check",
    "def run_with_hook(module, hook, x):\n    raise NotImplementedError\n\ncheck('00.2', run_with_hook)",
    "print = lambda *args, **kwargs: None\njson = _json = _ex = str = repr = None",
    "def check(id, answer):\n    pass\n\ncheck('01.1', lambda *args: None)",
]

UNNUMBERED = [
    "from hooklab.exercises import check",
    "def run_with_hook(module, hook, x):\n    raise NotImplementedError\n\ncheck('00.2', run_with_hook)",
    "x_undefined_name + 1",
]


def write(path: Path, cells: list[str], markdown_first: bool = False) -> Path:
    cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if markdown_first:
        cells.insert(0, nbformat.v4.new_markdown_cell("# Exercises\nRun every cell."))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_students_notebooks_and_the_worked_answers_are_graded(tmp_path, capsys):
    student = write(tmp_path / "00_start_here.ipynb", STUDENT)
    before = student.read_text()
    answers = ROOT / "notebooks" / "solutions" / "00_start_here_solutions.ipynb"
    saboteur = write(tmp_path / "anna_01_tensor_hooks.ipynb", SABOTEUR)
    unnumbered = write(tmp_path / "homework.ipynb", UNNUMBERED)
    out, table = tmp_path / "grades.json", tmp_path / "grades.csv"
    paths = [str(p) for p in (student, answers, saboteur, unnumbered)]

    assert grade.main([*paths, "--json", str(out), "--csv", str(table), "--jobs", "2"]) == 0

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    # two at a time, reported in the order given
    assert [line.split(":")[0] for line in printed.splitlines() if not line.startswith(" ")] == paths
    assert list(results) == paths
    # every exercise of the notebook, checked or not
    verdicts = {id: r["verdict"] for id, r in results[str(student)]["exercises"].items()}
    assert verdicts == {"00.1": "failed", "00.2": "not solved yet"} | dict.fromkeys(ids("00")[2:], "not checked")
    assert results[str(student)]["passed"] == 0
    assert results[str(student)]["problems"] == [
        "error in cell 3 (raise ValueError('a typo in the student notebook')): ValueError: a typo in the student "
        "notebook"
    ]
    assert f"{student}: 0 of {len(ids('00'))} passed" in printed
    assert "no verdict recorded: the check(...) line did not run" in printed
    assert results[str(answers)]["passed"] == len(ids("00")), results[str(answers)]
    assert results[str(answers)]["problems"] == []
    assert student.read_text() == before  # the student's file is not changed

    # a rebound print (and json, str, repr) does not stop the collection; the number is found
    # anywhere in the name; another notebook's exercise is listed apart, with its title, and is
    # not counted; a check of the student's own records nothing
    sab = results[str(saboteur)]
    assert sab["graded"] and sab["number"] == "01"
    assert list(sab["exercises"]) == ids("01")
    assert sab["exercises"]["01.1"]["verdict"] == "not checked"
    assert "something other than hooklab's check" in sab["exercises"]["01.1"]["detail"]
    assert sab["also_checked"] == {"00.2": {"title": grade_title("00.2"), "verdict": "not solved yet", "detail": ""}}
    assert f"{saboteur}: 0 of {len(ids('01'))} passed" in printed
    assert f"also checked: 00.2 ({grade_title('00.2')}) not solved yet" in printed

    # no number in the name: only what was checked, and a note saying so
    un = results[str(unnumbered)]
    assert un["number"] is None and list(un["exercises"]) == ["00.2"]
    assert f"{unnumbered}: 0 of 1 passed" in printed
    assert "no notebook number (like 04_) found in the file name" in printed
    assert un["problems"] == [
        "error in cell 3 (x_undefined_name + 1): NameError: name 'x_undefined_name' is not defined"
    ]

    # the CSV: one row per student and exercise of the notebook, also-checked ones left out
    with table.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["student", "notebook", "exercise", "verdict", "reason"]
    by_file = {}
    for row in rows[1:]:
        by_file.setdefault(row[1], []).append(row)
    assert by_file[str(student)][0] == [tmp_path.name, str(student), "00.1", "failed", results[str(student)][
        "exercises"]["00.1"]["detail"]]  # fmt: skip
    assert [r[2:4] for r in by_file[str(student)]] == [[id, verdicts[id]] for id in ids("00")]
    assert {r[0] for r in by_file[str(answers)]} == {"solutions"}
    assert [r[3] for r in by_file[str(answers)]] == ["passed"] * len(ids("00"))
    assert [r[0] for r in by_file[str(saboteur)]] == ["anna"] * len(ids("01"))
    assert [r[2] for r in by_file[str(saboteur)]] == ids("01")
    assert [r[:4] for r in by_file[str(unnumbered)]] == [[tmp_path.name, str(unnumbered), "00.2", "not solved yet"]]
    assert len(rows) == 1 + 2 * len(ids("00")) + len(ids("01")) + 1


def ids(number: str) -> list[str]:
    """The exercises of notebook ``number``, in the course's order: what a report lists for it."""
    from hooklab.exercises import exercises

    return [id for id in exercises() if id.startswith(number + ".")]


def grade_title(id: str) -> str:
    from hooklab.exercises import exercises

    return exercises()[id].title


def test_a_timeout_or_a_dead_kernel_does_not_stop_the_batch(tmp_path, capsys):
    looping = write(tmp_path / "00_loop.ipynb", ["while True:\n    pass", "raise ValueError('ran after the loop')"],
                    markdown_first=True)  # fmt: skip
    dying = write(tmp_path / "00_dies.ipynb", ["x = 1", "import os; os._exit(1)", "y = 2"])
    last = write(tmp_path / "00_last.ipynb", ["x = 1"])
    out, table = tmp_path / "grades.json", tmp_path / "grades.csv"

    status = grade.main([str(looping), str(dying), str(last), "--timeout", "5", "--json", str(out), "--csv",
                         str(table), "--jobs", "1"])  # fmt: skip

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert status == 1  # one notebook could not be graded
    # the looping cell is interrupted (cells counted from 1, markdown included) and the run goes on
    loop = results[str(looping)]
    assert loop["graded"] and loop["of"] == len(ids("00"))
    assert loop["problems"] == ["timed out in cell 2 (while True:) after 5 s (the kernel was interrupted)",
                                "error in cell 3 (raise ValueError('ran after the loop')): ValueError: ran after "
                                "the loop"]  # fmt: skip
    assert results[str(dying)] == {"graded": False, "why": "the kernel died in cell 2 (import os; os._exit(1))",
                                   "problems": []}  # fmt: skip
    assert f"{dying}: not graded — the kernel died in cell 2 (import os; os._exit(1))" in printed
    assert results[str(last)]["graded"] and f"{last}: 0 of {len(ids('00'))} passed" in printed
    # a notebook that was not graded: each of its exercises says so, with the reason
    with table.open(newline="", encoding="utf-8") as f:
        dead = [row for row in csv.reader(f) if row[1] == str(dying)]
    assert [row[2:] for row in dead] == [[id, "not graded", "the kernel died in cell 2 (import os; os._exit(1))"]
                                         for id in ids("00")]  # fmt: skip


@pytest.mark.parametrize(("path", "folder", "student"), [
    ("students/anna/04_backprop.ipynb", "students", "anna"),
    ("students/anna/week2/04_backprop.ipynb", "students", "anna"),
    ("students/anna_04_backprop.ipynb", "students", "anna"),
    ("students/hw-03-anna.ipynb", "students", "hw"),
    ("bob/04_backprop.ipynb", None, "bob"),
    ("bob/homework.ipynb", None, "bob"),
])  # fmt: skip
def test_the_student_is_the_folder_or_the_name_before_the_number(path, folder, student):
    assert grade.student_of(Path(path), Path(folder) if folder else None) == student


@pytest.mark.parametrize("option", ["--jobs=0", "--jobs=-2", "--timeout=0"])
def test_a_count_that_is_not_positive_is_a_usage_error(option, capsys):
    with pytest.raises(SystemExit) as stop:
        grade.main([str(ROOT / "notebooks" / "00_start_here.ipynb"), option])
    assert stop.value.code == 2
    assert "must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "number"), [
    ("04_backprop_by_hand.ipynb", "04"), ("anna_04_backprop.ipynb", "04"), ("hw-03-anna.ipynb", "03"),
    ("2024_05_explorers.ipynb", "05"), ("homework.ipynb", None), ("99_extra.ipynb", None), ("v1_2.ipynb", None),
])  # fmt: skip
def test_the_notebook_number_is_found_anywhere_in_the_name(name, number):
    assert grade.number_of(Path(name), {"00", "01", "02", "03", "04", "05", "06"}) == number


def test_the_default_jobs_are_the_usable_cores_or_all_where_the_system_cannot_say(monkeypatch):
    assert grade.cores() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert grade.cores() == 6
