"""Round three (issue 22, point 5) in the other hosts: Jupyter Notebook 7 and marimo, light and dark.

The notebook of test_round3_e2e.py (an sdpa Llama of 8 layers and a Mixtral); in each host, by
keyboard: a search, a breakpoint from the focused result, Continue to it (so the results, the call
stack's variables and the stop reason are on screen), then axe finds no serious or critical
violation inside either widget, and at 900 px nothing is cut off. marimo's dark theme comes from
its own config (`[display] theme = "dark"`), which puts `dark-theme` on its body; the widget then
takes its own dark palette. Screenshots go to test-artifacts/.
"""

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
ROOT = HERE.parents[1]
NOTEBOOK = "e2e_round3.ipynb"
LONG = 180_000

sys.path.insert(0, str(HERE))
from lab_server import LabServer, free_port  # noqa: E402
from test_inspector_e2e import _menu  # noqa: E402
from test_inspector_views import assert_inside  # noqa: E402
from test_round3_e2e import NARROW, assert_current_in_view, axe_serious  # noqa: E402


def _env(**extra: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", **extra)


def _break_and_continue(page, root, expect, keyboard: bool = True) -> None:
    """Search, break at the first result, Continue to it. `keyboard=False` clicks the buttons instead
    (Notebook 7 here; its letter keys are tested in test_round4_hosts.py, where the widget's `b` no
    longer reaches the notebook's command shortcuts)."""
    root.locator(".nnsp-title").click()
    page.keyboard.press("/")
    page.keyboard.type("layers.1.self_attn")
    page.keyboard.press("Enter")
    first = root.locator(".nnsp-result").first
    expect(first).to_contain_text("model.layers.1.self_attn", timeout=60_000)
    expect(first).to_have_attribute("data-ran", "false")  # nothing ran yet
    if keyboard:
        page.keyboard.press("ArrowDown")
        page.keyboard.press("b")
    else:
        first.get_by_role("button", name=re.compile("^Break at")).click()
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of model.layers.1.self_attn")
    if keyboard:
        page.keyboard.press("Escape")
        page.keyboard.press("c")
    else:
        root.get_by_role("button", name="Continue").click()
    expect(root.locator(".nnsp-stop-reason")).to_have_text("stopped: entered model.layers.1.self_attn", timeout=60_000)
    expect(root.get_by_label("Variables of the selected frame")).to_contain_text("hidden_states")
    expect(first).to_have_attribute("data-ran", "true")  # the results shown follow the run: it is inside that block


def _check(page, artifacts, host: str, scheme: str) -> None:
    roots = page.locator(".nnsp-root")
    for width in (1280, 900):
        page.set_viewport_size({"width": width, "height": 3400 if width > 1000 else 4800})
        page.wait_for_timeout(500)
        roots.first.screenshot(path=str(artifacts / f"round3-{host}-llama-{width}-{scheme}.png"))
        assert_current_in_view(roots.first)
        if width == 900:
            for i in range(roots.count()):
                assert_inside(roots.nth(i), NARROW)
    serious = axe_serious(page)
    assert not serious, f"{host} {scheme}: {serious}"


def test_round3_in_jupyter_notebook_7_light_and_dark(browser, artifacts, tmp_path, monkeypatch):
    pytest.importorskip("notebook", minversion="7")
    from playwright.sync_api import expect

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    server = LabServer(tmp_path / "root", [HERE / NOTEBOOK], app="notebook").start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(f"{error}\n{error.stack}"))
        page.goto(server.url(NOTEBOOK))
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
        page.wait_for_timeout(2000)
        _menu(page, "Run", "Run All Cells")
        expect(page.locator(".nnsp-root")).to_have_count(2, timeout=LONG)
        root = page.locator(".nnsp-root").first
        _break_and_continue(page, root, expect, keyboard=False)
        _check(page, artifacts, "notebook7", "light")
        _menu(page, "Settings", "Theme", "JupyterLab Dark")
        page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
        page.wait_for_timeout(500)
        _check(page, artifacts, "notebook7", "dark")
        _menu(page, "Settings", "Theme", "JupyterLab Light")
        # Notebook 7's own bundle throws "reading 'schema'" on a fresh server (see test_inspector_hosts.py)
        ours = [e for e in errors if "/static/notebook/notebook_core." not in e]
        assert not ours, ours
        page.close()
    finally:
        server.stop()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_round3_in_marimo(browser, artifacts, tmp_path, scheme):
    pytest.importorskip("marimo")
    from playwright.sync_api import expect

    config = tmp_path / "config" / "marimo"
    config.mkdir(parents=True)
    (config / "marimo.toml").write_text(f'[display]\ntheme = "{scheme}"\n')
    env = _env(XDG_CONFIG_HOME=str(tmp_path / "config"))
    app = tmp_path / "e2e_round3.py"
    subprocess.run([sys.executable, "-m", "marimo", "convert", str(HERE / NOTEBOOK), "-o", str(app)], check=True,
                   env=env, capture_output=True, timeout=120)
    port = free_port()
    log = (tmp_path / "marimo.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(app), "--headless", "--host", "127.0.0.1",
                                "--port", str(port), "--no-token"], env=env, stdout=log, stderr=subprocess.STDOUT,
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
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"http://127.0.0.1:{port}/")
        expect(page.locator(".nnsp-root")).to_have_count(2, timeout=LONG)
        root = page.locator(".nnsp-root").first
        expect(root).to_have_attribute("data-theme", scheme, timeout=30_000)
        _break_and_continue(page, root, expect)
        expect(root.locator(".nnsp-status")).to_contain_text(re.compile(r"paused · step \d+"))
        _check(page, artifacts, "marimo", scheme)
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
