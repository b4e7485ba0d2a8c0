"""Round four (issue 42, points 1 and 2) in the other hosts: Jupyter Notebook 7 and marimo.

In each host: the quick start, all its cells run right after the widget is made, opens at the run's
true step (step card, Source, Tensor); on the 4-layer GPT-2 of e2e_round4.ipynb a search jump moves
only the view and Escape brings it back; breakpoints set from Python are listed at once (a predicate
with its source text); and a new run shows no hit of another run. Notebook 7 runs the issue's whole
sequence (its edit and break_at cells run one at a time); marimo runs every cell at start, so there
the breakpoints come first and the new run, after Reset, has the old run's name ("base") and must
show its own single hit, "1 hit", not the other run's; it runs in marimo's light and dark themes,
checks that Escape after a search jump focuses the run's current row (round four's focus fix), and
leaves screenshots of GPT-2 at 1280 and 900 px in test-artifacts/. Letter keys are not pressed in
Notebook 7 (its command-mode shortcuts see them); buttons are clicked instead.
"""

from __future__ import annotations

import json
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
NOTEBOOK = "e2e_round4.ipynb"
LONG = 180_000

sys.path.insert(0, str(HERE))
from lab_server import LabServer, free_port  # noqa: E402
from test_inspector_views import assert_inside  # noqa: E402
from test_round3_e2e import NARROW, assert_current_in_view  # noqa: E402
from test_round4_e2e import (INTERNAL, assert_quickstart_not_stale, look_and_come_back,  # noqa: E402
                             quickstart_expected, run_all, run_cell, three_actions_to_heads, user_text)


def _env(**extra: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", **extra)


def _ours(errors: list[str]) -> list[str]:
    # Notebook 7's own bundle throws "reading 'schema'" on a fresh server (see test_inspector_hosts.py)
    return [e for e in errors if "/static/notebook/notebook_core." not in e]


def _kernel_state(page) -> dict:
    text = run_cell(page, 1, "KERNEL-STATE")
    return json.loads(re.search(r"KERNEL-STATE (\{.*\})", text).group(1))


def test_round4_in_jupyter_notebook_7(browser, artifacts, tmp_path, monkeypatch):
    pytest.importorskip("notebook", minversion="7")
    from playwright.sync_api import expect

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    server = LabServer(tmp_path / "root", [HERE / NOTEBOOK, ROOT / "notebooks" / "quickstart.ipynb"],
                       app="notebook").start()
    try:
        want = quickstart_expected()
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(f"{error}\n{error.stack}"))
        page.goto(server.url("quickstart.ipynb"))
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
        page.wait_for_timeout(2000)
        run_all(page, "mlp_inspector.html True")  # given again if the kernel was not ready
        root = page.locator(".nnsp-root").first
        assert_quickstart_not_stale(page, root, expect, want)
        page.close()

        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.on("pageerror", lambda error: errors.append(f"{error}\n{error.stack}"))
        page.goto(server.url(NOTEBOOK))
        page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
        page.wait_for_timeout(2000)
        run_cell(page, 0, "")
        root = page.locator(".nnsp-root").first
        root.wait_for(timeout=LONG)
        assert three_actions_to_heads(root, expect) <= 3  # from the fresh widget
        reason = root.locator(".nnsp-stop-reason")
        root.get_by_role("button", name="Continue").click()
        expect(root.locator(".nnsp-status")).to_contain_text("finished", timeout=LONG)
        # ▶ on a statement of h.1.attn: a new run "base 2" stops there
        root.get_by_label("Search the schema").fill("attention_interface(self")
        root.get_by_label("Search the schema").press("Enter")
        target = root.locator(".nnsp-result", has_text="transformer.h.1.attn").filter(has_text="attention_interface(self").first
        try:
            expect(target).to_be_visible(timeout=30_000)
        except AssertionError:
            root.screenshot(path=str(artifacts / "round4-notebook7-failed.png"))
            raise AssertionError(f"no result: {root.locator('.nnsp-search-count').inner_text()!r}, box "
                                 f"{root.get_by_label('Search the schema').input_value()!r}, "
                                 f"results {root.locator('.nnsp-results').inner_text()[:300]!r}") from None
        target.get_by_role("button", name=re.compile("^Run to")).click()
        expect(reason).to_contain_text("stopped: reached attn_output, attn_weights = attention_interface(", timeout=60_000)
        first = _kernel_state(page)
        assert first["run"] == "base 2"
        # an edit (it becomes "fork 1"), then clear_edits and break_at from Python: listed at once
        assert "DONE edit fork 1" in run_cell(page, 2, "DONE edit")
        run_cell(page, 3, "DONE breakpoints")
        bps = root.get_by_label("Breakpoints", exact=True)
        expect(bps).to_contain_text("entry of transformer.h.3.attn", timeout=30_000)
        expect(bps).to_contain_text("lambda step: step.step_index == 10**9")
        root.get_by_role("button", name="Reset").click()
        expect(root.locator(".nnsp-status")).to_contain_text("base 2 · ready", timeout=30_000)
        for block in ("h.1.attn", "h.3.attn"):
            root.get_by_role("button", name="Continue").click()
            expect(reason).to_have_text(f"stopped: entered transformer.{block}", timeout=60_000)
        state = _kernel_state(page)
        assert state["run"] == "base 2" and state["run_id"] != first["run_id"]
        assert [h[0] for h in state["hits"]] == [state["run_id"]] * 2
        hits = root.get_by_label("Breakpoint hits")
        expect(hits.locator("li")).to_have_count(2)
        expect(hits).not_to_contain_text(f"step {first['step_index']} ")
        # the view apart from the run
        look_and_come_back(page, root, expect)
        assert not INTERNAL.findall(user_text(root))
        root.screenshot(path=str(artifacts / "round4-notebook7-1280-light.png"))
        assert not _ours(errors), _ours(errors)
        page.close()
    finally:
        server.stop()


class _Marimo:
    """`marimo run` of a notebook converted with `marimo convert`, on 127.0.0.1."""

    def __init__(self, notebook: Path, tmp_path: Path, full_width: bool = False):
        env = _env(XDG_CONFIG_HOME=str(tmp_path / "config"))
        self.app = tmp_path / (notebook.stem + ".py")
        subprocess.run([sys.executable, "-m", "marimo", "convert", str(notebook), "-o", str(self.app)], check=True,
                       env=env, capture_output=True, timeout=120)
        if full_width:  # the app as wide as the window (marimo's default column is about 700 px whatever the window)
            source = self.app.read_text()
            assert "marimo.App()" in source, "marimo convert no longer writes `app = marimo.App()`"
            self.app.write_text(source.replace("marimo.App()", 'marimo.App(width="full")', 1))
        self.port = free_port()
        self.log_path = tmp_path / f"marimo-{notebook.stem}.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(self.app), "--headless", "--host",
                                         "127.0.0.1", "--port", str(self.port), "--no-token"], env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"marimo did not start: {self.log_path.read_text()[-2000:]}")
                time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()


def _focus_on_run_row(root) -> bool:
    """Whether the focus is on the tree item of the run's current row (marimo may hold the widget
    in a shadow root: the active element is read from the widget's own root node)."""
    return root.evaluate("""(el) => {
      const active = el.getRootNode().activeElement;
      const row = el.querySelector(".nnsp-tree .nnsp-row.nnsp-current");
      return Boolean(active && row && active === row.closest("[role='treeitem']"));
    }""")


def _escape_focuses_the_run_row(page, root, expect) -> None:
    """Round four's focus fix: Escape after a search jump gives the focus to the run's current row
    (not to the row looked at), from the search box and from the widget itself."""
    look_and_come_back(page, root, expect)  # Escape in the search box
    deadline = time.monotonic() + 10
    while not _focus_on_run_row(root) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert _focus_on_run_row(root), "Escape in the search box did not focus the run's current row"
    run_row = root.locator(".nnsp-tree .nnsp-row.nnsp-current").get_attribute("data-node")
    box = root.get_by_label("Search the schema")
    box.fill("h.0.attn")
    box.press("Enter")
    looking = root.locator(".nnsp-tree .nnsp-row.nnsp-looking")
    expect(looking).to_have_count(1, timeout=30_000)
    root.locator(".nnsp-title").click()  # the widget has the focus, not the search box
    page.keyboard.press("Escape")
    expect(looking).to_have_count(0)
    expect(root.locator(".nnsp-tree .nnsp-row.nnsp-current")).to_have_attribute("data-node", run_row)
    deadline = time.monotonic() + 10
    while not _focus_on_run_row(root) and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert _focus_on_run_row(root), "Escape in the widget did not focus the run's current row"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_round4_in_marimo(browser, artifacts, tmp_path, scheme):
    pytest.importorskip("marimo")
    from playwright.sync_api import expect

    (tmp_path / "config" / "marimo").mkdir(parents=True)
    (tmp_path / "config" / "marimo" / "marimo.toml").write_text(f'[display]\ntheme = "{scheme}"\n')
    want = quickstart_expected()
    quick = _Marimo(ROOT / "notebooks" / "quickstart.ipynb", tmp_path)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(quick.url)
        root = page.locator(".nnsp-root").first
        root.wait_for(timeout=LONG)
        assert_quickstart_not_stale(page, root, expect, want)
        page.close()
    finally:
        quick.stop()

    app = _Marimo(HERE / NOTEBOOK, tmp_path, full_width=True)  # every cell runs: the edit cell fails (no paused run), as it should
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(app.url)
        root = page.locator(".nnsp-root").first
        root.wait_for(timeout=LONG)
        bps = root.get_by_label("Breakpoints", exact=True)
        expect(bps).to_contain_text("entry of transformer.h.1.attn", timeout=60_000)
        expect(bps).to_contain_text("lambda step: step.step_index == 10**9")
        expect(root).to_have_attribute("data-theme", scheme, timeout=30_000)
        reason = root.locator(".nnsp-stop-reason")
        status = root.locator(".nnsp-status")
        root.locator(".nnsp-title").click()
        page.keyboard.press("c")
        expect(reason).to_have_text("stopped: entered transformer.h.1.attn", timeout=60_000)
        _escape_focuses_the_run_row(page, root, expect)
        # a second hit of this run (▶ on a statement further in h.1.attn), then Reset: the new run is
        # called "base" again, and lists its own hit only
        root.get_by_label("Search the schema").fill("attention_interface(self")
        root.get_by_label("Search the schema").press("Enter")
        target = root.locator(".nnsp-result", has_text="transformer.h.1.attn").filter(has_text="attention_interface(self").first
        expect(target).to_be_visible(timeout=30_000)
        target.get_by_role("button", name=re.compile("^Run to")).click()
        expect(reason).to_contain_text("stopped: reached attn_output, attn_weights = attention_interface(", timeout=60_000)
        hits = root.get_by_label("Breakpoint hits")
        expect(hits.locator("li")).to_have_count(2)
        old_step = re.search(r"step (\d+)", status.inner_text()).group(1)
        root.get_by_role("button", name="Reset").click()
        expect(status).to_contain_text("base · ready", timeout=30_000)
        expect(hits.locator("li")).to_have_count(0)
        root.get_by_role("button", name="Continue").click()
        expect(reason).to_have_text("stopped: entered transformer.h.1.attn", timeout=60_000)
        expect(hits.locator("li")).to_have_count(1)
        expect(hits).not_to_contain_text(f"step {old_step} ")
        expect(root.locator(".nnsp-bp", has_text="entry of transformer.h.1.attn")).to_contain_text("1 hit")
        expect(root.locator(".nnsp-bp", has_text="entry of transformer.h.1.attn")).not_to_contain_text("2 hits")
        assert not INTERNAL.findall(user_text(root))
        for width in (1280, 900):  # GPT-2 paused in h.1.attn, its two hits listed
            page.set_viewport_size({"width": width, "height": 3400})  # the whole widget painted
            page.wait_for_timeout(500)
            root.screenshot(path=str(artifacts / f"round4-marimo-gpt2-{width}-{scheme}.png"))
            assert_current_in_view(root)
            if width == 900:
                assert_inside(root, NARROW)
        page.set_viewport_size({"width": 1280, "height": 1400})
        # without breakpoints, from a new run: layer 1's attention output and heads in three actions
        root.get_by_role("button", name="Clear breakpoints").click()
        root.get_by_role("button", name="Reset").click()
        expect(status).to_contain_text("ready", timeout=30_000)
        assert three_actions_to_heads(root, expect) <= 3
        assert not errors, errors
        page.close()
    finally:
        app.stop()


def test_widget_letter_keys_do_not_reach_notebook_7(browser, artifacts, tmp_path, monkeypatch):
    """Notebook 7's command-mode shortcuts (b: insert a cell below, c: copy, ...) must not see the
    widget's own keys: `b` on a search result sets a breakpoint and adds no cell, `c` continues."""
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
        cells = page.locator(".jp-Notebook .jp-Cell")
        cells.first.wait_for(timeout=LONG)
        page.wait_for_timeout(2000)
        run_cell(page, 0, "")
        root = page.locator(".nnsp-root").first
        root.wait_for(timeout=LONG)
        count = cells.count()
        root.locator(".nnsp-title").click()  # the notebook is in command mode now, the widget has the focus
        page.keyboard.press("/")
        page.keyboard.type("h.1.attn")
        page.keyboard.press("Enter")
        first = root.locator(".nnsp-result").first
        expect(first).to_contain_text("transformer.h.1.attn", timeout=60_000)
        page.keyboard.press("ArrowDown")
        page.keyboard.press("b")
        expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of transformer.h.1.attn", timeout=30_000)
        page.keyboard.press("Escape")
        page.keyboard.press("c")
        expect(root.locator(".nnsp-stop-reason")).to_have_text("stopped: entered transformer.h.1.attn", timeout=60_000)
        for key in ("b", "a", "x", "d"):  # the notebook's own insert/cut/delete keys, on the widget
            root.locator(".nnsp-title").click()
            page.keyboard.press(key)
        page.wait_for_timeout(1000)
        assert cells.count() == count, f"the widget's keys changed the notebook: {count} cells became {cells.count()}"
        assert not _ours(errors), _ours(errors)
        page.close()
    finally:
        server.stop()
