"""The pause before a sub-block call end to end (issue 11, item 2): a transformers GPT-2 built from
its config in a real JupyterLab on localhost, driven by headless Chromium.

Run to the step before `transformer.h.1.attn` is called, Step: the widget shows "about to call
transformer.h.1.attn(hidden_states, ...)" with the call site's line highlighted, and the kernel is
paused before the call (not at a step). Step over from there: the kernel's step is the call's own
completion step. From the same pause, Step enters the callee's first instruction and Step out comes
back to the completion. Screenshots of the paused state (1280 and 900 px wide, light and dark) go
to test-artifacts/issue11a/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab_server import LabServer
from test_inspector_e2e import LONG, _expect, _kernel_state, _menu

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
NOTEBOOK = "e2e_call_pause.ipynb"
ATTN = "transformer.h.1.attn"


@pytest.fixture(scope="module")
def pause_lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("lab-call-pause") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _screens(page, root, folder: Path, stem: str) -> None:
    """The whole widget at 1280 and 900 px wide, light and dark: the viewport is made tall enough
    for the widget to fit below JupyterLab's own bars."""
    folder.mkdir(parents=True, exist_ok=True)
    for theme in ("light", "dark"):
        if theme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
        for width in (1280, 900):
            page.set_viewport_size({"width": width, "height": 2600 if width > 1000 else 3600})
            page.wait_for_timeout(400)
            root.scroll_into_view_if_needed()
            root.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(200)
            root.screenshot(path=str(folder / f"{stem}-{width}-{theme}.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1300})


def _open(browser, lab):
    page = browser.new_page(viewport={"width": 1280, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    return page, root, errors


def _to_the_attn_call(page, root, expect, key: str) -> dict:
    """Run to the step before the call (Run to), then Step by `key`: paused before the call."""
    state = _kernel_state(page)
    before = state["before_attn"]
    root.get_by_label("Run to step").fill(str(before))
    root.get_by_role("button", name="Run to", exact=True).click()
    status = root.locator(".nnsp-status")
    expect(status).to_contain_text(f"step {before}", timeout=60_000)
    root.locator(".nnsp-title").click()
    page.keyboard.press(key)
    expect(status).to_contain_text(f"before {ATTN}", timeout=30_000)
    state = _kernel_state(page)
    assert state["pause"] == ATTN and state["step_index"] == before and state["trait_pause"] == "call", state
    return state


def test_paused_before_the_attn_call_step_over_lands_on_the_calls_completion(pause_lab, browser, artifacts):
    expect = _expect()
    page, root, errors = _open(browser, pause_lab)
    state = _to_the_attn_call(page, root, expect, "s")

    # the card says what is about to be called, with its arguments; the call site's line is highlighted
    card = root.locator(".nnsp-stepinfo")
    expect(card).to_contain_text(f"about to call {ATTN}(hidden_states, cache, attention_mask, …)")
    expect(root.get_by_label(f"Arguments of the call of {ATTN}")).to_contain_text("float32[2, 8, 32]")
    current = root.locator(".nnsp-source-pause .nnsp-line-current")
    expect(current).to_have_attribute("data-line", str(state["line"]))
    assert "self.attn(" in state["line_text"]
    assert current.locator(".nnsp-code").inner_text() == state["line_text"]
    expect(root.get_by_label("Call stack frames")).to_contain_text(f"→ {ATTN} (about to be called)")
    expect(root.get_by_label("Apply edit")).to_be_disabled()
    expect(root.locator(".nnsp-hist-caption")).to_contain_text("hidden_states")
    _screens(page, root, artifacts / "issue11a", "paused-before-call")

    # Step over (the "o" key): the kernel's step is the call's own completion step
    root.locator(".nnsp-title").click()
    page.keyboard.press("o")
    expect(root.locator(".nnsp-status")).to_contain_text(f"step {state['completion']}", timeout=60_000)
    after = _kernel_state(page)
    assert after["pause"] is None and after["step_index"] == state["completion"] and after["is_attn_call"], after
    assert after["block"] == "transformer.h.1"
    expect(root.locator(".nnsp-stepinfo")).not_to_contain_text("about to call")
    expect(root.get_by_label("Apply edit")).to_be_enabled()
    assert errors == [], errors
    page.close()


def test_from_the_pause_step_enters_the_attn_block_and_step_out_returns_to_the_completion(pause_lab, browser):
    expect = _expect()
    page, root, errors = _open(browser, pause_lab)
    state = _to_the_attn_call(page, root, expect, "i")  # "i": step into, as "s"

    # Step (the button) from the pause: the callee's first instruction
    root.get_by_role("button", name="Step", exact=True).click()
    expect(root.locator(".nnsp-status")).to_contain_text(f"step {state['before_attn'] + 1}", timeout=30_000)
    inside = _kernel_state(page)
    assert inside["pause"] is None and inside["block"] == ATTN and inside["step_index"] == state["before_attn"] + 1
    expect(root.get_by_label("Call stack frames")).to_contain_text(ATTN)
    expect(root.get_by_label("Call stack frames")).not_to_contain_text("about to be called")
    assert root.locator(".nnsp-line-current .nnsp-code").inner_text() == inside["line_text"]

    # Step out (the button): back at the call's completion in transformer.h.1
    root.get_by_role("button", name="Step out").click()
    expect(root.locator(".nnsp-status")).to_contain_text(f"step {state['completion']}", timeout=60_000)
    out = _kernel_state(page)
    assert out["step_index"] == state["completion"] and out["is_attn_call"] and out["block"] == "transformer.h.1"
    assert errors == [], errors
    page.close()
