"""The inspector, round three (issue 22), end to end in JupyterLab with a kernel, by keyboard: a
transformers Llama of 8 layers with its default sdpa attention, and a Mixtral (e2e_round3.ipynb).

State that belongs to a run: a breakpoint's stop reason is gone after Reset and a Step; `g` and `/`
replace their old text; Escape gives the focus back to the tree; a run to a step past the end and
a run to a row that never runs say "target not reached" and stay where they were. Search results
carry their path and a "never ran" flag. The by-layer chart of a paused run puts its points at
their layer numbers. The sdpa heads are recomputed, labelled, their tokens on the axes of an
enlarged head, equal to the eager model's weights. The same statement in every layer. Screenshots
at 1280 and 900 px, light and dark, of both models go to test-artifacts/; axe finds no serious or
critical violation in either theme, and at 900 px nothing is cut off.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
AXE = HERE.parents[1] / "js" / "node_modules" / "axe-core" / "axe.min.js"
NOTEBOOK = "e2e_round3.ipynb"
LONG = 180_000

sys.path.insert(0, str(HERE))
from lab_server import LabServer  # noqa: E402
from test_inspector_e2e import _kernel_state, _menu  # noqa: E402
from test_inspector_views import FIELDS, assert_inside  # noqa: E402

# what must be visible whole at 900 px besides the usual fields: the search results' buttons, the
# call stack's stats, the tree's current row and the source's current line
NARROW = FIELDS + [".nnsp-result-open", ".nnsp-results .nnsp-icon", ".nnsp-vars-table td", ".nnsp-row.nnsp-current",
                   ".nnsp-line-current"]


@pytest.fixture(scope="module")
def round3_lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("lab-round3") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def axe_serious(page, root_selector: str = ".nnsp-root") -> list:
    """The serious and critical axe violations inside every widget root of the page (also roots in
    shadow DOM, where marimo renders widgets); fails when there is no root to scan."""
    if not AXE.exists():
        pytest.skip(f"{AXE} is missing: run `make js-deps`")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("""async (selector) => {
      const roots = [];
      const visit = (node) => {
        roots.push(...node.querySelectorAll(selector));
        for (const el of node.querySelectorAll("*")) if (el.shadowRoot) visit(el.shadowRoot);
      };
      visit(document);
      const out = [];
      for (const el of roots) {
        const r = await axe.run(el);
        for (const v of r.violations) out.push({ id: v.id, impact: v.impact, nodes: v.nodes.slice(0, 3).map((n) => n.target), why: v.nodes.slice(0, 3).map((n) => (n.failureSummary || "").slice(0, 160)) });
      }
      return { scanned: roots.length, violations: out };
    }""", root_selector)
    assert result["scanned"] > 0, "axe found no widget to scan"
    return [v for v in result["violations"] if v["impact"] in ("serious", "critical")]


def assert_current_in_view(root) -> None:
    """The row and source line the view shows lie whole inside their pane's visible area (not half cut
    at its edge), whatever the width: the "looking at" ones where the user moved the view (round four:
    the view and the run's place are two things), else the run's current ones."""
    problems = root.evaluate("""(root) => {
      const out = [];
      for (const [pane, looking, item] of [[".nnsp-tree", ".nnsp-row.nnsp-looking", ".nnsp-row.nnsp-current"],
                                           [".nnsp-source", ".nnsp-line-looking", ".nnsp-line-current"]]) {
        const box = root.querySelector(pane), el = box && (box.querySelector(looking) || box.querySelector(item));
        if (!el) continue;
        const b = box.getBoundingClientRect(), r = el.getBoundingClientRect();
        const top = b.top + box.clientTop, bottom = top + box.clientHeight;
        if (r.top < top - 1 || r.bottom > bottom + 1) out.push(`${item} [${Math.round(r.top)}, ${Math.round(r.bottom)}] outside ${pane} [${Math.round(top)}, ${Math.round(bottom)}]`);
      }
      return out;
    }""")
    assert not problems, problems


def _focus_widget(root) -> None:
    root.locator(".nnsp-title").click()


def _press_in_widget(page, root, *keys: str) -> None:
    _focus_widget(root)
    for key in keys:
        page.keyboard.press(key)


def _screens(page, root, artifacts, stem: str, scheme: str) -> None:
    for width in (1280, 900):
        page.set_viewport_size({"width": width, "height": 3400 if width > 1000 else 4800})  # the whole widget in view
        page.wait_for_timeout(400)
        root.screenshot(path=str(artifacts / f"{stem}-{width}-{scheme}.png"))
        assert_current_in_view(root)
        if width == 900:
            assert_inside(root, NARROW)
    page.set_viewport_size({"width": 1280, "height": 1400})


def test_round3_by_keyboard_on_an_sdpa_llama_and_a_mixtral_in_jupyterlab(round3_lab, browser, artifacts):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(round3_lab.url(NOTEBOOK))
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    expect(page.locator(".nnsp-root")).to_have_count(2, timeout=LONG)
    root = page.locator(".nnsp-root").first
    status = root.locator(".nnsp-status")
    reason = root.locator(".nnsp-stop-reason")
    search = root.get_by_label("Search the schema")
    run_to = root.get_by_label("Run to step")

    # "/" searches; a breakpoint from the focused result with "b"
    _press_in_widget(page, root, "/")
    expect(search).to_be_focused()
    page.keyboard.type("layers.1.self_attn")
    page.keyboard.press("Enter")
    first = root.locator(".nnsp-result").first
    expect(first).to_contain_text("model.layers.1.self_attn", timeout=30_000)
    page.keyboard.press("ArrowDown")
    expect(first.locator(".nnsp-result-open")).to_be_focused()
    page.keyboard.press("b")
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of model.layers.1.self_attn")
    # Escape gives the focus back to the tree
    page.keyboard.press("Escape")
    assert page.evaluate("() => !!document.activeElement.closest('.nnsp-tree [role=treeitem]')")
    # "/" again: the old query is selected, so typing replaces it
    _press_in_widget(page, root, "/")
    page.keyboard.type("post_attention_layernorm")
    expect(search).to_have_value("post_attention_layernorm")
    page.keyboard.press("Escape")
    assert page.evaluate("() => !!document.activeElement.closest('.nnsp-tree [role=treeitem]')")

    # Continue to the breakpoint, then Reset and Step: no stale "stopped" line, here or in the kernel
    _press_in_widget(page, root, "c")
    expect(reason).to_have_text("stopped: entered model.layers.1.self_attn", timeout=60_000)
    _press_in_widget(page, root, "r")
    expect(status).to_contain_text("ready")
    expect(reason).to_have_text("")
    _press_in_widget(page, root, "s", "s")
    expect(status).to_contain_text(re.compile(r"step 1\b"))
    expect(reason).to_have_text("")
    state = _kernel_state(page)
    assert state["stop_reason"] == "" and state["step_index"] == 1
    assert state["hits"] == [], "the hit of the abandoned run went with it"

    # g 120, then g 6: the second number replaces the first (no 1206)
    _press_in_widget(page, root, "g")
    expect(run_to).to_be_focused()
    page.keyboard.type("120")
    page.keyboard.press("Enter")
    expect(status).to_contain_text("step 120", timeout=60_000)
    _press_in_widget(page, root, "g")
    page.keyboard.type("6")
    expect(run_to).to_have_value("6")
    page.keyboard.press("Enter")
    expect(status).to_contain_text(re.compile(r"step 6$"), timeout=60_000)
    # past the end: it says so and stays at step 6, paused
    _press_in_widget(page, root, "g")
    page.keyboard.type("99999")
    page.keyboard.press("Enter")
    expect(reason).to_contain_text("target not reached: step 99999; the run finished at step", timeout=60_000)
    expect(reason).to_contain_text("back at step 6")
    expect(status).to_contain_text(re.compile(r"paused · step 6$"))
    page.keyboard.press("Escape")
    assert page.evaluate("() => !!document.activeElement.closest('.nnsp-tree [role=treeitem]')")

    # a row that never runs: flagged in the results; "h" on it says why it was not reached (with no
    # breakpoint on the way, which would stop the run first)
    root.get_by_role("button", name="Clear breakpoints").click()
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("none")
    _press_in_widget(page, root, "/")
    page.keyboard.type("You must specify exactly one")
    page.keyboard.press("Enter")
    never = root.locator(".nnsp-result").first
    expect(never).to_have_attribute("data-ran", "false", timeout=30_000)
    expect(never).to_contain_text("never ran")
    expect(never).to_contain_text("model")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("h")
    expect(reason).to_contain_text("target not reached: `raise ValueError", timeout=60_000)
    expect(reason).to_contain_text("in an untaken branch")
    expect(status).to_contain_text(re.compile(r"paused · step 6$"))
    state = _kernel_state(page)
    assert state["step_index"] == 6 and state["status"] == "paused" and state["never_ran"] is False
    assert state["stop_reason"].startswith("target not reached")
    page.keyboard.press("Escape")

    # by layer with a partial run: a finished base run, then a run paused inside layer 3
    _press_in_widget(page, root, "c")
    expect(status).to_contain_text("finished", timeout=60_000)
    _press_in_widget(page, root, "/")
    page.keyboard.type("layers.3.mlp")
    page.keyboard.press("Enter")
    expect(root.locator(".nnsp-result").first).to_contain_text("model.layers.3.mlp", timeout=30_000)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("b")
    expect(root.get_by_label("Breakpoints", exact=True)).to_contain_text("entry of model.layers.3.mlp")
    _press_in_widget(page, root, "r", "c")
    expect(reason).to_have_text("stopped: entered model.layers.3.mlp", timeout=60_000)
    state = _kernel_state(page)
    assert state["hits"] == [[state["run"], "entered model.layers.3.mlp"]]
    current = root.locator(".nnsp-tree .nnsp-row.nnsp-current")  # deep in the tree the first payload left out
    expect(current).to_have_count(1)
    expect(current).to_contain_text("down_proj")
    root.get_by_role("tab", name="Trends").click()
    chart = root.locator(".nnsp-layer-chart")
    runs = state["runs"]
    base_dots = chart.locator(f"circle.nnsp-series-0")
    paused_dots = chart.locator(f"circle.nnsp-series-1")
    expect(base_dots).to_have_count(8, timeout=30_000)
    expect(paused_dots).to_have_count(3)  # layers 0, 1 and 2 have returned; layer 3 is running
    base_x = {d.get_attribute("data-layer"): d.get_attribute("cx") for d in base_dots.all()}
    for dot in paused_dots.all():
        assert dot.get_attribute("cx") == base_x[dot.get_attribute("data-layer")]
    assert [d.get_attribute("data-layer") for d in paused_dots.all()] == ["0", "1", "2"]
    expect(chart.locator(".nnsp-layer-tick")).to_have_count(3 + 8)  # y ticks, and a number per layer
    expect(chart).to_contain_text(f"{runs[-1]} (paused: layers 0–2 returned)")

    # the same statement in every layer: the current statement, per run
    root.get_by_role("tab", name="Layers").click()
    root.get_by_role("button", name="This statement in every layer").click()
    table = root.locator(".nnsp-layers-table")
    expect(table.locator("thead th")).to_have_count(9, timeout=30_000)
    expect(table.locator("tbody tr").first.locator(".nnsp-layer-cell")).to_have_count(8)
    expect(table.locator("tbody tr").nth(1)).to_contain_text("not run yet")

    # sdpa attention heads, recomputed: pick an attn_output row of the finished run in the trace
    root.get_by_role("tab", name="Trace").click()
    root.get_by_label("Trace of run").select_option(label=runs[0])
    root.get_by_label("Filter by variable").fill("attn_output")
    rows = root.locator(".nnsp-tabpanel[aria-label='Trace'] tbody tr")
    expect(rows.first).to_contain_text("model.layers.0.self_attn", timeout=30_000)
    expect(root.locator(".nnsp-tabpanel[aria-label='Trace']")).to_contain_text(f"{runs[0]}")
    rows.first.click()
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text(f"{runs[0]} · ")
    expect(root.locator(".nnsp-tensor-caption")).to_contain_text("attn_output")
    attention = root.locator(".nnsp-attention")
    expect(attention.locator(".nnsp-subhead").first).to_contain_text("attention (recomputed) · model.layers.0.self_attn",
                                                                     timeout=30_000)
    expect(attention).to_contain_text("recomputed from the sdpa_attention_forward call's query, key, causal mask and scale")
    heads = attention.locator(".nnsp-attn-open")
    expect(heads).to_have_count(4)
    heads.nth(1).focus()
    page.keyboard.press("Enter")  # enlarge head 1: its tokens on the axes
    big = attention.locator("canvas.nnsp-attn-big")
    expect(big).to_be_visible()
    state = _kernel_state(page)
    labels = [f"{i}:{t}" for i, t in enumerate(state["tokens"])]
    assert attention.locator(".nnsp-attn-keys .nnsp-attn-tick").all_inner_texts() == labels
    assert attention.locator(".nnsp-attn-queries .nnsp-attn-tick").all_inner_texts() == labels
    big.scroll_into_view_if_needed()
    box = big.bounding_box()
    page.mouse.move(box["x"] + 1, box["y"] + 1)
    page.mouse.move(box["x"] + 2.5 * box["width"] / 8, box["y"] + 3.5 * box["height"] / 8)
    readout = attention.locator(".nnsp-readout")
    expect(readout).to_have_attribute("data-index", f"head 1, query {labels[3]}, key {labels[2]}")
    shown = float(readout.get_attribute("data-value"))
    assert shown == state["head_1"][3][2]
    assert abs(shown - state["eager_head_1"][3][2]) < 1e-6  # the eager model's own weight
    attention.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "round3-llama-attention-1280-light.png"))

    # screenshots of both models, 1280 and 900 px, light and dark; axe in both themes
    mixtral = page.locator(".nnsp-root").nth(1)
    for scheme in ("light", "dark"):
        if scheme == "dark":
            _menu(page, "Settings", "Theme", "JupyterLab Dark")
            page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
            page.wait_for_timeout(500)
        root.get_by_role("tab", name="Trends").click()
        _screens(page, root, artifacts, "round3-llama", scheme)
        _screens(page, mixtral, artifacts, "round3-mixtral", scheme)
        serious = axe_serious(page)
        assert not serious, f"JupyterLab {scheme}: {serious}"
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    assert not errors, errors
    page.close()
