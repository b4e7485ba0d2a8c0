"""Write docs/API.md from the docstrings of every public name.

    python docs/apidoc.py            # rewrite docs/API.md
    python docs/apidoc.py --check    # exit 1 when docs/API.md is not what the code says

The public names are `nnschemaparser.__all__` and `nnschemaparser.widget.__all__`, in that order,
grouped by the module that defines them. Each gets its kind, its signature and its docstring; a
class also lists its public methods and properties (defined by the class itself) with the first
paragraph of their docstrings. Nothing is written by hand: change a docstring, run the script.
`tests/package/test_api_doc.py` fails when the file is out of date.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("API.md")
PACKAGES = ("nnschemaparser", "nnschemaparser.widget")

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return _ADDRESS.sub("", text)


def _first_paragraph(doc: str) -> str:
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ")


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        if issubclass(obj, enum.Enum):
            return "enum"
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "constant"


def _members(cls: type) -> list[str]:
    lines = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            doc = inspect.getdoc(value) or ""
            lines.append(f"- `{name}` (property){': ' + _first_paragraph(doc) if doc else ''}")
        elif isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
            func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if not func.__qualname__.startswith(cls.__qualname__ + "."):
                continue  # set on the class from outside (a viewer another stage registers): not its API
            doc = inspect.getdoc(func) or ""
            lines.append(f"- `{name}{_signature(func)}`{': ' + _first_paragraph(doc) if doc else ''}")
    return lines


def _entry(name: str, obj: Any) -> list[str]:
    kind = _kind(obj)
    lines = [f"### `{name}`", ""]
    if kind == "constant":
        if isinstance(obj, (set, frozenset)):
            shown = "{" + ", ".join(repr(v) for v in sorted(obj)) + "}"
        else:
            shown = _ADDRESS.sub("", repr(obj))
        lines += [f"*constant* `{type(obj).__name__}` = `{shown}`", ""]
        return lines
    signature = _signature(obj)
    lines += [f"*{kind}* `{name}{signature}`", ""]
    doc = inspect.getdoc(obj)
    own_doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else doc
    if doc and own_doc:
        lines += [doc, ""]
    if inspect.isclass(obj):
        members = _members(obj)
        if members:
            lines += ["Members:", ""] + members + [""]
    return lines


def render() -> str:
    """The whole of docs/API.md."""
    out = ["# API reference", "",
           "Generated from the docstrings by `python docs/apidoc.py`; do not edit by hand. Every name of",
           "`nnschemaparser.__all__` and `nnschemaparser.widget.__all__`, grouped by the module defining it.", ""]
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        out += [f"## `{package_name}`", ""]
        groups: dict[str, list[str]] = {}
        for name in package.__all__:
            obj = getattr(package, name)
            module = getattr(obj, "__module__", None) if _kind(obj) != "constant" else None
            groups.setdefault(module or package_name, []).append(name)
        for module, names in groups.items():
            out += [f"### Module `{module}`", ""] if module != package_name else []
            out += [f"Names: {', '.join(f'`{n}`' for n in names)}", ""]
            for name in names:
                out += ["#" + line if line.startswith("### ") else line for line in _entry(name, getattr(package, name))]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/API.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python docs/apidoc.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
