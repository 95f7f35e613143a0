"""The course's kernel, "Hook Lab": installed by make env, named by every notebook, and carrying
the kernel environment wherever a notebook is opened (JupyterLab, a hub, VS Code, nbval)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from install_kernel import DISPLAY_NAME, KERNEL_ENV, NAME, kernel_json  # tools/

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_the_kernel_is_installed_in_this_environment_with_the_course_settings():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(NAME)
    assert spec.display_name == DISPLAY_NAME
    assert spec.env == KERNEL_ENV and KERNEL_ENV["OMP_NUM_THREADS"] == "1"
    assert Path(spec.argv[0]).resolve() == Path(sys.executable).resolve()


def test_a_course_kernel_keeps_cancelling_queued_cells_after_an_error():
    """Run All sends every cell at once; with ipykernel's default wait of 0 s, a cell whose request arrives
    after the error was handled still runs (the browser test caught it on a loaded machine)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=NAME)
    printed = []
    try:
        reply = kc.execute_interactive("print(get_ipython().kernel.stop_on_error_timeout)", timeout=60,
                                       output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok" and "".join(printed).strip() == "1.0"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_every_notebook_names_the_course_kernel(path):
    spec = json.loads(path.read_text())["metadata"]["kernelspec"]
    assert spec == {"name": NAME, "display_name": DISPLAY_NAME, "language": "python"}


def test_a_kernel_started_from_the_spec_runs_with_its_environment(monkeypatch):
    """Start the installed kernel the way JupyterLab does and ask it for its environment: the values
    must come from the spec, not from this process (conftest sets them here too)."""
    from jupyter_client.manager import start_new_kernel

    for name in KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)

    printed = []

    def keep(message):
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    env = "os.environ['OMP_NUM_THREADS'], os.environ['PYTHONHASHSEED']"
    code = f"import os, torch\nprint({env}, torch.get_num_threads())"
    manager, client = start_new_kernel(kernel_name=NAME)
    try:
        reply = client.execute_interactive(code, timeout=120, output_hook=keep)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    assert "".join(printed).split() == ["1", "0", "1"]


def test_the_spec_is_written_for_the_python_that_installs_it():
    spec = kernel_json("/some/python")
    assert spec["argv"][0] == "/some/python" and spec["argv"][-2:] == ["-f", "{connection_file}"]
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "install_kernel.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--user" in out
