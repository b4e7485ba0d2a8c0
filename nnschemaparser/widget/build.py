"""Builds the inspector's browser files, `static/widget.js`, `static/widget.css`, `static/views.js` and
`static/static.js` (see js/build.mjs), and `static/logical.js`, `static/patch.js` and `static/diverge.js`
(the Logical, Patch and Diverge tabs, sent on request), from js/ with esbuild.

The browser code lives in js/ as ES modules (an npm package with pinned devDependencies: esbuild,
typescript). `js/build.mjs` bundles `js/index.js` into one minified ESM file and minifies
`js/styles.css`; the result is deterministic, and the built files are checked in so that
`pip install` needs no Node. This module is the Python-side driver:

    python -m nnschemaparser.widget.build           # npm ci (when js/node_modules is missing), then build
    python -m nnschemaparser.widget.build --check   # rebuild into a temp dir; exit 1 naming stale files

Needs node and npm on PATH (Debian: `apt-get install nodejs npm`, or `make js-deps`). Depends on the
standard library only; nothing else in the package imports it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["build", "stale", "ensure_deps", "JS_DIR", "STATIC_DIR", "OUTPUTS", "BuildError"]

JS_DIR = Path(__file__).resolve().parents[2] / "js"
STATIC_DIR = Path(__file__).resolve().parent / "static"
OUTPUTS = ("widget.js", "widget.css", "logical.js", "views.js", "static.js", "patch.js", "diverge.js")
_FIX = "install Node.js 18+ and npm (Debian: apt-get install nodejs npm, or run `make js-deps`)"


class BuildError(Exception):
    """The build could not run (no js/ sources, node or npm missing, npm ci or esbuild failed)."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"`{name}` is not on PATH: {_FIX}")
    return path


def _run(command: list[str], what: str, cwd: Path = JS_DIR) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}".rstrip())


def ensure_deps(js_dir: Path = JS_DIR) -> None:
    """Check the sources are there and run `npm ci` in js/ when js/node_modules is missing."""
    if not (js_dir / "package.json").is_file():
        raise BuildError(f"no js/package.json at {js_dir}; the sources live in a clone of the repository "
                         "(an installed package ships only the built files)")
    _tool("node")
    if not (js_dir / "node_modules").is_dir():
        _run([_tool("npm"), "ci", "--no-audit", "--no-fund", "--silent"], "npm ci in js/", cwd=js_dir)


def build(out_dir: Path = STATIC_DIR) -> list[Path]:
    """Build widget.js and widget.css into `out_dir` (default: the package's static/); returns their paths."""
    ensure_deps()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _run([_tool("node"), str(JS_DIR / "build.mjs"), "--outdir", str(out_dir), "--quiet"], "esbuild (js/build.mjs)")
    return [out_dir / name for name in OUTPUTS]


def stale(static_dir: Path = STATIC_DIR) -> list[str]:
    """The names of the built files in `static_dir` that differ from a fresh build (empty: up to date)."""
    with tempfile.TemporaryDirectory(prefix="nnsp-widget-") as tmp:
        build(Path(tmp))
        return [name for name in OUTPUTS
                if not (static_dir / name).is_file()
                or (static_dir / name).read_bytes() != (Path(tmp) / name).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the inspector's static/widget.js and widget.css from js/ "
                                                 "with esbuild (runs npm ci first when js/node_modules is missing).")
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temp dir and exit 1 if the checked-in files differ; write nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            old = stale()
            if old:
                print(f"stale in {STATIC_DIR}: {', '.join(old)}\nrun: python -m nnschemaparser.widget.build",
                      file=sys.stderr)
                return 1
            print(f"static/{', '.join(OUTPUTS)} are up to date")
            return 0
        for path in build():
            print(f"wrote {path}")
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
