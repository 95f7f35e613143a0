"""``make release`` (tools/release.py): a student copy with the lessons and the field guide
(``notebooks/guide/``) but without worked answers (of either) or tests, whose two commands work with
what it holds: ``make lab`` as in the course, ``make test`` grading the copy's own notebooks. A
course with guide notebooks and guide answers, written in tmp_path, shows what is kept whether or
not the course has guide notebooks yet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import release  # tools/, on pytest's path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "release"
    release.build(out)
    return out


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_the_copy_has_the_notebooks_hooklab_and_the_set_up_but_no_answers_and_no_tests(copy):
    held = files(copy)
    course_notebooks = {p.relative_to(ROOT).as_posix() for folder in ("notebooks", "notebooks/guide")
                        for p in (ROOT / folder).glob("*.ipynb")}  # fmt: skip
    assert {f for f in held if f.startswith("notebooks/")} == course_notebooks
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "hooklab").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip
    assert {f for f in held if f.startswith("src/")} == package  # the trained weights too
    needed = ["README.md", "Makefile", "LICENSE", "LICENSE-notebooks", "requirements.lock", "pyproject.toml",
              "binder/requirements.txt", "binder/postBuild", "tools/install_kernel.py", "tools/grade.py",
              "tools/grade_kernel.py"]
    assert [name for name in needed if name not in held] == []
    assert not [f for f in held if "solution" in f or f.startswith("tests/") or "__pycache__" in f]
    assert os.access(copy / "binder" / "postBuild", os.X_OK)
    with zipfile.ZipFile(copy.parent / "hooklab-student.zip") as archive:
        assert {n.removeprefix("release/") for n in archive.namelist() if not n.endswith("/")} == held


def test_the_guide_is_copied_and_graded_by_make_test_and_no_worked_answer_of_lesson_or_guide(tmp_path, monkeypatch):
    """A course whose notebooks are made up (two lessons, a guide notebook, their worked answers);
    everything else is the course's own, linked in."""
    import grade  # tools/

    course = tmp_path / "course"
    for name in ["src", "tools", "Makefile", "README.md", *release.FILES]:
        (course / name).parent.mkdir(parents=True, exist_ok=True)
        (course / name).symlink_to(ROOT / name)
    made_up = ["notebooks/00_a.ipynb", "notebooks/01_b.ipynb", "notebooks/guide/G1_c.ipynb",
               "notebooks/solutions/00_a_solutions.ipynb", "notebooks/solutions/G1_c_solutions.ipynb"]  # fmt: skip
    for name in made_up:
        (course / name).parent.mkdir(parents=True, exist_ok=True)
        (course / name).write_text("{}")
    monkeypatch.setattr(release, "ROOT", course)

    release.build(tmp_path / "release")

    held = files(tmp_path / "release")
    assert {f for f in held if f.startswith("notebooks/")} == set(made_up[:3])
    _, found = grade.parse([str(tmp_path / "release" / "notebooks")])  # what the copy's make test grades
    assert sorted(p.relative_to(tmp_path / "release").as_posix() for p, _ in found) == sorted(made_up[:3])


def test_the_notebooks_say_the_worked_answers_come_from_the_instructor(copy):
    """The lessons' "Worked answers: [solutions/…](…)" and the guide's "worked answers are in […]"
    would point into the folder the copy leaves out; every other markdown cell is the course's."""
    for notebook in sorted((copy / "notebooks").rglob("*.ipynb")):
        course = json.loads((ROOT / notebook.relative_to(copy)).read_text(encoding="utf-8"))["cells"]
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        assert "solutions/" not in json.dumps(cells), notebook.name
        assert [c["cell_type"] for c in cells] == [c["cell_type"] for c in course]
        for mine, theirs in zip(cells, course, strict=True):
            if mine["cell_type"] == "markdown" and "solutions/" in "".join(theirs["source"]):
                assert "from your instructor" in "".join(mine["source"]), notebook.name
            else:
                assert mine["source"] == theirs["source"], notebook.name


def test_a_predictions_answer_is_not_stored_in_the_copy_and_every_other_output_is(copy):
    """A student reads the **Predict.** question, writes a guess, then runs the cell that shows the
    answer: in the copy that cell has no stored output (in the course it has one, checked by nbval)."""
    hidden = 0
    for notebook in sorted((copy / "notebooks").glob("*.ipynb")):
        course = json.loads((ROOT / notebook.relative_to(copy)).read_text(encoding="utf-8"))["cells"]
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        answers = release.answer_cells(course)
        predictions = [i for i, c in enumerate(course) if "".join(c["source"]).startswith("**Predict.**")]
        assert len(answers) >= len(predictions) // 2, f"{notebook.name}: the answer cells are not found"
        for i, (mine, theirs) in enumerate(zip(cells, course, strict=True)):
            if i in answers:
                assert theirs["outputs"], (notebook.name, i)
                assert mine["outputs"] == [] and mine["execution_count"] is None, (notebook.name, i)
                assert "".join(course[i - 2]["source"]).startswith("**Predict.**")
                assert "guess" in "".join(course[i - 1]["source"])
            elif mine["cell_type"] == "code":
                assert mine["outputs"] == theirs["outputs"], (notebook.name, i)
        hidden += len(answers)
    assert hidden >= 30


@pytest.mark.parametrize(("line", "expected"), [
    ("Worked answers: [`solutions/00_a.ipynb`](solutions/00_a.ipynb).", "Worked answers: from your instructor."),
    ("worked answers are in\n[solutions/G2_b.ipynb](../solutions/G2_b.ipynb).",
     "worked answers come from your instructor."),
    ("its worked answer is in [x](../solutions/G6_c.ipynb).", "its worked answer comes from your instructor."),
    ("`G4.1` have worked answers in\n[s](../solutions/G4_d.ipynb).",
     "`G4.1` have worked answers from your instructor."),
])  # fmt: skip
def test_links_to_the_worked_answers_are_rewritten(line, expected):
    assert release.without_answer_links(line, "n.ipynb") == expected


def test_a_link_to_the_answers_written_another_way_stops_the_release():
    with pytest.raises(SystemExit, match=r"n\.ipynb links to solutions/"):
        release.without_answer_links("See [the answers](solutions/00_a.ipynb).", "n.ipynb")


def test_the_readme_is_for_students_and_names_only_what_the_copy_has(copy):
    readme = (copy / "README.md").read_text()
    assert "solutions/" not in readme
    for gone in ("## For instructors", "## Contributing", "## On Binder"):
        assert gone not in readme
    for kept in ("## Two commands", "## The notebooks", "## Getting help", "## License"):
        assert kept in readme
    targets = set(re.findall(r"(?m)^([a-z]+):", (copy / "Makefile").read_text()))
    mentioned = set(re.findall(r"`make (\w+)", readme))
    assert mentioned and mentioned <= targets, mentioned - targets
    for link in re.findall(r"\]\(([^)#:]+)\)", readme):  # relative links
        assert (copy / link).exists(), link


def dry_run(copy: Path, target: str) -> str:
    # --no-print-directory: under `make unit`, MAKELEVEL makes a nested make announce its directory
    result = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=copy, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "MAKEFLAGS": ""})  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_test_and_make_lab_use_only_files_the_copy_has(copy):
    test, lab = dry_run(copy, "test"), dry_run(copy, "lab")
    assert "-r requirements.lock" in test and "tools/install_kernel.py" in test
    assert test.strip().endswith("tools/grade.py --sandbox off notebooks")
    assert "jupyter lab --notebook-dir=notebooks" in lab
    for used in set(re.findall(r"(?:tools/\S+\.py|-r \S+)", test + lab)):
        assert (copy / used.removeprefix("-r ")).is_file(), used
    # the set-up rules are the course's own, so they cannot drift apart
    course = (ROOT / "Makefile").read_text()
    for first_line in ("PYTHON ?=", "# Rebuilt when", "lab:"):
        assert release.block(course, first_line) in (copy / "Makefile").read_text()


def test_hooklab_imports_from_the_copy_and_its_make_test_grades_a_notebook(copy):
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    where = subprocess.run([sys.executable, "-c", "import hooklab.exercises; print(hooklab.__file__)"], cwd=copy,
                           env=env, capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(copy)
    graded = subprocess.run([sys.executable, "tools/grade.py", "--sandbox", "off", "notebooks/00_start_here.ipynb"],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert graded.returncode == 0, graded.stdout + graded.stderr
    from hooklab.exercises import exercises

    count = sum(id.startswith("00.") and ex.kind == "exercise" for id, ex in exercises().items())
    assert re.search(rf"notebooks/00_start_here\.ipynb: \d+ of {count} passed", graded.stdout), graded.stdout
