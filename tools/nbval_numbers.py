"""nbval, with printed numbers compared to the precision they were printed with.

Strict nbval compares a cell's output text character by character, so ``407.3188`` stored on
one CPU fails against ``407.3189`` computed on another: float sums are added up in another order
on other kernels and thread counts, and PyTorch promises no bit-identical results across
platforms. This plugin keeps nbval's comparison and relaxes exactly one thing:

* the text is cut into tokens: words (with their digits and dots: ``conv2d``, ``layer4.1``,
  ``torch.float32``), numbers, punctuation and line ends. Words, punctuation, line ends, integers
  and version numbers (``2.14.1``) must be equal; spaces between tokens are not compared (columns
  of a printed tensor move when one entry gains a minus sign);
* a number with a decimal point or an exponent may differ by ``tolerance(printed)``: two units in
  its last printed digit, or a hundred-thousandth of its size where that is larger (a long sum
  printed to many digits). A number printed without decimals (``3.`` in a tensor) must be equal
  to within that relative floor, like an integer.

When an output differs only within these tolerances, the reference is used for it and nbval's
own comparison runs as usual; otherwise nbval reports the difference, and this plugin adds a plain
line per number, e.g. ``Cell 12: expected 97.56 (±0.02), got 95.11``.

It is loaded for every nbval run from the repository's ``conftest.py``; ``tests/test_nbval_numbers.py``
tests the comparator, and ``tests/test_notebooks.py`` tampers with a stored notebook to show
that a real change still fails.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import NamedTuple

#: two units in the last printed digit
ULPS = 2
#: the relative floor: differences below this share of a number's size always pass
RELATIVE = 1e-5

TOKEN = re.compile(
    r"""(?P<version>\d+(?:\.\d+){2,})                       # 2.14.1: text
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)  # conv2d, layer4.1, nan, inf
      | (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      | (?P<newline>\n)
      | (?P<space>[^\S\n]+)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


class Token(NamedTuple):
    kind: str  # "text" or "number"
    text: str


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` that are compared: spaces dropped, numbers apart from the rest."""
    found = []
    for match in TOKEN.finditer(text):
        if match.lastgroup == "space":
            continue
        found.append(Token("number" if match.lastgroup == "number" else "text", match.group()))
    return found


def is_integer(number: str) -> bool:
    return not re.search(r"[.eE]", number)


def tolerance(printed: str) -> float:
    """How far a number printed as ``printed`` may move: 0 for an integer."""
    if is_integer(printed):
        return 0.0
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    floor = RELATIVE * abs(float(printed))
    if decimals == 0 and not exponent:  # "3." in a tensor of whole numbers
        return floor
    unit = 10.0 ** (int(exponent or 0) - decimals)
    return max(ULPS * unit, floor)


class Mismatch(NamedTuple):
    expected: str
    got: str
    allowed: float | None  # None: the texts differ, not only a number

    def __str__(self) -> str:
        if self.allowed is None:
            return f"expected {self.expected!r}, got {self.got!r}"
        if self.allowed == 0:
            return f"expected {self.expected}, got {self.got} (a whole number: compared exactly)"
        return f"expected {self.expected} (±{self.allowed:.2g}), got {self.got}"


def mismatches(expected: str, got: str) -> list[Mismatch]:
    """Every difference between two printed outputs that the tolerances do not cover.

    An empty list means: equal but for numbers within tolerance and spacing.
    """
    want, have = tokens(expected), tokens(got)
    if len(want) != len(have):
        return [Mismatch(expected.strip()[:200], got.strip()[:200], None)]
    found = []
    for a, b in zip(want, have, strict=True):
        if a == b:
            continue
        if a.kind != "number" or b.kind != "number" or is_integer(a.text) != is_integer(b.text):
            found.append(Mismatch(a.text, b.text, None))
            continue
        allowed = max(tolerance(a.text), tolerance(b.text))
        x, y = float(a.text), float(b.text)
        if math.isfinite(x) and math.isfinite(y) and abs(x - y) <= allowed * (1 + 1e-9):
            continue
        found.append(Mismatch(a.text, b.text, allowed))
    return found


# ----- the nbval side -----------------------------------------------------------------------------

def _texts(outputs, skip: tuple[str, ...]) -> dict[str, list[tuple[dict, str]]]:
    """The compared text fields of a cell's outputs, grouped by key in nbval's order (images and
    the other keys nbval skips are left out: sanitizing a long base64 string is slow)."""
    fields = defaultdict(list)
    for output in outputs:
        if output.get("output_type") == "stream":
            fields[output["name"]].append((output, "text"))
            continue
        for key, value in output.items():
            if key == "data":
                for mime, data in value.items():
                    if isinstance(data, str) and mime not in skip:
                        fields[mime].append((value, mime))
            elif key in ("ename", "evalue"):
                fields[key].append((output, key))
    return fields


def accept_close_numbers(cell, test, ref) -> list[str]:
    """Replace each test text that equals its reference within tolerance by the reference; return
    one plain line for every number (or text) that differs beyond it."""
    notes = []
    skip = tuple(cell.parent.skip_compare)
    ref_fields = _texts(ref, skip)
    for key, tested in _texts(test, skip).items():
        for (test_box, test_key), (ref_box, ref_key) in zip(tested, ref_fields.get(key, []), strict=False):
            got, expected = cell.sanitize(test_box[test_key]), cell.sanitize(ref_box[ref_key])
            if got == expected:
                continue
            found = mismatches(expected, got)
            if not found:
                test_box[test_key] = ref_box[ref_key]
            notes += [f"{cell.name}: {m}" for m in found[:5]]
            if len(found) > 5:
                notes.append(f"{cell.name}: ... and {len(found) - 5} more differences")
    return notes


def pytest_configure(config):
    if not getattr(config.option, "nbval", False) and not getattr(config.option, "nbval_lax", False):
        return
    from nbval.plugin import IPyNbCell

    if getattr(IPyNbCell.compare_outputs, "compares_numbers", False):
        return
    strict = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        notes = accept_close_numbers(self, test, ref)
        same = strict(self, test, ref, skip_compare)
        if not same and notes:
            self.comparison_traceback[:0] = ["Numbers and words that differ beyond the printed precision:", *notes, ""]
        return same

    compare_outputs.compares_numbers = True
    IPyNbCell.compare_outputs = compare_outputs
