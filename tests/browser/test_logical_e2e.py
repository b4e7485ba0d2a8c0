"""The Logical view in JupyterLab with a kernel that is rank 0 of a real gloo group: e2e_logical.ipynb
shards a tiny transformers Llama (LlamaConfig, random weights) with FSDP2 over 2 processes on
127.0.0.1 (rank 1 is the kernel's child process, tests/support/logical_lab.py), captures it with
capture_logical and calls show_logical with a one-process reference. The Logical tab appears, is
reached by keyboard, shows one row per value with the placement as a text badge, the local and the
whole shape and the comparison (exact / max abs diff) as the kernel computed them; Enter on a badge
reads the placement out, the filter finds the unknown placements; axe finds no serious violation
in light or dark; screenshots at 1280 and 900 px in light and dark go to test-artifacts/."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
REPO = HERE.parents[1]
AXE = REPO / "js" / "node_modules" / "axe-core" / "axe.min.js"
NOTEBOOK = "e2e_logical.ipynb"
LONG = 240_000

sys.path.insert(0, str(HERE))
from test_inspector_e2e import _menu  # noqa: E402
from test_inspector_lab_views import _probe  # noqa: E402

WORDS = {"S(0)@dp": "Shard(0) over dp", "R": "Replicate", "?@dp": "unknown over dp"}


@pytest.fixture(scope="module")
def logical_lab(tmp_path_factory):
    from lab_server import LabServer

    os.environ["NNSP_REPO"] = str(REPO)  # the kernel imports tests/support/logical_lab.py from here
    server = LabServer(tmp_path_factory.mktemp("lab-logical") / "root", [HERE / NOTEBOOK])
    server.start()
    yield server
    server.stop()


def _axe(page) -> list:
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document.querySelector(\".nnsp-tabpanel[aria-label='Logical']\"))")
    return [(v["id"], [n["target"] for n in v["nodes"]][:3]) for v in result["violations"]
            if v["impact"] in ("serious", "critical")]


def test_logical_view_of_a_llama_sharded_over_two_gloo_ranks_in_jupyterlab(logical_lab, browser, artifacts):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(logical_lab.url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=LONG)
    page.get_by_text(re.compile(r"\| Idle")).first.wait_for(timeout=LONG)
    _menu(page, "Run", "Run All Cells")
    root = page.locator(".nnsp-root")
    root.wait_for(timeout=LONG)
    probe = _probe(page)

    # by keyboard: from the Layers tab, Tab to the Logical tab and press Enter
    root.get_by_role("tab", name="Layers").focus()
    page.keyboard.press("Tab")
    tab = root.get_by_role("tab", name="Logical")
    expect(tab).to_be_focused()
    page.keyboard.press("Enter")
    expect(tab).to_have_attribute("aria-selected", "true")
    panel = root.locator(".nnsp-tabpanel[aria-label='Logical']")
    rows = panel.locator("tbody tr")
    expect(rows).to_have_count(probe["rows"], timeout=60_000)
    expect(panel.locator(".nnsp-lg-summary")).to_contain_text(
        f"{probe['rows']} values of FSDPLlamaForCausalLM on a mesh dp=2 (2 ranks)")
    expect(panel.locator(".nnsp-lg-summary")).to_contain_text(re.compile(rf"against one process: {probe['exact']} of \d+ exact"))

    # each checked row as the kernel has it: badge words, both shapes, the comparison
    for want in probe["checks"]:
        row = rows.nth(want["step"] - 1)
        expect(row.locator("td").nth(0)).to_have_text(str(want["step"]))
        expect(row.locator("td").nth(1)).to_have_text(want["var"])
        badge = row.locator(".nnsp-lg-badge")
        expect(badge).to_have_text(WORDS[want["badge"]])
        expect(badge).to_have_attribute("aria-label", f"{want['var']} placement: {WORDS[want['badge']]}")
        expect(row.locator(".nnsp-lg-local")).to_have_text("[" + ", ".join(map(str, want["local_shape"])) + "]")
        expect(row.locator(".nnsp-lg-block")).to_have_text(want["block"] or "FSDPLlamaForCausalLM")
        compare = row.locator(".nnsp-lg-compare")
        if want["logical_shape"] is None:  # not gathered: the note says why, nothing is compared
            expect(row.locator("td").nth(3)).to_have_text("")
            expect(row.locator(".nnsp-lg-note")).to_contain_text("placement unknown")
            expect(compare).to_have_text("")
            continue
        expect(row.locator("td").nth(3)).to_have_text("[" + ", ".join(map(str, want["logical_shape"])) + "]")
        shown_mean = float(row.locator("td").nth(5).inner_text())  # after the comparison
        assert shown_mean == pytest.approx(want["stats"]["mean"], rel=1e-3, abs=1e-12)
        if want["compare"]["exact"]:
            expect(compare).to_have_text("exact")
        else:
            text = compare.inner_text()
            assert text.startswith("max abs diff ")
            assert float(text.split()[-1]) == pytest.approx(want["compare"]["max_abs_diff"], rel=1e-3)
            expect(compare).to_have_attribute("title", want["compare"]["reason"])

    # Tab from the tab into the panel to the first badge; Enter reads its placement out
    tab.focus()
    first_badge = rows.first.locator(".nnsp-lg-badge")
    for _ in range(6):
        page.keyboard.press("Tab")
        if first_badge.evaluate("el => el === document.activeElement"):
            break
    expect(first_badge).to_be_focused()
    page.keyboard.press("Enter")
    readout = panel.locator(".nnsp-lg-readout")
    expect(readout).to_contain_text("input_ids (FSDPLlamaForCausalLM, step 1): Shard(0) over dp: sharded on tensor dim 0 over mesh dim 'dp'; "
                                    "local [1, 6], whole [2, 6]. Against one process: exact")
    # the filter: the values whose placement is unknown
    panel.locator(".nnsp-lg-filter").fill("unknown")
    if probe["unknown"]:
        expect(rows).to_have_count(probe["unknown"])
    else:  # every value of this Llama has a placement: the table says that nothing matches
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_text("no value matches the filter")
    panel.locator(".nnsp-lg-filter").fill("")
    expect(rows).to_have_count(probe["rows"])

    assert not _axe(page), _axe(page)
    # the screenshots show the rows of the first attention (q, k, v, the cache, the attention output)
    rows.nth(24).evaluate("el => { el.closest('.nnsp-lg-wrap').scrollTop = el.offsetTop - 24; }")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-logical-1280-light.png"))
    page.set_viewport_size({"width": 900, "height": 1100})
    page.wait_for_timeout(400)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-logical-900-light.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Dark")
    page.locator("body[data-jp-theme-light='false']").wait_for(state="attached", timeout=30_000)
    page.wait_for_timeout(500)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-logical-900-dark.png"))
    serious = _axe(page)
    assert not serious, serious
    page.set_viewport_size({"width": 1280, "height": 1100})
    page.wait_for_timeout(400)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "lab-logical-1280-dark.png"))
    _menu(page, "Settings", "Theme", "JupyterLab Light")
    assert not errors, errors
    page.close()
