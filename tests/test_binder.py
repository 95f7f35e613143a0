"""Binder and JupyterHub images: repo2docker's build plan for this repository installs the locked
packages with pip, then hooklab, nbgitpuller and the "Hook Lab" kernel (binder/postBuild), on
Python 3.11.

repo2docker is not part of the course's environment (it is the hub's tool, and Docker is not
needed to print a plan). Install it anywhere, e.g. ``python3 -m venv /tmp/r2d &&
/tmp/r2d/bin/pip install jupyter-repo2docker``, and put it on PATH or name it in
``HOOKLAB_REPO2DOCKER``; without it the plan test is skipped (CONTRIBUTING.md shows its output).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO2DOCKER = os.environ.get("HOOKLAB_REPO2DOCKER") or shutil.which("repo2docker")


@pytest.fixture(scope="module")
def plan() -> str:
    if not REPO2DOCKER:
        pytest.skip("repo2docker is not installed (pip install jupyter-repo2docker, see CONTRIBUTING.md)")
    result = subprocess.run([REPO2DOCKER, "--no-build", "--no-run", "--debug", str(ROOT)], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout + result.stderr


def test_repo2docker_installs_the_locked_packages_then_hooklab_and_its_kernel(plan):
    assert "Building conda environment for python=3.11" in plan
    install = plan.index('pip install --no-cache-dir -r "binder/requirements.txt"')
    post_build = plan.index("RUN ./binder/postBuild")
    assert install < post_build
    # the root files are not what it reads: binder/ takes precedence
    assert "src/environment.yml" not in plan and "src/requirements.txt " not in plan


def test_post_build_installs_hooklab_and_the_kernel_into_the_image_python(tmp_path):
    """Run binder/postBuild with a stand-in python that logs what it is asked to do."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    subprocess.run([ROOT / "binder" / "postBuild"], cwd=ROOT, env=env, check=True, timeout=60)
    calls = log.read_text().splitlines()
    assert calls[0].startswith("-m pip install") and calls[0].endswith(" --no-deps .")
    # nbgitpuller for hubs, at an exact version, adding no package the lock does not pin
    assert calls[1].startswith("-m pip install") and calls[1].endswith(" --no-deps nbgitpuller==1.3.0")
    assert calls[2].startswith("tools/install_kernel.py")
    assert (ROOT / calls[2].split()[0]).is_file()
    assert len(calls) == 3


def test_the_package_postbuild_installs_holds_every_module_and_the_trained_weights(tmp_path):
    """binder/postBuild runs ``pip install .`` (not an editable install): the wheel it builds must
    carry every file hooklab loads, not only the ones an editable install finds in src/."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(source)], check=True, timeout=300)  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("hooklab-*.whl")
    packed = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("hooklab/")}
    needed = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "hooklab").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip
    assert any(name.endswith(".pt") for name in needed)  # the trained weights are among them
    assert needed - packed == set()
