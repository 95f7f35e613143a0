"""``make test``'s checks on two queues: the longest first, each check in its own process.

Each check is a Makefile target that also runs on its own (``make unit-core``, ``make sections``,
``make nbval``, ``make variant-no-simd``, ``make variant-avx2``, ``make browser``). They do not share
files, so any two can run side by side; two at a time keeps both cores busy (the machine's two
cores, or ``--jobs``). Each check's output goes to ``artifacts/checks/<target>.log``; this prints
one line when a check starts and one when it ends (its pytest summary), the end of the log of a
check that failed, and exits 1 when any check failed.

    python tools/run_checks.py [--jobs N] [target ...]

The expected durations order the queue (longest first, so the last check to start is short); they
are a fresh clone's seconds on 2 cores, measured side by side, and only order the work.
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "artifacts" / "checks"

# target: expected seconds, side by side with another check
CHECKS = {
    "sections": 180,
    "variant-no-simd": 175,
    "unit-core": 155,
    "variant-avx2": 142,
    "nbval": 140,
    "browser": 77,
}


def summary(log: Path) -> str:
    """The last pytest summary line of a log ("481 passed in 147.08s"), without its ``=`` frame."""
    lines = [line.strip().strip("=").strip() for line in log.read_text(errors="replace").splitlines()]
    found = [line for line in lines if " passed" in line or " failed" in line or " error" in line]
    return found[-1] if found else (lines[-1] if lines else "no output")


def run(target: str, started: float, print_lock: threading.Lock) -> bool:
    log = LOGS / f"{target}.log"
    with print_lock:
        print(f"[{time.monotonic() - started:5.0f} s] start  {target}", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.call(["make", "--no-print-directory", target], cwd=ROOT, stdout=out,
                             stderr=subprocess.STDOUT)
    with print_lock:
        mark = "ok  " if rc == 0 else "FAIL"
        print(f"[{time.monotonic() - started:5.0f} s] {mark}   {target}: {summary(log)} "
              f"({time.monotonic() - t0:.0f} s; log: {log.relative_to(ROOT)})", flush=True)
        if rc:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(f"    {line}" for line in tail), flush=True)
    return rc == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="checks at a time (default 2)")
    parser.add_argument("targets", nargs="*", help=f"checks to run (default: all of {', '.join(CHECKS)})")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in CHECKS]
    if unknown or args.jobs < 1:
        parser.error(f"unknown check {', '.join(unknown)}: choose from {', '.join(CHECKS)}" if unknown
                     else "--jobs must be at least 1")
    todo: queue.Queue[str] = queue.Queue()
    for target in sorted(args.targets or CHECKS, key=lambda t: -CHECKS[t]):
        todo.put(target)
    LOGS.mkdir(parents=True, exist_ok=True)
    started, print_lock, failed = time.monotonic(), threading.Lock(), []

    def worker() -> None:
        while True:
            try:
                target = todo.get_nowait()
            except queue.Empty:
                return
            if not run(target, started, print_lock):
                failed.append(target)

    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.monotonic() - started
    if failed:
        print(f"{len(failed)} of {len(args.targets or CHECKS)} checks failed in {total:.0f} s: {', '.join(failed)}")
        return 1
    n = len(args.targets or CHECKS)
    print(f"{n} of {n} checks passed in {total:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.pop("MAKEFLAGS", None)
    sys.exit(main())
