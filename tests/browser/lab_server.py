"""A throwaway JupyterLab server and a headless Chromium for the browser tests (and the widget bench).

`LabServer` starts `jupyter lab` on 127.0.0.1 with a free port, a random token, `--no-browser`, a
temporary root folder and its own settings, config and runtime folders (nothing of the user's is
read or written), and stops it on `stop()`. The kernel is the Python running this code: jupyter
maps the native kernelspec's `python` to `sys.executable`. `launch_chromium` starts the Debian
Chromium at CHROMIUM with flags that keep it offline and quiet.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

# Settings that keep pop-ups (news, update checks) from covering the notebook.
_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/apputils-extension/themes.jupyterlab-settings": {"theme": "JupyterLab Light"},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """`jupyter lab` serving `root`; `url(path)` opens a notebook with the token."""

    def __init__(self, root: Path, notebooks: list[Path], app: str = "lab"):
        # app: "lab" (JupyterLab 4) or "notebook" (Jupyter Notebook 7, the same server with its own front end)
        if app not in ("lab", "notebook"):
            raise ValueError(f"app must be 'lab' or 'notebook', got {app!r}")
        self.app = app
        self.root = Path(root)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.process: Optional[subprocess.Popen] = None
        self.log_path = self.root.parent / "jupyterlab.log"
        self.root.mkdir(parents=True, exist_ok=True)
        for notebook in notebooks:
            shutil.copy(notebook, self.root / notebook.name)

    def start(self, timeout: float = 120.0) -> "LabServer":
        home = self.root.parent
        settings = home / "lab-settings"
        for name, value in _SETTINGS.items():
            path = settings / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "jupyter-config"),
                   JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"), JUPYTER_PLATFORM_DIRS="1")
        app = "LabApp" if self.app == "lab" else "JupyterNotebookApp"
        command = [sys.executable, "-m", "jupyter", self.app, "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
                   f"--{app}.user_settings_dir={settings}", f"--{app}.workspaces_dir={home / 'workspaces'}",
                   "--ServerApp.port_retries=0"] + (["--LabApp.extension_manager=readonly"] if self.app == "lab" else [])
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI often run as root
            command.append("--allow-root")
        log = self.log_path.open("w")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}; see {self.log_path}:\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s; see {self.log_path}")

    def url(self, path: str) -> str:
        where = "lab/tree" if self.app == "lab" else "notebooks"
        return f"http://127.0.0.1:{self.port}/{where}/{path}?token={self.token}"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


def run_code_cell(page, index: int, marker: Optional[str] = None, timeout: float = 120.0) -> str:
    """Run code cell `index` of the notebook open in `page` (JupyterLab or Notebook 7) and return its
    output text once the run has finished and, where `marker` is given, the output holds it.

    The cell is clicked and given Ctrl+Enter. A key press the page did not take (focus kept by a
    widget that was busy re-rendering) leaves the prompt as it was: after 10 s the cell is clicked
    and given the key again, so a lost key press costs seconds, not the whole timeout. A run that
    finishes without `marker` fails at once, with what the cell printed and the prompt it shows.
    """
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(index)
    prompt = cell.locator(".jp-InputArea-prompt")
    output = cell.locator(".jp-OutputArea")
    before = prompt.inner_text()
    deadline = time.monotonic() + timeout
    presses = 0
    now = before
    while time.monotonic() < deadline:
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        presses += 1
        taken = time.monotonic() + 10
        while time.monotonic() < min(taken, deadline) and prompt.inner_text() == before:
            time.sleep(0.1)
        if prompt.inner_text() != before:
            break
    finished_at = None
    while time.monotonic() < deadline:
        now = prompt.inner_text()
        if now != before and "*" not in now:
            text = output.inner_text()
            if marker is None or marker in text:
                return text
            # outputs travel on another channel than the reply that sets the prompt: give them 5 s
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at > 5:
                raise AssertionError(f"cell {index} finished ({now!r}) without printing {marker!r}; "
                                     f"it printed: {text[-800:]!r}")
        time.sleep(0.2)
    raise AssertionError(f"cell {index} did not finish printing {marker!r} within {timeout:.0f} s "
                         f"({presses} Ctrl+Enter; prompt was {before!r}, is {now!r}; "
                         f"output: {output.inner_text()[-800:]!r})")
