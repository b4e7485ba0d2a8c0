"""The Diverge view of a `torch.compile` model b (issue 39, point 4) in a real JupyterLab, driven by
headless Chromium: e2e_diverge_compiled.ipynb.

A tiny transformers GPT-2 against `torch.compile` of a copy with a user backend that computes gelu
with its tanh approximation (tests/support/compile_faults.TanhGelu). report.show() opens on its
Diverge tab with the activation's line (transformers' GELUActivation.forward) highlighted as the first
culprit. The user reaches the lines with Tab, steps both runs to the culprit with Enter, to another
line with a click and to the next one with an arrow key and Enter: each time the kernel's b run (its
own code without the compiler) and a run stand at that line, and the panel names the line's compiled
region and its errors. Screenshots at 1280 and 900 px, light and dark, go to test-artifacts/views/.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from test_inspector_e2e import LONG, _expect, _menu
from test_patch_diverge_e2e import _screens
from lab_server import run_code_cell  # noqa: E402

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
REPO = HERE.parents[1]
NOTEBOOK = "e2e_diverge_compiled.ipynb"


@pytest.fixture(scope="module")
def compiled_lab(tmp_path_factory):
    from lab_server import LabServer

    os.environ["NNSP_REPO"] = str(REPO)  # the kernel imports this checkout's package and tests/support
    server = LabServer(tmp_path_factory.mktemp("lab-compiled") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _state(page) -> dict:
    text = run_code_cell(page, 1, "DIVERGE-STATE", timeout=90)
    return json.loads(re.search(r"DIVERGE-STATE (\{.*\})", text).group(1))


def _region_words(region: str) -> str:
    return "this statement alone" if region == "statement" else region


def _at(state: dict, index: int) -> None:
    """Both kernel runs stand at row `index`'s statement (b's code and a's are the same module)."""
    row = state["table"][index]
    assert state["selected"] == index
    assert (state["b"]["line"], state["b"]["block"], state["b"]["var"]) == (row["line"], row["block"] or "GPT2Model",
                                                                            row["var"])
    assert (state["a"]["block"], state["a"]["var"]) == (state["b"]["block"], row["var"]) and state["a"]["step"] > 0


def test_compiled_b_culprit_is_highlighted_and_tab_enter_click_and_arrows_step_both_runs(compiled_lab, browser,
                                                                                         artifacts):
    expect = _expect()
    folder = artifacts / "views"
    folder.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(compiled_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    state = _state(page)
    assert state["backend_calls"] > 0  # the user's backend was the one compiling
    first, table = state["first"], state["table"]
    assert [table[first]["line"], table[first]["region"]] == [state["planted"][1], "statement"]
    tab = root.get_by_role("tab", name="Diverge")
    expect(tab).to_have_attribute("aria-selected", "true", timeout=LONG)
    panel = root.locator(".nnsp-tabpanel[aria-label='Diverge']")
    lines = panel.locator(".nnsp-dv-line")
    expect(lines).to_have_count(state["rows"], timeout=LONG)
    expect(panel.locator(".nnsp-dv-sides [data-side='b']")).to_contain_text("torch.compile, backend TanhGelu")
    # every line is matched (b's code is a's): the status is said once, in the summary, not on each line
    expect(panel.locator(".nnsp-dv-summary")).to_contain_text(f"({state['rows']} matched)")
    expect(panel.locator(".nnsp-dv-line .nnsp-dv-status").first).to_be_hidden()
    culprit = panel.locator(".nnsp-dv-line.nnsp-dv-first")
    expect(culprit).to_have_count(1)
    expect(culprit).to_have_attribute("data-index", str(first))
    expect(culprit).to_have_attribute("data-line", str(state["planted"][1]))
    expect(culprit).to_have_attribute("data-flagged", "true")
    expect(culprit).to_contain_text("return self.act(input)")
    # each line names the region compiled to measure it
    for index, row in enumerate(table):
        expect(lines.nth(index)).to_have_attribute("data-region", row["region"])
    box = panel.locator(".nnsp-dv-lines").bounding_box()
    line_box = culprit.bounding_box()
    assert box["y"] <= line_box["y"] and line_box["y"] + line_box["height"] <= box["y"] + box["height"]
    fill = culprit.locator(".nnsp-dv-fill").bounding_box()
    tick = culprit.locator(".nnsp-dv-tick").bounding_box()
    assert fill["x"] + fill["width"] > tick["x"] + tick["width"]  # above its bound
    _screens(page, panel, folder, "diverge-compiled")

    # keyboard: from the Diverge tab, Tab reaches the list on the culprit, Enter steps both runs there
    tab.focus()
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.classList.contains('nnsp-dv-line')"):
            break
    assert page.evaluate("() => document.activeElement.dataset.index") == str(first)
    page.keyboard.press("Enter")
    detail = panel.locator(".nnsp-dv-detail")
    region = detail.locator(".nnsp-dv-region")
    expect(region).to_contain_text(_region_words("statement"), timeout=LONG)
    expect(detail.locator(".nnsp-dv-compiled")).to_contain_text("backend TanhGelu")
    expect(detail.locator("td[data-side='b'][data-key='step']")).to_contain_text("step", timeout=LONG)
    state = _state(page)
    _at(state, first)
    assert state["b"]["block"] == "h.0.mlp.act"
    expect(detail.locator("td[data-side='b'][data-key='step']")).to_contain_text(f"step {state['b']['step']}")
    expect(detail.locator("td[data-side='a'][data-key='step']")).to_contain_text(f"step {state['a']['step']}")
    expect(root.locator(".nnsp-stepinfo")).to_contain_text("h.0.mlp.act")  # the inspector's step card follows b

    # a click on an earlier line: the attention call, measured as its block compiled alone
    attn = next(i for i, row in enumerate(table) if row["region"] == "block h.0.attn")
    lines.nth(attn).click()
    expect(region).to_contain_text("block h.0.attn", timeout=LONG)
    state = _state(page)
    _at(state, attn)

    # arrows then Enter: from the clicked line down to the culprit's caller line (its block compiled)
    target = first + 1
    lines.nth(attn).focus()  # re-running the state cell took the focus
    for _ in range(target - attn):
        page.keyboard.press("ArrowDown")
    assert page.evaluate("() => document.activeElement.dataset.index") == str(target)
    page.keyboard.press("Enter")
    expect(region).to_contain_text(table[target]["region"], timeout=LONG)
    expect(detail).to_contain_text(f"line {table[target]['line']}")
    state = _state(page)
    _at(state, target)
    _screens(page, panel, folder, "diverge-compiled-stepped")
    assert not errors, errors
    page.close()
