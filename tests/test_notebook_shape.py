"""The shape every lesson notebook keeps, so that it stays a lesson: at most 3,000 words of
prose, no code cell over 30 lines, an exercise inside each numbered section (the first within
the first 60 % of the notebook, all in the order of their numbers), a summary at the end, and
no mention of the documents the course grew from (students never saw them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MAX_WORDS, MAX_LINES, FIRST_EXERCISE_BY = 3000, 30, 0.6
SOURCES = re.compile(
    r"\bseed\s*0\d\d\b|\bseed's\b|(?:the|course's|\*)\s*seeds\b|\bSeed(?:Conv)?Net\b|original notebook|\bblog\b"
    r"|\bkaggle\b|Q&A|stack\s*overflow",
    re.IGNORECASE,
)
CHECK = re.compile(r"""^\s*check\(\s*["'](\d\d\.\d+)["']""", re.MULTILINE)
NUMBERED = re.compile(r"^##\s+\d+\s*[.·]", re.MULTILINE)


def cells(path: Path) -> list[dict]:
    return [{**c, "text": "".join(c["source"])} for c in json.loads(path.read_text())["cells"]]


def prose_words(path: Path) -> int:
    """Words of the markdown cells, without code spans, links' targets and HTML tags."""
    text = "\n".join(c["text"] for c in cells(path) if c["cell_type"] == "markdown")
    text = re.sub(r"```.*?```|`[^`]*`|\]\([^)]*\)|<[^>]+>", " ", text, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z0-9][\w'’-]*", text))


def test_there_are_lessons():
    assert len(LESSONS) == 7


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_at_most_3000_words_of_prose(path):
    assert prose_words(path) <= MAX_WORDS


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_code_cell_over_30_lines(path):
    long = [(i, len(c["text"].rstrip().splitlines())) for i, c in enumerate(cells(path))
            if c["cell_type"] == "code" and len(c["text"].rstrip().splitlines()) > MAX_LINES]  # fmt: skip
    assert not long, f"cells (index, lines) over {MAX_LINES} lines: split them, one idea a cell"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_mention_of_source_documents(path):
    named = [i for i, c in enumerate(cells(path)) if SOURCES.search(c["text"])]
    assert not named, f"cells {named} name documents students never saw: teach the example as the course's own"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_an_exercise_inside_each_numbered_section_and_a_summary(path):
    all_cells = cells(path)
    sections, current = {}, None
    for cell in all_cells:
        if cell["cell_type"] == "markdown" and (heading := re.search(r"^##\s+.*$", cell["text"], re.M)):
            current = heading.group() if NUMBERED.match(heading.group()) else None
            if current:
                sections[current] = []
        elif current and cell["cell_type"] == "code":
            sections[current] += CHECK.findall(cell["text"])
    assert sections, "no numbered sections ('## 1. ...')"
    without = [name for name, found in sections.items() if not found]
    assert not without, f"numbered sections without an exercise (a check(...) cell): {without}"
    first = next(i for i, c in enumerate(all_cells) if c["cell_type"] == "code" and CHECK.search(c["text"]))
    assert first <= FIRST_EXERCISE_BY * len(all_cells), f"the first exercise is at cell {first} of {len(all_cells)}"
    assert any(re.search(r"^##\s+Summary", c["text"], re.M) for c in all_cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_exercises_appear_in_the_order_of_their_numbers(path):
    """A student who meets 01.5 before 01.1 thinks they skipped something."""
    ids = [found for c in cells(path) if c["cell_type"] == "code" for found in CHECK.findall(c["text"])]
    number = path.stem[:2]
    assert ids == [f"{number}.{k}" for k in range(1, len(ids) + 1)]
