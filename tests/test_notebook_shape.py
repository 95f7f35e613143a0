"""The shape every lesson keeps, so that it stays a lesson, and every guide notebook, so that it
stays a reference.

A lesson: a problem shown in its first five cells; at most 45 cells and 2,000 words of prose;
no code cell over 20 lines; in every numbered section a prediction (a ``**Predict.**`` cell,
then the student's guess checked) and an exercise, each numbered in order; a summary. A guide
notebook: a contents list, code cells of at most 30 lines, each numbered section saying whether
what it shows is documented or measured. Both: no mention of the documents the course grew from
(students never saw them), and every guide notebook linked from a lesson. That each section runs
from the setup cells alone is ``test_sections.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALL_LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Lessons 04-06 keep the earlier, looser shape until they are reworked as lessons of this kind.
EARLIER_SHAPE = set()
LESSONS = [p for p in ALL_LESSONS if p.stem not in EARLIER_SHAPE]
GUIDES = sorted((ROOT / "notebooks" / "guide").glob("G[0-9]*_*.ipynb"))
MAX_CELLS, MAX_WORDS, MAX_LINES, GUIDE_MAX_LINES, PROBLEM_WITHIN = 45, 2000, 20, 30, 5
SOURCES = re.compile(
    r"\bseed\s*0\d\d\b|\bseed's\b|(?:the|course's|\*)\s*seeds\b|\bSeed(?:Conv)?Net\b|original notebook|\bblog\b"
    r"|\bkaggle\b|Q&A|stack\s*overflow",
    re.IGNORECASE,
)
CHECK = re.compile(r"""^\s*check\(\s*["']((?:\d\d|G\d+)\.\d+)["']""", re.MULTILINE)
PREDICTION = re.compile(r"""^\s*check\(\s*["']((?:\d\d|G\d+)\.[a-z])["']""", re.MULTILINE)
NUMBERED = re.compile(r"^##\s+\d+\s*[.·]", re.MULTILINE)
HEADING = re.compile(r"^##\s+.*$", re.MULTILINE)


def cells(path: Path) -> list[dict]:
    return [{**c, "text": "".join(c["source"])} for c in json.loads(path.read_text())["cells"]]


def sections(all_cells: list) -> tuple[list[int], dict[str, list[int]]]:
    """The indices of the cells before the first numbered section (title, problem, setup), and of
    each numbered section's cells by heading (a section ends at the next ``## `` heading)."""
    setup, parts, current = [], {}, None
    for i, cell in enumerate(all_cells):
        text = "".join(cell["source"])
        heading = HEADING.search(text) if cell["cell_type"] == "markdown" else None
        if heading:
            current = heading.group() if NUMBERED.match(heading.group()) else None
            if current:
                parts[current] = []
            elif parts:
                current = ""  # after the numbered sections: neither setup nor a section
        if current:
            parts[current].append(i)
        elif current is None and not parts:
            setup.append(i)
    return setup, parts


def prose_words(path: Path) -> int:
    """Words of the markdown cells, without code spans, links' targets and HTML tags."""
    text = "\n".join(c["text"] for c in cells(path) if c["cell_type"] == "markdown")
    text = re.sub(r"```.*?```|`[^`]*`|\]\([^)]*\)|<[^>]+>", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z0-9][\w'’-]*", text))


def code_lines(cell: dict) -> int:
    return len(cell["text"].rstrip().splitlines())


def test_there_are_lessons_and_a_guide():
    assert len(ALL_LESSONS) == 9 and GUIDES


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_is_small(path):
    all_cells = cells(path)
    long = [(i, code_lines(c)) for i, c in enumerate(all_cells)
            if c["cell_type"] == "code" and code_lines(c) > MAX_LINES]  # fmt: skip
    assert len(all_cells) <= MAX_CELLS, f"{len(all_cells)} cells: move depth to notebooks/guide/"
    assert prose_words(path) <= MAX_WORDS, f"{prose_words(path)} words of prose: move depth to notebooks/guide/"
    assert not long, f"code cells (index, lines) over {MAX_LINES} lines: split them, one idea a cell"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_opens_with_a_problem_the_student_sees(path):
    first = cells(path)[:PROBLEM_WITHIN]
    shown = [c for c in first if c["cell_type"] == "code" and c.get("outputs")]
    assert shown, f"none of the first {PROBLEM_WITHIN} cells is a code cell showing the problem"


@pytest.mark.parametrize("path", ALL_LESSONS + GUIDES, ids=lambda p: p.stem)
def test_no_mention_of_source_documents(path):
    named = [i for i, c in enumerate(cells(path)) if SOURCES.search(c["text"])]
    assert not named, f"cells {named} name documents students never saw: teach the example as the course's own"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_each_numbered_section_has_a_prediction_and_an_exercise(path):
    all_cells = cells(path)
    _, parts = sections(all_cells)
    assert parts, "no numbered sections ('## 1. ...')"
    for heading, indices in parts.items():
        predicted = [i for i in indices if all_cells[i]["cell_type"] == "markdown"
                     and all_cells[i]["text"].lstrip().startswith("**Predict.**")
                     and i + 1 < len(all_cells) and PREDICTION.search(all_cells[i + 1]["text"])]  # fmt: skip
        assert predicted, f"{heading}: no '**Predict.**' cell followed by the guess's check(\"NN.a\", guess)"
        assert any(CHECK.search(all_cells[i]["text"]) for i in indices if all_cells[i]["cell_type"] == "code"), \
            f"{heading}: no exercise (a check(\"NN.k\", answer) cell)"
    assert any(re.search(r"^##\s+Summary", c["text"], re.M) for c in all_cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("path", ALL_LESSONS + GUIDES, ids=lambda p: p.stem)
def test_exercises_and_predictions_appear_in_the_order_of_their_numbers(path):
    """A student who meets 01.5 before 01.1 thinks they skipped something."""
    code = [c["text"] for c in cells(path) if c["cell_type"] == "code"]
    ids = [found for text in code for found in CHECK.findall(text)]
    number = path.stem.split("_")[0]
    assert ids == [f"{number}.{k}" for k in range(1, len(ids) + 1)]
    guesses = [found for text in code for found in PREDICTION.findall(text)]
    assert guesses == [f"{number}.{chr(ord('a') + k)}" for k in range(len(guesses))]


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.stem)
def test_a_guide_section_says_what_is_documented_and_what_is_measured(path):
    all_cells = cells(path)
    long = [(i, code_lines(c)) for i, c in enumerate(all_cells)
            if c["cell_type"] == "code" and code_lines(c) > GUIDE_MAX_LINES]  # fmt: skip
    assert not long, f"code cells (index, lines) over {GUIDE_MAX_LINES} lines"
    setup, parts = sections(json.loads(path.read_text())["cells"])
    assert parts, "no numbered sections ('## 1. ...')"
    contents = " ".join(all_cells[i]["text"] for i in setup)
    for heading, indices in parts.items():
        prose = " ".join(all_cells[i]["text"] for i in indices if all_cells[i]["cell_type"] == "markdown")
        assert re.search(r"\b(documented|measured)\b", prose, re.I), \
            f"{heading}: say what is documented (link) or measured"
        title = re.sub(r"^##\s+", "", heading).strip()
        anchor = "#" + title.replace(" ", "-")
        assert anchor in contents, f"the contents list does not link {title!r} (as ({anchor}))"


def test_every_guide_notebook_is_linked_from_a_lesson_and_every_guide_link_resolves():
    links = {}
    for path in ALL_LESSONS:
        for target in re.findall(r"\]\((guide/[^)#\s]+)(?:#[^)\s]*)?\)", path.read_text()):
            links.setdefault(target, []).append(path.stem)
    missing = [t for t in links if not (ROOT / "notebooks" / t).exists()]
    assert not missing, f"lessons link guide notebooks that do not exist: {missing}"
    unlinked = [g.name for g in GUIDES if f"guide/{g.name}" not in links]
    assert not unlinked, f"guide notebooks no lesson links to: {unlinked}"
