"""The package as users get it: a built wheel, installed (not editable) into a fresh venv.

The wheel must carry the widget's built browser files and declare the widget stack (anywidget,
ipywidgets, traitlets, pandas, matplotlib) as dependencies, so `pip install nnschemaparser` is
enough for `from nnschemaparser.widget import ...`. The fresh venv sees the project's installed
third-party packages through a path file (this machine has no index to install torch from again),
never the editable checkout: the test asserts the import comes from the wheel.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DECLARED = ("anywidget", "ipywidgets", "traitlets", "pandas", "matplotlib", "torch", "safetensors", "greenlet")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "node_modules", "build", "dist",
                                                                 "*.egg-info", "__pycache__", "test-artifacts", "out"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp / "dist").glob("nnschemaparser-*.whl")
    return path


def test_wheel_declares_the_widget_stack_and_carries_the_browser_files(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line]
    required = {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip().lower() for r in requires}
    assert set(DECLARED) <= required, f"not declared: {set(DECLARED) - required}"
    assert {"nnschemaparser/widget/static/widget.js", "nnschemaparser/widget/static/widget.css"} <= names
    assert "nnschemaparser/runtime/program.py" in names and "nnschemaparser/examples/mlp.py" in names
    assert "nnschemaparser/store/_statistics.c" in names  # the store's statistics kernel, built on first use
    assert "nnschemaparser/traces/_diverge_errors.c" in names  # diverge's per-row error kernel, built on first use
    assert "nnschemaparser/runtime/_nsp_floats.h" in names  # the header both kernels include
    assert not any(n.startswith(("tests/", "js/", "bench/")) for n in names)
    # neurarch-trace's names: the console script and `python -m neurarch_trace`
    assert {"neurarch_trace/__init__.py", "neurarch_trace/__main__.py"} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as archive:
        assert "neurarch-trace = neurarch_trace:main" in archive.read(entry_points).decode()


def test_the_installed_wheel_imports_the_widget_and_renders_its_static_page(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # third-party packages come from the project's environment; its editable nnschemaparser does not,
    # because path files in a directory added by a path file are not processed
    (fresh_site / "project-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                           str(fresh_site), str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    script = tmp_path / "use.py"
    script.write_text(
        "import sys, torch\n"
        "import nnschemaparser\n"
        f"assert nnschemaparser.__file__.startswith({str(fresh_site)!r}), nnschemaparser.__file__\n"
        "from nnschemaparser.examples.mlp import MLP\n"
        "from nnschemaparser.widget import inspect_model_widget\n"
        "torch.manual_seed(0)\n"
        "widget = inspect_model_widget(MLP().eval(), {'x': torch.randn(2, 784)})\n"
        "widget.step(); widget.step(); widget.step()  # the first Step stops before the call of fc1\n"
        "import shutil\n"
        "from nnschemaparser.store import native\n"
        "assert native.kernel() is not None or not shutil.which('cc'), native.problem()  # built from the wheel's copy\n"
        "from nnschemaparser.traces import diverge_native\n"
        "assert diverge_native.available() or not shutil.which('cc'), diverge_native.problem()  # _diverge_errors.c shipped\n"
        f"page = widget.to_html({str(tmp_path / 'page.html')!r}).read_text()\n"
        "assert 'createStaticModel' in page and 'nnsp-data' in page\n"
        "print('ok', widget.step_index)\n")
    run = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["ok", "2"]
