"""Grade students' copies of the course notebooks (``make grade NB="a.ipynb b.ipynb"``, or a
folder of them: ``make grade NB=students/``).

Each notebook is run top to bottom in a fresh kernel, in the course's environment, on a copy in
memory: the student's file is not changed. A cell that raises does not stop the run (the next
cells may still reach their checks). Then, for every exercise of that notebook (``04.1``–``04.5``
for a file named ``04_…``), the report gives the verdict of its last ``check(...)``: passed,
failed (with the checker's reason), not solved yet, or not checked (the ``check`` line never ran:
it was deleted, or its cell failed before reaching it). ``--json FILE`` writes the same as JSON.

The student's code runs with your permissions, in the same process as the checks: grade on a
machine or account you do not mind it touching, and treat a verdict as feedback, not as proof
(code that wants to can fake it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat
from run_notebooks import execute  # tools/, beside this file

MARK = "hooklab-grade:"
COLLECT = f"import json as _json, hooklab.exercises as _ex\nprint({MARK!r}, _json.dumps(_ex.checked()))"


def run(path: Path, timeout: int) -> tuple[dict, list[str]]:
    """The verdicts of the notebook's checks, and one line per cell that raised."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(COLLECT))
    execute(nb, path, timeout, allow_errors=True)
    errors = []
    for number, cell in enumerate(nb.cells[:-1], start=1):
        for out in cell.get("outputs", []):
            if out.output_type == "error" and "raises-exception" not in cell.metadata.get("tags", []):
                errors.append(f"cell {number}: {out.ename}: {out.evalue}".splitlines()[0][:200])
    outputs = nb.cells[-1].get("outputs", [])
    found = [line for out in outputs if out.output_type == "stream" for line in out.text.splitlines()
             if line.startswith(MARK)]  # fmt: skip
    if not found:
        failed = next((f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"), "no output")
        raise RuntimeError(f"{path}: the verdicts could not be collected ({failed})")
    return json.loads(found[-1][len(MARK):]), errors


def expected(path: Path) -> dict[str, str]:
    """The exercises of a notebook, by id (title as value), from its number; all of them if the
    name does not start with one."""
    from hooklab.exercises import exercises

    known = {id: ex.title for id, ex in exercises().items()}
    number = re.match(r"(\d\d)_", path.name)
    return {id: t for id, t in known.items() if number is None or id.startswith(number.group(1) + ".")}


def report(path: Path, verdicts: dict, errors: list[str]) -> tuple[list[str], dict]:
    wanted = expected(path)
    rows = {}
    for id, title in wanted.items():
        verdict, detail = verdicts.get(id, ("not checked", "its check(...) line did not run"))
        rows[id] = {"title": title, "verdict": verdict, "detail": detail}
    for id, (verdict, detail) in verdicts.items():  # checks of another notebook's exercises
        if id not in rows:
            rows[id] = {"title": "", "verdict": verdict, "detail": detail}
    passed = sum(r["verdict"] == "passed" for r in rows.values())
    lines = [f"{path}: {passed} of {len(rows)} passed"]
    width = max((len(r["title"]) for r in rows.values()), default=0)
    for id, r in rows.items():
        detail = f" — {r['detail']}" if r["detail"] else ""
        lines.append(f"  {id}  {r['title']:<{width}}  {r['verdict']}{detail}")
    lines += [f"  error in {e}" for e in errors]
    return lines, {"passed": passed, "exercises": rows, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="students' notebooks (.ipynb), or folders of them")
    parser.add_argument("--json", type=Path, help="also write the verdicts to this file")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = []
    for given in args.notebooks:
        if given.is_dir():
            paths += sorted(p for p in given.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif given.is_file():
            paths.append(given)
        else:
            parser.error(f"no such notebook or folder: {given}")
    if not paths:
        parser.error(f"no notebook in {', '.join(map(str, args.notebooks))}")
    results = {}
    for path in paths:
        verdicts, errors = run(path.resolve(), args.timeout)
        lines, results[str(path)] = report(path, verdicts, errors)
        print("\n".join(lines), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
