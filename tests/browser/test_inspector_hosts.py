"""The same notebook (e2e_inspector.ipynb) in the other anywidget hosts we can run here: Jupyter
Notebook 7 (its own front end on the Jupyter server) and marimo (the notebook converted by
`marimo convert`, served by `marimo run` on 127.0.0.1). In each, the widget renders, the buttons
reach the kernel and the kernel's replies come back (JupyterLab 4 is test_inspector_e2e.py).
Screenshots go to test-artifacts/."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
NOTEBOOK = "e2e_inspector.ipynb"
LONG = 180_000
ROOT = HERE.parents[1]

sys.path.insert(0, str(HERE))
from lab_server import LabServer, free_port  # noqa: E402
from test_inspector_e2e import _kernel_state, _menu  # noqa: E402


def _env() -> dict:
    # the servers' kernels import this checkout's package
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _step_three_times(root, expect) -> None:
    step = root.get_by_role("button", name="Step", exact=True)
    step.click()  # the first Step stops before the call of fc1
    expect(root.locator(".nnsp-status")).to_contain_text("before fc1", timeout=60_000)
    for n in (1, 2, 3):
        step.click()
        expect(root.locator(".nnsp-status")).to_contain_text(f"step {n}", timeout=60_000)
    expect(root.locator(".nnsp-row.nnsp-current")).to_contain_text("hidden = self.fc1(x)")
    expect(root.locator(".nnsp-hist[data-role='activation'] rect").first).to_be_attached()
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("hidden [2, 256]")


def test_the_notebook_runs_in_jupyter_notebook_7(browser, artifacts, tmp_path, monkeypatch):
    pytest.importorskip("notebook", minversion="7")
    from playwright.sync_api import expect

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    server = LabServer(tmp_path / "root", [HERE / NOTEBOOK], app="notebook").start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(f"{error}\n{error.stack}"))
        page.goto(server.url(NOTEBOOK))
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
        page.wait_for_timeout(2000)
        _menu(page, "Run", "Run All Cells")
        root = page.locator(".nnsp-root")
        root.wait_for(timeout=LONG)
        expect(root.locator(".nnsp-tree")).to_contain_text("hidden = self.fc1(x)", timeout=LONG)
        _step_three_times(root, expect)
        state = _kernel_state(page)
        assert state["step_index"] == 3 and state["status"] == "paused"
        root.screenshot(path=str(artifacts / "host-notebook7.png"))
        # Notebook 7's own bundle (notebook_core, its settings loader) throws "reading 'schema'" on this
        # fresh server; the stack is not the widget's code. Every other page error fails the test.
        ours = [e for e in errors if "/static/notebook/notebook_core." not in e]
        assert not ours, ours
        page.close()
    finally:
        server.stop()


def test_the_notebook_runs_in_marimo(browser, artifacts, tmp_path):
    pytest.importorskip("marimo")
    from playwright.sync_api import expect

    app = tmp_path / "e2e_inspector.py"
    subprocess.run([sys.executable, "-m", "marimo", "convert", str(HERE / NOTEBOOK), "-o", str(app)], check=True,
                   env=_env(), capture_output=True, timeout=120)
    port = free_port()
    log = (tmp_path / "marimo.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(app), "--headless", "--host", "127.0.0.1",
                                "--port", str(port), "--no-token"], env=_env(), stdout=log, stderr=subprocess.STDOUT,
                               cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"marimo did not start: {(tmp_path / 'marimo.log').read_text()[-2000:]}")
                time.sleep(0.5)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"http://127.0.0.1:{port}/")
        root = page.locator(".nnsp-root")
        root.wait_for(timeout=LONG)
        expect(root.locator(".nnsp-tree")).to_contain_text("hidden = self.fc1(x)", timeout=LONG)
        _step_three_times(root, expect)
        # a reset and a step from the keyboard: the kernel answers through marimo's model too
        root.locator(".nnsp-title").click()
        page.keyboard.press("r")
        expect(root.locator(".nnsp-status")).to_contain_text("ready")
        page.keyboard.press("s")  # before the call of fc1
        expect(root.locator(".nnsp-status")).to_contain_text("before fc1")
        page.keyboard.press("s")
        expect(root.locator(".nnsp-status")).to_contain_text(re.compile(r"paused · step 1"))
        root.screenshot(path=str(artifacts / "host-marimo.png"))
        assert not errors, errors
        page.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
