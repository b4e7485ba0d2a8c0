"""The Routing view in JupyterLab with a kernel: a tiny transformers Mixtral in e2e_routing.ipynb.
The Routing tab is reached by keyboard, one heatmap per layer is drawn with token and expert
labels, a hovered cell's weight is the router's own (forward hooks on the gates), Enter on a map
reads its routing out, axe finds no serious violation in the panel, and screenshots at 1280 and 900 px in light and dark go to test-artifacts/."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
AXE = HERE.parents[1] / "js" / "node_modules" / "axe-core" / "axe.min.js"
NOTEBOOK = "e2e_routing.ipynb"
LONG = 180_000

sys.path.insert(0, str(HERE))
from test_inspector_e2e import _menu  # noqa: E402
from test_inspector_lab_views import _hover_cell, _probe  # noqa: E402


@pytest.fixture(scope="module")
def routing_lab(tmp_path_factory):
    from lab_server import LabServer

    server = LabServer(tmp_path_factory.mktemp("lab-routing") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def test_routing_heatmaps_of_a_mixtral_in_jupyterlab(routing_lab, browser, artifacts):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(routing_lab.url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root")
    root.wait_for(timeout=LONG)
    probe = _probe(page)

    # by keyboard: from the Layers tab, Tab to the Routing tab and press Enter
    root.get_by_role("tab", name="Layers").focus()
    page.keyboard.press("Tab")
    routing_tab = root.get_by_role("tab", name="Routing")
    expect(routing_tab).to_be_focused()
    page.keyboard.press("Enter")
    expect(routing_tab).to_have_attribute("aria-selected", "true")
    panel = root.locator(".nnsp-tabpanel[aria-label='Routing']")
    maps = panel.locator(".nnsp-rt-box")
    expect(maps).to_have_count(2, timeout=60_000)
    expect(maps.first).to_have_attribute("aria-label", re.compile(r"^layer 0 routing: 6 tokens x 4 experts, top 2"))
    first = panel.locator("figure.nnsp-attn-head").first
    expect(first.locator(".nnsp-attn-queries .nnsp-attn-tick")).to_have_text(["0:3", "1:14", "2:15", "3:9", "4:2", "5:6"])
    expect(first.locator(".nnsp-rt-x .nnsp-attn-tick")).to_have_text(["0", "1", "2", "3"])
    expect(panel.locator(".nnsp-legend")).to_be_visible()
    # issue 42: the scale spans the chosen weights (unrouted cells grey), and tokens per expert per layer
    chosen = [w for layer in probe["weights"].values() for row in layer for w in row if w]
    expect(panel.locator(".nnsp-rt-legend")).to_contain_text("grey: not routed")
    low = float(panel.locator(".nnsp-legend-end").first.inner_text())  # shown with 4 significant digits
    assert low > 0 and abs(low - min(chosen)) <= 1e-3 * min(chosen)
    for layer in (0, 1):
        counts = [sum(1 for row in probe["weights"][str(layer)] if row[e]) for e in range(4)]
        expect(panel.locator("figure.nnsp-attn-head").nth(layer).locator(".nnsp-rt-counts .nnsp-attn-tick")).to_have_text(
            [str(c) for c in counts])

    # the drawn cells: a hovered cell's weight is the router's, 0 where the token did not go
    readout = panel.locator(".nnsp-readout")
    for layer in (0, 1):
        canvas = panel.locator("canvas.nnsp-rt-map").nth(layer)
        assert canvas.evaluate("c => c.width > 0 && c.height > 0")
        canvas.scroll_into_view_if_needed()
        page.wait_for_timeout(200)
        for token, expert in ((0, 0), (2, 3), (5, 1)):
            _hover_cell(page, canvas, token, expert, 6, 4)
            expect(readout).to_have_attribute("data-index", f"layer {layer}, token {token}:{[3, 14, 15, 9, 2, 6][token]}, expert {expert}")
            assert float(readout.get_attribute("data-value")) == probe["weights"][str(layer)][token][expert]

    # Tab from the tab to the first map, then Enter reads that layer's routing out
    routing_tab.focus()
    for _ in range(8):
        page.keyboard.press("Tab")
        if maps.first.evaluate("el => el === document.activeElement"):
            break
    expect(maps.first).to_be_focused()
    page.keyboard.press("Enter")
    expect(readout).to_contain_text("layer 0: token 0:3: expert")

    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-routing-1280-light.png"))
    page.set_viewport_size({"width": 900, "height": 1100})
    page.wait_for_timeout(400)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-routing-900-light.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Dark")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.wait_for_timeout(500)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-routing-900-dark.png"))
    if AXE.exists():  # no serious accessibility violation in the Routing panel (dark theme)
        page.add_script_tag(path=str(AXE))
        result = page.evaluate("async () => await axe.run(document.querySelector(\".nnsp-tabpanel[aria-label='Routing']\"))")
        serious = [(v["id"], [n["target"] for n in v["nodes"]][:3]) for v in result["violations"]
                   if v["impact"] in ("serious", "critical")]
        assert not serious, serious
    page.set_viewport_size({"width": 1280, "height": 1100})
    page.wait_for_timeout(400)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-routing-1280-dark.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    assert not errors, errors
    page.close()
