"""The source statements of a block, for the tree's statement rows ("reads like the source").

`StatementIndex.of_signature(signature)` parses a block's forward source (a `FunctionSchema` with `source`,
`filename` and `firstlineno`) and knows every statement in it by its span in the *file*: absolute
lines, and the columns the lowering writes into each `SourceLocation` (the file's columns, not those
of the dedented text `ast` parsed). It answers three questions:

- `of(location)`: the innermost statement holding an instruction's location (its start position;
  by line alone for a location without columns). A temporary, an attribute fetch and the call of
  one statement all map to that statement; the instructions of a lambda or comprehension helper map
  to the statement that holds the lambda (they have no statement of their own); the test of an `if`
  and the target unpacking of a `for` map to the compound statement itself.
- `inside(stmt, context)`: whether `stmt` is nested strictly inside the statement `context` (the
  compound statement whose branch holds the instructions, or the function itself).
- `text(stmt)`: the statement's own source on one line (a compound statement's header only, up to
  its colon), comments dropped, continuation lines joined, elided past `MAX_TEXT` characters;
  `target_text(stmt)` the same of the names a `for` or `with ... as` binds.

Depends on the standard library only (the widget's tree builds it from a schema's signature).
"""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from typing import Any, Optional

__all__ = ["StatementIndex", "MAX_TEXT", "COMPOUND"]

# A statement row's text is elided past this many characters (the full text is in the source pane).
MAX_TEXT = 120

# The compound statements that stay compound rows, with the instruction kind each lowers to.
COMPOUND: dict[type, str] = {ast.If: "if", ast.For: "for", ast.While: "while", ast.Try: "try",
                             ast.With: "with", ast.FunctionDef: "def"}
if hasattr(ast, "TryStar"):  # Python 3.11+
    COMPOUND[ast.TryStar] = "try"


class StatementIndex:
    """Every statement of one function's source, addressed by its span in the file."""

    def __init__(self, source: str, firstlineno: int, filename: str = ""):
        self.firstlineno = firstlineno
        self.filename = filename
        self.lines = source.splitlines()
        dedented = textwrap.dedent(source)
        self.indent = _indent_removed(self.lines, dedented.splitlines())
        tree = ast.parse(dedented)
        function = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if function is None:
            raise ValueError("the source is not a function definition")
        self.function = function
        self.parent: dict[int, Optional[ast.AST]] = {id(function): None}
        self.statements: list[ast.stmt] = []
        self._spans: dict[int, tuple[int, int, int, int]] = {}
        self._collect(function, function)
        # Sorted by start; the walk is depth first, so of two starting at one place (`if x: y`) the
        # inner one comes later, and the last statement that holds a position is the innermost.
        self._of: dict[tuple, Optional[ast.stmt]] = {}
        self._inside: dict[tuple[int, int], bool] = {}
        self._by_start = sorted(self.statements, key=lambda s: self._spans[id(s)][:2])

    @classmethod
    def of_signature(cls, signature: Any) -> Optional["StatementIndex"]:
        """The index of a block's signature, or None when it has no source that parses."""
        if signature is None or not getattr(signature, "source", ""):
            return None
        try:
            return cls(signature.source, signature.firstlineno, signature.filename)
        except (SyntaxError, ValueError):
            return None

    def _collect(self, node: ast.AST, owner: ast.AST) -> None:
        # Statements sit in statement bodies and in the except handlers, match cases and the like
        # between them; an expression holds none (a lambda's body is an expression).
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.parent[id(child)] = owner
                self.statements.append(child)
                self._spans[id(child)] = self._span(child)
                self._collect(child, child)
            elif not isinstance(child, ast.expr):
                self._collect(child, owner)

    # -- positions -----------------------------------------------------------------------------

    def _line(self, lineno: int) -> str:
        index = lineno - self.firstlineno
        return self.lines[index] if 0 <= index < len(self.lines) else ""

    def _column(self, lineno: int, offset: int) -> int:
        """The file column of `ast`'s `col_offset` (UTF-8 bytes of the dedented line) on file line `lineno`."""
        dedented = self._line(lineno)[self.indent:].encode("utf-8")
        return self.indent + len(dedented[:offset].decode("utf-8", errors="ignore"))

    def _span(self, node: ast.AST) -> tuple[int, int, int, int]:
        lineno = node.lineno + self.firstlineno - 1
        end = (node.end_lineno or node.lineno) + self.firstlineno - 1
        return lineno, self._column(lineno, node.col_offset), end, self._column(end, node.end_col_offset or 0)

    def span(self, stmt: ast.stmt) -> tuple[int, int, int, int]:
        """(first line, first column, last line, end column) of `stmt` in the file."""
        return self._spans[id(stmt)]

    # -- queries -------------------------------------------------------------------------------

    def of(self, location: Any) -> Optional[ast.stmt]:
        """The innermost statement holding `location`'s start, or None (no location, or outside every
        statement: the function's own implicit `return None`). Statements nest or are apart, so
        of those that hold it the innermost starts last."""
        if location is None or not location.lineno:
            return None
        if self.filename and location.filename and location.filename != self.filename:
            return None  # lowered from another file's source: no statement of this one
        key = (location.lineno, location.col, location.end_lineno)
        if key in self._of:  # every layer of a model shares its source positions
            return self._of[key]
        self._of[key] = found = self._innermost(location)
        return found

    def _innermost(self, location: Any) -> Optional[ast.stmt]:
        has_columns = bool(location.end_lineno)
        found = None
        for stmt in reversed(self._by_start):
            first, col, last, end_col = self._spans[id(stmt)]
            if has_columns:
                start, here = (first, col), (location.lineno, location.col)
                if start <= here and here < (last, end_col):
                    found = stmt
                    break
            elif first <= location.lineno <= last:
                found = stmt
                break
        return found

    def inside(self, stmt: ast.stmt, context: Optional[ast.AST]) -> bool:
        """Whether `stmt` is nested strictly inside `context` (None: the function itself)."""
        context = self.function if context is None else context
        key = (id(stmt), id(context))
        if key not in self._inside:
            parent = self.parent.get(id(stmt))
            while parent is not None and parent is not context:
                parent = self.parent.get(id(parent))
            self._inside[key] = parent is not None
        return self._inside[key]

    def is_compound_of(self, stmt: ast.stmt, kind: str, location: Any) -> bool:
        """Whether an instruction of `kind` ("if", "for", "try", ...) at `location` is the compound
        statement `stmt` itself (not an `a and b`, `x if c else y` or assert lowered to an "if")."""
        if COMPOUND.get(type(stmt)) != kind or location is None:
            return False
        first, col, _, _ = self._spans[id(stmt)]
        return location.lineno == first and (not location.end_lineno or location.col == col)

    def text(self, stmt: ast.AST) -> str:
        """The statement's own source on one line: a compound statement's header up to its colon.
        (Any node with a position will do: `target_text` asks for a `for` target's.)"""
        first, col, last, end_col = self._spans[id(stmt)] if id(stmt) in self._spans else self._span(stmt)
        body = getattr(stmt, "body", None)
        if type(stmt) in COMPOUND and body:
            last, end_col = self._header_end(stmt, body[0])
        lines = [self._line(n) for n in range(first, last + 1)]
        if not lines:
            return ""
        lines[-1] = lines[-1][:end_col]
        lines[0] = lines[0][col:]
        return one_line(lines)

    def target_text(self, stmt: ast.stmt) -> str:
        """The source of the names a `for` (or `with ... as`) binds at the top of its body: `i, layer`."""
        target = getattr(stmt, "target", None) if isinstance(stmt, ast.For) else None
        if isinstance(stmt, ast.With) and stmt.items:
            target = stmt.items[0].optional_vars
        if target is None:
            return ""
        return self.text(target)

    def _header_end(self, stmt: ast.stmt, first_body: ast.stmt) -> tuple[int, int]:
        """Where a compound statement's header ends: after the colon before its body."""
        body_line, body_col, _, _ = self._spans[id(first_body)]
        first = self._spans[id(stmt)][0]
        # The header is every line from the statement's start to the body's; on the body's own line
        # (`if x: y`) only what comes before the body. The colon is the last one before the body.
        for lineno in range(body_line, first - 1, -1):
            line = self._line(lineno)
            limit = body_col if lineno == body_line else len(line)
            code = _code_part(line[:limit])
            cut = code.rfind(":")
            if cut >= 0:
                return lineno, cut + 1
        return body_line, body_col


def _indent_removed(lines: list[str], dedented: list[str]) -> int:
    first = next((line for line in lines if line.strip()), "")
    first_dedented = next((line for line in dedented if line.strip()), "")
    return len(first) - len(first_dedented)


def _code_part(line: str) -> str:
    """`line` without a trailing comment (a `#` outside string literals)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[:token.start[1]]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return line


def one_line(lines: list[str]) -> str:
    """Physical lines of one statement joined into one: comments dropped, continuation backslashes
    and the line breaks inside brackets turned into single spaces (none after an opening bracket or
    before a closing one), elided with "…" past MAX_TEXT characters."""
    text = "\n".join(lines)
    comments: list[tuple[int, int, int]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text + "\n").readline):
            if token.type == tokenize.COMMENT:
                comments.append((token.start[0], token.start[1], token.end[1]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        comments = []  # an unterminated string: keep the text as it is
    cut = list(lines)
    for row, start, _ in reversed(comments):
        cut[row - 1] = cut[row - 1][:start]
    pieces = [line.strip() for line in cut]
    pieces = [p[:-1].rstrip() if p.endswith("\\") else p for p in pieces]
    out = ""
    for piece in pieces:
        if not piece:
            continue
        if out and not (out[-1] in "([{" or piece[0] in ")]}"):
            out += " "
        out += piece
    if len(out) > MAX_TEXT:
        out = out[:MAX_TEXT - 1].rstrip() + "…"
    return out
