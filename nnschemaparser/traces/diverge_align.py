"""Statement alignment for `diverge`: which statement of schema b stands for which statement of schema a.

A *row* of a comparison is one tensor a statement binds to a source name (`hidden = self.fc(x)`),
or, for a `return` of an expression (`return F.linear(input, w, b)`), the returned tensor (var
`return`, `return[i]` for a tuple). Temporaries (`$t3`) are never rows: they are the inside of
their statement.

Both schemas' rows are listed statically per block path (`block_statements`): the statement's
file, first line, full text (its lines `lineno..end_lineno`, read with `linecache`) and the names
it binds. Blocks at the same path are aligned like a diff (`align_schemas`): `difflib` over the
statements' normalized text (whitespace dropped), "equal" runs pair as *matched*; inside a
"replace" run a b statement pairs as *edited* with the a statement still free after the last pair
that scores best, its score the texts' similarity plus 1 when both bind a common name (at least
`EDIT_RATIO`: a renamed variable or an edited right-hand side is paired, an unrelated line is not),
never crossing an earlier pair; what stays unpaired is
*inserted* (b only) or *deleted* (a only). The names two paired statements bind pair by name when
both have it, else by position among the names the statement binds; a name left over is its
side's alone. A block path present on one side only makes all its statements one side's.

Depends on schema only (and the standard library); never on views.
"""

from __future__ import annotations

import dataclasses
import difflib
import linecache
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from ..schema.model import FunctionSchema, Instruction, ModelBlockSchema, ReturnInstruction

__all__ = ["Statement", "Alignment", "EDIT_RATIO", "block_statements", "align_schemas", "row_var_names"]

EDIT_RATIO = 0.6
"""The least `difflib` similarity of two statement texts in a changed stretch to pair them as edited."""


@dataclass
class Statement:
    """One source statement of a block that binds rows: where it is and the names it binds, in order."""

    path: str
    filename: str
    lineno: int
    text: str
    names: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.filename, self.lineno


def row_var_names(instr: Instruction) -> list[str]:
    """The row names `instr` binds: its named `out_var`, or `return` / `return[i]` for a return of temporaries."""
    if isinstance(instr, ReturnInstruction):
        names = instr.out_vars
        if not any(n.startswith("$") for n in names):
            return []  # `return hidden`: the row is the statement that bound `hidden`
        if len(names) == 1 and not instr.as_tuple:
            return ["return"]
        return [f"return[{i}]" for i, n in enumerate(names) if n.startswith("$")]
    out = instr.out_var
    if out and not out.startswith("$") and not out.startswith("."):
        return [out]
    return []


def _statement_text(location: Any) -> str:
    first, last = location.lineno, max(location.end_lineno or 0, location.lineno)
    lines = [linecache.getline(location.filename, n) for n in range(first, min(last, first + 40) + 1)]
    text = "".join(lines).strip()
    return text or (location.code or "").strip()


def _walk(value: Any, out: list[Instruction]) -> None:
    if isinstance(value, Instruction):
        out.append(value)
        for f in dataclasses.fields(value):
            if f.name in ("resolved", "location", "binding", "target"):
                continue
            _walk(getattr(value, f.name), out)
    elif isinstance(value, FunctionSchema):
        _walk(getattr(value, "body", None), out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (Instruction, FunctionSchema, list, tuple)):
                _walk(item, out)


_STATEMENTS: "weakref.WeakKeyDictionary[ModelBlockSchema, dict]" = weakref.WeakKeyDictionary()


def block_statements(schema: ModelBlockSchema) -> dict[str, list[Statement]]:
    """{block path: its statements that bind rows, in source order}; a block's method blocks share its
    path. Worked out once per schema (kept while the schema lives)."""
    cached = _STATEMENTS.get(schema)
    if cached is None:
        cached = _STATEMENTS[schema] = _block_statements(schema)
    return cached


def _block_statements(schema: ModelBlockSchema) -> dict[str, list[Statement]]:
    found: dict[str, dict[tuple[str, int], Statement]] = {}
    for block in schema.iter_blocks():
        if block.is_skipped:
            continue
        path = block.path or block.name  # as the runtime names it (the root: its class name)
        statements = found.setdefault(path, {})
        instrs: list[Instruction] = []
        _walk(block.body, instrs)
        for instr in instrs:
            names = row_var_names(instr)
            loc = instr.location
            if not names or loc is None:
                continue
            key = (loc.filename, loc.lineno)
            st = statements.get(key)
            if st is None:
                st = statements[key] = Statement(path, loc.filename, loc.lineno, _statement_text(loc))
            for name in names:
                if name not in st.names:
                    st.names.append(name)
    files: dict[str, dict[str, int]] = {}
    result = {}
    for path, statements in found.items():
        order = files.setdefault(path, {})
        for fname, _ in statements:
            order.setdefault(fname, len(order))
        result[path] = sorted(statements.values(), key=lambda s: (order[s.filename], s.lineno))
    return result


def _normal(text: str) -> str:
    return "".join(text.split())


@dataclass
class Alignment:
    """The map from b's rows to a's: `b_to_a[(path, file, line)] = (a_file, a_line, status)` with
    status "matched" or "edited"; `var_b_to_a[(path, file, line)] = {b name: a name}`; the statements
    of each side (`a`, `b`) to tell inserted / deleted from untaken."""

    a: dict[str, list[Statement]]
    b: dict[str, list[Statement]]
    b_to_a: dict[tuple[str, str, int], tuple[str, int, str]] = field(default_factory=dict)
    var_b_to_a: dict[tuple[str, str, int], dict[str, str]] = field(default_factory=dict)
    a_texts: dict[tuple[str, str, int], str] = field(default_factory=dict)
    b_texts: dict[tuple[str, str, int], str] = field(default_factory=dict)
    a_paired: set = field(default_factory=set)

    def statement_of(self, side: str, path: str, filename: str, lineno: int) -> Optional[str]:
        """The full text of a statement of side "a" or "b" (None when the schema has no such row statement)."""
        return (self.a_texts if side == "a" else self.b_texts).get((path, filename, lineno))


def _pair_names(sa: Statement, sb: Statement) -> dict[str, str]:
    pairs = {n: n for n in sb.names if n in sa.names}
    rest_a = [n for n in sa.names if n not in pairs.values()]
    rest_b = [n for n in sb.names if n not in pairs]
    pairs.update(zip(rest_b, rest_a))
    return pairs


def align_schemas(schema_a: ModelBlockSchema, schema_b: ModelBlockSchema, same: bool = False) -> Alignment:
    """Align b's statements to a's, block path by block path (see the module docstring).

    `same=True` (one schema on both sides, or two instances of one class) pairs every statement
    with itself without diffing."""
    stmts_a = block_statements(schema_a)
    stmts_b = stmts_a if schema_b is schema_a else block_statements(schema_b)
    al = Alignment(stmts_a, stmts_b)
    for path, sts in stmts_a.items():
        for s in sts:
            al.a_texts[s.key] = s.text
    for path, sts in stmts_b.items():
        for s in sts:
            al.b_texts[s.key] = s.text
    for path, sb_list in stmts_b.items():
        sa_list = stmts_a.get(path)
        if not sa_list:
            continue
        if same or schema_b is schema_a:
            by_key = {(s.filename, s.lineno): s for s in sa_list}
            for sb in sb_list:
                sa = by_key.get((sb.filename, sb.lineno))
                if sa is not None:
                    _pair(al, sa, sb, "matched")
            continue
        ta = [_normal(s.text) for s in sa_list]
        tb = [_normal(s.text) for s in sb_list]
        matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                for sa, sb in zip(sa_list[i1:i2], sb_list[j1:j2]):
                    _pair(al, sa, sb, "matched")
            elif op == "replace":
                start = i1
                for j in range(j1, j2):
                    best, best_i = 0.0, None
                    for i in range(start, i2):
                        ratio = difflib.SequenceMatcher(None, ta[i], tb[j], autojunk=False).ratio()
                        # binding the same name makes two statements of a changed stretch one edited line
                        score = ratio + (1.0 if set(sa_list[i].names) & set(sb_list[j].names) else 0.0)
                        if score >= EDIT_RATIO and score > best:
                            best, best_i = score, i
                    if best_i is not None:
                        _pair(al, sa_list[best_i], sb_list[j], "edited")
                        start = best_i + 1
    return al


def _pair(al: Alignment, sa: Statement, sb: Statement, status: str) -> None:
    al.b_to_a[sb.key] = (sa.filename, sa.lineno, status)
    al.var_b_to_a[sb.key] = _pair_names(sa, sb)
    al.a_paired.add(sa.key)
