"""The inspector as a debugger end to end (issue 11): a transformers GPT-2 built from its config in a
real JupyterLab on localhost, driven by headless Chromium.

Search `h.1.attn` and jump there, set a breakpoint on it, Continue and check the kernel is paused in
that block with the highlighted line equal to the file's line; step out; break on a NaN injected by
an edit; an edit at a `key_states` step then Continue gives a fork with gradients; the histogram of
a value changed in place later is of the value at its step; a restarted kernel says so. Screenshots
(1280 and 900 px wide, light and dark theme) go to test-artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab_server import LabServer
from test_inspector_e2e import LONG, _expect, _kernel_state, _menu

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
NOTEBOOK = "e2e_debugger.ipynb"


@pytest.fixture(scope="module")
def debugger_lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("lab-debugger") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _screens(page, root, artifacts, stem: str) -> None:
    for width in (1280, 900):
        page.set_viewport_size({"width": width, "height": 1300 if width > 1000 else 2600})
        page.wait_for_timeout(300)
        root.screenshot(path=str(artifacts / f"{stem}-{width}-light.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Dark")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    for width in (1280, 900):
        page.set_viewport_size({"width": width, "height": 1300 if width > 1000 else 2600})
        page.wait_for_timeout(300)
        root.screenshot(path=str(artifacts / f"{stem}-{width}-dark.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1300})


def test_search_break_continue_step_out_nan_and_fork_gradients_on_gpt2(debugger_lab, browser, artifacts):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1280, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(debugger_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    expect(page.locator(".nnsp-root")).to_have_count(2, timeout=LONG)
    status = root.locator(".nnsp-status")

    # search h.1.attn by keyboard: "/" focuses the box, Enter searches and jumps to the first result
    root.locator(".nnsp-title").click()
    page.keyboard.press("/")
    search = root.get_by_label("Search the schema")
    expect(search).to_be_focused()
    page.keyboard.type("h.1.attn")
    page.keyboard.press("Enter")
    first = root.locator(".nnsp-result").first
    expect(first).to_contain_text("attn · GPT2Attention", timeout=30_000)
    # ancestors expanded; the row is marked "looking at" (the run's current row is the run's, issue 42)
    expect(root.locator(".nnsp-row.nnsp-looking")).to_contain_text("attn · GPT2Attention")

    # a breakpoint on it, Continue: paused in that block, at the line the kernel says, shown as in the file
    first.get_by_role("button", name=re.compile("^Break at")).click()
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of transformer.h.1.attn")
    root.get_by_role("button", name="Continue").click()
    expect(root.locator(".nnsp-stop-reason")).to_contain_text("entered transformer.h.1.attn", timeout=60_000)
    state = _kernel_state(page)
    assert state["status"] == "paused" and state["block"] == "transformer.h.1.attn"
    assert state["stop_reason"] == "entered transformer.h.1.attn"
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", str(state["line"]))
    assert root.locator(".nnsp-line-current .nnsp-code").inner_text() == state["line_text"]
    expect(root.get_by_label("Call stack frames")).to_contain_text("transformer.h.1.attn")
    expect(root.get_by_label("Variables of transformer.h.1.attn")).to_contain_text("hidden_states")
    _screens(page, root, artifacts, "debugger-breakpoint")

    # step out (the "u" key): back in the decoder layer, at the call's own step
    root.locator(".nnsp-title").click()
    page.keyboard.press("u")
    expect(root.get_by_label("Call stack frames")).not_to_contain_text("transformer.h.1.attn", timeout=30_000)
    state = _kernel_state(page)
    assert state["block"] == "transformer.h.1" and state["status"] == "paused"
    assert root.locator(".nnsp-line-current .nnsp-code").inner_text() == state["line_text"]

    # a NaN injected by an edit at h.0's key_states, caught by "Break on NaN/Inf"
    root.get_by_role("button", name="Clear breakpoints").click()
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("none")
    key_step = state["key_step"]
    root.get_by_label("Run to step").fill(str(key_step))
    root.get_by_role("button", name="Run to", exact=True).click()
    expect(status).to_contain_text(f"step {key_step}", timeout=60_000)
    root.get_by_role("tab", name="Edit").click()
    root.get_by_label("Edit action").select_option("expression")
    root.get_by_label("Edit argument").fill("value * float('nan')")
    root.get_by_role("button", name="Apply edit").click()
    expect(root.get_by_label("Queued edits")).to_contain_text(f"step {key_step}: key_states")
    root.get_by_role("button", name="Break on NaN/Inf").click()
    root.get_by_role("button", name="Continue").click()
    expect(root.locator(".nnsp-stop-reason")).to_contain_text("NaN or an Inf", timeout=60_000)
    state = _kernel_state(page)
    assert state["status"] == "paused" and state["finite"] is False and state["step_index"] > key_step
    _screens(page, root, artifacts, "debugger-nan")

    # drop the NaN edit; a scale edit at key_states, Continue: a fork with gradients, shown at the edit
    root.get_by_role("button", name="Clear breakpoints").click()
    root.get_by_role("button", name="Remove edit 1").click()
    root.get_by_role("button", name="Reset").click()
    expect(status).to_contain_text("ready")
    root.get_by_label("Run to step").fill(str(key_step))
    root.get_by_role("button", name="Run to", exact=True).click()
    expect(status).to_contain_text(f"step {key_step}", timeout=60_000)
    root.get_by_label("Edit action").select_option("scale")
    root.get_by_label("Edit argument").fill("0.5")
    root.get_by_role("button", name="Apply edit").click()
    root.get_by_role("button", name="Continue").click()
    expect(status).to_contain_text("finished", timeout=60_000)
    state = _kernel_state(page)
    assert state["fork"] and state["gradients"] and state["grad_note"] == "", state
    root.get_by_role("tab", name="Trace").click()
    root.get_by_label("Trace of run").select_option(label=state["run"])
    root.get_by_label("Filter by variable").fill("key_states")
    edited = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr", has_text="transformer.h.0.attn").first
    expect(edited).to_contain_text("key_states")
    edited.click()
    expect(root.locator(".nnsp-hist-caption")).to_contain_text(f"{state['run']} · step {key_step}")
    expect(root.locator(".nnsp-hist[data-role='gradient'] rect").first).to_be_attached()  # the fork's gradient

    # run to here from that trace row of the finished fork: the active run goes to the matching step
    root.get_by_role("button", name="Reset").click()
    expect(status).to_contain_text("ready")
    root.get_by_label("Trace of run").select_option(label=state["run"])
    edited.click()
    root.get_by_role("button", name="Run to this step").click()
    expect(status).to_contain_text(f"step {key_step}", timeout=60_000)
    assert _kernel_state(page)["step_index"] == key_step
    assert errors == [], errors
    page.close()


def test_histogram_of_a_value_changed_in_place_is_of_its_step_and_a_restart_says_so(debugger_lab, browser, artifacts):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1280, "height": 1300})
    page.goto(debugger_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    expect(page.locator(".nnsp-root")).to_have_count(2, timeout=LONG)
    small = page.locator(".nnsp-root").nth(1)
    small.get_by_role("button", name="Continue").click()
    expect(small.locator(".nnsp-status")).to_contain_text("finished", timeout=60_000)
    small.get_by_role("tab", name="Trace").click()
    rows = small.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")
    small.get_by_label("Filter by variable").fill("output")
    expect(rows).to_have_count(2)  # the zeros it was made as, and the model output
    expect(rows.first).to_contain_text("Tensor creation")
    rows.first.click()  # `output = torch.zeros_like(x)`, later filled in place
    activation = small.locator(".nnsp-hist[data-role='activation']")
    expect(activation.locator(".nnsp-changed-later")).to_contain_text("changed in place later")
    heights = [float(h) for h in activation.locator("rect").evaluate_all("els => els.map(e => e.getAttribute('height'))")]
    assert sum(1 for h in heights if h > 0) == 1, heights  # all 8 values are 0: one bar, as at its step
    expect(activation).to_contain_text("n=8")
    small.scroll_into_view_if_needed()
    small.screenshot(path=str(artifacts / "debugger-inplace-1280-light.png"))

    # a restarted kernel: the next click says so instead of "Cannot send"
    _menu(page, "Kernel", "Restart Kernel…")
    page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    small.get_by_role("button", name="Step", exact=True).click()
    expect(small.locator(".nnsp-errorbar")).to_contain_text("kernel restarted: re-run the cell", timeout=30_000)
    small.screenshot(path=str(artifacts / "debugger-restarted-1280-light.png"))
    page.close()
