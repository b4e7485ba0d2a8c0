"""The tree reads like the source (issue 11, item 3) end to end: a transformers GPT-2 built from its
config in a real JupyterLab, driven by headless Chromium.

The default view shows one row per statement with the statement's text from the file and no `$t`
rows; the "Lowered" button shows the lowered instructions (`$t` temporaries, attribute fetches) and
the kernel's `show_lowered` follows it, the `l` key switches back, and setting `show_lowered` in
Python switches the browser. A step inside a statement highlights the statement row; ArrowRight
opens it and the highlight moves to the step's instruction, ArrowLeft folds it again. The rows of
the attention forward are counted in both views (test-artifacts/issue11b/rows.json), and
screenshots of both views at 1280 and 900 px, light and dark, go to test-artifacts/issue11b/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab_server import LabServer
from test_inspector_e2e import LONG, _expect, _kernel_state, _menu

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
NOTEBOOK = "e2e_tree_views.ipynb"

# The rows drawn inside a block's node (not its sub-blocks' contents): their texts, in order.
ROW_TEXTS = """(el) => [...el.querySelectorAll(':scope > .nnsp-children .nnsp-row')]
  .filter((row) => row.getClientRects().length > 0)
  .map((row) => row.querySelector('.nnsp-text').textContent)"""


@pytest.fixture(scope="module")
def tree_lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("lab-tree") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _screens(page, root, folder: Path, stem: str) -> None:
    for theme, light in (("light", "true"), ("dark", "false")):
        if theme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator(f"body[data-jp-theme-light='{light}']").wait_for(state="attached", timeout=30_000)
        for width in (1280, 900):
            page.set_viewport_size({"width": width, "height": 1300 if width > 1000 else 2600})
            page.wait_for_timeout(300)
            root.screenshot(path=str(folder / f"{stem}-{width}-{theme}.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    page.locator("body[data-jp-theme-light='true']").wait_for(state="attached", timeout=30_000)
    page.set_viewport_size({"width": 1280, "height": 1300})


def test_source_view_by_default_lowered_view_by_toggle_and_steps_highlight_statement_rows(tree_lab, browser, artifacts):
    expect = _expect()
    folder = artifacts / "issue11b"
    folder.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(tree_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root").first
    root.wait_for(timeout=LONG)
    tree = root.locator(".nnsp-tree")
    state = _kernel_state(page)
    attn = state["attn"]
    assert state["show_lowered"] is True  # the notebook's last cell set it: the browser follows
    expect(tree).to_have_attribute("data-view", "lowered")
    root.locator(".nnsp-title").click()
    page.keyboard.press("l")
    expect(tree).to_have_attribute("data-view", "source")
    toggle = root.get_by_role("button", name="Lowered")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    assert _kernel_state(page)["show_lowered"] is False

    # jump to the attention block by search, open it: statement rows with the file's text, no $t rows
    root.locator(".nnsp-title").click()
    page.keyboard.press("/")
    page.keyboard.type("h.0.attn")
    page.keyboard.press("Enter")
    block = tree.locator(f"[role='treeitem'][data-node='{attn}']")
    expect(block.locator(":scope > .nnsp-row")).to_have_class(re.compile("nnsp-looking"), timeout=30_000)
    block.locator(":scope > .nnsp-row .nnsp-toggle").click()
    expect(block).to_have_attribute("aria-expanded", "true")
    lines = [line.strip() for line in open(state["file"], encoding="utf-8")]
    for wanted in ("query_states = query_states.view(shape_q).transpose(1, 2)",
                   "shape_q = (*query_states.shape[:-1], -1, self.head_dim)",
                   "using_eager = self.config._attn_implementation == \"eager\""):
        assert wanted in lines
        expect(block.locator(".nnsp-kind-s > .nnsp-row .nnsp-text", has_text=wanted)).to_have_count(1)
    expect(block.locator(".nnsp-kind-i > .nnsp-row .nnsp-text", has_text="if is_cross_attention:").first).to_be_visible()
    source_rows = block.evaluate(ROW_TEXTS)
    assert not [t for t in source_rows if t.startswith("$t")], source_rows

    # a step inside a statement highlights the statement row
    root.get_by_role("button", name="Continue").click()
    expect(root.locator(".nnsp-status")).to_contain_text("finished", timeout=60_000)
    step = _kernel_state(page)["shape_q_step"]
    root.get_by_role("button", name="Reset").click()
    expect(root.locator(".nnsp-status")).to_contain_text("ready")
    root.get_by_label("Run to step").fill(str(step - 1))  # the statement's first instructions, not its last
    root.get_by_role("button", name="Run to", exact=True).click()
    expect(root.locator(".nnsp-status")).to_contain_text(f"step {step - 1}", timeout=60_000)
    state = _kernel_state(page)
    statement, node = state["statement"], state["node"]
    assert statement >= 0 and node != statement, state
    statement_row = tree.locator(f".nnsp-row[data-node='{statement}']")
    expect(statement_row).to_have_class(re.compile("nnsp-current"))
    expect(statement_row).to_contain_text("shape_q = (*query_states.shape[:-1], -1, self.head_dim)")
    expect(tree.locator(".nnsp-row.nnsp-current")).to_have_count(1)

    # by keyboard: ArrowRight opens the statement and the highlight moves to the step's instruction
    item = tree.locator(f"[role='treeitem'][data-node='{statement}']")
    item.focus()
    page.keyboard.press("ArrowRight")
    expect(item).to_have_attribute("aria-expanded", "true")
    own = tree.locator(f".nnsp-row[data-node='{node}']")
    expect(own).to_have_class(re.compile("nnsp-current"))
    page.keyboard.press("ArrowDown")  # into the statement's instructions
    expect(item.locator("[role='treeitem']").first).to_be_focused()
    page.keyboard.press("ArrowLeft")  # to the statement
    expect(item).to_be_focused()
    page.keyboard.press("ArrowLeft")  # folds it: the highlight goes back to the statement row
    expect(item).to_have_attribute("aria-expanded", "false")
    expect(statement_row).to_have_class(re.compile("nnsp-current"))
    _screens(page, root, folder, "tree-source")

    # the toggle: the lowered instructions, $t rows among them; the kernel's trait follows
    toggle.click()
    expect(tree).to_have_attribute("data-view", "lowered")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    expect(own).to_have_class(re.compile("nnsp-current"))
    expect(own.locator(".nnsp-text")).to_have_text(state["node_text"])
    # the statements' instructions not in the first payload (the tree is sent lazily) come on request
    split = block.locator(".nnsp-text").filter(has_text=re.compile(r"^\$t\d+ = getattr\(self, 'split_size'\)$"))
    expect(split.first).to_be_attached(timeout=30_000)
    expect(block.locator(".nnsp-loading")).to_have_count(0)
    lowered_rows = block.evaluate(ROW_TEXTS)
    assert any(re.fullmatch(r"\$t\d+ = getattr\(self, 'split_size'\)", t) for t in lowered_rows), lowered_rows
    assert any(t.startswith("$t") for t in lowered_rows)
    assert not block.locator(".nnsp-kind-s > .nnsp-row").count(), "no statement rows in the lowered view"
    assert _kernel_state(page)["show_lowered"] is True
    _screens(page, root, folder, "tree-lowered")

    # back in the source view, a search for a lowered instruction finds the statement holding it
    root.locator(".nnsp-title").click()
    page.keyboard.press("l")
    expect(tree).to_have_attribute("data-view", "source")
    expect(statement_row).to_have_class(re.compile("nnsp-current"))
    root.locator(".nnsp-title").click()
    page.keyboard.press("/")
    page.keyboard.press("Control+a")
    page.keyboard.type("getattr(self, 'split_size')")
    page.keyboard.press("Enter")
    # the source view lists (and marks "looking at") the statement holding the lowered instruction:
    # no $t row in its results (issue 42); the run's current row stays where it was
    looking = tree.locator(".nnsp-row.nnsp-looking")
    expect(looking).to_have_count(1)
    expect(looking.locator(".nnsp-text")).to_contain_text("self.split_size")
    expect(looking).not_to_contain_text("$t")
    expect(looking).to_be_visible()
    expect(looking.locator("xpath=..")).to_have_class(re.compile("nnsp-kind-s"))
    expect(statement_row).to_have_class(re.compile("nnsp-current"))
    (folder / "rows.json").write_text(json.dumps({
        "block": "transformer.h.0.attn", "model": "GPT2LMHeadModel, 2 layers, n_embd 32, eager attention",
        "source_view_rows": len(source_rows), "lowered_view_rows": len(lowered_rows),
        "source_view": source_rows, "lowered_view": lowered_rows}, indent=1))
    assert len(source_rows) < len(lowered_rows)
    assert errors == [], errors
    page.close()
