"""A share opened in Chromium: `nnschemaparser serve` started for real on 127.0.0.1, a model shared with
the command's `--share`, and its `/p/<id>` page (the inspector's static page, under its CSP) loaded
over HTTP: the tree renders with the model's blocks, a block shows its source, nothing logs an error
(a blocked script or fetch would), and hostile text from the upload shows as text. Screenshots at
1280 and 900 px go to test-artifacts/."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

HOSTILE_NAME = "<img src=x onerror=\"document.title='pwned'\"></title><script>alert(1)</script>"
HOSTILE_COMMENT = ("# <!-- </script><script>document.title='pwned'</script><b onmouseover=alert(1)>bold</b>"
                   " <!-- a comment opener blanked the page when the payload wrote it as <\\!--")

MODELS = textwrap.dedent('''
    from torch import nn


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x).relu())


    class Hostile(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 4)

        def forward(self, x):
            COMMENT
            return self.fc1(x)
''').replace("COMMENT", HOSTILE_COMMENT)


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    """The server and the share URLs of TwoLayer and Hostile, made with the command's --share."""
    from tests.widget.test_share_server import Server

    from nnschemaparser.__main__ import main as command

    folder = tmp_path_factory.mktemp("shared-page")
    server = Server(folder, "--rate-limit", "1000")
    models = folder / "shared_models.py"
    models.write_text(MODELS)
    urls = {}
    try:
        import contextlib
        import io
        import os

        cwd = os.getcwd()
        os.chdir(folder)
        try:
            for name, extra in (("TwoLayer", []), ("Hostile", ["--name", HOSTILE_NAME])):
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                    code = command([f"{models}:{name}", "--input", "2,16", "--share", "--share-source", "--api", server.url,
                                    "-o", str(folder / f"{name}.neurarch.json"), *extra])
                assert code == 0, out.getvalue()
                urls[name] = out.getvalue().rstrip("\n").splitlines()[-1].removeprefix("Share: ")
        finally:
            os.chdir(cwd)
        yield urls
    finally:
        server.stop()


def _watch(page, base: str) -> list[str]:
    """Console errors and warnings, page errors, dialogs, and any request outside the server `base`."""
    problems: list[str] = []
    page.on("console", lambda message: problems.append(f"{message.type}: {message.text}")
            if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
    page.on("dialog", lambda dialog: (problems.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    page.on("request", lambda request: problems.append(f"request: {request.url}")
            if not request.url.startswith(base) else None)
    return problems


@pytest.mark.parametrize("width", [1280, 900])
def test_a_shared_model_opens_in_the_inspector_page_with_its_tree_and_sources(browser, shares, artifacts, width):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 1000})
    problems = _watch(page, shares["TwoLayer"].split("/p/")[0] + "/")
    response = page.goto(shares["TwoLayer"])
    assert response.status == 200 and "script-src 'sha256-" in response.headers["content-security-policy"]
    root = page.locator(".nnsp-root.nnsp-static")
    tree = root.locator(".nnsp-tree")
    # the source view: the forward's one statement, as written
    expect(tree.locator(".nnsp-row", has_text="return self.fc2(self.fc1(x).relu())")).to_be_visible()
    root.get_by_role("button", name="Lowered").click()  # the static page lowers too
    expect(tree.locator(".nnsp-row", has_text="CALL fc1(x)")).to_be_visible()
    expect(tree.locator(".nnsp-row", has_text="fc1 · Linear")).to_be_visible()
    expect(tree.locator(".nnsp-row", has_text="fc2 · Linear")).to_be_visible()
    expect(page.locator(".nnsp-preface")).to_contain_text("| TwoLayer")
    expect(page.locator(".nnsp-preface")).to_contain_text("Runs            yes")
    # a block of the shared schema shows its own source (the schema carries it; the model is not here)
    tree.locator(".nnsp-row", has_text="fc1 · Linear").click()
    expect(root.locator(".nnsp-source")).to_contain_text("F.linear(input, self.weight, self.bias)")
    expect(root.locator(".nnsp-source-file")).to_contain_text("modules/linear.py")
    page.screenshot(path=str(artifacts / f"shared-page-{width}.png"), full_page=True)  # the tree open, fc1's source
    tree.locator(".nnsp-row", has_text="TwoLayer").first.click()
    expect(root.locator(".nnsp-source")).to_contain_text("return self.fc2(self.fc1(x).relu())")
    expect(root.locator(".nnsp-source-file")).to_contain_text("shared_models.py")
    box = root.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box
    assert not problems, problems
    page.close()


def test_hostile_text_in_a_share_is_shown_as_text(browser, shares, artifacts):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    problems = _watch(page, shares["Hostile"].split("/p/")[0] + "/")
    page.goto(shares["Hostile"])
    root = page.locator(".nnsp-root.nnsp-static")
    expect(root.locator(".nnsp-tree .nnsp-row", has_text="return self.fc1(x)")).to_be_visible()
    assert page.title() == f"{HOSTILE_NAME} · nnschemaparser"
    expect(page.locator(".nnsp-preface")).to_contain_text("<img src=x")  # the card names the graph
    root.locator(".nnsp-tree .nnsp-row", has_text="Hostile").first.click()
    expect(root.locator(".nnsp-source")).to_contain_text(HOSTILE_COMMENT)
    assert page.locator("img, [onerror], [onmouseover]").count() == 0
    assert page.title() == f"{HOSTILE_NAME} · nnschemaparser"  # no script of the upload set it to 'pwned'
    page.screenshot(path=str(artifacts / "shared-page-hostile-1280.png"), full_page=True)
    assert not problems, problems
    page.close()
