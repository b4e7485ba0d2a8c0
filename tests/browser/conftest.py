"""Fixtures of the end-to-end tests: a JupyterLab server on localhost and a headless Chromium page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from lab_server import CHROMIUM, LabServer, launch_chromium  # noqa: E402

HERE = Path(__file__).parent
ARTIFACTS = HERE.parents[1] / "test-artifacts"


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: end-to-end tests in JupyterLab driven by headless Chromium")


def pytest_collection_modifyitems(config, items):
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=f"{CHROMIUM} is not installed (apt-get install chromium); .ci/run installs it")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("lab") / "root", [HERE / "e2e_inspector.ipynb"])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
