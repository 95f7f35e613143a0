"""The environment: requirements.txt pins the direct dependencies, requirements.lock every package;
environment.yml and binder/requirements.txt carry the lock's pins exactly; what is installed is what
is locked; make stops before any download on a Python other than 3.11; JupyterLab has widgets."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from lock import conda_pins, pins  # tools/, on pytest's path
from packaging.requirements import Requirement

from hooklab.course import pinned_versions

ROOT = Path(__file__).resolve().parents[1]
LOCKED = pins((ROOT / "requirements.lock").read_text())


def test_the_lock_pins_every_package_exactly_and_each_direct_pin_at_its_version():
    locked = {}
    for line in LOCKED:
        req = Requirement(line)
        (spec,) = req.specifier  # one exact version per line (and per environment marker)
        assert spec.operator == "==", f"not an exact pin: {line}"
        locked.setdefault(req.name.lower(), set()).add(spec.version)
    for name, version in pinned_versions(ROOT / "requirements.txt").items():
        assert locked.get(name) == {version}, f"{name}=={version} in requirements.txt, {locked.get(name)} locked"
    assert len(locked) > 3 * len(pinned_versions(ROOT / "requirements.txt"))  # the indirect ones are there


def test_environment_yml_and_binder_carry_exactly_the_locked_pins():
    assert conda_pins((ROOT / "environment.yml").read_text()) == LOCKED
    assert "python=3.11" in (ROOT / "environment.yml").read_text()
    assert pins((ROOT / "binder" / "requirements.txt").read_text()) == LOCKED
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_every_locked_package_for_this_platform_is_installed_at_the_locked_version():
    wrong = []
    for line in LOCKED:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            installed = importlib.metadata.version(req.name)
            if installed not in req.specifier:
                wrong.append(f"{req.name}: {installed} installed, {req.specifier} locked")
    assert not wrong, "run make env: " + "; ".join(wrong)


def test_every_requirement_is_an_exact_pin():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][^\s]*", line), f"not an exact pin: {line}"


def test_package_dependencies_are_all_pinned_and_installed_at_the_pin():
    pins = pinned_versions(ROOT / "requirements.txt")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = re.split(r"[<>=!\[ ]", dep, maxsplit=1)[0].lower()
        assert name in pins, f"{name} is a dependency of hooklab but has no pin in requirements.txt"
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, f"{name}: installed != pinned"


def test_jupyterlab_has_the_widget_extension_enabled():
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, timeout=120
    )
    listing = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # drop colour codes
    assert re.search(r"@jupyter-widgets/jupyterlab-manager v\S+ enabled\s+OK", listing), listing


def test_make_reinstalls_nothing_when_pins_are_unchanged():
    """`make -q env` exits 0 only when the venv's install stamp is newer than the pins."""
    result = subprocess.run(["make", "-q", "env"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, "the environment would be rebuilt although nothing changed"


@pytest.mark.parametrize("version", ["3.12.7", "3.10.14"])
def test_make_stops_before_any_download_on_another_python(tmp_path, version):
    """A stand-in python that reports another version and would log any other use of itself."""
    fake, log, venv = tmp_path / "python3", tmp_path / "calls.log", tmp_path / "venv"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\ncase \"$*\" in *version_info*) echo {version}; exit 1;; esac\n")
    fake.chmod(0o755)
    result = subprocess.run(["make", "env", f"PYTHON={fake}", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})  # fmt: skip
    assert result.returncode != 0
    assert f"Hook Lab needs Python 3.11, and {fake} is Python {version}" in result.stdout + result.stderr
    assert not venv.exists()
    assert all("version_info" in call for call in log.read_text().splitlines())  # no venv, no pip


def test_reuse_freed_memory_is_safe_to_call_again():
    from hooklab.course import reuse_freed_memory

    first, second = reuse_freed_memory(), reuse_freed_memory()
    assert first == second and isinstance(first, bool)
