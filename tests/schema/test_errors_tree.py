"""The exception tree in nnschemaparser/schema/errors.py's docstring is the package's real one.

Every module of the package is imported; every class it defines that subclasses BaseException must
appear in the tree, under each of its bases, with the module that defines it; and every class the
tree names must exist there, with the bases the tree draws. So the tree cannot go stale.
"""

from __future__ import annotations

import builtins
import importlib
import pkgutil
import re

import pytest

import nnschemaparser
from nnschemaparser.schema import errors

PACKAGE = nnschemaparser.__name__
_LINE = re.compile(r"^    ((?:[│ ]   |[├└]── )*)([A-Za-z_]\w*)(?: \(([\w.]+)\))?(?:\s{2,}\S.*)?$")
_TREE_CHARS = set("│├└")


def tree_entries(doc: str) -> list[tuple[str, str, str | None]]:
    """(class, module, parent class) for every line of the tree; roots are builtins with parent None."""
    entries, stack = [], []  # stack[depth] = the qualified name of the last line at that depth
    for line in doc.splitlines():
        match = _LINE.match(line)
        if not match:
            assert not (set(line) & _TREE_CHARS), f"a tree line the test cannot read: {line!r}"
            continue
        prefix, name, module = match.groups()
        depth = len(prefix) // 4
        if depth == 0:
            assert module is None and isinstance(getattr(builtins, name, None), type), \
                f"a root of the tree must be a builtin class: {line!r}"
            module = "builtins"
        else:
            assert depth <= len(stack), f"a line deeper than its parent's: {line!r}"
            module = f"{PACKAGE}.{module}" if module else errors.__name__
        del stack[depth:]
        entries.append((name, module, stack[-1] if stack else None))
        stack.append(f"{module}.{name}")
    return entries


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def package_exceptions() -> dict[str, type]:
    """Every BaseException subclass the package defines, by qualified name (every module imported)."""
    for info in pkgutil.walk_packages(nnschemaparser.__path__, f"{PACKAGE}.", onerror=lambda name: pytest.fail(
            f"{name} does not import")):
        importlib.import_module(info.name)
    found, pending = {}, [BaseException]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == PACKAGE or cls.__module__.startswith(f"{PACKAGE}."):
            found[_qualified(cls)] = cls
    return found


def test_every_exception_class_of_the_package_is_in_the_tree_under_its_bases():
    parents: dict[str, set[str]] = {}
    for name, module, parent in tree_entries(errors.__doc__):
        parents.setdefault(f"{module}.{name}", set()).add(parent)
    defined = package_exceptions()
    assert len(defined) > 20  # the walk imported the stages
    missing = sorted(set(defined) - set(parents))
    assert not missing, f"add these to the tree in nnschemaparser/schema/errors.py: {missing}"
    wrong = {name: (sorted(parents[name]), sorted(_qualified(b) for b in cls.__bases__))
             for name, cls in defined.items() if parents[name] != {_qualified(b) for b in cls.__bases__}}
    assert not wrong, f"drawn under other bases than their own (tree, code): {wrong}"


def test_every_class_the_tree_names_exists_where_it_says():
    gone = []
    for name, module, _ in tree_entries(errors.__doc__):
        cls = getattr(importlib.import_module(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module):
            gone.append(f"{module}.{name}")
    assert not gone, f"the tree in nnschemaparser/schema/errors.py names classes that are not there: {gone}"


def test_the_tree_reader_reads_depths_modules_and_roots():
    doc = ("x\n\n    Exception\n    ├── NNSchemaError                 text\n"
           "    │   └── FileLimitError (files.file_format)  more text\n    └── Other (a.b)\n")
    assert tree_entries(doc) == [
        ("Exception", "builtins", None),
        ("NNSchemaError", errors.__name__, "builtins.Exception"),
        ("FileLimitError", f"{PACKAGE}.files.file_format", f"{errors.__name__}.NNSchemaError"),
        ("Other", f"{PACKAGE}.a.b", "builtins.Exception"),
    ]
    with pytest.raises(AssertionError, match="deeper"):
        tree_entries("    ├── Dangling (x)  a tree line with no root above it\n")
    with pytest.raises(AssertionError, match="cannot read"):
        tree_entries("    Exception\n    ├──Unspaced\n")
    with pytest.raises(AssertionError, match="builtin"):
        tree_entries("    NNSchemaError\n")
