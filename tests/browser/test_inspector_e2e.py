"""The inspector widget end to end: a real JupyterLab on localhost, driven by headless Chromium.

One notebook (e2e_inspector.ipynb) builds the widget for the quick start's MLP; its second cell
prints the kernel's view of the widget (`KERNEL-STATE {...}`), re-run by the test after each action
to check what the kernel sees. Screenshots (light and dark theme) and the measured click-to-view
round trips are written to test-artifacts/, which git ignores.
"""

from __future__ import annotations

import json
import re

import pytest

from lab_server import run_code_cell  # noqa: E402

pytestmark = pytest.mark.browser

NOTEBOOK = "e2e_inspector.ipynb"
LONG = 120_000  # ms: kernel start and the first torch import on a small machine


def _expect():
    from playwright.sync_api import expect

    return expect


def _menu(page, top: str, *path: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    for index, label in enumerate(path):
        item = page.locator(".lm-Menu-content .lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(label)}$"))
        if index < len(path) - 1:
            item.first.hover()
        else:
            item.first.click()


def _kernel_state(page) -> dict:
    """Re-run the notebook's state cell and parse what it prints."""
    text = run_code_cell(page, 1, "KERNEL-STATE", timeout=60)
    return json.loads(re.search(r"KERNEL-STATE (\{.*\})", text).group(1))


def _step_and_time(root, button, expect, expected_step: int) -> float:
    button.click()
    expect(root.locator(".nnsp-status")).to_contain_text(f"step {expected_step}")
    expect(root).to_have_attribute("data-commands", re.compile(r"\d+"))
    return float(root.get_attribute("data-round-trip-ms"))


def test_step_edit_and_compare_in_jupyterlab(lab, browser, artifacts):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1500, "height": 1150})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(lab.url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)  # the kernel is up
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root")
    root.wait_for(timeout=LONG)

    # the tree shows the forward with its source names
    tree = root.locator(".nnsp-tree")
    expect(tree).to_contain_text("hidden = self.fc1(x)", timeout=LONG)
    expect(tree).to_contain_text("activated = hidden.relu()")
    expect(tree).to_contain_text("fc1 · Linear")
    assert _kernel_state(page)["step_index"] == 0

    # Step from the UI: the first Step stops before the call of fc1 (no step yet), then three steps;
    # the kernel agrees
    step = root.get_by_role("button", name="Step", exact=True)
    step.click()
    expect(root.locator(".nnsp-status")).to_contain_text("before fc1")
    assert _kernel_state(page)["step_index"] == 0
    timings = [_step_and_time(root, step, expect, n) for n in (1, 2, 3)]
    expect(root.locator(".nnsp-row.nnsp-current")).to_contain_text("hidden = self.fc1(x)")
    expect(root.locator(".nnsp-line-current")).to_contain_text("hidden = self.fc1(x)")
    expect(root.locator(".nnsp-hist[data-role='activation'] rect").first).to_be_attached()
    state = _kernel_state(page)
    assert state["step_index"] == 3 and state["status"] == "paused"

    # an edit from the UI: scale hidden by 0; then a bad one, refused with its reason
    root.get_by_label("Edit action").select_option("scale")
    root.get_by_label("Edit argument").fill("0")
    root.get_by_role("button", name="Apply edit").click()
    expect(root.get_by_label("Queued edits")).to_contain_text("step 3: hidden ← scale by 0.0")
    root.get_by_label("Edit action").select_option("expression")
    root.get_by_label("Edit argument").fill("value[:1]")
    root.get_by_role("button", name="Apply edit").click()
    expect(root.locator(".nnsp-tabpanel .nnsp-error")).to_contain_text("shape")
    state = _kernel_state(page)
    assert state["edits"] == ["step 3: hidden ← scale by 0.0"] and state["active"] == "fork 1"

    # finish the fork, then compare it with the base run from the Compare tab
    root.get_by_role("button", name="Continue").click()
    expect(root.locator(".nnsp-status")).to_contain_text("finished")
    root.get_by_role("tab", name="Compare").click()
    root.get_by_role("button", name="Compare runs").click()
    expect(root.locator(".nnsp-summary")).to_contain_text("base vs fork 1")
    expect(root.locator(".nnsp-summary")).to_contain_text("first divergence: step 3 (hidden in MLP)")
    root.get_by_role("button", name="Jump to first divergence").click()
    expect(root.locator("tr.nnsp-first")).to_contain_text("hidden")
    expect(root.locator(".nnsp-hist-caption")).to_contain_text("fork 1 · step 3")
    state = _kernel_state(page)
    assert state["compare"] == {"a": "base", "b": "fork 1", "first_var": "hidden", "first_step": 3}

    # the trace table pages from the kernel and filters by variable
    root.get_by_role("tab", name="Trace").click()
    rows = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")
    expect(rows).to_have_count(7)
    root.get_by_label("Filter by variable").fill("activated")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("ReLU activation")

    # keyboard shortcuts reach the widget, not the notebook ("r" would turn a cell into a raw cell)
    root.locator(".nnsp-title").click()
    page.keyboard.press("r")
    expect(root.locator(".nnsp-status")).to_contain_text("ready")
    page.keyboard.press("s")  # before the call of fc1
    page.keyboard.press("s")
    page.keyboard.press("s")
    expect(root.locator(".nnsp-status")).to_contain_text("step 2")
    assert page.locator(".jp-Notebook .jp-RawCell").count() == 0
    assert page.locator(".jp-Notebook .jp-CodeCell").count() == 2
    state = _kernel_state(page)
    assert state["step_index"] == 2 and state["active"] == "fork 2", "Reset replays the queued edit as a new fork"

    # light and dark screenshots, kept as test artefacts
    root.get_by_role("tab", name="Compare").click()
    root.get_by_role("button", name="Compare runs").click()
    root.scroll_into_view_if_needed()
    root.screenshot(path=str(artifacts / "inspector-light.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Dark")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.wait_for_timeout(500)
    root.screenshot(path=str(artifacts / "inspector-dark.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)

    (artifacts / "inspector-roundtrip.json").write_text(json.dumps({"step_click_to_view_ms": timings}))
    assert not errors, f"console errors: {errors}"
    page.close()


def test_static_page_shows_tree_and_trace_without_a_kernel(browser, artifacts, tmp_path):
    expect = _expect()
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.support.widget_models import mlp_case

    from nnschemaparser.widget import InspectorState
    from nnschemaparser.widget.static_html import write_static_html

    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    page_path = write_static_html(state, tmp_path / "mlp.html", title="MLP (static)")
    for scheme in ("light", "dark"):
        page = browser.new_page(viewport={"width": 1300, "height": 1000}, color_scheme=scheme)
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_path.as_uri())
        root = page.locator(".nnsp-root.nnsp-static")
        expect(root.locator(".nnsp-tree")).to_contain_text("hidden = self.fc1(x)")
        expect(root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")).to_have_count(7)
        expect(root.get_by_role("button", name="Step", exact=True)).to_be_disabled()
        root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").nth(3).click()
        expect(root.locator(".nnsp-hist-caption")).to_contain_text("activated")
        page.screenshot(path=str(artifacts / f"static-{scheme}.png"), full_page=True)
        assert not errors, f"console errors ({scheme}): {errors}"
        page.close()
