"""The environment: requirements.txt pins the direct dependencies, requirements.lock every package;
environment.yml and binder/requirements.txt carry the lock's pins exactly; what is installed is what
is locked; make accepts Python 3.11, 3.12 and 3.13 and stops before any download on another; JupyterLab has
widgets."""

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


SUPPORTED = ("3.11", "3.12", "3.13")


def fake_python(tmp_path, version):
    """A stand-in python that reports ``version``, logs every other use of itself and fails it."""
    fake, log = tmp_path / "python3", tmp_path / "calls.log"
    reply = f"case \"$*\" in *version_info*) echo {version}; exit 0;; esac"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n{reply}\nexit 1\n")
    fake.chmod(0o755)
    return fake, log


def make_env(fake, venv):
    return subprocess.run(["make", "env", f"PYTHON={fake}", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})  # fmt: skip


@pytest.mark.parametrize("version", ["3.10.14", "3.14.0", "3.9.18"])
def test_make_stops_before_any_download_on_another_python(tmp_path, version):
    fake, log = fake_python(tmp_path, version)
    result = make_env(fake, tmp_path / "venv")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"Hook Lab needs Python 3.11, 3.12 or 3.13, and {fake} is Python {version}." in out
    assert "make env PYTHON=/path/to/python3.13   (or python3.11, python3.12)" in out  # how to pick one
    assert not (tmp_path / "venv").exists()
    assert all("version_info" in call for call in log.read_text().splitlines())  # no venv, no pip


@pytest.mark.parametrize("version", ["3.11.7", "3.12.1", "3.13.0"])
def test_make_goes_on_to_create_the_venv_on_a_supported_python(tmp_path, version):
    """Past the check, make asks the fake for a venv (which it refuses): nothing is built."""
    fake, log = fake_python(tmp_path, version)
    result = make_env(fake, tmp_path / "venv")
    assert "Hook Lab needs" not in result.stdout + result.stderr
    assert f"-m venv {tmp_path / 'venv'}" in log.read_text().splitlines()
    assert not (tmp_path / "venv").exists()


def test_the_supported_pythons_agree_everywhere():
    """The Makefile, pyproject.toml's requires-python, make pythons and the README name the same versions."""
    from packaging.specifiers import SpecifierSet
    from pythons import SUPPORTED as checked  # tools/

    makefile = re.search(r"^SUPPORTED_PYTHONS := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert tuple(makefile) == checked == SUPPORTED
    for minor in range(8, 16):
        assert (f"3.{minor}" in SUPPORTED) == (f"3.{minor}.0" in requires), f"requires-python {requires}, 3.{minor}"
    assert "Python 3.11, 3.12 or 3.13" in (ROOT / "README.md").read_text()
    assert sys.version_info[:2] in [tuple(map(int, v.split("."))) for v in SUPPORTED]


def test_make_pythons_reports_a_python_it_does_not_find(tmp_path, monkeypatch, capsys):
    """No venv is built: with nothing on PATH and an empty pyenv, every version is 'not found'."""
    import pythons

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    assert pythons.main(["3.12", "3.13"]) == 0
    out = capsys.readouterr().out
    assert "Python 3.12: not found" in out and "Python 3.13: not found" in out


def test_reuse_freed_memory_is_safe_to_call_again():
    from hooklab.course import reuse_freed_memory

    first, second = reuse_freed_memory(), reuse_freed_memory()
    assert first == second and isinstance(first, bool)


def _fake_python(folder, minor, failing_output):
    """A ``python<minor>`` on PATH that tells its version and fails every other command."""
    script = folder / f"python{minor}"
    version = f'if [ "$1" = "-c" ]; then echo {minor}.9; exit 0; fi'
    script.write_text(f'#!/bin/sh\n{version}\necho "{failing_output}"\nexit 1\n')
    script.chmod(0o755)


def test_make_pythons_prints_why_an_install_failed(tmp_path, monkeypatch, capsys):
    """A failed install is a failure whose cause (the log's last lines) is in the printed report."""
    import pythons

    _fake_python(tmp_path, "3.12", "ERROR: [Errno 28] No space left on device")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(pythons, "ROOT", tmp_path)
    assert pythons.main(["3.12"]) == 1
    out = capsys.readouterr().out
    assert "Python 3.12: failed" in out and "install failed: -m venv" in out
    assert "| ERROR: [Errno 28] No space left on device" in out


def test_make_pythons_refuses_a_new_venv_without_room(tmp_path, monkeypatch, capsys):
    """Too little disk for a new venv: said before pip starts, with the fix."""
    import shutil

    import pythons

    _fake_python(tmp_path, "3.13", "should not run")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(pythons, "ROOT", tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**11, 10**11 - 10**9, 10**9))
    assert pythons.main(["3.13"]) == 1
    out = capsys.readouterr().out
    assert "install not started: 1.0 GB free" in out and "make clean" in out and "should not run" not in out
