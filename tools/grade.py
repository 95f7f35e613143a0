"""Grade students' copies of the course notebooks (``make grade NB="a.ipynb b.ipynb"``, or a
folder of them: ``make grade NB=students/``).

Each notebook is copied alone into a new temporary folder (nothing else is beside it: no
``hooklab`` of the student's own) and run there top to bottom in a fresh kernel, in the course's
environment and in a sandbox (below): the student's file is not changed. A cell that raises does
not stop the run (the next cells may still reach their checks), and neither does a cell that runs
longer than ``--timeout`` seconds (``GRADE_ARGS="--timeout 60"``; default 300): the kernel is
interrupted and the next cell runs. Then, for every exercise of that notebook (``04.1``, ``04.2``,
… for a file whose name holds ``04_`` or ``04-``, e.g. ``anna_04_backprop.ipynb``; ``G1.1``… for a
field guide notebook, whose name holds ``G1_``, e.g. ``anna_G1_tensor_and_graph_hooks.ipynb``), the
report gives the verdict of its last ``check(...)``: passed, failed (with the checker's reason),
not solved yet, suspect (below), or not checked (no verdict was recorded: the ``check`` line did
not run, or the student's ``check`` is not hooklab's). "N of M passed" counts this notebook's
exercises only; exercises of other notebooks checked in it are listed after them ("also checked").
When no notebook number is found in the file name, only the exercises the notebook checked are
listed, with a note saying so. A course notebook without exercises (a guide notebook may have none)
is "0 of 0 passed".

Predictions (``check("01.a", guess)``: what the student expected a cell to show, before running
it) are shown but not marked: they count in no "N of M", and one line says how many of the
guesses made were right, ``predictions: 3 right of 5 made (not marked)`` (none when no guess was
made; a prediction left at ``guess = ...`` is not made).

Then come the cells that raised or timed out. Cells are counted from 1 at the top of the notebook,
markdown cells included (JupyterLab shows no numbers), and each is also named by the first
non-empty line of its source, e.g. ``cell 12 (x_undefined_name + 1)``.

Each ``check`` appends its verdict to a log as it runs, so a kernel that dies later
(``os._exit``, a crash, a limit below) keeps the verdicts already earned: the report says in which
cell the run ended, and the cells after it count as not run. A notebook cannot be graded when it
cannot be read, its kernel does not start, or a timed-out cell does not stop on the interrupt (the
next cell then times out too, and the run is given up); the batch goes on with the next notebook.
``--json FILE`` writes the same as JSON, rewritten after every notebook, the predictions apart
under ``"predictions"`` (each one's verdict: right, not quite, not in the form asked, or no guess
yet). The exit status is 0 when every notebook was graded and ran to its end (whatever its
verdicts), 1 when at least one could not be graded or was ended early, 2 for a usage error
(bubblewrap missing included).

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

The sandbox (``--sandbox required``, the default) is Debian's bubblewrap (``bwrap``; install it
with ``tools/ensure_sandbox.sh`` or ``apt-get install bubblewrap``; no Docker; as a user other than
root it needs unprivileged user namespaces, Debian's default, and grading checks that it runs):
the whole system
read-only, a private ``/tmp`` and ``/dev``, the folders of the notebooks being graded hidden (one
student's code cannot read another's notebook), the notebook's temporary folder the only place
written to (deleted afterwards), no network (a loopback of its own), and its own process ids.
Without a working bwrap, grading stops and says so; ``--sandbox fallback`` grades anyway with a
loud warning (the student's code then runs with your permissions), ``--sandbox off`` quietly (a
student's own notebooks, as the student copy's ``make test`` runs them). With or without it:
``--memory`` (default 2G) caps the memory the kernel and every process it starts hold resident,
watched every 0.1 s (not an address-space limit, under which torch does not even import; an
allocation can overshoot by what it gets in 0.1 s before the kernel is killed); ``--cpu-time``
(default 900 s) caps the CPU time of the whole notebook; ``--output`` (default 20M) caps what it
prints (past it, output is dropped and the running cell interrupted); ``--timeout`` caps each cell.

A verdict is not taken from the student's kernel at face value. The kernel imports the course's
``hooklab`` before the first cell; each ``check`` then writes its verdict to the log signed with a
key made for this run (read and deleted by the kernel before the first cell), together with what it
found changed at that moment: hooklab's functions and classes rebound or their code replaced, an
exercise registered again, a ``sys.modules`` entry of hooklab or torch replaced, a torch function or
builtin that checks use rebound, the log written other than through ``check``. Such a verdict is
reported as ``suspect`` with the reason, and so is every pass of a notebook whose log holds lines
not signed with the key, whose kernel imported a ``hooklab`` other than the course's (its folder
and the hash of its files are compared), or which has a ``hooklab`` beside it. What a determined
student can still do: the key and the checks live in the kernel the student's code runs in, so code
written against hooklab's source can read the key out of the kernel's memory and sign a verdict
of its own, undo a change before the check looks, or change a checker's inner workings that are
not watched (an object the checker uses, rather than a name that holds it); and the checks test
what they test: an answer written to pass them passes. Read a surprising pass in the notebook.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hmac
import io
import json
import multiprocessing
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from install_kernel import NAME  # tools/, beside this file
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"  # the course's (or the student copy's)
GRADE_KERNEL = Path(__file__).resolve().with_name("grade_kernel.py")
TIMEOUT = "hooklab-grade-timeout"  # ename of the reply nbclient gives a cell it interrupted
NOT_CHECKED = (
    "not checked",
    "no verdict recorded: the check(...) line did not run, or it called something other than hooklab's check",
)
NO_SANDBOX = ("bubblewrap (bwrap) is not installed or does not work here{why}: tools/ensure_sandbox.sh installs "
              "Debian's package (apt-get install bubblewrap). Without it a student's code can write wherever you "
              "can and reach the network; to grade anyway, with a warning, pass --sandbox fallback")  # fmt: skip


def one_line(text: str) -> str:
    """The first line of ``text``, at most 250 characters: what a report line shows of a message."""
    return text.splitlines()[0][:250] if text else ""


class NotGraded(Exception):
    """The notebook's run was given up; the message says why."""


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


@dataclass
class Settings:
    """What ``run`` needs to know besides the notebook: the limits and the sandbox."""

    timeout: int = 300  # seconds per cell
    memory: int = 2 * 2**30  # bytes resident (the kernel and every process it starts)
    cpu: int = 900  # CPU seconds per notebook
    output: int = 20 * 2**20  # bytes of output per notebook
    sandbox: bool = True
    hidden: list[str] = field(default_factory=list)  # folders the sandbox hides (the students' notebooks)


def sandbox_command(base: Path, settings: Settings) -> list[str]:
    """bwrap: the system read-only, a private /tmp and /dev, the folders of students' notebooks
    hidden, ``base`` the only place written to, no network (a loopback of its own), its own
    process ids (it sees no other process), killed with the grader."""
    tmp = ["/tmp"] + ([tempfile.gettempdir()] if tempfile.gettempdir() != "/tmp" else [])
    # the course and its Python, if they live under a private /tmp: shown again, read-only, before the
    # students' folders are hidden (a course cloned into /tmp would otherwise have no kernel to start)
    course = {NOTEBOOKS.parent, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    shown = sorted(str(p) for p in course if any(p.is_relative_to(folder) for folder in tmp))
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            *(arg for folder in tmp for arg in ("--tmpfs", folder)),
            *(arg for folder in shown for arg in ("--ro-bind", folder, folder)),
            *(arg for folder in settings.hidden for arg in ("--tmpfs", folder)),
            "--bind", str(base), str(base), "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--die-with-parent", "--setenv", "IPYTHONDIR", str(base / "run" / "ipython"),
            "--unsetenv", "JPY_PARENT_PID", "--"]  # fmt: skip
            # JPY_PARENT_PID: the grader's process id, which the kernel cannot see from inside


class GradingKernelManager(AsyncKernelManager):
    """The course's kernel, started by tools/grade_kernel.py (hooklab imported and its verdict log
    started before any cell runs), inside ``prefix`` (the sandbox's command, or nothing)."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if cmd[cmd.index("-m") + 1:cmd.index("-m") + 2] != ["ipykernel_launcher"]:
            raise NotGraded(f"the {NAME} kernel does not start ipykernel_launcher: run make env again")
        at = cmd.index("-m")
        cmd[at:at + 2] = [str(GRADE_KERNEL), self.grading_folder]
        return [*self.prefix, *cmd]

    async def interrupt_kernel(self) -> None:
        """SIGINT to the kernel's own process only: sent to its process group (jupyter_client's
        way), it would also reach bwrap, which ends the sandbox on it."""
        import psutil

        try:
            tree = psutil.Process(self.provisioner.process.pid).children(recursive=True)
            kernel = next(p for p in tree if str(GRADE_KERNEL) in p.cmdline() and p.name() != "bwrap")
            kernel.send_signal(signal.SIGINT)
        except (psutil.Error, StopIteration, AttributeError):
            pass  # the kernel has gone: nothing to interrupt


class Client(NotebookClient):
    """nbclient, keeping at most ``limit`` bytes of output: past it, outputs are dropped and the
    running cell is interrupted (once)."""

    def __init__(self, *args, limit: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit, self.size, self.cut_in = limit, 0, None

    def output(self, outs, msg, display_id, cell_index):
        self.size += len(json.dumps(msg.get("content", {})))
        if self.size <= self.limit:
            return super().output(outs, msg, display_id, cell_index)
        if self.cut_in is None:
            self.cut_in = cell_index
            self.interrupting = asyncio.ensure_future(self.km.interrupt_kernel())
        return None


def size_text(count: float) -> str:
    return f"{count / 2**30:.1f} GB" if count >= 2**30 else f"{count / 2**20:.0f} MB"


class Limits(threading.Thread):
    """Polls the kernel's processes (every 0.1 s) and kills them all when together they hold more
    than ``settings.memory`` bytes resident or have used ``settings.cpu`` seconds of CPU;
    ``reason`` then says which."""

    def __init__(self, pid: int, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.pid, self.settings, self.reason, self.done = pid, settings, None, threading.Event()
        self.cpu, self.peak = 0.0, 0.0  # as last seen: CPU seconds, and the most memory held at once

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self.done.wait(0.1):
            try:
                tree = [root, *root.children(recursive=True)]
                ended = root.cpu_times()
            except psutil.Error:
                return
            memory = cpu = 0.0
            for process in tree:
                try:
                    memory += process.memory_info().rss
                    times = process.cpu_times()
                    cpu += times.user + times.system
                except psutil.Error:
                    pass
            cpu += ended.children_user + ended.children_system  # processes that ended
            self.cpu, self.peak = cpu, max(self.peak, memory)
            if memory > self.settings.memory:
                self.reason = (f"its memory passed the limit of {size_text(self.settings.memory)} (--memory; "
                               f"{size_text(memory)} resident): the kernel was stopped")  # fmt: skip
            elif cpu > self.settings.cpu:
                self.reason = (f"it used more than {self.settings.cpu} s of CPU time (--cpu-time): the kernel "
                               "was stopped")  # fmt: skip
            else:
                continue
            for process in reversed(tree):
                try:
                    process.kill()
                except psutil.Error:
                    pass
            return


def run(path: Path, settings: Settings) -> tuple[dict | None, list[str], str | None, list[str], dict]:
    """The verdicts of the notebook's checks, one line per cell that raised or timed out (and for
    the end of a run that stopped early), why the notebook could not be graded (then None
    instead of the verdicts), if so, why its verdicts are suspect, if they are, and what its
    kernel used (CPU seconds, peak resident memory, as the limits last saw them).

    The notebook is copied alone into a new temporary folder, its kernel started there (in the
    sandbox, if ``settings.sandbox``), and the verdicts are read from the log the kernel's
    ``check`` writes as it goes, signed with a key made for this run."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        return None, [], one_line(f"could not be read: {type(exc).__name__}: {exc}"), [], {}
    suspect = [f"a {name} lies beside the notebook: it would replace the course's package in a kernel started "
               "there (this grade ran on a copy of the notebook alone, without it)"
               for name in ("hooklab/", "hooklab.py") if (path.parent / name.rstrip("/")).exists()]  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="hooklab-grade-"))
    try:
        return run_in(base, path, nb, settings, suspect)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_in(base: Path, path: Path, nb, settings: Settings, suspect: list[str]):
    work, folder = base / "work", base / "run"
    work.mkdir()
    folder.mkdir()
    shutil.copyfile(path, work / path.name)  # what the student's code finds beside itself: its own notebook
    key = secrets.token_bytes(32)
    (folder / "key").write_bytes(key)
    km = GradingKernelManager(kernel_name=NAME, transport="ipc", ip=str(folder / "kernel"),
                              connection_file=str(folder / "kernel.json"))  # fmt: skip
    km.prefix = sandbox_command(base, settings) if settings.sandbox else []
    km.grading_folder = str(folder)
    watch, limits = Watch(nb), None
    client = Client(nb, km=km, timeout=settings.timeout, limit=settings.output, allow_errors=True, startup_timeout=180,
                    interrupt_on_timeout=True, extra_arguments=["--HistoryManager.hist_file=:memory:"],
                    resources={"metadata": {"path": str(work)}},
                    error_on_timeout={"ename": TIMEOUT, "evalue": f"timed out after {settings.timeout} s",
                                      "traceback": []},
                    on_cell_execute=watch.on_execute, on_cell_error=watch.on_error)  # fmt: skip

    def started(**_) -> None:
        nonlocal limits
        limits = Limits(km.provisioner.process.pid, settings)
        limits.start()

    client.on_notebook_start = started  # called once the kernel runs, before the first cell
    course = course_files()  # what the kernel's hooklab must hash to
    why, ended = None, None
    try:
        client.execute(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the kernel's own, not the cells'
    except NotGraded as given_up:
        why = str(given_up)
    except DeadKernelError:
        ended = ("the kernel died " + (f"in {where(nb, watch.running)}" if watch.running is not None else
                                       "before the first cell ran"))  # fmt: skip
    except Exception as exc:  # e.g. a kernel that fails to start
        why = one_line(f"could not be run: {type(exc).__name__}: {exc}")
    finally:
        if limits is not None:
            limits.done.set()
    if limits is not None and limits.reason is not None:
        ended = f"stopped in {where(nb, watch.running)}: {limits.reason}" if watch.running is not None else \
            f"stopped: {limits.reason}"  # fmt: skip
    problems = []
    for index, cell in enumerate(nb.cells):
        if index in watch.timed_out:
            problems.append(f"timed out in {where(nb, index)} after {settings.timeout} s (the kernel was interrupted)")
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error" and "raises-exception" not in cell.metadata.get("tags", []):
                problems.append(one_line(f"error in {where(nb, index)}: {out.ename}: {out.evalue}"))
    if client.cut_in is not None:
        problems.append(f"the output passed the limit of {size_text(settings.output)} (--output) in "
                        f"{where(nb, client.cut_in)}: later output was dropped, and the cell interrupted")  # fmt: skip
    if ended is not None:
        problems.append(f"{ended}; the cells after it did not run (the verdicts of the checks before it are kept)")
    verdicts, started_log, doubts = read_log(folder / "verdicts.log", key, course)
    if why is None and not started_log:
        why = "the kernel never started its verdict log (was it the course's kernel? run make env again)"
    if why is not None:
        return None, problems, why, suspect, {}
    used = {"cpu_seconds": round(limits.cpu, 1), "peak_memory_mb": round(limits.peak / 2**20)} if limits else {}
    return verdicts, problems, None, suspect + doubts, used


def read_log(log: Path, key: bytes, course: str | None = None) -> tuple[dict, bool, list[str]]:
    """The last verdict of each exercise in the kernel's log, whether the log was started, and what
    makes it suspect: lines not signed with this run's key (left out), lines out of order, a
    ``hooklab`` other than the course's. A verdict written while something in the checking
    machinery was changed becomes ``suspect``, with what was changed."""
    from hooklab.exercises import sign

    try:
        lines = log.read_text(encoding="utf-8", errors="replace").split("\n")
    except FileNotFoundError:
        return {}, False, []
    lines.pop()  # "" after the last newline; else a line cut off when the kernel was killed
    verdicts, started, doubts, seq = {}, False, [], 0
    for line in lines:
        payload = line.rpartition("\t")[0]
        if not hmac.compare_digest(sign(key, payload).encode(), line.encode()):
            doubts.append("the verdict log holds lines the course's check did not write (they were left out)")
            continue
        record = json.loads(payload)  # signed with the key: written by the course's hooklab
        if record["seq"] != seq:
            doubts.append("the verdict log's lines are out of order or repeated")
        seq = record["seq"] + 1
        if record["kind"] == "start" and record["seq"] == 0:
            started = True
            doubts += course_hooklab(record["hooklab"], record["files"], course)
        elif record["kind"] == "check":
            verdict, detail = record["verdict"], record["detail"]
            if record["suspect"]:
                said = f"; the check said: {verdict}" + (f" — {detail}" if detail else "")
                verdict, detail = "suspect", "; ".join(record["suspect"]) + said
            verdicts[record["id"]] = (verdict, detail)
    return verdicts, started, list(dict.fromkeys(doubts))


def course_files() -> str:
    """The hash of the course's hooklab files (``hooklab.exercises.package_hash``)."""
    import hooklab
    from hooklab.exercises import package_hash

    return package_hash(os.path.dirname(hooklab.__file__))


def course_hooklab(folder: str, files: str, course: str | None) -> list[str]:
    """Why the kernel's hooklab (its folder, the hash of its files) is not the course's, if it is
    not. ``course``: the course's hash when the kernel started (it is hashed again, in case the
    course itself was edited while the kernel started)."""
    import hooklab

    ours = os.path.dirname(hooklab.__file__)
    if os.path.realpath(folder) != os.path.realpath(ours):
        return [f"the kernel imported hooklab from {folder}, not the course's {ours}"]
    if files not in (course, course_files()):
        return [f"the files of hooklab in {ours} are not the course's (their hash differs)"]
    return []


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


def report(path: Path, verdicts: dict, problems: list[str], suspect: list[str] = ()) -> tuple[list[str], dict]:
    """The report's lines for one notebook, and the same as a dict (for the JSON). When the notebook
    as a whole is ``suspect`` (why: ``suspect``), each of its passed verdicts becomes ``suspect``."""
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
        if suspect and verdict in ("passed", "right"):
            verdict, detail = "suspect", f"{'; '.join(suspect)}; the check said: {verdict}" + \
                (f" — {detail}" if detail else "")  # fmt: skip
        return {"title": titles.get(id, ""), "verdict": verdict, "detail": detail}

    rows = {id: row(id, verdicts.get(id, NOT_CHECKED)) for id in mine}
    others = {id: row(id, v) for id, v in verdicts.items() if id not in rows}
    predictions = {id: row(id, v) for id, v in guesses.items()}
    passed = sum(r["verdict"] == "passed" for r in rows.values())
    lines = [f"{path}: {passed} of {len(rows)} passed"]
    lines += [f"  suspect: {why}" for why in suspect]
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
    made = [r["verdict"] for r in predictions.values() if r["verdict"] != "no guess yet"]
    if made:
        lines.append(f"  predictions: {made.count('right')} right of {len(made)} made (not marked)")
    lines += [f"  {p}" for p in problems]
    result = {"graded": True, "number": number, "passed": passed, "of": len(rows), "exercises": rows,
              "also_checked": others, "predictions": predictions, "problems": problems,
              "suspect": list(suspect)}  # fmt: skip
    return lines, result


def write(path: Path, text: str) -> None:
    """Replace ``path`` in one step, so an interrupted batch leaves a whole file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cores() -> int:
    """The cores this process may use (all of the machine's where the system cannot say, as on macOS)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def size(text: str) -> int:
    """Bytes from ``2G``, ``1500M``, ``512k`` or a plain number of bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write e.g. 2G, 1500M)")
    return int(float(found[1]) * 2 ** {"": 0, "k": 10, "m": 20, "g": 30}[found[2].lower()])


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[tuple[Path, str]]]:
    """The options, and every notebook to grade with its student's name."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="students' notebooks (.ipynb), or folders of them")
    parser.add_argument("--json", type=Path, help="also write the verdicts to this file (after every notebook)")
    parser.add_argument("--csv", type=Path, help="also write one row per student and exercise to this file")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell before it is interrupted")
    parser.add_argument("--jobs", type=int, default=cores(),
                        help="notebooks run at a time, one kernel each (default: the number of cores)")  # fmt: skip
    parser.add_argument("--memory", type=size, default=size("2G"), metavar="SIZE",
                        help="memory a notebook's kernel may hold resident, with every process it starts (default "
                             "2G; watched every 0.1 s, then the kernel is killed)")  # fmt: skip
    parser.add_argument("--cpu-time", type=int, default=900, dest="cpu", metavar="SECONDS",
                        help="CPU seconds a notebook's kernel may use in all (default 900)")  # fmt: skip
    parser.add_argument("--output", type=size, default=size("20M"), metavar="SIZE",
                        help="output a notebook may print (default 20M; past it the cell is interrupted and later "
                             "output dropped)")  # fmt: skip
    parser.add_argument("--sandbox", choices=["required", "fallback", "off"], default="required",
                        help="run each kernel in bubblewrap: no network, the system read-only, writes only in its "
                             "temporary folder (default required: stop if bwrap is missing; fallback: grade "
                             "without it, with a warning; off: without it, for your own notebooks)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("timeout", "jobs", "memory", "cpu", "output"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('cpu', 'cpu-time')} must be a positive number")
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
    if args.sandbox != "off":
        broken = sandbox_broken()
        if broken is not None and args.sandbox == "required":
            print(NO_SANDBOX.format(why=broken), file=sys.stderr)
            raise SystemExit(2)
        if broken is not None:
            print(WARNING.format(why=broken), file=sys.stderr, flush=True)
            args.sandbox = "off"
    return args, found


WARNING = ("\n" + "!" * 100 + "\nWARNING: grading WITHOUT the sandbox: bubblewrap (bwrap) is not installed or does not "
           "work here{why}.\nEach student's code runs with your permissions: it can write wherever you can and reach "
           "the network.\nThe limits on memory, CPU time and output still hold. tools/ensure_sandbox.sh installs "
           "bubblewrap.\n" + "!" * 100 + "\n")  # fmt: skip


def sandbox_broken() -> str | None:
    """Why bwrap cannot run a sandbox here, or None when it can."""
    if shutil.which("bwrap") is None:
        return ""
    try:
        tried = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                                "--unshare-pid", "--die-with-parent", "--", "true"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f" ({type(exc).__name__}: {exc})"
    return None if tried.returncode == 0 else f" (bwrap says: {one_line(tried.stderr.strip())})"


def settings_of(args: argparse.Namespace, found: list[tuple[Path, str]]) -> Settings:
    """The limits, and the folders the sandbox hides: those holding the notebooks graded (so that one
    student's code cannot read another's notebook), except a folder that holds the course itself."""
    import hooklab

    needed = [Path(hooklab.__file__).resolve().parent, Path(sys.prefix).resolve(), GRADE_KERNEL.parent]
    folders = {p.resolve().parent for p, _ in found} | {g.resolve() for g in args.notebooks if g.is_dir()}
    hidden = sorted(str(f) for f in folders if not any(n.is_relative_to(f) for n in needed) and f != Path("/"))
    return Settings(timeout=args.timeout, memory=args.memory, cpu=args.cpu, output=args.output,
                    sandbox=args.sandbox != "off", hidden=hidden)  # fmt: skip


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
    settings = settings_of(args, found)
    results, rows, status = {}, [], 0
    runs = graded([p for p, _ in found], args.jobs, settings)
    for (path, student), (verdicts, problems, why, suspect, used) in zip(found, runs, strict=True):
        if why is None:
            lines, result = report(path, verdicts, problems, suspect)
            result["used"] = used
            status = status or int(any("did not run" in p for p in problems))
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
    if args.sandbox == "off" and argv_sandbox(argv) != "off":
        print(WARNING.format(why=""), file=sys.stderr)  # again at the end, where it is seen
    return status


def argv_sandbox(argv: list[str] | None) -> str:
    """The --sandbox the command line asked for (parse turns a fallback without bwrap into off)."""
    argv = sys.argv[1:] if argv is None else argv
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--sandbox=")]
    given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--sandbox"]
    return given[-1] if given else "required"


def graded(paths: list[Path], jobs: int, settings: Settings):
    """``run``'s result for each path, in order; ``jobs`` notebooks run at a time, each in its
    own worker process (started fresh, not forked from this one) with its own kernel."""
    if jobs == 1 or len(paths) == 1:
        yield from (run(p.resolve(), settings) for p in paths)
        return
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=spawn) as pool:
        futures = [pool.submit(run, p.resolve(), settings) for p in paths]
        for future in futures:
            try:
                yield future.result()
            except Exception as exc:  # the worker process itself died (killed, out of memory)
                yield None, [], one_line(f"the grading process died: {type(exc).__name__}: {exc}"), [], {}


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
