"""The Patch view (issue 40, point 5) and the Diverge view (issue 39, point 4) in a real JupyterLab,
driven by headless Chromium: e2e_patch_diverge.ipynb.

Patch: a tiny GPT-2 sweep over both layers' outputs per position (12 patched runs). The effect
heatmap has one cell per row of the DataFrame, and each cell's value read back from the DOM is the
row's `effect` exactly (the attribution heatmap: the attribution table's); hovering a cell reads out
its site, position, effect and attribution; arrow keys move between cells and Enter opens the cell's
patched run: the kernel's active run is that fork, paused at the first divergence from the clean run,
and the Compare tab shows the pair with its first divergence marked.

Diverge: a GPT-2 version pair whose b downcasts one residual add. report.show() opens on its Diverge
tab; the first culprit is the planted line, highlighted and scrolled into view; clicking it steps
both runs there (the kernel's b and a runs bind hidden_states in transformer.h.0), Enter on another
line steps both to that one. Screenshots of both views at 1280 and 900 px, light and dark, go to
test-artifacts/views/.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from test_inspector_e2e import LONG, _expect, _menu
from lab_server import run_code_cell  # noqa: E402

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
REPO = HERE.parents[1]
NOTEBOOK = "e2e_patch_diverge.ipynb"


@pytest.fixture(scope="module")
def views_lab(tmp_path_factory):
    from lab_server import LabServer

    os.environ["NNSP_REPO"] = str(REPO)  # the kernel imports this checkout's package and tests/support
    server = LabServer(tmp_path_factory.mktemp("lab-views") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _state(page, index: int, tag: str) -> dict:
    """Re-run code cell `index` and parse the `tag {...}` line it prints."""
    text = run_code_cell(page, index, tag, timeout=90)
    return json.loads(re.search(tag + r" (\{.*\})", text).group(1))


def _screens(page, target, folder: Path, stem: str) -> None:
    for theme, light in (("light", "true"), ("dark", "false")):
        if theme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator(f"body[data-jp-theme-light='{light}']").wait_for(state="attached", timeout=30_000)
        for width in (1280, 900):
            page.set_viewport_size({"width": width, "height": 1100})
            page.wait_for_timeout(400)
            # tall enough for the whole view below JupyterLab's sticky toolbar, its bottom edge at the
            # viewport's: an element scrolled to the top edge would sit under the toolbar
            height = target.evaluate("el => el.getBoundingClientRect().height")
            page.set_viewport_size({"width": width, "height": max(1100, int(height) + 400)})
            page.wait_for_timeout(200)
            target.evaluate("el => el.scrollIntoView({block: 'end'})")
            page.wait_for_timeout(200)
            target.screenshot(path=str(folder / f"{stem}-{width}-{theme}.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1100})


def test_patch_heatmap_values_hover_keyboard_and_opening_a_fork_at_its_first_divergence(views_lab, browser, artifacts):
    expect = _expect()
    folder = artifacts / "views"
    folder.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(views_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    kernel = _state(page, 1, "KERNEL-STATE")
    rows = kernel["rows"]
    root.get_by_role("tab", name="Patch").click()
    panel = root.locator(".nnsp-tabpanel[aria-label='Patch']")
    exact = panel.locator("table.nnsp-pt-grid[data-kind='effect'] td.nnsp-pt-cell")
    expect(exact).to_have_count(len(rows), timeout=LONG)
    cells = exact.evaluate_all("(tds) => tds.map((td) => [Number(td.dataset.index), td.dataset.value, td.style.background])")
    assert sorted(i for i, _, _ in cells) == list(range(len(rows)))
    scale = max(abs(r["effect"]) for r in rows)
    for index, value, colour in cells:
        effect = rows[index]["effect"]
        assert float(value) == effect  # the DataFrame's value, to the bit
        # the diverging scale: red above 0, blue below, its strength |effect| / the largest |effect|
        numbers = [float(n) for n in re.findall(r"[\d.]+", colour)]
        alpha = numbers[3] if len(numbers) == 4 else 1.0
        assert alpha == pytest.approx(abs(effect) / scale, abs=1 / 255 + 1e-3)  # the browser keeps alpha in 8 bits
        if effect:
            assert numbers[:3] == ([178, 24, 43] if effect > 0 else [33, 102, 172])
    estimate = panel.locator("table.nnsp-pt-grid[data-kind='attribution'] td.nnsp-pt-cell")
    expect(estimate).to_have_count(len(rows))
    for index, value, _ in estimate.evaluate_all(
            "(tds) => tds.map((td) => [Number(td.dataset.index), td.dataset.value, ''])"):
        row = rows[index]
        assert float(value) == kernel["attribution"][f"{row['site']}/{row['position']}"]
    # rows are layers 0 and 1, columns positions 0..5 in order
    layout = exact.evaluate_all("(tds) => tds.map((td) => [td.parentElement.rowIndex, td.cellIndex, Number(td.dataset.index)])")
    for r, c, index in layout:
        assert (rows[index]["site"], rows[index]["position"]) == (f"transformer.h.{r - 1}:output", c - 1)
    # hover: the value read out
    strongest = max(range(len(rows)), key=lambda i: abs(rows[i]["effect"]))
    target = panel.locator(f"table[data-kind='effect'] td[data-index='{strongest}']")
    target.hover()
    readout = panel.locator(".nnsp-pt-readout")
    expect(readout).to_contain_text(f"{rows[strongest]['site']} · layer {rows[strongest]['site'].split('.')[2].split(':')[0]}"
                                    f" · position {rows[strongest]['position']} · effect")
    shown = float(re.search(r"effect (\S+)", readout.inner_text()).group(1))
    assert shown == pytest.approx(rows[strongest]["effect"], rel=1e-3)
    assert "attribution" in readout.inner_text()
    _screens(page, panel, folder, "patch")
    # keyboard: from the first cell, arrows to the strongest, Enter opens it
    first = panel.locator("table[data-kind='effect'] td[data-index='0']")
    first.focus()
    row_of, col_of = {i: (r, c) for r, c, i in layout}[strongest]
    for _ in range(c_moves := col_of - 1):
        page.keyboard.press("ArrowRight")
    for _ in range(row_of - 1):
        page.keyboard.press("ArrowDown")
    assert c_moves >= 0
    focused = page.evaluate("() => Number(document.activeElement.dataset.index)")
    assert focused == strongest
    page.keyboard.press("Enter")
    compare_tab = root.get_by_role("tab", name="Compare")
    expect(compare_tab).to_have_attribute("aria-selected", "true", timeout=LONG)
    summary = root.locator(".nnsp-tabpanel[aria-label='Compare'] .nnsp-summary")
    expect(summary).to_contain_text("first divergence", timeout=LONG)
    expect(root.locator(".nnsp-tabpanel[aria-label='Compare'] tr.nnsp-first")).to_have_count(1)
    kernel = _state(page, 1, "KERNEL-STATE")
    fork = f"patch {rows[strongest]['site']} position {rows[strongest]['position']}"
    assert kernel["active"] == fork and kernel["runs"] == ["clean", fork] and kernel["interventions"] == 1
    assert kernel["status"] == "paused"
    assert kernel["last_compare"]["a"] == "clean" and kernel["last_compare"]["b"] == fork
    first_row = kernel["last_compare"]["first"]
    assert kernel["step_index"] == first_row["step_index_b"] and summary.get_attribute("data-first") == str(kernel["step_index"])
    assert kernel["var"] == first_row["out_var"]
    # the step card follows the fork
    expect(root.locator(".nnsp-toolbar")).to_contain_text(fork)
    _screens(page, root.locator(".nnsp-tabpanel[aria-label='Compare']"), folder, "patch-opened-compare")
    root.get_by_role("tab", name="Patch").click()
    expect(panel.locator("td[data-open='true']")).to_have_count(2)  # the exact and the estimate cell
    _screens(page, panel, folder, "patch-opened")
    assert not errors, errors
    page.close()


def test_diverge_view_highlights_the_planted_line_and_steps_both_runs_to_a_line(views_lab, browser, artifacts):
    expect = _expect()
    folder = artifacts / "views"
    folder.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(views_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").nth(1)
    root.wait_for(timeout=LONG)
    state = _state(page, 3, "DIVERGE-STATE")
    expect(root.get_by_role("tab", name="Diverge")).to_have_attribute("aria-selected", "true", timeout=LONG)
    panel = root.locator(".nnsp-tabpanel[aria-label='Diverge']")
    lines = panel.locator(".nnsp-dv-line")
    expect(lines).to_have_count(state["rows"], timeout=LONG)
    culprit = panel.locator(".nnsp-dv-line.nnsp-dv-first")
    expect(culprit).to_have_count(1)
    expect(culprit).to_have_attribute("data-line", str(state["planted_line"]))
    expect(culprit).to_have_attribute("data-index", str(state["first"]))
    expect(culprit).to_have_attribute("data-status", "edited")
    expect(culprit).to_contain_text("to(torch.bfloat16).float()")
    # scrolled into view inside its pane
    box = panel.locator(".nnsp-dv-lines").bounding_box()
    line_box = culprit.bounding_box()
    assert box["y"] <= line_box["y"] and line_box["y"] + line_box["height"] <= box["y"] + box["height"]
    # the bar: longer than the bound's tick on the flagged line
    fill = culprit.locator(".nnsp-dv-fill").bounding_box()
    tick = culprit.locator(".nnsp-dv-tick").bounding_box()
    assert fill["x"] + fill["width"] > tick["x"] + tick["width"]
    _screens(page, panel, folder, "diverge")
    culprit.click()
    detail = panel.locator(".nnsp-dv-detail")
    expect(detail.locator("td[data-side='b'][data-key='step']")).to_contain_text("step", timeout=LONG)
    state = _state(page, 3, "DIVERGE-STATE")
    assert state["selected"] == state["first"]
    assert (state["b"]["line"], state["b"]["block"], state["b"]["var"]) == (state["planted_line"], "transformer.h.0",
                                                                            "hidden_states")
    assert (state["a"]["block"], state["a"]["var"]) == ("transformer.h.0", "hidden_states") and state["a"]["step"] > 0
    expect(detail.locator("td[data-side='b'][data-key='step']")).to_contain_text(f"step {state['b']['step']}")
    expect(detail.locator("td[data-side='a'][data-key='step']")).to_contain_text(f"step {state['a']['step']}")
    # the inspector's own source and step card followed b
    expect(root.locator(".nnsp-stepinfo")).to_contain_text("hidden_states")
    # keyboard: the next line down, Enter steps both runs there
    culprit.focus()  # re-running the state cell took the focus
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    nxt = state["table"][state["first"] + 1]
    expect(detail).to_contain_text(f"line {nxt['line']}", timeout=LONG)
    state = _state(page, 3, "DIVERGE-STATE")
    assert state["selected"] == state["first"] + 1
    assert (state["b"]["line"], state["b"]["block"], state["b"]["var"]) == (nxt["line"], nxt["block"], nxt["var"])
    _screens(page, panel, folder, "diverge-stepped")
    assert not errors, errors
    page.close()
