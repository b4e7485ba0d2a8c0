"""The inspector's views in a real browser: a static page with two runs (Compare offline, heatmaps),
the layout at 1280 and 900 px (checked by element geometry), the keyboard-only walk through tree and
tables, and an axe-core scan. No kernel: the page is written by to_html's code; the kernel-backed
views (heatmap spot checks, Llama attention heads, the layer chart) are in test_inspector_lab_views.py.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "js" / "node_modules" / "axe-core" / "axe.min.js"
sys.path.insert(0, str(ROOT))


def _expect():
    from playwright.sync_api import expect

    return expect


@pytest.fixture(scope="module")
def two_run_page(tmp_path_factory):
    from tests.support.widget_models import mlp_case

    from nnschemaparser.widget import InspectorState
    from nnschemaparser.widget.static_html import write_static_html

    _, x, schema = mlp_case()
    state = InspectorState(schema, {"x": x})
    state.continue_()
    state.reset()
    state.run_to(3)
    state.edit("scale", 0.0)
    state.continue_()
    state.tensor_view(run="fork 1", trace_step=4)
    return write_static_html(state, tmp_path_factory.mktemp("static") / "two-runs.html", title="MLP, base and fork")


def _errors(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def assert_inside(root, selectors: list[str]) -> None:
    """Every element matched by `selectors` that is shown lies inside the widget's box and is not
    clipped by an ancestor that hides overflow (its whole width is visible)."""
    problems = root.evaluate("""(root, selectors) => {
      const box = root.getBoundingClientRect();
      const out = [];
      for (const selector of selectors) {
        for (const el of root.querySelectorAll(selector)) {
          const r = el.getBoundingClientRect();
          if (!r.width && !r.height) continue;
          if (r.left < box.left - 1 || r.right > box.right + 1) out.push(`${selector} [${Math.round(r.left)}, ${Math.round(r.right)}] outside [${Math.round(box.left)}, ${Math.round(box.right)}]`);
          if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX === "hidden") out.push(`${selector} cut off: ${el.scrollWidth} > ${el.clientWidth}: ${el.textContent.slice(0, 40)}`);
        }
      }
      return out;
    }""", selectors)
    assert not problems, problems


def _assert_headers_in_view(root, tab: str, headers: list[str]) -> None:
    """The named header cells of a tab's table lie inside its scroll box without scrolling."""
    wrap = root.locator(f".nnsp-tabpanel[aria-label='{tab}'] .nnsp-table-wrap")
    box = wrap.bounding_box()
    for header in headers:
        cell = wrap.locator("th", has_text=re.compile(f"^{re.escape(header)}")).first.bounding_box()
        assert box["x"] <= cell["x"] and cell["x"] + cell["width"] <= box["x"] + box["width"] + 1, \
            f"{tab}: {header!r} at {cell} is outside the visible table {box}"


FIELDS = [".nnsp-toolbar button", ".nnsp-toolbar input", ".nnsp-status", ".nnsp-field", ".nnsp-value", ".nnsp-panel",
          ".nnsp-source", ".nnsp-tree", ".nnsp-hist", ".nnsp-heatmap-box", ".nnsp-tab", ".nnsp-controls > *"]


def test_a_static_page_with_two_runs_compares_them_without_a_kernel(browser, two_run_page, artifacts):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors = _errors(page)
    page.goto(two_run_page.as_uri())
    root = page.locator(".nnsp-root.nnsp-static")
    root.get_by_role("tab", name="Compare").click()
    root.get_by_label("Run B").select_option("fork 1")
    root.get_by_role("button", name="Compare runs").click()
    expect(root.locator(".nnsp-summary")).to_contain_text("base vs fork 1")
    expect(root.locator(".nnsp-summary")).to_contain_text("first divergence: step 3 (hidden in MLP)")
    root.get_by_role("button", name="Jump to first divergence").click()
    expect(root.locator("tr.nnsp-first")).to_contain_text("hidden")
    _assert_headers_in_view(root, "Compare", ["status", "max |Δ|", "mean |Δ|"])
    # the first divergence selects fork 1's step: its histograms and its stored heatmap
    expect(root.locator(".nnsp-hists .nnsp-hist-caption")).to_contain_text("fork 1 · step 3")
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("fork 1 · step 3")
    # the difference with base at that step, on a diverging scale, from the page's data
    root.get_by_label("Difference with run").select_option("base")
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("− base")
    expect(root.locator(".nnsp-legend-mid")).to_contain_text("0 in the middle")
    # each run's trace from the page
    root.get_by_role("tab", name="Trace").click()
    root.get_by_label("Trace of run").select_option("base")
    expect(root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")).to_have_count(7)
    _assert_headers_in_view(root, "Trace", ["mean", "std", "min", "max"])
    root.get_by_role("tab", name="Trends").click()
    expect(root.locator(".nnsp-trend[data-var='hidden']")).to_be_visible()
    # the tree coloured by divergence from base: the edited hidden is tinted, the input step is not
    root.get_by_label("Trends of run").select_option("fork 1")
    root.get_by_label("Colour the tree by").select_option("divergence")
    tree = root.locator(".nnsp-tree")
    expect(tree.locator(".nnsp-row[data-colour-value]", has_text="hidden = self.fc1(x)")).to_have_attribute(
        "data-colour-value", re.compile(r"^max \|fork 1 - base\| = [1-9]"))
    expect(tree.locator(".nnsp-row", has_text="hidden = self.fc1(x)")).to_have_attribute("style", re.compile("--nnsp-tint"))
    page.screenshot(path=str(artifacts / "static-two-runs-1280.png"), full_page=True)
    assert not errors, errors
    page.close()


@pytest.mark.parametrize("width, scheme", [(1280, "light"), (900, "light"), (900, "dark"), (1280, "dark")])
def test_the_layout_shows_every_field_at_1280_and_900_px(browser, two_run_page, artifacts, width, scheme):
    expect = _expect()
    page = browser.new_page(viewport={"width": width, "height": 1000}, color_scheme=scheme)
    errors = _errors(page)
    page.goto(two_run_page.as_uri())
    root = page.locator(".nnsp-root.nnsp-static")
    expect(root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").first).to_be_visible()
    root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").nth(3).click()
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("activated")
    assert_inside(root, FIELDS)
    columns = root.locator(".nnsp-main").evaluate("el => getComputedStyle(el).gridTemplateColumns.split(' ').length")
    own_width = root.bounding_box()["width"]
    assert columns == (2 if own_width > 760 else 1), f"{width} px viewport, widget {own_width} px: {columns} columns"
    _assert_headers_in_view(root, "Trace", ["mean", "std", "min", "max"])  # the stats, without scrolling
    # the trace table's key columns stay in view when the table scrolls sideways
    wrap = root.locator(".nnsp-tabpanel[aria-label='Trace'] .nnsp-table-wrap")
    wrap.evaluate("el => { el.scrollLeft = el.scrollWidth; }")
    first_cell = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").first.locator("td").first
    assert first_cell.bounding_box()["x"] >= wrap.bounding_box()["x"] - 1
    page.screenshot(path=str(artifacts / f"views-{width}-{scheme}.png"), full_page=True)
    assert not errors, errors
    page.close()


def test_a_narrow_cell_of_468_px_shows_every_field(browser, two_run_page, artifacts):
    expect = _expect()
    page = browser.new_page(viewport={"width": 900, "height": 1000})
    page.goto(two_run_page.as_uri())
    page.add_style_tag(content="#nnsp-static { width: 468px; }")  # JupyterLab at 900 px with the file browser open
    root = page.locator(".nnsp-root.nnsp-static")
    expect(root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").first).to_be_visible()
    assert root.bounding_box()["width"] <= 470
    assert_inside(root, FIELDS)
    assert root.locator(".nnsp-main").evaluate("el => getComputedStyle(el).gridTemplateColumns.split(' ').length") == 1
    page.screenshot(path=str(artifacts / "views-468-cell.png"), full_page=True)
    page.close()


def test_keyboard_only_walk_through_the_tree_and_the_tables(browser, two_run_page):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(two_run_page.as_uri())
    root = page.locator(".nnsp-root.nnsp-static")
    tree = root.locator("[role='tree']")
    expect(tree.locator("[role='treeitem']").first).to_have_attribute("tabindex", "0")
    # Tab from the widget's start reaches the tree (one tab stop for the whole tree)
    root.focus()
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('role')") == "treeitem":
            break
    else:
        raise AssertionError("Tab never reached the tree")
    focused = lambda: page.evaluate("document.activeElement.dataset.node")  # noqa: E731
    root_node = focused()
    page.keyboard.press("ArrowDown")
    second = focused()
    assert second != root_node
    page.keyboard.press("End")
    last = focused()
    page.keyboard.press("Home")
    assert focused() == root_node
    page.keyboard.press("ArrowDown")
    assert focused() == second
    # ArrowLeft on a child goes to its parent; on the open root it closes it, ArrowRight opens it again
    page.keyboard.press("ArrowLeft")
    assert focused() == root_node
    page.keyboard.press("ArrowLeft")
    expect(tree.locator(f"[role='treeitem'][data-node='{root_node}']")).to_have_attribute("aria-expanded", "false")
    page.keyboard.press("ArrowRight")
    expect(tree.locator(f"[role='treeitem'][data-node='{root_node}']")).to_have_attribute("aria-expanded", "true")
    page.keyboard.press("ArrowRight")
    assert focused() == second, "ArrowRight on an open item goes to its first child"
    closed = tree.locator(f"[role='treeitem'][data-node='{root_node}'] > .nnsp-children > [role='treeitem'][aria-expanded='false']")
    assert closed.count() > 0, "the MLP's calls are closed at first"
    page.keyboard.press("*")  # opens every sibling of the focused item
    expect(closed).to_have_count(0)
    assert last not in (None, root_node)
    # the trace table: rows are focusable, arrows move, Enter selects the row for the views
    rows = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")
    rows.first.focus()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    assert page.evaluate("document.activeElement.dataset.step") == "4"
    page.keyboard.press("Enter")
    expect(root.locator(".nnsp-hists .nnsp-hist-caption")).to_contain_text("activated")
    # the comparison table, by keyboard only
    root.get_by_role("tab", name="Compare").focus()
    page.keyboard.press("Enter")
    root.get_by_role("button", name="Compare runs").focus()
    page.keyboard.press("Enter")
    compare_rows = root.locator(".nnsp-tabpanel[aria-label='Compare'] tbody tr")
    expect(compare_rows.first).to_be_visible()
    compare_rows.nth(2).focus()
    page.keyboard.press("Enter")
    expect(root.locator(".nnsp-hists .nnsp-hist-caption")).to_contain_text("fork 1")
    page.close()


@pytest.mark.skipif(not AXE.exists(), reason="axe-core is not installed (cd js && npm ci)")
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_an_axe_scan_of_the_widget_finds_no_serious_violation(browser, two_run_page, scheme):
    expect = _expect()
    page = browser.new_page(viewport={"width": 1280, "height": 1000}, color_scheme=scheme)
    page.goto(two_run_page.as_uri())
    root = page.locator(".nnsp-root.nnsp-static")
    expect(root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").first).to_be_visible()
    root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr").nth(3).click()
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("activated")
    page.add_script_tag(path=str(AXE))
    for tab in ("Trace", "Compare", "Trends", "Edit"):
        root.get_by_role("tab", name=tab).click()
        if tab == "Compare":
            root.get_by_role("button", name="Compare runs").click()
            expect(root.locator(".nnsp-tabpanel[aria-label='Compare'] tbody tr").first).to_be_visible()
        result = page.evaluate("async () => await axe.run(document.querySelector('.nnsp-root'))")
        serious = [(v["id"], v["impact"], v["help"], [n["target"] for n in v["nodes"]][:3])
                   for v in result["violations"] if v["impact"] in ("serious", "critical")]
        assert not serious, f"{tab} tab ({scheme}): {serious}"
    page.close()


def test_the_demo_page_compares_base_and_fork_offline(browser, tmp_path):
    from nnschemaparser.examples.demo import main

    expect = _expect()
    assert main(["--out", str(tmp_path)]) == 0
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors = _errors(page)
    page.goto((tmp_path / "inspector.html").as_uri())
    root = page.locator(".nnsp-root.nnsp-static")
    root.get_by_role("tab", name="Compare").click()
    root.get_by_role("button", name="Jump to first divergence").click()
    expect(root.locator(".nnsp-summary")).to_contain_text("base vs fork 1")
    expect(root.locator("tr.nnsp-first")).to_contain_text("hidden")
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("fork 1 · step 3")
    assert not errors, errors
    page.close()
