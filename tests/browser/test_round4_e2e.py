"""The inspector, round four (issue 42), end to end in JupyterLab on a transformers GPT-2 of 4 layers
(e2e_round4.ipynb) and on the quick start notebook.

1. Where the run is and where the user is looking are two things: a search jump, a tree row click
   and a trace row move only the view (a "looking at" row and line, a chip saying where the run is);
   the run's current row, current line and step card stay at its step; Escape comes back. The quick
   start, Run All: the view made while the next cells drive the run shows the run's true step in
   the step card, Source and Tensor.
2. Runs have ids: the issue's sequence (finish base, ▶ on a statement, an edit makes it a fork,
   clear_edits and break_at from Python, Reset, two Continues) shows only the new run's hits.
4. Source words only: the widget's text holds no `$tN`, row number or intrinsic name.
5. "not run yet" until a run has finished, then "never ran".
6. Breakpoints set from Python are listed at once, a predicate with its source text.
Screenshots at 1280 and 900 px, light and dark, go to test-artifacts/ (round4-*.png).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
NOTEBOOK = "e2e_round4.ipynb"
LONG = 180_000
INTERNAL = re.compile(r"\$t\d+|intrinsics\.|\brow \d+")

sys.path.insert(0, str(HERE))
from lab_server import LabServer, run_code_cell  # noqa: E402
from test_inspector_e2e import _menu  # noqa: E402
from test_inspector_views import FIELDS, assert_inside  # noqa: E402

# at 900 px nothing of a tree row may be cut off: its ●▶ buttons included
NARROW = FIELDS + [".nnsp-row.nnsp-current", ".nnsp-line-current", ".nnsp-look", ".nnsp-result-open"]


@pytest.fixture(scope="module")
def round4_lab(tmp_path_factory):
    # the kernel imports this checkout's package (not another install of it)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved) if p)
    server = LabServer(tmp_path_factory.mktemp("lab-round4") / "root",
                       [HERE / NOTEBOOK, ROOT / "notebooks" / "quickstart.ipynb"])
    try:
        server.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    yield server
    server.stop()


def run_cell(page, index: int, marker: str) -> str:
    """Run code cell `index` of the open notebook and return its output once it holds `marker`."""
    return run_code_cell(page, index, marker)


def kernel_state(page) -> dict:
    text = run_cell(page, 1, "KERNEL-STATE")
    return json.loads(re.search(r"KERNEL-STATE (\{.*\})", text).group(1))


def user_text(root) -> str:
    """The text a user reads in the widget: everything shown but the data tables (Trace, Compare)."""
    return root.evaluate("""(root) => {
      const copy = root.cloneNode(true);
      for (const el of copy.querySelectorAll(".nnsp-tabpanel table, [hidden]")) el.remove();
      return copy.innerText || copy.textContent;
    }""")


def assert_row_actions_in_view(root) -> None:
    """No tree row's ●▶ lies right of the tree's visible box (the row's text and shapes give way)."""
    outside = root.evaluate("""(root) => {
      const tree = root.querySelector(".nnsp-tree");
      const right = tree.getBoundingClientRect().left + tree.clientLeft + tree.clientWidth;
      return [...tree.querySelectorAll(".nnsp-row-actions")].filter((el) => {
        const r = el.getBoundingClientRect();
        return r.width && r.right > right + 1;
      }).map((el) => el.closest(".nnsp-row").textContent.slice(0, 60));
    }""")
    assert not outside, f"{len(outside)} rows with their buttons cut off: {outside[:5]}"


def screens(page, root, stem: str, artifacts) -> None:
    for scheme in ("light", "dark"):
        if scheme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
        for width in (1280, 900):
            page.set_viewport_size({"width": width, "height": 2000 if width > 1000 else 3400})
            page.wait_for_timeout(400)
            root.screenshot(path=str(artifacts / f"round4-{stem}-{width}-{scheme}.png"))
            if width == 900:
                assert_inside(root, NARROW)
                assert_row_actions_in_view(root)
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1400})


def _open(browser, lab, notebook: str):
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(lab.url(notebook) + "&reset")  # a fresh workspace: no other notebook restored beside this one
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    return page, errors


def run_all(page, done: str) -> None:
    """Run All Cells, again if it was given before the kernel was ready, until `done` is printed."""
    for _ in range(3):
        _menu(page, "Run", "Run All Cells")
        try:
            page.get_by_text(done).first.wait_for(timeout=90_000)
            return
        except Exception:
            continue
    raise AssertionError(f"Run All did not print {done!r}")


def press(page, root, *keys: str) -> None:
    """Press stepper keys in the widget, each after the one before has been answered and drawn."""
    for key in keys:
        before = int(root.get_attribute("data-commands") or 0)
        root.locator(".nnsp-title").click()
        page.keyboard.press(key)
        deadline = time.monotonic() + 60
        while int(root.get_attribute("data-commands") or 0) <= before:
            assert time.monotonic() < deadline, f"{key!r} was not answered within 60 s"
            time.sleep(0.1)


def _search(page, root, query: str) -> None:
    root.locator(".nnsp-title").click()
    page.keyboard.press("/")
    page.keyboard.type(query)
    page.keyboard.press("Enter")


def assert_view_follows_run(root, expect, state: dict) -> None:
    """The run's marks are at the kernel's step: the step card, the current row, the current line."""
    expect(root.locator(".nnsp-stepinfo .nnsp-step-index")).to_have_text(f"step {state['step_index']}", timeout=30_000)
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", str(state["line"]), timeout=30_000)
    expect(root.locator(".nnsp-tree .nnsp-row.nnsp-current")).to_have_count(1)


def quickstart_expected() -> dict:
    """The step card the quick start's widget must show after its cells ran (the same run, here)."""
    import torch

    from nnschemaparser.examples.mlp import MLP
    from nnschemaparser.parser.model_parser import NNParser
    from nnschemaparser.widget import InspectorState

    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(2, 784)
    state = InspectorState(NNParser.parse_model(model=model, inputs_tensors_values={"x": x}), {"x": x})
    for _ in range(4):
        state.step()
    state.continue_()
    want = state.view_step()
    state.close()
    return want


def assert_quickstart_not_stale(page, root, expect, want: dict) -> None:
    """Step card, Source (file, current line) and Tensor (trace step) are the run's last step, and stay so."""
    expect(root.locator(".nnsp-status")).to_contain_text(f"finished · step {want['index']}", timeout=LONG)
    expect(root.locator(".nnsp-stepinfo .nnsp-step-index")).to_have_text(f"step {want['index']}")
    header = root.locator(".nnsp-source-file")
    expect(header).to_contain_text(Path(want["file"]).name, timeout=30_000)
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", str(want["line"]))
    caption = root.locator(".nnsp-tensor-caption")
    expect(caption).to_contain_text(f"(trace #{want['trace_step']})", timeout=30_000)
    page.wait_for_timeout(2000)  # nothing answered late draws over it
    expect(header).to_contain_text(Path(want["file"]).name)
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", str(want["line"]))
    expect(caption).to_contain_text(f"(trace #{want['trace_step']})")


def look_and_come_back(page, root, expect) -> None:
    """Paused: a search jump marks its row "looking at" and leaves the run's row, line and card;
    Escape in the search box brings the view back to the run."""
    current = root.locator(".nnsp-tree .nnsp-row.nnsp-current")
    expect(current).to_have_count(1, timeout=30_000)
    run_row = current.get_attribute("data-node")
    step = root.locator(".nnsp-stepinfo .nnsp-step-index").inner_text()
    line = root.locator(".nnsp-line-current").get_attribute("data-line")
    _search(page, root, "h.0.attn")
    result = root.locator(".nnsp-result").first  # the block itself comes first (not a stale result of an older search)
    expect(result).to_contain_text("attn · GPT2Attention", timeout=30_000)
    expect(result).to_contain_text("transformer.h.0.attn")
    looking = root.locator(".nnsp-tree .nnsp-row.nnsp-looking")
    expect(looking).to_have_attribute("data-node", result.get_attribute("data-node"), timeout=30_000)
    expect(current).to_have_attribute("data-node", run_row)
    expect(root.locator(".nnsp-stepinfo .nnsp-step-index")).to_have_text(step)
    chip = root.locator(".nnsp-look")
    expect(chip).to_contain_text(f"the run is at {step}")
    root.get_by_label("Search the schema").focus()
    page.keyboard.press("Escape")
    expect(chip).to_be_hidden()
    expect(looking).to_have_count(0)
    expect(current).to_have_attribute("data-node", run_row)
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", line)


def three_actions_to_heads(root, expect) -> int:
    """From a fresh widget: layer 1's attention output and its heads. Returns the actions it took:
    the search (its text and Enter), "output" on the block's result, "heads" on it."""
    actions = 0
    box = root.get_by_label("Search the schema")
    box.fill("h.1.attn")
    box.press("Enter")
    actions += 1
    result = root.locator(".nnsp-result", has_text="transformer.h.1.attn").first
    result.get_by_role("button", name="output of transformer.h.1.attn").click()
    actions += 1
    caption = root.locator(".nnsp-tensor-caption")
    expect(caption).to_contain_text("attn_output [1, 8, 32]", timeout=60_000)
    expect(root.locator(".nnsp-stop-reason")).to_have_text("stopped: returned from transformer.h.1.attn")
    result.get_by_role("button", name="heads of transformer.h.1.attn").click()
    actions += 1
    grid = root.locator(".nnsp-attention")
    expect(grid).to_contain_text("transformer.h.1.attn · 4 heads", timeout=60_000)
    expect(grid.get_by_label("Attention heads").locator(":scope > *")).to_have_count(4)
    expect(caption).to_contain_text("attn_output [1, 8, 32]")
    return actions


def test_the_view_moves_apart_from_the_run_and_escape_comes_back(round4_lab, browser, artifacts):
    from playwright.sync_api import expect

    page, errors = _open(browser, round4_lab, NOTEBOOK)
    run_cell(page, 0, "")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    run_cell(page, 3, "DONE breakpoints")
    # a predicate and two breakpoints set from Python are listed without a widget command
    bps = root.get_by_label("Breakpoints", exact=True)
    expect(bps).to_contain_text("entry of transformer.h.1.attn", timeout=60_000)
    expect(bps).to_contain_text("lambda step: step.step_index == 10**9")
    # nothing ran yet: a row is "not run yet", not "never ran"
    _search(page, root, "h.2.mlp")
    first = root.locator(".nnsp-result").first
    expect(first).to_contain_text("not run yet", timeout=30_000)
    expect(root.locator(".nnsp-results")).not_to_contain_text("never ran")
    page.keyboard.press("Escape")
    root.locator(".nnsp-title").click()
    page.keyboard.press("c")
    expect(root.locator(".nnsp-stop-reason")).to_have_text("stopped: entered transformer.h.1.attn", timeout=60_000)
    press(page, root, "o", "o", "o")
    state = kernel_state(page)
    assert state["block"] == "transformer.h.1.attn" and state["status"] == "paused"
    assert_view_follows_run(root, expect, state)
    current = root.locator(".nnsp-tree .nnsp-row.nnsp-current")
    run_row = current.get_attribute("data-node")

    # a search jump moves only the view
    _search(page, root, "h.0.attn")
    result = root.locator(".nnsp-result").first
    expect(result).to_contain_text("transformer.h.0.attn", timeout=30_000)
    looking = root.locator(".nnsp-tree .nnsp-row.nnsp-looking")
    expect(looking).to_have_attribute("data-node", result.get_attribute("data-node"), timeout=30_000)
    expect(current).to_have_attribute("data-node", run_row)  # the run's row stays
    expect(root.locator(".nnsp-stepinfo .nnsp-step-index")).to_have_text(f"step {state['step_index']}")
    expect(root.locator(".nnsp-line-current")).to_have_count(0)  # h.0.attn's source: the run's line is not in it
    chip = root.locator(".nnsp-look")
    expect(chip).to_be_visible()
    expect(chip).to_contain_text(f"the run is at step {state['step_index']}")
    expect(chip.get_by_role("button")).to_have_text(f"back to step {state['step_index']} (Esc)")
    assert kernel_state(page)["step_index"] == state["step_index"]  # looking ran nothing
    screens(page, root, "looking", artifacts)

    # Escape: back to where the run is, the focus on its row
    result_box = root.get_by_label("Search the schema")
    result_box.focus()
    page.keyboard.press("Escape")
    expect(chip).to_be_hidden()
    expect(looking).to_have_count(0)
    assert_view_follows_run(root, expect, state)
    focused = root.evaluate("(root) => document.activeElement && document.activeElement.dataset.node")
    assert focused == run_row

    # a click on a row of the run's own block: the looking line and the current line side by side
    block = root.locator(f".nnsp-tree [role='treeitem'][data-node='{run_row}']").locator(
        "xpath=ancestor::div[contains(@class, 'nnsp-kind-block')][1]")
    statement = block.locator(".nnsp-row", has_text="attn_output.reshape(").first
    statement.locator(".nnsp-text").click()
    expect(root.locator(".nnsp-line-looking")).to_have_count(1)
    expect(root.locator(".nnsp-line-current")).to_have_attribute("data-line", str(state["line"]))
    expect(current).to_have_attribute("data-node", run_row)
    root.locator(".nnsp-title").click()
    page.keyboard.press("Escape")
    expect(root.locator(".nnsp-line-looking")).to_have_count(0)

    # a trace row: the view goes to the row that bound it
    root.get_by_role("tab", name="Trace").click()
    root.locator(".nnsp-tabpanel:not([hidden]) tbody tr").nth(2).click()
    expect(root.locator(".nnsp-tree .nnsp-row.nnsp-looking")).to_have_count(1, timeout=30_000)
    expect(current).to_have_attribute("data-node", run_row)
    # a step brings the view back to the run
    press(page, root, "o")
    expect(chip).to_be_hidden(timeout=30_000)
    state = kernel_state(page)
    assert_view_follows_run(root, expect, state)
    assert not errors, errors
    page.close()


def test_the_quick_start_run_all_opens_at_the_runs_true_step(round4_lab, browser, artifacts):
    """The quick start's Run All: the widget view is made while the next cells step and finish the
    run; Source and Tensor must show the run's last step, not an early one answered late."""
    from playwright.sync_api import expect

    want = quickstart_expected()
    page, errors = _open(browser, round4_lab, "quickstart.ipynb")
    run_all(page, "mlp_inspector.html True")
    root = page.locator(".nnsp-root").first
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    assert_quickstart_not_stale(page, root, expect, want)
    root.screenshot(path=str(artifacts / "round4-quickstart-1280-light.png"))
    assert not errors, errors
    page.close()


def test_a_new_run_shows_no_hit_of_another_run_and_user_text_has_source_words_only(round4_lab, browser, artifacts):
    from playwright.sync_api import expect

    page, errors = _open(browser, round4_lab, NOTEBOOK)
    run_cell(page, 0, "")  # the widget (the cells after the state cell are run one at a time below)
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    # 1. finish base
    root.locator(".nnsp-title").click()
    page.keyboard.press("c")
    expect(root.locator(".nnsp-status")).to_contain_text("finished", timeout=LONG)
    # 5. after a finished run, a row no run ran "never ran"
    _search(page, root, "_upcast_and_reordered_attn")
    expect(root.locator(".nnsp-result").first).to_contain_text("never ran", timeout=30_000)
    # 2. ▶ on `attn_output, attn_weights = attention_interface(...)` of h.1.attn: a new run stops there
    _search(page, root, "attention_interface(self")
    target = root.locator(".nnsp-result", has_text="transformer.h.1.attn").filter(has_text="attention_interface(self").first
    expect(target).to_be_visible(timeout=30_000)
    target.get_by_role("button", name=re.compile("^Run to")).click()
    reason = root.locator(".nnsp-stop-reason")
    expect(reason).to_contain_text("stopped: reached attn_output, attn_weights = attention_interface(", timeout=60_000)
    first = kernel_state(page)
    assert first["run"] == "base 2" and len(first["hits"]) == 1
    # 3. an edit: the run becomes "fork 1"; 4. clear_edits and break_at from Python, listed at once
    assert "DONE edit fork 1" in run_cell(page, 2, "DONE edit")
    run_cell(page, 3, "DONE breakpoints")
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of transformer.h.3.attn", timeout=30_000)
    root.locator(".nnsp-title").click()
    page.keyboard.press("r")
    expect(root.locator(".nnsp-status")).to_contain_text("base 2 · ready", timeout=30_000)
    hits = root.get_by_label("Breakpoint hits")
    expect(hits.locator("li")).to_have_count(0)
    for block in ("h.1.attn", "h.3.attn"):
        root.locator(".nnsp-title").click()
        page.keyboard.press("c")
        expect(reason).to_have_text(f"stopped: entered transformer.{block}", timeout=60_000)
    state = kernel_state(page)
    assert state["run"] == "base 2" and state["run_id"] != first["run_id"]
    assert [h[0] for h in state["hits"]] == [state["run_id"]] * 2  # no other run's hit, in Python either
    expect(hits.locator("li")).to_have_count(2)
    expect(hits).not_to_contain_text(f"step {first['step_index']} ")
    for label in ("entry of transformer.h.1.attn", "entry of transformer.h.3.attn"):
        expect(root.locator(".nnsp-bp", has_text=label)).to_contain_text("1 hit")
    # 4. the text a user reads: the stop reason, the step card, search results, the Layers header
    _search(page, root, "attn_output")
    expect(root.locator(".nnsp-result").first).to_be_visible(timeout=30_000)
    root.get_by_role("tab", name="Layers").click()
    root.get_by_role("button", name="This statement in every layer").click()
    expect(root.locator(".nnsp-layers-table")).to_be_visible(timeout=30_000)
    text = user_text(root)
    assert "entered transformer.h.3.attn" in text and "attn_output" in text
    assert not INTERNAL.findall(text), INTERNAL.findall(text)[:10]
    # the data tables too: a temporary's variable cell is the statement that computed it
    for tab, table in (("Trace", ".nnsp-tabpanel:not([hidden]) table"), ("Compare", ".nnsp-tabpanel:not([hidden]) table")):
        root.get_by_role("tab", name=tab).click()
        if tab == "Compare":
            root.get_by_role("button", name="Compare runs").click()
        expect(root.locator(f"{table} tbody tr").first).to_be_visible(timeout=60_000)
        cells = root.locator(table).inner_text()
        assert not INTERNAL.findall(cells), (tab, INTERNAL.findall(cells)[:10])
        if tab == "Trace":
            screens(page, root, "trace-words", artifacts)
    assert "key_states = key_states.view(shape_kv).transpose(1, 2)" in cells  # a temporary of h.0.attn, in words
    root.get_by_role("tab", name="Layers").click()
    screens(page, root, "runs", artifacts)
    assert not errors, errors
    page.close()


def test_layer_1_attention_output_and_heads_in_three_actions(round4_lab, browser, artifacts):
    from playwright.sync_api import expect

    page, errors = _open(browser, round4_lab, NOTEBOOK)
    run_cell(page, 0, "")  # a fresh widget
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    assert three_actions_to_heads(root, expect) <= 3
    state = kernel_state(page)
    assert state["block"] == "transformer.h.1.attn" and state["stop_reason"] == "returned from transformer.h.1.attn"
    # "every layer": the statement that bound the output, in each layer, per run
    root.locator(".nnsp-result", has_text="transformer.h.1.attn").first.get_by_role(
        "button", name="every layer of transformer.h.1.attn").click()
    layers = root.locator(".nnsp-layers-table")
    expect(layers).to_be_visible(timeout=60_000)
    expect(root.locator(".nnsp-tabpanel:not([hidden]) .nnsp-note").first).to_contain_text(
        "attn_output = self.resid_dropout(attn_output) · in each layer of transformer.h")
    expect(layers.locator(".nnsp-layer-cell")).to_have_count(2)  # layers 0 and 1 have returned
    screens(page, root, "heads", artifacts)
    assert not errors, errors
    page.close()


def test_a_block_row_offers_output_heads_and_every_layer(round4_lab, browser, artifacts):
    """Point 3 on the tree: a block row's views (out, heads, layers) on the focused row, each one
    action (a click or Shift+O / Shift+H / Shift+L), none of the row cut off at 900 px."""
    from playwright.sync_api import expect

    page, errors = _open(browser, round4_lab, NOTEBOOK)
    run_cell(page, 0, "")  # a fresh widget
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    _search(page, root, "h.1.attn")  # the block's row comes into view, "looking at"
    result = root.locator(".nnsp-result", has_text="transformer.h.1.attn").first
    expect(result).to_be_visible(timeout=30_000)
    row = root.locator(".nnsp-tree .nnsp-row.nnsp-looking")
    expect(row).to_have_attribute("data-node", result.get_attribute("data-node"), timeout=30_000)
    expect(row).to_contain_text("attn · GPT2Attention")
    item = row.locator("xpath=..")
    item.focus()
    views = row.locator(".nnsp-row-view")
    expect(views).to_have_count(3)
    assert [views.nth(i).inner_text() for i in range(3)] == ["out", "heads", "layers"]
    expect(views.first).to_be_visible()
    # other block rows keep their width for their text: their views take no room
    hidden = root.locator(".nnsp-tree .nnsp-row:not(.nnsp-looking):not(.nnsp-current) .nnsp-row-views")
    assert hidden.count() > 0 and all(not hidden.nth(i).is_visible() for i in range(min(hidden.count(), 5)))
    actions = 1  # the search
    page.keyboard.press("Shift+H")  # heads: run to the block's output, show its heads
    actions += 1
    grid = root.locator(".nnsp-attention")
    expect(grid).to_contain_text("transformer.h.1.attn · 4 heads", timeout=60_000)
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("attn_output [1, 8, 32]", timeout=60_000)
    assert actions <= 3
    state = kernel_state(page)
    assert state["block"] == "transformer.h.1.attn" and state["stop_reason"] == "returned from transformer.h.1.attn"
    _search(page, root, "h.0.mlp")
    result = root.locator(".nnsp-result", has_text="transformer.h.0.mlp").first
    expect(result).to_be_visible(timeout=30_000)
    row = root.locator(".nnsp-tree .nnsp-row.nnsp-looking")
    expect(row).to_have_attribute("data-node", result.get_attribute("data-node"), timeout=30_000)
    expect(row.locator(".nnsp-row-view")).to_have_count(2)  # no heads on an MLP
    row.locator("xpath=..").focus()
    page.keyboard.press("Shift+L")  # every layer
    layers = root.locator(".nnsp-layers-table")
    expect(layers).to_be_visible(timeout=60_000)
    expect(root.locator(".nnsp-stop-reason")).to_have_text("stopped: returned from transformer.h.0.mlp", timeout=30_000)
    screens(page, root, "block-row", artifacts)
    assert not errors, errors
    page.close()
