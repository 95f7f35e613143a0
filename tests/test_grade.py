"""``make grade`` (tools/grade.py): a student's notebook is run in a fresh kernel and every
exercise of that notebook gets a verdict, including the ones whose check never ran; predictions
are shown but not marked; a notebook that loops forever, kills its kernel or sabotages the
collection does not stop the batch.

The notebooks graded here are written in tmp_path and check made-up exercises and predictions of a
guide notebook "G99" and a lesson "98", registered by the notebook's first cell in the student's
kernel and by the ``made_up`` fixture in this process (where the report is written): the tests
do not change when the course's own exercises do.

Each notebook run starts a kernel (a few seconds: it imports hooklab, and so torch, before the first
cell), so the cases are batched into a few grade.main calls of two jobs each: the course's cases,
a short timeout and a dying kernel, the fakes, and the sandbox with its limits. The sandbox
(bubblewrap) is used where it works (tools/ensure_sandbox.sh installs it); its own test is skipped,
saying so, where it cannot run."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import grade  # tools/, on pytest's path (pyproject.toml)
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The made-up exercises and predictions, as a notebook's first cell registers them.
REGISTER = '''from hooklab.exercises import Outcome, exercise, prediction


@exercise("G99.1", "double a number")
def _double(answer):
    return Outcome(answer(2) == 4 and answer(-3) == -6, "double(2) and double(-3) checked")


@exercise("G99.2", "name the method")
def _name(answer):
    return Outcome(answer() == "register_hook", f"got {answer()!r}")


@exercise("G99.3", "count the calls")
def _count(answer):
    return Outcome(answer == 3, "count again")


@prediction("G99.a", "which hook fires first", why="The tensor hook fires before the module's.")
def _first():
    return "the tensor hook"


@prediction("G99.b", "how many calls", why="One call per forward pass.", wrong=[(4, "Count the passes.")])
def _calls():
    return 3


@prediction("G99.c", "which entry is None", why="The input's gradient is None.")
def _none():
    return 0


@exercise("98.1", "the lesson's exercise")
def _lesson(answer):
    return Outcome(answer == 1, "not 1")
'''

STUDENT = [
    REGISTER,
    "from hooklab.exercises import check",
    "check('G99.1', lambda x: x + x)",  # passed
    "check('G99.a', 'The tensor hook')",  # right
    "guess = 4\ncheck('G99.b', guess)",  # not quite, with the hint for 4
    "guess = ...  # a number\ncheck('G99.c', guess)",  # no guess yet: not made
    "raise ValueError('a typo in the student notebook')",
    # G99.2: the stub, untouched
    "def name():\n    raise NotImplementedError\n\ncheck('G99.2', name)",
    # G99.3: the cell was deleted
    "check('98.1', 2)",  # another notebook's exercise: listed apart, not counted
]

ANSWERS = [
    REGISTER,
    "from hooklab.exercises import check",
    "check('G99.1', lambda x: 2 * x)",
    "check('G99.2', lambda: 'register_hook')",
    "guess = ...\ncheck('G99.c', guess)",  # a stored lesson's prediction: no guess, so no predictions line
    "check('G99.3', 3)",
]

# Lesson 98, which checks an exercise of G99, then sabotages what the collection could use and
# calls a check of its own.
SABOTEUR = [
    REGISTER,
    "from hooklab.exercises import check",
    "def name():\n    raise NotImplementedError\n\ncheck('G99.2', name)",
    "print = lambda *args, **kwargs: None\njson = _json = _ex = str = repr = None",
    "def check(id, answer):\n    pass\n\ncheck('98.1', 1)",
]

UNNUMBERED = [
    REGISTER,
    "from hooklab.exercises import check",
    "def name():\n    raise NotImplementedError\n\ncheck('G99.2', name)",
    "check('G99.a', 'the module hook')",
    "x_undefined_name + 1",
]


@pytest.fixture
def made_up(monkeypatch):
    """The made-up exercises registered in this process too, for as long as the test runs."""
    import hooklab.exercises as registry

    registry.exercises()  # every module of the course imported first: the copy below holds their exercises
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    exec(REGISTER, {})


def write(path: Path, cells: list[str], markdown_first: bool = False) -> Path:
    cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if markdown_first:
        cells.insert(0, nbformat.v4.new_markdown_cell("# Exercises\nRun every cell."))
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


@pytest.fixture(scope="module")
def sandbox() -> bool:
    """Whether bubblewrap works here, after tools/ensure_sandbox.sh tried to install it."""
    if grade.sandbox_broken() is not None:
        subprocess.run([str(ROOT / "tools" / "ensure_sandbox.sh")], capture_output=True, timeout=600)
    return grade.sandbox_broken() is None


G99 = ["G99.1", "G99.2", "G99.3"]  # the exercises a G99 notebook is graded on (its predictions are not)


def test_students_notebooks_and_the_worked_answers_are_graded(tmp_path, capsys, made_up):
    student = write(tmp_path / "G99_tensor_hooks.ipynb", STUDENT)
    before = student.read_text()
    answers = write(tmp_path / "G99_tensor_hooks_solutions.ipynb", ANSWERS)
    saboteur = write(tmp_path / "anna_98_tensor_hooks.ipynb", SABOTEUR)
    unnumbered = write(tmp_path / "homework.ipynb", UNNUMBERED)
    out, table = tmp_path / "grades.json", tmp_path / "grades.csv"
    paths = [str(p) for p in (student, answers, saboteur, unnumbered)]

    assert grade.main([*paths, "--json", str(out), "--csv", str(table), "--jobs", "2", "--sandbox", "fallback"]) == 0

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    # two at a time, reported in the order given
    assert [line.split(":")[0] for line in printed.splitlines() if not line.startswith(" ")] == paths
    assert list(results) == paths
    # every exercise of the guide notebook, checked or not; predictions apart, not counted
    mine = results[str(student)]
    assert mine["number"] == "G99"
    verdicts = {id: r["verdict"] for id, r in mine["exercises"].items()}
    assert verdicts == {"G99.1": "passed", "G99.2": "not solved yet", "G99.3": "not checked"}
    assert mine["passed"] == 1 and mine["of"] == 3
    assert f"{student}: 1 of 3 passed" in printed
    assert "no verdict recorded: the check(...) line did not run" in printed
    assert mine["problems"] == [
        "error in cell 7 (raise ValueError('a typo in the student notebook')): ValueError: a typo in the student "
        "notebook"
    ]
    assert {id: r["verdict"] for id, r in mine["predictions"].items()} == {
        "G99.a": "right", "G99.b": "not quite", "G99.c": "no guess yet"}  # fmt: skip
    assert mine["predictions"]["G99.b"] == {"title": "how many calls", "verdict": "not quite",
                                            "detail": "Count the passes."}  # fmt: skip
    assert "  predictions: 1 right of 2 made (not marked)" in printed.splitlines()
    assert mine["also_checked"] == {"98.1": {"title": "the lesson's exercise", "verdict": "failed", "detail": "not 1"}}
    assert student.read_text() == before  # the student's file is not changed

    # the worked answers pass; a prediction without a guess makes no predictions line
    assert results[str(answers)]["passed"] == 3 and results[str(answers)]["problems"] == []
    answers_report = printed[printed.index(f"{answers}:"):printed.index(f"{saboteur}:")]
    assert "predictions:" not in answers_report

    # a rebound print (and json, str, repr) does not stop the collection; the number is found
    # anywhere in the name; another notebook's exercise is listed apart, with its title, and is
    # not counted; a check of the student's own records nothing
    sab = results[str(saboteur)]
    assert sab["graded"] and sab["number"] == "98"
    assert list(sab["exercises"]) == ["98.1"]
    assert sab["exercises"]["98.1"]["verdict"] == "not checked"
    assert "something other than hooklab's check" in sab["exercises"]["98.1"]["detail"]
    assert sab["also_checked"] == {"G99.2": {"title": "name the method", "verdict": "not solved yet", "detail": ""}}
    assert sab["predictions"] == {}
    assert f"{saboteur}: 0 of 1 passed" in printed
    assert "also checked: G99.2 (name the method) not solved yet" in printed

    # no number in the name: only the exercises it checked, and a note saying so; predictions apart
    un = results[str(unnumbered)]
    assert un["number"] is None and list(un["exercises"]) == ["G99.2"] and list(un["predictions"]) == ["G99.a"]
    assert f"{unnumbered}: 0 of 1 passed" in printed
    assert "no notebook number (like 04_ or G1_) found in the file name" in printed
    assert "  predictions: 0 right of 1 made (not marked)" in printed.splitlines()
    assert un["problems"] == [
        "error in cell 5 (x_undefined_name + 1): NameError: name 'x_undefined_name' is not defined"
    ]

    # the CSV: one row per student and exercise of the notebook; predictions and also-checked ones left out
    with table.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["student", "notebook", "exercise", "verdict", "reason"]
    by_file = {}
    for row in rows[1:]:
        by_file.setdefault(row[1], []).append(row)
    assert by_file[str(student)][0] == [tmp_path.name, str(student), "G99.1", "passed",
                                        "double(2) and double(-3) checked"]  # fmt: skip
    assert [r[2:4] for r in by_file[str(student)]] == [[id, verdicts[id]] for id in G99]
    assert [r[3] for r in by_file[str(answers)]] == ["passed"] * 3
    assert [r[:3] for r in by_file[str(saboteur)]] == [["anna", str(saboteur), "98.1"]]
    assert [r[:4] for r in by_file[str(unnumbered)]] == [[tmp_path.name, str(unnumbered), "G99.2", "not solved yet"]]
    assert len(rows) == 1 + 3 + 3 + 1 + 1


def test_a_timeout_or_a_dead_kernel_does_not_stop_the_batch_and_earned_verdicts_are_kept(tmp_path, capsys,
                                                                                            made_up):
    looping = write(tmp_path / "G99_loop.ipynb", ["while True:\n    pass", "raise ValueError('ran after the loop')"],
                    markdown_first=True)  # fmt: skip
    dying = write(tmp_path / "G99_dies.ipynb", [REGISTER, "from hooklab.exercises import check",
                                                "check('G99.1', lambda x: x + x)", "import os; os._exit(1)",
                                                "check('G99.3', 3)"])  # fmt: skip
    out, table = tmp_path / "grades.json", tmp_path / "grades.csv"

    status = grade.main([str(looping), str(dying), "--timeout", "5", "--json", str(out), "--csv", str(table),
                         "--jobs", "2", "--sandbox", "fallback"])  # fmt: skip

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert status == 1  # one notebook did not run to its end
    # the looping cell is interrupted (cells counted from 1, markdown included) and the run goes on
    loop = results[str(looping)]
    assert loop["graded"] and loop["of"] == 3
    assert loop["problems"] == ["timed out in cell 2 (while True:) after 5 s (the kernel was interrupted)",
                                "error in cell 3 (raise ValueError('ran after the loop')): ValueError: ran after "
                                "the loop"]  # fmt: skip
    # the kernel died in cell 4: the verdict earned in cell 3 is kept, the check after it did not run
    dead = results[str(dying)]
    assert dead["graded"] and dead["passed"] == 1
    assert {id: r["verdict"] for id, r in dead["exercises"].items()} == {
        "G99.1": "passed", "G99.2": "not checked", "G99.3": "not checked"}  # fmt: skip
    died = ("the kernel died in cell 4 (import os; os._exit(1)); the cells after it did not run (the verdicts of "
            "the checks before it are kept)")  # fmt: skip
    assert dead["problems"] == [died]
    assert f"{dying}: 1 of 3 passed" in printed and f"  {died}" in printed
    with table.open(newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if row[1] == str(dying)]
    assert [row[2:4] for row in rows] == [["G99.1", "passed"], ["G99.2", "not checked"], ["G99.3", "not checked"]]


def test_a_notebook_that_cannot_be_read_is_not_graded_and_has_a_row_per_exercise(tmp_path, capsys, made_up):
    broken = tmp_path / "G99_broken.ipynb"
    broken.write_text("not json")
    table = tmp_path / "grades.csv"
    assert grade.main([str(broken), "--csv", str(table), "--sandbox", "off"]) == 1
    assert f"{broken}: not graded — could not be read: " in capsys.readouterr().out
    with table.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    assert [row[2:4] for row in rows] == [[id, "not graded"] for id in G99]


#: Fakes of a pass, each on an exercise of the course's notebook 00, each undone after its check.
TAMPERING = [
    "import hooklab.exercises as ex\nfrom hooklab.exercises import Exercise, Outcome, check",
    # the verdict machinery rebound (the first fake)
    "real = ex._verdict\nex._verdict = lambda *args: ('passed', 'looks great')\ncheck('00.1', None)\n"
    "ex._verdict = real",
    # an exercise registered again, with a checker that passes anything
    "old = ex._REGISTRY['00.2']\nex._REGISTRY['00.2'] = Exercise('00.2', old.title, lambda a: Outcome(True, 'ok'))\n"
    "check('00.2', print)\nex._REGISTRY['00.2'] = old",
    # sys.modules edited: a torch whose allclose says yes to anything
    "import sys, types, torch\nfake = types.ModuleType('torch')\nfake.__dict__.update(vars(torch))\n"
    "fake.allclose = lambda *args, **kwargs: True\nsys.modules['torch'] = fake\ncheck('00.3', print)\n"
    "sys.modules['torch'] = torch",
    # a verdict written straight to the log, past check
    "ex._GRADING['write']({'kind': 'check', 'id': '00.4', 'verdict': 'passed', 'detail': '', 'suspect': []})",
    # a line appended to the log file by hand
    "with open('../run/verdicts.log', 'a') as log:\n"
    "    log.write('{\"seq\": 9, \"kind\": \"check\", \"id\": \"00.4\", \"verdict\": \"passed\"}\\tfeed\\n')",
]

#: A hooklab of the student's own, whose check says "passed" to anything (the issue's second fake).
FAKE_HOOKLAB = {"__init__.py": "", "exercises.py": "def check(id, answer):\n    print(f'Exercise {id}: passed')\n"}


def test_faked_passes_are_flagged_suspect_with_the_reason(tmp_path, capsys):
    tamper = write(tmp_path / "carl_00_start_here.ipynb", TAMPERING)
    (tmp_path / "dana").mkdir()
    untouched = write(tmp_path / "dana" / "00_start_here.ipynb", [
        "from hooklab.exercises import check", "def f(module, x):\n    raise NotImplementedError\n\ncheck('00.1', f)"])
    (tmp_path / "dana" / "hooklab").mkdir()
    for name, text in FAKE_HOOKLAB.items():
        (tmp_path / "dana" / "hooklab" / name).write_text(text)
    out = tmp_path / "grades.json"

    assert grade.main([str(tamper), str(untouched), "--json", str(out), "--jobs", "2", "--sandbox", "fallback"]) == 0

    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    carl = results[str(tamper)]
    assert carl["passed"] == 0 and {r["verdict"] for r in carl["exercises"].values()} == {"suspect"}
    reasons = {id: r["detail"] for id, r in carl["exercises"].items()}
    assert reasons["00.1"].startswith("hooklab.exercises._verdict was replaced; the check said: passed — looks great")
    assert reasons["00.2"].startswith("exercise 00.2 was registered again (its checker replaced)")
    assert reasons["00.3"].startswith("sys.modules['torch'] was replaced or removed")
    assert reasons["00.4"].startswith("this verdict was written by something other than hooklab's check")
    assert carl["suspect"] == ["the verdict log holds lines the course's check did not write (they were left out)"]
    assert f"{tamper}: 0 of 4 passed\n  suspect: the verdict log holds lines" in printed
    # the hooklab beside the notebook is not used (the notebook runs alone in a new folder), and is reported
    dana = results[str(untouched)]
    assert dana["exercises"]["00.1"]["verdict"] == "not solved yet"
    assert dana["suspect"] == ["a hooklab/ lies beside the notebook: it would replace the course's package in a "
                               "kernel started there (this grade ran on a copy of the notebook alone, without it)"]


def test_the_sandbox_keeps_writes_in_and_the_network_out_and_the_limits_stop_the_kernel(tmp_path, capsys, made_up,
                                                                                        sandbox):  # fmt: skip
    if not sandbox:
        pytest.skip("bubblewrap (bwrap) does not work here, and tools/ensure_sandbox.sh could not install it")
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("the original")
    escaped = ROOT / "escaped-from-a-grading-kernel.txt"
    listening = socket.create_server(("127.0.0.1", 0))  # the host's loopback: out of the kernel's reach
    port = listening.getsockname()[1]
    (tmp_path / "eve").mkdir()
    hog = write(tmp_path / "eve" / "G99_sandbox.ipynb", [
        REGISTER, "from hooklab.exercises import check", "check('G99.1', lambda x: 2 * x)",
        f"open({str(decoy)!r}, 'w').write('overwritten')",
        f"open({str(escaped)!r}, 'w').write('escaped')",
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)",
        "for i in range(3000):\n    print('x' * 1000); __import__('time').sleep(0.002)",  # still printing when stopped
        "chunks = []\nfor i in range(60):  # 3 GB at most, should the limit fail\n    chunks.append(b'x' * 50 * 2**20)",
        "check('G99.3', 3)",
    ])  # fmt: skip
    out = tmp_path / "grades.json"
    try:
        status = grade.main([str(hog), "--json", str(out), "--memory", "1G", "--output", "1M"])
    finally:
        listening.close()
        escaped.unlink(missing_ok=True)

    assert status == 1
    result = json.loads(out.read_text())[str(hog)]
    assert decoy.read_text() == "the original"
    problems = result["problems"]  # cell 4 wrote to a folder of its own: the students' folders are hidden
    assert problems[0].startswith("error in cell 5 (open(") and "Read-only file system" in problems[0]
    assert problems[1].startswith("error in cell 6 (import socket): ConnectionRefusedError")
    assert problems[2] == ("the output passed the limit of 1 MB (--output) in cell 7 (for i in range(3000):): "
                           "later output was dropped, and the cell interrupted")  # fmt: skip
    assert problems[3].startswith("stopped in cell 8 (chunks = []): its memory passed the limit of 1.0 GB "
                                  "(--memory; ")  # fmt: skip
    assert problems[3].endswith("resident): the kernel was stopped; the cells after it did not run (the verdicts "
                                "of the checks before it are kept)")  # fmt: skip
    assert {id: r["verdict"] for id, r in result["exercises"].items()} == {
        "G99.1": "passed", "G99.2": "not checked", "G99.3": "not checked"}  # fmt: skip


def test_without_bubblewrap_grading_stops_unless_the_instructor_chose_the_fallback(tmp_path, capsys, monkeypatch):
    notebook = str(write(tmp_path / "00_start_here.ipynb", ["x = 1"]))
    monkeypatch.setattr(grade.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit) as stop:
        grade.parse([notebook])
    assert stop.value.code == 2
    assert "bubblewrap (bwrap) is not installed" in capsys.readouterr().err
    args, _ = grade.parse([notebook, "--sandbox", "fallback"])
    assert args.sandbox == "off" and "WARNING: grading WITHOUT the sandbox" in capsys.readouterr().err
    args, _ = grade.parse([notebook, "--sandbox", "off"])
    assert args.sandbox == "off" and capsys.readouterr().err == ""


def test_the_help_names_every_limit_and_the_sandbox():
    text = subprocess.run([sys.executable, str(ROOT / "tools" / "grade.py"), "--help"], capture_output=True,
                          text=True, timeout=120, check=True).stdout  # fmt: skip
    for option in ("--memory", "--cpu-time", "--output", "--timeout", "--sandbox", "--jobs"):
        assert option in text


def test_a_guide_notebook_without_exercises_passes_0_of_0_and_counts_its_predictions(tmp_path, monkeypatch):
    """G98 has no registered exercise or prediction, only a notebook in the course's guide folder."""
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "G98_module_hooks.ipynb").write_text("{}")
    monkeypatch.setattr(grade, "NOTEBOOKS", tmp_path)
    verdicts = {"G98.a": ("right", "why"), "G98.b": ("not quite", "why"), "G98.c": ("right", "why")}

    lines, result = grade.report(Path("anna_G98_module_hooks.ipynb"), verdicts, [])

    assert lines == ["anna_G98_module_hooks.ipynb: 0 of 0 passed", "  predictions: 2 right of 3 made (not marked)"]
    assert result["number"] == "G98" and result["exercises"] == {} and result["also_checked"] == {}
    assert list(result["predictions"]) == ["G98.a", "G98.b", "G98.c"]
    assert grade.csv_rows("anna", Path("anna_G98_module_hooks.ipynb"), result) == []


@pytest.mark.parametrize(("path", "folder", "student"), [
    ("students/anna/04_backprop.ipynb", "students", "anna"),
    ("students/anna/week2/04_backprop.ipynb", "students", "anna"),
    ("students/anna_04_backprop.ipynb", "students", "anna"),
    ("students/hw-03-anna.ipynb", "students", "hw"),
    ("students/anna_G1_tensor_and_graph_hooks.ipynb", "students", "anna"),
    ("students/bob-g2-forward.ipynb", "students", "bob"),
    ("bob/04_backprop.ipynb", None, "bob"),
    ("bob/G1_tensor_and_graph_hooks.ipynb", None, "bob"),
    ("bob/homework.ipynb", None, "bob"),
])  # fmt: skip
def test_the_student_is_the_folder_or_the_name_before_the_number(path, folder, student):
    assert grade.student_of(Path(path), Path(folder) if folder else None) == student


@pytest.mark.parametrize("option", ["--jobs=0", "--jobs=-2", "--timeout=0", "--cpu-time=0"])
def test_a_count_that_is_not_positive_is_a_usage_error(option, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        grade.main([str(write(tmp_path / "00_start_here.ipynb", ["x = 1"])), option])
    assert stop.value.code == 2
    assert "must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "number"), [
    ("04_backprop_by_hand.ipynb", "04"), ("anna_04_backprop.ipynb", "04"), ("hw-03-anna.ipynb", "03"),
    ("2024_05_explorers.ipynb", "05"), ("homework.ipynb", None), ("99_extra.ipynb", None), ("v1_2.ipynb", None),
    ("G1_tensor_and_graph_hooks.ipynb", "G1"), ("anna_G2_forward.ipynb", "G2"), ("hw-g3-anna.ipynb", "G3"),
    ("G10_later.ipynb", "G10"), ("G4_not_yet.ipynb", None), ("big1_x.ipynb", None),
    ("G1_tensor_and_graph_hooks_solutions.ipynb", "G1"), ("G4_then_02_forward.ipynb", "02"),
])  # fmt: skip
def test_the_notebook_number_is_found_anywhere_in_the_name(name, number):
    course = {"00", "01", "02", "03", "04", "05", "06", "10", "G1", "G2", "G3", "G10"}
    assert grade.number_of(Path(name), course) == number


def test_the_course_numbers_are_those_of_its_exercises_and_of_its_notebooks(tmp_path, monkeypatch):
    (tmp_path / "guide").mkdir()
    for name in ("00_start_here.ipynb", "guide/G1_tensor_and_graph_hooks.ipynb", "guide/notes.ipynb"):
        (tmp_path / name).write_text("{}")
    monkeypatch.setattr(grade, "NOTEBOOKS", tmp_path)
    assert grade.course_numbers(["04.1", "04.a", "G2.1"]) == {"00", "04", "G1", "G2"}


def test_the_default_jobs_are_the_usable_cores_or_all_where_the_system_cannot_say(monkeypatch):
    assert grade.cores() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert grade.cores() == 6
