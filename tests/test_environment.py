"""The environment: one list of pins, mirrored exactly by environment.yml; JupyterLab has widgets."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from hooklab.course import pinned_versions

ROOT = Path(__file__).resolve().parents[1]


def conda_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        match = re.match(r"^\s*-\s*([A-Za-z0-9_.-]+)==(\S+)\s*$", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_environment_yml_has_exactly_the_same_pins():
    assert conda_pins() == pinned_versions(ROOT / "requirements.txt")
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


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


def test_reuse_freed_memory_is_safe_to_call_again():
    from hooklab.course import reuse_freed_memory

    first, second = reuse_freed_memory(), reuse_freed_memory()
    assert first == second and isinstance(first, bool)
