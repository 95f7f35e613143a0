"""Write a student copy of the course (``make release``): ``artifacts/release/``, ready to push to a
class repository, and the same as ``artifacts/hooklab-student.zip``.

The copy holds the lessons (``notebooks/NN_name.ipynb``) and the field guide
(``notebooks/guide/GK_name.ipynb``) without the worked answers of either
(``notebooks/solutions/``), the ``hooklab`` package, the licenses, the pins
(``requirements.txt``, ``requirements.lock``, ``environment.yml``, ``binder/``),
``pyproject.toml``, the tools its Makefile runs, the README without the parts for instructors and
maintainers, and a Makefile with the same two commands: ``make lab`` as in the course repository
(its set-up rules are copied from the course's Makefile), and ``make test``, which runs every
notebook of the copy (the guide's too) in a fresh kernel and reports each exercise's verdict
(``tools/grade.py --sandbox off notebooks``: the student's own notebooks on the student's own
machine, which may have no bubblewrap). No tests: the course's exercise tests need the worked answers.

The notebooks' links to their worked answers (``Worked answers: [solutions/…](…)``) would point
into the missing folder: in the copy they say that the worked answers come from the instructor
(``without_answer_links``). The cells that show a prediction's answer are copied without their
stored output (``answer_cells``): the student guesses, then runs the cell to see it.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["LICENSE", "LICENSE-notebooks", "requirements.txt", "requirements.lock", "environment.yml",
         "pyproject.toml", ".gitignore", "binder"]  # fmt: skip
NOTEBOOK_FOLDERS = ["notebooks", "notebooks/guide"]  # the lessons and the field guide; not notebooks/solutions
TOOLS = ["install_kernel.py", "grade.py", "grade_kernel.py"]  # and every tools/ module they import
README_SECTIONS = ["# Hook Lab", "## Two commands", "## The notebooks", "## Getting help",
                   "## The helper package `hooklab`", "## Known limits", "## License"]  # fmt: skip

TWO_COMMANDS = """## Two commands

```bash
make lab    # build the pinned environment if needed, then open JupyterLab on the course
make test   # run every notebook top to bottom in a fresh kernel and report each exercise:
            # passed, failed and why, or not solved yet (your files are not changed)
```

Both need only Python 3.11, 3.12 or 3.13 and `make`. `make` takes the first of `python3.11`,
`python3.12`, `python3.13`, `python3` that runs and, if it is not one of these versions, stops at
once and says what it found: install one of them (python.org, your package manager, pyenv, or
`uv python install 3.13`) and pick it with `make env PYTHON=/path/to/python3.13`. The first run
installs every package at the version in `requirements.lock` into `.venv` (a few minutes; about
6 GB), then `hooklab` and the course's Jupyter kernel, "Hook Lab". Pass extra
JupyterLab options with `make lab LAB_ARGS="--no-browser --port 8899"`.

"""

MAKEFILE = """# Hook Lab, student copy: `make lab` to study, `make test` to check your exercises. See README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

{variables}
{exports}
.PHONY: help env lab test clean

help:
\t@echo "make lab    build the environment if needed and open JupyterLab on the course"
\t@echo "make test   run every notebook in a fresh kernel and report each exercise's verdict"
\t@echo "make env    create .venv with the pinned packages and the Hook Lab kernel"
\t@echo "make clean  delete .venv"

env: $(STAMP)

{stamp_rule}
{lab_rule}
# Each notebook runs top to bottom in a fresh kernel, as a grader runs it; the files are not changed.
test: $(STAMP)
\t$(BIN)/python tools/grade.py --sandbox off notebooks $(GRADE_ARGS)

clean:
\trm -rf $(VENV)
"""


def block(makefile: str, first_line: str) -> str:
    """The lines of ``makefile`` from the one starting with ``first_line`` to the next blank line."""
    match = re.search(rf"(?m)^{re.escape(first_line)}.*\n(?:.+\n)*", makefile)
    if match is None:
        raise SystemExit(f"the Makefile has no line starting with {first_line!r}: update tools/release.py")
    return match[0]


def student_makefile(makefile: str) -> str:
    """The release's Makefile: its variables, kernel environment, env and lab rules are the course's."""
    exports = "".join(line + "\n" for line in makefile.splitlines() if re.match(r"(un)?export ", line))
    return MAKEFILE.format(variables=block(makefile, "PYTHON ?="), exports=exports,
                           stamp_rule=block(makefile, "# Rebuilt when"), lab_rule=block(makefile, "lab:"))  # fmt: skip


def student_readme(readme: str) -> str:
    """The README's sections for students, with the release's two commands and no worked answers;
    ``make grade`` is the copy's ``make test``."""
    sections = {part.splitlines()[0]: part for part in re.split(r"(?m)^(?=## )", readme)}
    missing = [title for title in README_SECTIONS if title not in sections]
    if missing:
        raise SystemExit(f"README.md has no section {missing}: update README_SECTIONS in tools/release.py")
    kept = [TWO_COMMANDS if title == "## Two commands" else sections[title] for title in README_SECTIONS]
    paragraphs = "".join(kept).replace("`make grade`", "`make test`").split("\n\n")  # the copy's make test grades
    paragraphs = [STUDY if "(#a-student-copy)" in p else p for p in paragraphs if "solutions/" not in p]
    return "\n\n".join(paragraphs).rstrip() + "\n"


#: What the copy's README says in place of the course's paragraph on studying from the student copy.
STUDY = ("The answer to each **Predict.** question is not stored under it: write your guess, then run\n"
         "the cell after it to see the answer.")


#: How a notebook points to its worked answers, and what the copy says instead: "Worked answers:
#: [link]" (a lesson's summary), "worked answers are in [link]", "its worked answer is in [link]"
#: and "have worked answers in [link]" (the field guide's introductions).
LINK = r"\s*\[[^\]]*\]\([^)]*solutions/[^)]*\)"
ANSWER_LINKS = [
    (re.compile(r"(?i)(worked answers):" + LINK), r"\1: from your instructor"),
    (re.compile(r"(?i)(worked answers) are in" + LINK), r"\1 come from your instructor"),
    (re.compile(r"(?i)(worked answer) is in" + LINK), r"\1 comes from your instructor"),
    (re.compile(r"(?i)(worked answers) in" + LINK), r"\1 from your instructor"),
]


def without_answer_links(text: str, name: str) -> str:
    """A notebook's markdown with every link to ``solutions/`` rewritten (``ANSWER_LINKS``); a link
    written some other way stops the release, naming the notebook."""
    for pattern, replacement in ANSWER_LINKS:
        text = pattern.sub(replacement, text)
    if re.search(r"\]\([^)]*solutions/", text):
        raise SystemExit(f"{name} links to solutions/ in a way tools/release.py cannot rewrite for the student "
                         "copy: add its wording to ANSWER_LINKS")  # fmt: skip
    return text


PREDICT = re.compile(r"^\s*\*\*Predict\.\*\*")
GUESS = re.compile(r"""^\s*check\(\s*["'](?:\d\d|G\d+)\.[a-z]["']\s*,""", re.MULTILINE)


def answer_cells(cells: list[dict]) -> list[int]:
    """The cells that show a prediction's answer: after each ``**Predict.**`` markdown cell and the
    code cell holding the student's guess (``check("01.a", guess)``), the next code cell."""
    text = lambda cell: "".join(cell["source"])  # noqa: E731
    found = []
    for i in range(len(cells) - 2):
        if (cells[i]["cell_type"] == "markdown" and PREDICT.match(text(cells[i]))
                and cells[i + 1]["cell_type"] == "code" and GUESS.search(text(cells[i + 1]))
                and cells[i + 2]["cell_type"] == "code"):  # fmt: skip
            found.append(i + 2)
    return found


def copy_notebook(source: Path, folder: Path) -> None:
    """Copy a notebook into ``folder`` for a student: its links to the worked answers rewritten
    (cells whose markdown names ``solutions/``), and no stored output in the cells that show a
    prediction's answer (``answer_cells``), so the answer appears only when the student runs the
    cell after guessing; every other cell as it was."""
    import json

    nb = json.loads(source.read_text(encoding="utf-8"))
    cells = nb.get("cells", [])
    for cell in cells:
        if cell["cell_type"] == "markdown" and "solutions/" in "".join(cell["source"]):
            lines = without_answer_links("".join(cell["source"]), source.name).splitlines(keepends=True)
            cell["source"] = lines
    for index in answer_cells(cells):
        cells[index]["outputs"], cells[index]["execution_count"] = [], None
    (folder / source.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def tools_needed(names: list[str]) -> list[str]:
    """``names`` and every module of tools/ they import, directly or not."""
    found, todo = [], list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.append(name)
        for node in ast.walk(ast.parse((ROOT / "tools" / name).read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []  # fmt: skip
            todo += [f"{m}.py" for m in modules if (ROOT / "tools" / f"{m}.py").is_file()]
    return sorted(found)


def build(out: Path) -> Path:
    """Write the student copy into ``out`` (replaced) and zip it beside; return the zip."""
    if out.exists():
        shutil.rmtree(out)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")
    for folder in NOTEBOOK_FOLDERS:
        for notebook in sorted((ROOT / folder).glob("*.ipynb")):
            (out / folder).mkdir(parents=True, exist_ok=True)
            copy_notebook(notebook, out / folder)
    shutil.copytree(ROOT / "src", out / "src", ignore=ignore)
    for name in FILES:
        source = ROOT / name
        shutil.copytree(source, out / name, ignore=ignore) if source.is_dir() else shutil.copy2(source, out)
    (out / "tools").mkdir()
    for name in tools_needed(TOOLS):
        shutil.copy2(ROOT / "tools" / name, out / "tools")
    (out / "Makefile").write_text(student_makefile((ROOT / "Makefile").read_text()))
    (out / "README.md").write_text(student_readme((ROOT / "README.md").read_text()))
    return Path(shutil.make_archive(str(out.parent / "hooklab-student"), "zip", out.parent, out.name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "release", help="default: artifacts/release")
    args = parser.parse_args(argv)
    archive = build(args.out.resolve())
    print(f"wrote the student copy to {args.out} and {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
