"""Reading the source of a function and locating it: the input of the lowering.

Works from functions, not classes: `inspect.getsource(SomeClass)` fails for classes defined in a
notebook cell, while the source of their methods is available through the code object's file and
line (IPython registers cell sources with `linecache`). Depends on the standard library only.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from ..schema.errors import SourceUnavailableError, UnsupportedSyntaxError

__all__ = ["FunctionSource", "function_source", "unwrap_function"]


@dataclass(frozen=True)
class FunctionSource:
    """A function's parsed definition with the file and line numbering of the original source."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    filename: str
    firstlineno: int
    lines: tuple[str, ...]
    indent: int = 0  # the columns textwrap.dedent took off every line before parsing

    def column(self, lineno: int, offset: int) -> int:
        """The 0-based character column in the file of `ast`'s `col_offset` (UTF-8 bytes of the
        dedented text) on absolute line `lineno`."""
        index = lineno - self.firstlineno
        if not 0 <= index < len(self.lines):
            return offset + self.indent
        dedented = self.lines[index][self.indent:].encode("utf-8")
        return self.indent + len(dedented[:offset].decode("utf-8", errors="ignore"))

    def line_text(self, lineno: int) -> str:
        """The source text of absolute line `lineno` of the file (stripped)."""
        index = lineno - self.firstlineno
        if 0 <= index < len(self.lines):
            return self.lines[index].strip()
        return ""


def unwrap_function(fn: Callable) -> Callable:
    """The innermost function under `functools.wraps`-style decorators and bound methods."""
    fn = getattr(fn, "__func__", fn)
    return inspect.unwrap(fn)


@functools.lru_cache(maxsize=4096)
def _parse_cached(filename: str, firstlineno: int, text: str) -> ast.Module:
    return ast.parse(text)


_SOURCES: dict[Any, FunctionSource] = {}


def function_source(fn: Callable) -> FunctionSource:
    """Parse the definition of `fn` (already unwrapped) and return its FunctionDef node.

    Line numbers in the returned node are absolute line numbers of `filename`. Results are cached
    per code object and file: the lowering reads the tree and never changes it. (Code objects
    compare equal without their file, so the same function at the same line of two files would
    otherwise share the first one's source and file name.)
    """
    code = getattr(fn, "__code__", None)
    key = (code.co_filename, code) if code is not None else None
    cached = _SOURCES.get(key) if key is not None else None
    if cached is not None:
        return cached
    result = _read_function_source(fn)
    owner = _enclosing_class(getattr(fn, "__qualname__", ""))
    if owner and _has_private_names(result.node):
        result = FunctionSource(node=_Mangler(owner).visit(copy.deepcopy(result.node)), filename=result.filename,
                                firstlineno=result.firstlineno, lines=result.lines, indent=result.indent)
    if len(_SOURCES) > 8192:
        _SOURCES.clear()
    _SOURCES[key] = result
    return result


def _enclosing_class(qualname: str) -> str:
    """The class a function's body is compiled in (`Block.forward` -> "Block"; "" for none):
    the last dotted part before the function that is no `<locals>`."""
    parts = qualname.split(".")[:-1]
    if not parts or parts[-1] == "<locals>":
        return ""  # a function defined inside a function (or at module level): no class body
    return parts[-1]


def _private(name: str) -> bool:
    return name.startswith("__") and not name.endswith("__")


def _has_private_names(node: ast.AST) -> bool:
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and _private(child.attr):
            return True
        if isinstance(child, ast.Name) and _private(child.id):
            return True
        if isinstance(child, ast.arg) and _private(child.arg):
            return True
        if isinstance(child, ast.keyword) and child.arg and _private(child.arg):
            return True
    return False


class _Mangler(ast.NodeTransformer):
    """Private names (`self.__scale`, `__helper`) as CPython compiles them in a class body:
    `_Class__scale` (the class name without its leading underscores)."""

    def __init__(self, owner: str):
        self.prefix = "_" + owner.lstrip("_") if owner.strip("_") else ""

    def mangle(self, name: str) -> str:
        return self.prefix + name if self.prefix and _private(name) else name

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = self.mangle(node.attr)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.mangle(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        self.generic_visit(node)
        node.arg = self.mangle(node.arg)
        return node

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        self.generic_visit(node)
        if node.arg:
            node.arg = self.mangle(node.arg)
        return node


def _read_function_source(fn: Callable) -> FunctionSource:
    code = getattr(fn, "__code__", None)
    if code is None:
        raise SourceUnavailableError(
            f"{getattr(fn, '__qualname__', fn)!r} has no Python source (it is a builtin or C extension); "
            "it will run as an opaque call")
    filename = code.co_filename
    try:
        lines, firstlineno = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        lines = []
        firstlineno = code.co_firstlineno
        all_lines = linecache.getlines(filename)
        if all_lines:
            block = inspect.getblock(all_lines[firstlineno - 1:])
            lines = list(block)
        if not lines:
            raise SourceUnavailableError(
                f"cannot read the source of {fn.__qualname__} (file {filename!r}); define the model in a "
                "file or a notebook cell so its source is available") from None
    text = textwrap.dedent("".join(lines))
    try:
        tree = _parse_cached(filename, firstlineno, text)
    except SyntaxError as exc:
        raise UnsupportedSyntaxError(f"cannot parse the source of {fn.__qualname__}: {exc.msg}",
                                     filename, firstlineno + (exc.lineno or 1) - 1) from None
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        raise SourceUnavailableError(f"the source of {fn.__qualname__} is not a function definition "
                                     "(a lambda or an assignment); it will run as an opaque call")
    if node.name != code.co_name:
        raise SourceUnavailableError(
            f"the source at {filename}:{firstlineno} defines {node.name!r}, not {code.co_name!r}: the file "
            "changed since the code was loaded, or the code was made by exec() with a borrowed filename; "
            "it will run as an opaque call")
    # Shift line numbers to absolute positions of the file, on a copy so the cache stays intact.
    node = _shifted_copy(node, firstlineno - 1)
    first = next((line for line in lines if line.strip()), "")
    first_dedented = next((line for line in text.splitlines(True) if line.strip()), "")
    return FunctionSource(node=node, filename=filename, firstlineno=firstlineno,
                          lines=tuple(line.rstrip("\n") for line in lines),
                          indent=len(first) - len(first_dedented))


def _shifted_copy(node: ast.AST, offset: int) -> Any:
    import copy

    node = copy.deepcopy(node)
    if offset:
        for child in ast.walk(node):
            if hasattr(child, "lineno"):
                child.lineno += offset
                if getattr(child, "end_lineno", None) is not None:
                    child.end_lineno += offset
    return node
