"""Grade students' copies of the course notebooks (``make grade NB="a.ipynb b.ipynb"``, or a
folder of them: ``make grade NB=students/``).

Each notebook is run top to bottom in a fresh kernel, in the course's environment, on a copy in
memory: the student's file is not changed. A cell that raises does not stop the run (the next
cells may still reach their checks), and neither does a cell that runs longer than ``--timeout``
seconds (``GRADE_ARGS="--timeout 60"``; default 300): the kernel is interrupted and the next cell
runs. Then, for every exercise of that notebook (``04.1``, ``04.2``, … for a file whose name holds
``04_`` or ``04-``, e.g. ``anna_04_backprop.ipynb``; ``G1.1``… for a field guide notebook, whose
name holds ``G1_``, e.g. ``anna_G1_tensor_and_graph_hooks.ipynb``), the report gives the verdict
of its last ``check(...)``: passed, failed (with the checker's reason), not solved yet, or not
checked (no verdict was recorded: the ``check`` line did not run, or the student's ``check`` is
not hooklab's). "N of M passed" counts this notebook's exercises only; exercises of other
notebooks checked in it are listed after them ("also checked"). When no notebook number is found
in the file name, only the exercises the notebook checked are listed, with a note saying so. A
course notebook without exercises (a guide notebook may have none) is "0 of 0 passed".

Predictions (``check("01.a", guess)``: what the student expected a cell to show, before running
it) are shown but not marked: they count in no "N of M", and one line says how many of the
guesses made were right, ``predictions: 3 right of 5 made (not marked)`` (none when no guess was
made; a prediction left at ``guess = ...`` is not made).

Then come the cells that raised or timed out. Cells are counted from 1 at the top of the notebook,
markdown cells included (JupyterLab shows no numbers), and each is also named by the first
non-empty line of its source, e.g. ``cell 12 (x_undefined_name + 1)``.

A notebook cannot be graded when its kernel dies (``os._exit``, a crash), when a timed-out cell
does not stop on the interrupt (the next cell then times out too, and the run is given up), or
when the verdicts cannot be collected at the end: the report says which cell and the batch goes
on with the next notebook. ``--json FILE`` writes the same as JSON, rewritten after every
notebook, the predictions apart under ``"predictions"`` (each one's verdict: right, not quite,
or no guess yet). The exit status is 0 when every notebook was graded (whatever its verdicts), 1
when at least one could not be graded, 2 for a usage error.

``--jobs N`` runs N notebooks at a time, one kernel each (default: the number of cores this
process may use); the report keeps the order of the command line. Each kernel runs on one thread
and needs about as much memory as a student's (see the README). ``--csv FILE`` writes one row per
student and exercise (none for predictions): student, notebook, exercise, verdict, reason. The
student is the first folder below the folder given on the command line
(``students/anna/04_backprop.ipynb`` → ``anna``); for a notebook given by itself or lying directly
in that folder, it is the part of the file name before the notebook number
(``anna_04_backprop.ipynb``, ``anna_G1_tensor_and_graph_hooks.ipynb`` → ``anna``), or else the
notebook's folder. A notebook that could not be graded gets one row per exercise, verdict
``not graded`` and the reason; exercises of other notebooks ("also checked") get no row.

The student's code runs with your permissions, in the same process as the checks: grade on a
machine or account you do not mind it touching, and treat a verdict as feedback, not as proof
(code that wants to can fake it).
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from nbclient.exceptions import DeadKernelError
from run_notebooks import execute  # tools/, beside this file

# Appended as the notebook's last cell. Its last expression, the verdicts as a JSON string, comes
# back as the cell's execute_result (its repr as text/plain): no print and no other builtin (a
# student may rebind them), only private names bound by import statements. hooklab is not imported
# when the notebook did not import it (nothing was checked then; importing torch could take longer
# than a short --timeout).
COLLECT = (
    "import json as _hooklab_grade_json, sys as _hooklab_grade_sys\n"
    "_hooklab_grade_json.dumps(_hooklab_grade_sys.modules['hooklab.exercises'].checked()\n"
    "                          if 'hooklab.exercises' in _hooklab_grade_sys.modules else {})"
)
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"  # the course's (or the student copy's)
TIMEOUT = "hooklab-grade-timeout"  # ename of the reply nbclient gives a cell it interrupted
NOT_CHECKED = (
    "not checked",
    "no verdict recorded: the check(...) line did not run, or it called something other than hooklab's check",
)


def one_line(text: str) -> str:
    """The first line of ``text``, at most 250 characters: what a report line shows of a message."""
    return text.splitlines()[0][:250] if text else ""


class NotGraded(Exception):
    """The notebook's verdicts could not be collected; the message says why."""


def where(nb, index: int) -> str:
    """``cell N (first non-empty source line)``, N counting every cell from 1, markdown included."""
    line = next((s.strip() for s in nb.cells[index].source.splitlines() if s.strip()), "")
    line = line if len(line) <= 60 else line[:59] + "…"
    return f"cell {index + 1} ({line})"


class Watch:
    """nbclient hooks: which cell is running, which timed out; gives up when a timed-out cell was
    still running after the interrupt (the next cell then times out too)."""

    def __init__(self, nb) -> None:
        self.nb = nb
        self.running: int | None = None
        self.previous: int | None = None  # the code cell run before the current one
        self.timed_out: list[int] = []

    def on_execute(self, cell, cell_index: int) -> None:
        self.previous, self.running = self.running, cell_index

    def on_error(self, cell, cell_index: int, execute_reply: dict) -> None:
        if execute_reply.get("content", {}).get("ename") != TIMEOUT:
            return
        self.timed_out.append(cell_index)
        if self.previous is not None and self.previous in self.timed_out:
            raise NotGraded(
                f"{where(self.nb, self.previous)} timed out and was still running after the interrupt "
                "(the next cell timed out too): the run was given up"
            )


def run(path: Path, timeout: int) -> tuple[dict | None, list[str], str | None]:
    """The verdicts of the notebook's checks, one line per cell that raised or timed out, and why
    the verdicts could not be collected (then None instead of them), if so."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        return None, [], one_line(f"could not be read: {type(exc).__name__}: {exc}")
    nb.cells.append(nbformat.v4.new_code_cell(COLLECT))
    last = len(nb.cells) - 1
    watch = Watch(nb)
    why = None
    try:
        execute(nb, path, timeout, allow_errors=True, interrupt_on_timeout=True,
                error_on_timeout={"ename": TIMEOUT, "evalue": f"timed out after {timeout} s", "traceback": []},
                on_cell_execute=watch.on_execute, on_cell_error=watch.on_error)  # fmt: skip
    except NotGraded as given_up:
        why = str(given_up)
    except DeadKernelError:
        why = "the kernel died " + ("while collecting the verdicts" if watch.running == last else
                                    f"in {where(nb, watch.running)}" if watch.running is not None else
                                    "before the first cell ran")  # fmt: skip
    except Exception as exc:  # e.g. a kernel that fails to start (a module in the student's folder shadowing one)
        why = one_line(f"could not be run: {type(exc).__name__}: {exc}")
    problems = []
    for index, cell in enumerate(nb.cells[:last]):
        if index in watch.timed_out:
            problems.append(f"timed out in {where(nb, index)} after {timeout} s (the kernel was interrupted)")
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error" and "raises-exception" not in cell.metadata.get("tags", []):
                problems.append(one_line(f"error in {where(nb, index)}: {out.ename}: {out.evalue}"))
    if why is None:
        try:
            return collected(nb.cells[last]), problems, None
        except NotGraded as failed:
            why = str(failed)
    return None, problems, why


def collected(cell) -> dict:
    """The verdicts from the collection cell's result: the ``repr`` of their JSON string."""
    for out in cell.get("outputs", []):
        if out.output_type == "execute_result" and "text/plain" in out.get("data", {}):
            try:
                verdicts = json.loads(ast.literal_eval(out.data["text/plain"]))
                return {id: tuple(v) for id, v in verdicts.items()}
            except (ValueError, SyntaxError, TypeError, AttributeError) as exc:
                raise NotGraded(f"the verdicts could not be collected (unreadable result: {exc})") from None
    failed = next((f"{o.ename}: {o.evalue}" for o in cell.get("outputs", []) if o.output_type == "error"), "no result")
    raise NotGraded(one_line(f"the verdicts could not be collected ({failed})"))


#: A notebook number in a file name: G and digits (the field guide: ``G1_…``, ``anna_g1_…``), or
#: two digits (a lesson: ``04_…``, ``anna_04_…``, ``hw-04-…``), then ``_`` or ``-``.
NUMBER = re.compile(r"(?<![A-Za-z\d])([Gg]\d+)[_-]|(?<![\dGg])(\d\d)[_-]")


def number_of(path: Path, numbers: set[str]) -> str | None:
    """The notebook number in the file name (``NUMBER``: ``04`` for ``anna_04_backprop.ipynb``,
    ``G1`` for ``G1_tensor_and_graph_hooks.ipynb``), anywhere in the name, the first that is in
    ``numbers`` (a course notebook's)."""
    found = [guide.upper() or lesson for guide, lesson in NUMBER.findall(path.name)]
    return next((n for n in found if n in numbers), None)


def course_numbers(ids) -> set[str]:
    """The numbers of the course's notebooks: those of the exercises and predictions ``ids``, and
    those of the notebooks in ``notebooks/`` and ``notebooks/guide/`` (a guide notebook may have
    no exercise)."""
    names = [p.name for folder in (NOTEBOOKS, NOTEBOOKS / "guide") for p in folder.glob("*.ipynb")]
    return {id.split(".")[0] for id in ids} | {m[1] for name in names if (m := re.match(r"(\d\d|G\d+)_", name))}


def is_prediction(id: str, known: dict) -> bool:
    """Whether ``id`` is a prediction (``01.a``) rather than an exercise (``01.1``)."""
    return known[id].kind == "prediction" if id in known else bool(re.fullmatch(r"[^.]+\.[a-z]", id))


def report(path: Path, verdicts: dict, problems: list[str]) -> tuple[list[str], dict]:
    from hooklab.exercises import exercises

    known = exercises()
    titles = {id: ex.title for id, ex in known.items()}
    guesses = {id: v for id, v in verdicts.items() if is_prediction(id, known)}
    verdicts = {id: v for id, v in verdicts.items() if id not in guesses}
    number = number_of(path, course_numbers(known))
    if number is None:
        mine = dict.fromkeys(verdicts)
    else:
        mine = dict.fromkeys(id for id in known if id.startswith(number + ".") and not is_prediction(id, known))

    def row(id: str, verdict_and_detail: tuple) -> dict:
        verdict, detail = verdict_and_detail
        return {"title": titles.get(id, ""), "verdict": verdict, "detail": detail}

    rows = {id: row(id, verdicts.get(id, NOT_CHECKED)) for id in mine}
    others = {id: row(id, v) for id, v in verdicts.items() if id not in rows}
    predictions = {id: row(id, v) for id, v in guesses.items()}
    passed = sum(r["verdict"] == "passed" for r in rows.values())
    lines = [f"{path}: {passed} of {len(rows)} passed"]
    if number is None:
        lines.append("  note: no notebook number (like 04_ or G1_) found in the file name: only the exercises it "
                     "checked are listed")  # fmt: skip
    width = max((len(r["title"]) for r in rows.values()), default=0)
    for id, r in rows.items():
        detail = f" — {r['detail']}" if r["detail"] else ""
        lines.append(f"  {id}  {r['title']:<{width}}  {r['verdict']}{detail}")
    for id, r in others.items():
        detail = f" — {r['detail']}" if r["detail"] else ""
        lines.append(f"  also checked: {id} ({r['title']}) {r['verdict']}{detail}")
    made = [r["verdict"] for r in predictions.values() if r["verdict"] in ("right", "not quite")]
    if made:
        lines.append(f"  predictions: {made.count('right')} right of {len(made)} made (not marked)")
    lines += [f"  {p}" for p in problems]
    result = {"graded": True, "number": number, "passed": passed, "of": len(rows), "exercises": rows,
              "also_checked": others, "predictions": predictions, "problems": problems}  # fmt: skip
    return lines, result


def write(path: Path, text: str) -> None:
    """Replace ``path`` in one step, so an interrupted batch leaves a whole file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cores() -> int:
    """The cores this process may use (all of the machine's where the system cannot say, as on macOS)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[tuple[Path, str]]]:
    """The options, and every notebook to grade with its student's name."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="students' notebooks (.ipynb), or folders of them")
    parser.add_argument("--json", type=Path, help="also write the verdicts to this file (after every notebook)")
    parser.add_argument("--csv", type=Path, help="also write one row per student and exercise to this file")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell before it is interrupted")
    parser.add_argument("--jobs", type=int, default=cores(),
                        help="notebooks run at a time, one kernel each (default: the number of cores)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.jobs <= 0:
        parser.error("--jobs must be a positive number of notebooks run at a time")
    found = []
    for given in args.notebooks:
        if given.is_dir():
            found += [(p, student_of(p, given)) for p in sorted(given.rglob("*.ipynb"))
                      if ".ipynb_checkpoints" not in p.parts]  # fmt: skip
        elif given.is_file():
            found.append((given, student_of(given, None)))
        else:
            parser.error(f"no such notebook or folder: {given}")
    if not found:
        parser.error(f"no notebook in {', '.join(map(str, args.notebooks))}")
    return args, found


def student_of(path: Path, folder: Path | None) -> str:
    """The first folder below ``folder``; else the file name before its notebook number
    (``anna_04_backprop.ipynb``, ``anna_G1_tensor_and_graph_hooks.ipynb`` → ``anna``); else the
    name of the notebook's folder."""
    if folder is not None and len(path.relative_to(folder).parts) > 1:
        return path.relative_to(folder).parts[0]
    found = NUMBER.search(path.name)
    before = path.name[: found.start()].strip("_- ") if found else ""
    return before or path.resolve().parent.name


def main(argv: list[str] | None = None) -> int:
    args, found = parse(argv)
    results, rows, status = {}, [], 0
    for (path, student), (verdicts, problems, why) in zip(found, graded([p for p, _ in found], args), strict=True):
        if why is None:
            lines, result = report(path, verdicts, problems)
        else:
            lines = [f"{path}: not graded — {why}", *(f"  {p}" for p in problems)]
            result = {"graded": False, "why": why, "problems": problems}
            status = 1
        results[str(path)] = result
        rows += csv_rows(student, path, result)
        print("\n".join(lines), flush=True)
        if args.json:
            write(args.json, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        if args.csv:
            write(args.csv, table(rows))
    return status


def graded(paths: list[Path], args: argparse.Namespace):
    """``run``'s result for each path, in order; ``--jobs`` notebooks run at a time, each in its
    own worker process (started fresh, not forked from this one) with its own kernel."""
    if args.jobs == 1 or len(paths) == 1:
        yield from (run(p.resolve(), args.timeout) for p in paths)
        return
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(paths)), mp_context=spawn) as pool:
        futures = [pool.submit(run, p.resolve(), args.timeout) for p in paths]
        for future in futures:
            try:
                yield future.result()
            except Exception as exc:  # the worker process itself died (killed, out of memory)
                yield None, [], one_line(f"the grading process died: {type(exc).__name__}: {exc}")


CSV_COLUMNS = ("student", "notebook", "exercise", "verdict", "reason")


def csv_rows(student: str, path: Path, result: dict) -> list[tuple[str, ...]]:
    """One row per exercise of the notebook (none for predictions); a notebook that was not graded
    gets ``not graded`` and the reason for each exercise of its number (one row without an
    exercise if it has none)."""
    if result["graded"]:
        return [(student, str(path), id, r["verdict"], r["detail"]) for id, r in result["exercises"].items()]
    from hooklab.exercises import exercises

    known = exercises()
    number = number_of(path, course_numbers(known))
    ids = [id for id in known if number is not None and id.startswith(number + ".") and not is_prediction(id, known)]
    return [(student, str(path), id, "not graded", result["why"]) for id in ids or [""]]


def table(rows: list[tuple[str, ...]]) -> str:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows(rows)
    return text.getvalue()


if __name__ == "__main__":
    sys.exit(main())
