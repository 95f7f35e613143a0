"""The stored outputs on every supported Python found on this machine (``make pythons``).

For each supported version (3.11, 3.12, 3.13: ``SUPPORTED``, the Makefile's ``SUPPORTED_PYTHONS``)
this finds an interpreter, a ``pythonX.Y`` on PATH that runs, else one of pyenv's versions, and
runs strict nbval on every notebook in a virtual environment of that Python: ``.venv`` when it is
that version (the one ``make env`` built), else ``.venv-X.Y``, created and installed like ``make
env`` does (``requirements.lock``, then hooklab and the course's kernel; pip's cache is reused, and
nothing is reinstalled while the lock and ``pyproject.toml`` are unchanged). It prints one line per
version, passed, failed (with the failing cells) or not found, and exits 1 when a run failed; a
version that is not on the machine is reported, not failed. A new venv takes 6.2 GB: with less than
``VENV_GB`` free the version fails before pip starts, saying so, and a failed install prints the
last lines of its log, so that a CI log shows the cause.

Measured on this machine kind (2 shared cores, 2026-11-28), 3.12.1 and 3.13.0 two at a time:
with both venvs installed, nbval took 397 s and 376 s side by side, 6.6 minutes in all (load 5-7);
a first install of a venv (about 6 GB from the configured mirror, which pip does not cache: it
is local files) took 12-20 minutes at a load of 10-18, 2-3 minutes on a quiet machine.

    python tools/pythons.py                      # every supported version found
    python tools/pythons.py 3.12 3.13 --jobs 1   # these two, one after the other
    python tools/pythons.py --skip-venv          # not .venv's version (make test has checked it)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ("3.11", "3.12", "3.13")
VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# the nbval options of the Makefile's NBVAL
NBVAL = ["-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-kernel-name", "hooklab",
         "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=300"]  # fmt: skip
PIP = ["-m", "pip", "install", "--disable-pip-version-check", "-q"]
INSTALLING = Lock()  # one install at a time: `pip install -e .` writes src/hooklab.egg-info
VENV_GB = 7.0  # a venv of requirements.lock takes 6.2 GB (torch's CUDA build); pip needs room to unpack
TAIL = 15  # lines of a failed install's log printed with the failure, so a CI log shows the cause


def version_of(python: str | Path) -> str | None:
    """``X.Y.Z`` of the interpreter, or None when it does not run (e.g. a pyenv shim of a version
    that is installed but not selected)."""
    try:
        result = subprocess.run([str(python), "-c", VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def pyenv_pythons(minor: str) -> list[Path]:
    """pyenv's interpreters of version ``minor`` (``3.12``), newest patch first."""
    root = os.environ.get("PYENV_ROOT") or (Path.home() / ".pyenv")
    if shutil.which("pyenv"):
        result = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        root = result.stdout.strip() or root
    found = [path / "bin" / f"python{minor}" for path in Path(root, "versions").glob(f"{minor}.*")]
    patch = lambda path: [int(n) if n.isdigit() else -1 for n in re.split(r"[.]", path.parents[1].name)]  # noqa: E731
    return sorted((path for path in found if path.exists()), key=patch, reverse=True)


def find(minor: str) -> tuple[str, str] | None:
    """An interpreter of version ``minor`` and its full version: on PATH first, then pyenv's."""
    candidates = [shutil.which(f"python{minor}"), *pyenv_pythons(minor)]
    for python in filter(None, candidates):
        version = version_of(python)
        if version and version.rsplit(".", 1)[0] == minor:
            return str(python), version
    return None


class NoRoom(Exception):
    """Too little disk for a new venv: said before pip fills the disk."""


@dataclass
class Run:
    minor: str
    version: str = ""
    venv: str = ""
    status: str = "not found"
    install_s: float = 0.0
    nbval_s: float = 0.0
    summary: str = ""
    failed: tuple[str, ...] = ()
    detail: tuple[str, ...] = ()


def ensure_venv(python: str, venv: Path, log) -> float:
    """Create and install ``venv`` as ``make env`` does, unless it is up to date; seconds spent."""
    stamp = venv / ".hooklab-installed"
    inputs = [ROOT / "requirements.lock", ROOT / "pyproject.toml", ROOT / "tools" / "install_kernel.py"]
    if stamp.exists() and all(stamp.stat().st_mtime >= path.stat().st_mtime for path in inputs):
        return 0.0
    start = time.perf_counter()
    bin_python = venv / "bin" / "python"
    free_gb = shutil.disk_usage(ROOT).free / 1e9
    if not bin_python.exists() and free_gb < VENV_GB:
        raise NoRoom(f"{free_gb:.1f} GB free on the disk of the checkout, a new venv needs about {VENV_GB:.0f} GB:"
                     " free space (make clean deletes the .venv-X.Y) or name the versions to check")  # fmt: skip
    steps = [[python, "-m", "venv", str(venv)]] if not bin_python.exists() else []
    steps += [[str(bin_python), *PIP, "-r", "requirements.lock"],
              [str(bin_python), *PIP, "--no-deps", "-e", "."],
              [str(bin_python), "tools/install_kernel.py"]]  # fmt: skip
    for step in steps:
        log.write(f"$ {' '.join(step)}\n")
        log.flush()
        subprocess.run(step, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    stamp.touch()
    return time.perf_counter() - start


def check(minor: str, python: str, version: str, notebooks: list[str], logs: Path) -> Run:
    main = ROOT / ".venv"
    venv = main if version_of(main / "bin" / "python") == version else ROOT / f".venv-{minor}"
    run = Run(minor, version, os.path.relpath(venv, ROOT))
    with open(logs / f"pythons-{minor}.log", "w") as log:
        start = time.perf_counter()
        try:
            with INSTALLING:
                run.install_s = ensure_venv(python, venv, log)
        except NoRoom as error:
            run.status, run.summary = "failed", f"install not started: {error}"
            return run
        except subprocess.CalledProcessError as error:
            run.install_s = time.perf_counter() - start
            where = os.path.relpath(log.name, ROOT)
            run.status, run.summary = "failed", f"install failed: {' '.join(error.cmd[1:4])} (see {where})"
            log.flush()
            run.detail = tuple(Path(log.name).read_text(errors="replace").splitlines()[-TAIL:])
            return run
        env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
        # its own kernel first: the "hooklab" kernelspec of this venv, not one found elsewhere
        env.update(PYTHONHASHSEED="0", JUPYTER_PATH=str(venv / "share" / "jupyter"))
        start = time.perf_counter()
        result = subprocess.run([str(venv / "bin" / "python"), *NBVAL, "-q", "-rf", *notebooks], cwd=ROOT, env=env,
                                capture_output=True, text=True)  # fmt: skip
        run.nbval_s = time.perf_counter() - start
        log.write(result.stdout + result.stderr)
    lines = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout).strip().splitlines()  # without colour codes
    run.summary = lines[-1].strip("= ") if lines else f"no output (exit {result.returncode})"
    run.failed = tuple(line.removeprefix("FAILED ").split(" - ")[0] for line in lines if line.startswith("FAILED "))
    run.status = "passed" if result.returncode == 0 else "failed"
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="*", default=list(SUPPORTED), help="versions to check (default: all)")
    parser.add_argument("--skip-venv", action="store_true", help="leave out .venv's version (make test checked it)")
    parser.add_argument("--jobs", type=int, default=2, help="Pythons checked at the same time (default 2)")
    parser.add_argument("--notebooks", nargs="+", default=["notebooks"], help="what nbval runs (default: all)")
    args = parser.parse_args(argv)
    unknown = [v for v in args.versions if v not in SUPPORTED]
    if unknown:
        parser.error(f"not a supported version: {', '.join(unknown)} (supported: {', '.join(SUPPORTED)})")
    logs = ROOT / "artifacts"
    logs.mkdir(exist_ok=True)
    main_version = version_of(ROOT / ".venv" / "bin" / "python") or ""
    runs, todo = {}, []
    for minor in args.versions:
        found = find(minor)
        if args.skip_venv and main_version.rsplit(".", 1)[0] == minor:
            runs[minor] = Run(minor, main_version, ".venv", "skipped (make test ran nbval on .venv)")
        elif found is None:
            runs[minor] = Run(minor)
        else:
            todo.append((minor, *found))
    print(f"nbval on Python {', '.join(minor for minor, *_ in todo) or '(none)'}; logs in artifacts/pythons-X.Y.log")
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {minor: pool.submit(check, minor, python, version, args.notebooks, logs)
                   for minor, python, version in todo}  # fmt: skip
        for minor, future in futures.items():
            runs[minor] = future.result()
    for minor in args.versions:
        run = runs[minor]
        line = f"Python {minor}: {run.status}"
        if run.version and run.status in ("passed", "failed"):
            line += (f" (Python {run.version} in {run.venv}; install {run.install_s:.0f} s, nbval {run.nbval_s:.0f} s;"
                     f" {run.summary})")  # fmt: skip
        elif run.status == "not found":
            line += f" (no python{minor} on PATH, none in pyenv; install it, or leave it out)"
        print(line)
        for cell in run.failed:
            print(f"    failed: {cell}")
        for text in run.detail:
            print(f"    | {text}")
    print(f"total {time.perf_counter() - start:.0f} s")
    return 1 if any(run.status == "failed" for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
