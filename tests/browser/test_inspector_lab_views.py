"""The tensor views in JupyterLab with a kernel: a tiny transformers Llama (eager attention) in
e2e_views.ipynb. The heatmap's hovered values are checked against the tensor the kernel holds, the
attention heads are drawn per head with token labels, the by-layer chart of hidden_states matches the
eager decoder layers' outputs (forward hooks), the 900 px layout with the file browser open shows
every field, and an axe scan of the widget in JupyterLab's themes finds no serious violation."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
AXE = HERE.parents[1] / "js" / "node_modules" / "axe-core" / "axe.min.js"
NOTEBOOK = "e2e_views.ipynb"
LONG = 180_000

sys.path.insert(0, str(HERE))
from test_inspector_e2e import _menu  # noqa: E402
from test_inspector_views import FIELDS, assert_inside  # noqa: E402


@pytest.fixture(scope="module")
def views_lab(tmp_path_factory):
    from lab_server import LabServer

    server = LabServer(tmp_path_factory.mktemp("lab-views") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _probe(page) -> dict:
    output = page.locator(".jp-Notebook .jp-CodeCell").nth(1).locator(".jp-OutputArea")
    deadline = time.monotonic() + LONG / 1000
    while time.monotonic() < deadline:
        match = re.search(r"PROBE (\{.*\})", output.inner_text())
        if match:
            return json.loads(match.group(1))
        time.sleep(0.5)
    raise AssertionError("the probe cell printed nothing")


def _hover_cell(page, canvas, r: int, c: int, rows: int, cols: int) -> None:
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + (c + 0.5) * box["width"] / cols, box["y"] + (r + 0.5) * box["height"] / rows)


def test_heatmap_attention_heads_and_layer_chart_of_a_llama_in_jupyterlab(views_lab, browser, artifacts):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(views_lab.url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root")
    root.wait_for(timeout=LONG)
    probe = _probe(page)

    # pick the first attention weights from the trace table
    root.get_by_role("tab", name="Trace").click()
    root.get_by_label("Filter by variable").fill("attn_weights")
    rows = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")
    expect(rows).to_have_count(2, timeout=30_000)
    root.locator(f".nnsp-tabpanel[aria-label='Trace'] tbody tr[data-step='{probe['attn_trace_step']}']").click()
    tensor = root.locator(".nnsp-tensor")
    expect(tensor.locator(".nnsp-tensor-caption")).to_contain_text("attn_weights [1, 4, 5, 5]")
    # head 1 by its slider, then hover query 3, key 2: the value is the kernel's attn[0, 1, 3, 2]
    tensor.get_by_label("Index of dim 1").fill("1")
    tensor.get_by_label("Index of dim 1").dispatch_event("change")
    expect(tensor.locator(".nnsp-slider-value").nth(1)).to_have_text("1")
    canvas = tensor.locator("canvas.nnsp-heatmap")
    readout = tensor.locator(".nnsp-readout")
    page.wait_for_timeout(300)
    _hover_cell(page, canvas, 3, 2, 5, 5)
    expect(readout).to_have_attribute("data-index", "[0, 1, 3, 2]")
    assert float(readout.get_attribute("data-value")) == probe["attn_0_1_3_2"]

    # the attention grid: four heads with token labels; hover head 3, query 4, key 0
    attention = root.locator(".nnsp-attention")
    heads = attention.locator("canvas.nnsp-attn")
    expect(heads).to_have_count(4)
    # token labels on the axes of an enlarged head (Enter on a head)
    attention.locator(".nnsp-attn-open").nth(3).focus()
    page.keyboard.press("Enter")
    expect(attention.locator(".nnsp-attn-keys .nnsp-attn-tick")).to_have_text(["0:3", "1:14", "2:15", "3:9", "4:2"])
    expect(attention.locator(".nnsp-attn-queries .nnsp-attn-tick")).to_have_text(["0:3", "1:14", "2:15", "3:9", "4:2"])
    page.keyboard.press("Enter")  # and back
    expect(attention.locator(".nnsp-attn-large")).to_be_hidden()
    _hover_cell(page, heads.nth(3), 4, 0, 5, 5)
    expect(attention.locator(".nnsp-readout")).to_have_attribute("data-index", "head 3, query 4:2, key 0:3")
    assert float(attention.locator(".nnsp-readout").get_attribute("data-value")) == probe["attn_0_3_4_0"]
    root.scroll_into_view_if_needed()
    tensor.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-llama-attention-1280.png"), full_page=False)

    # Trends: the by-layer chart of hidden_states equals the eager layers' output norms
    root.get_by_role("tab", name="Trends").click()
    dots = root.locator(".nnsp-layer-dot")
    expect(dots).to_have_count(2, timeout=30_000)
    values = [float(dots.nth(i).get_attribute("data-value")) for i in range(2)]
    assert values == probe["layer_norms"]
    expect(root.locator(".nnsp-trend[data-var='attn_weights']").first).to_be_visible()
    root.locator(".nnsp-layer-chart").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-llama-trends-1280.png"))

    # 900 px with the file browser open: one column, every field inside the widget
    page.set_viewport_size({"width": 900, "height": 1100})
    if page.locator(".jp-FileBrowser").count() == 0 or not page.locator(".jp-FileBrowser").first.is_visible():
        page.keyboard.press("Control+Shift+F")
    page.wait_for_timeout(600)
    width = root.bounding_box()["width"]
    assert width < 760, f"the widget is {width} px wide at 900 px with the file browser open"
    assert root.locator(".nnsp-main").evaluate("el => getComputedStyle(el).gridTemplateColumns.split(' ').length") == 1
    assert_inside(root, FIELDS)
    for scheme in ("light", "dark"):
        if scheme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
            page.wait_for_timeout(500)
        root.locator(".nnsp-header").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / f"lab-900-{scheme}.png"))
        if AXE.exists():
            page.add_script_tag(path=str(AXE))
            result = page.evaluate("async () => await axe.run(document.querySelector('.nnsp-root'))")
            serious = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
                       for v in result["violations"] if v["impact"] in ("serious", "critical")]
            assert not serious, f"JupyterLab {scheme}: {serious}"
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    assert not errors, errors
    page.close()
