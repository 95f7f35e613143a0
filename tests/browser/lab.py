"""A private JupyterLab server for the browser tests: its own config, runtime, settings and
workspace directories, a token, 127.0.0.1 on a free port, and a stop that leaves no process behind.

``LabServer`` starts ``jupyter lab`` from the project's environment (the Python running the tests)
in a new process group, waits for ``/api/status``, and ``stop()`` shuts its kernels down through
the REST API, then ends the server by its own PID (process group), and finally any process the
server started (kernels run in their own sessions) that is still alive.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

#: Settings that make the UI predictable for a test: every cell stays in the DOM (no windowing,
#: so every output can be inspected), no news or update checks, no autosave surprises.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """``with LabServer(root, home) as lab: lab.url("lab/tree/x.ipynb")`` — stopped on exit, also on error."""

    def __init__(self, root: Path, home: Path, startup_timeout: float = 90.0):
        self.root = Path(root)
        self.home = Path(home)
        self.startup_timeout = startup_timeout
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "jupyter.log"

    # ----- addresses -----------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        request = urllib.request.Request(self.url(f"api/{path}"), method=method)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    # ----- lifecycle -----------------------------------------------------------------------
    def _environment(self) -> dict[str, str]:
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
            "IPYTHONDIR": "ipython",
        }
        env = dict(os.environ)
        for var, name in dirs.items():
            path = self.home / name
            path.mkdir(parents=True, exist_ok=True)
            env[var] = str(path)
        # os.environ already holds the course's kernel environment, without PYTHONWARNINGS (tests/conftest.py)
        env.pop("JUPYTER_TOKEN", None)
        for name, values in LAB_SETTINGS.items():
            path = self.home / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        return env

    def start(self) -> LabServer:
        command = [
            sys.executable, "-m", "jupyter", "lab", "--no-browser",
            "--ip", "127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
            "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: read cell outputs from the page
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--allow-root")
        env = self._environment()  # creates self.home and its directories
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.api("status", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.25)  # polling a server that is starting: nothing to wait on in a page yet
        raise TimeoutError(f"jupyter lab did not answer /api/status in {self.startup_timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Shut kernels down, end the server by its PID (process group), then any leftover child."""
        if self.proc is None:
            return
        pid, proc, self.proc = self.proc.pid, self.proc, None
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if proc.poll() is None:
            try:
                for kernel in self.api("kernels"):
                    self.api(f"kernels/{kernel['id']}", method="DELETE", timeout=10)
            except (urllib.error.URLError, OSError, ValueError):
                pass  # the server is stopped below anyway
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for child in children:  # kernels live in their own sessions: end them by their own PIDs
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=10)

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
