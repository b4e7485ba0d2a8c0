"""The widget's front end build (js/ with esbuild): the checked-in bundle is fresh and loads, and the JS
unit tests and the type check pass. Needs node and npm (`make js-deps`); skipped when node is absent."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from nnschemaparser.widget import build as widget_build

pytestmark = pytest.mark.skipif(shutil.which("node") is None,
                                reason="node is not installed (make js-deps installs it); the front end build needs it")


@pytest.fixture(scope="module")
def js_deps():
    """js/node_modules, installed by npm ci when missing."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (make js-deps installs it)")
    widget_build.ensure_deps()
    return widget_build.JS_DIR


def _npm(js_dir, script):
    return subprocess.run(["npm", "run", "--silent", script], cwd=js_dir, capture_output=True, text=True, timeout=300)


def test_checked_in_browser_files_equal_a_fresh_esbuild_build(js_deps):
    stale = widget_build.stale()
    assert not stale, f"{stale} in {widget_build.STATIC_DIR} are stale: run python -m nnschemaparser.widget.build"


def test_the_build_is_deterministic_and_stale_names_what_differs(js_deps, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    widget_build.build(first)
    widget_build.build(second)
    for name in widget_build.OUTPUTS:
        assert (first / name).read_bytes() == (second / name).read_bytes(), f"{name} differs between two builds"
    assert widget_build.stale(first) == []
    (first / "widget.js").write_text((first / "widget.js").read_text() + "\n// edited\n")
    (first / "widget.css").unlink()
    assert widget_build.stale(first) == ["widget.js", "widget.css"]


def test_the_check_command_passes_on_the_checked_in_files(js_deps):
    assert widget_build.main(["--check"]) == 0


def test_built_bundle_loads_in_node_as_an_es_module_with_render_and_create_static_model(tmp_path):
    text = (widget_build.STATIC_DIR / "widget.js").read_text()
    assert "</script" not in text.lower(), "the static page inlines the bundle in a <script> element"
    (tmp_path / "widget.mjs").write_text(text)
    # The static page inlines the bundle and boots it through __nnsp.index (see static_html.py).
    (tmp_path / "page.mjs").write_text(text + "\nexport const boot = __nnsp.index;\n")
    script = (
        "const m = await import(process.argv[1]); const p = await import(process.argv[2]);"
        "const model = m.createStaticModel({ traits: { title: 't', tree: { rows: [], total: 0, root: 0 } },"
        " sources: {}, trace: null, hists: {} });"
        "console.log(JSON.stringify({ render: typeof m.default.render, create: typeof m.createStaticModel,"
        " mode: model.get('mode'), keys: Object.keys(m).sort(),"
        " boot: p.boot.default.render === p.default.render && p.boot.createStaticModel === p.createStaticModel,"
        " bootRender: typeof p.boot.default.render }));"
    )
    done = subprocess.run(["node", "--input-type=module", "-e", script, str(tmp_path / "widget.mjs"),
                           str(tmp_path / "page.mjs")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {"render": "function", "create": "function", "mode": "static",
                   "keys": ["createStaticModel", "default"], "boot": True, "bootRender": "function"}


def test_js_unit_tests_pass(js_deps):
    done = _npm(js_deps, "test")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout and "# pass " in done.stdout


def test_js_type_check_passes(js_deps):
    done = _npm(js_deps, "typecheck")
    assert done.returncode == 0, f"tsc --noEmit found errors:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
