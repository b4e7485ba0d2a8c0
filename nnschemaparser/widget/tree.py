"""The block tree of a schema in the compact form the inspector sends to the browser.

Every block, statement, instruction and branch of a schema gets an integer node id, depth first. A
node travels as one short JSON row

    [id, parent, kind, text, shape, line, n_children, op, extra]

where `kind` is a one-letter code (see KINDS), `text` is the instruction as the dump writes it (so
it carries the source variable names), `shape` the resolved dtype[shape], `line` the forward's line,
`op` the qualified op name or the called block path, and `extra` a small dict only where needed
({"skip": reason}, {"to": target block node}, {"path": block path}, {"src": statement text},
{"end": a statement's last line}). The first rows, breadth first, fit a byte budget; the children
of any other node are fetched by id when it is expanded.

The tree reads like the source: a block's instructions are grouped by the source statement they
were lowered from (statements.StatementIndex). A statement lowered to several instructions is a
statement row (kind "s": its one-line source as `text`, the shapes of the source variables it binds)
holding them; one lowered to a single instruction, and a compound statement (if/for/while/try/with/
def), keeps that instruction's row with the statement's text in `extra["src"]`. The browser shows
the source text and folds statement rows by default; its lowered view (`show_lowered`) shows each
instruction's own text and lets statement rows through (their children drawn in their place). Node
ids are the same in both views, so steps, breakpoints and search address instructions as before.

The tree also maps what a run reports back to nodes: an executed instruction object, an entered
block object, a block path. Depends on schema, notation and the statement index only; knows nothing
about widgets.
"""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from ..schema.notation import instruction_text
from .statements import StatementIndex
from ..schema.model import (
    BlockInstruction,
    BreakInstruction,
    ContinueInstruction,
    ControlInstruction,
    FunctionInstruction,
    Instruction,
    ModelBlockSchema,
    OpInstruction,
    ReturnInstruction,
    TryInstruction,
    WithInstruction,
    condition_instructions,
)

__all__ = ["BlockTree", "KINDS", "INITIAL_TREE_BYTES"]

# The one-letter kinds of a row; the browser draws a badge per kind.
KINDS = {
    "B": "block", "o": "op", "c": "call", "i": "if", "f": "for", "w": "while", "t": "try",
    "W": "with", "d": "def", "r": "return", "k": "jump", "x": "other", "b": "branch",
    "s": "statement",
}
_CONTROL_KINDS = {"if": "i", "for": "f", "while": "w"}
_TEMP = re.compile(r"\$t\d+")  # the lowering's temporaries, never shown in user text
_QUOTED_TEMP = re.compile(r"'\$t\d+'")

# The initial tree stays under this many bytes of JSON (as Jupyter's json.dumps writes it: default
# separators); the rest is fetched on expansion, and revealing a step fetches its ancestors' rows in
# one request. The root and its rows fit; with the browser code (96 KB as JSON) the whole initial widget
# state of an 8-layer Llama is 98 KB (bench/bench_widget.py, tests/widget/test_initial_state.py).
INITIAL_TREE_BYTES = 1_500


def shape_text(resolved: Any) -> str:
    """`float32[2, 256]` for a tensor, the type name for anything else, "" when unresolved."""
    if resolved is None:
        return ""
    dtype = str(resolved.dtype)
    if dtype.startswith("torch."):
        return f"{dtype[6:]}[{', '.join(str(d) for d in resolved.shape)}]"
    return dtype


@dataclass
class _Node:
    parent: int
    kind: str
    text: str
    shape: str = ""
    line: int = 0
    op: str = ""
    extra: Optional[dict] = None
    children: list[int] = field(default_factory=list)
    block: int = 0  # the node of the block whose source holds this node


class BlockTree:
    """All nodes of a schema, with the maps from run events back to node ids."""

    def __init__(self, schema: ModelBlockSchema):
        if not isinstance(schema, ModelBlockSchema):
            raise TypeError(f"BlockTree needs a ModelBlockSchema (from NNParser.parse_model), "
                            f"got {type(schema).__name__}")
        self.schema = schema
        self.nodes: list[_Node] = []
        self.instruction_nodes: dict[int, int] = {}
        self.block_nodes: dict[int, int] = {}
        self.blocks: dict[int, ModelBlockSchema] = {}
        self.path_nodes: dict[str, int] = {}
        self.call_targets: dict[int, int] = {}  # call node -> the block node it calls
        self.statement_nodes: dict[int, int] = {}  # instruction node -> the statement row holding it
        self._pending_targets: list[tuple[int, ModelBlockSchema]] = []
        # interpreted blocks the parse run's live-call detector saw run as the real module
        self.live_reasons = {row["module"]: row["reason"] for row in getattr(schema, "live_calls", ())
                             if row.get("kind") not in ("helper", "unwatched") and row.get("module") is not None}
        self._indexes: dict[tuple, Optional[StatementIndex]] = {}
        self._texts: dict[tuple, str] = {}
        self._add_block(schema, parent=-1, label=schema.name)
        for node, target in self._pending_targets:  # the called blocks are built after the calls
            target_node = self.block_nodes.get(id(target))
            if target_node is not None:
                self.call_targets[node] = target_node
                self.nodes[node].extra = {**(self.nodes[node].extra or {}), "to": target_node}
        del self._pending_targets, self._indexes, self._texts

    # -- building ------------------------------------------------------------------------------

    def _new(self, node: _Node) -> int:
        self.nodes.append(node)
        index = len(self.nodes) - 1
        if node.parent >= 0:
            self.nodes[node.parent].children.append(index)
        return index

    def _add_block(self, block: ModelBlockSchema, parent: int, label: str) -> int:
        text = label if label == block.name else f"{label} · {block.name}"
        if block.method_name:
            text = f"{label}.{block.method_name}()"
        extra: dict[str, Any] = {"path": block.path}
        if block.skip_reason is not None:
            extra["skip"] = block.skip_reason
        elif block.method_name is None and block.path in self.live_reasons:
            extra["skip"] = f"ran live on the parse run: {self.live_reasons[block.path]}"
        shape = ", ".join(shape_text(r) for r in block.outputs)
        line = block.signature.firstlineno if block.signature is not None else 0
        node = self._new(_Node(parent, "B", text, shape=shape, line=line, op=block.module_type, extra=extra))
        self.nodes[node].block = node
        self.block_nodes[id(block)] = node
        self.blocks[node] = block
        if block.method_name is None:
            self.path_nodes.setdefault(block.path, node)
        self._add_body(block.body, node, node, block, None)
        if block.method_name is None:  # method blocks share their owner's methods and sub-blocks
            for method in block.methods.values():
                if id(method) not in self.block_nodes:
                    self._add_block(method, node, block.name)
            for key, child in block.sub_blocks.items():
                if id(child) not in self.block_nodes:
                    self._add_block(child, node, key)
        return node

    def _add_branch(self, label: str, body: list[Instruction], parent: int, owner: int,
                    block: ModelBlockSchema, context: Any, test: bool = False) -> None:
        """A branch row; `test`: the instructions of an `if`/`while` test or a `for` iterable, which
        the source view folds (the compound row's text shows them)."""
        if not body:
            return
        node = self._new(_Node(parent, "b", label, block=owner, extra={"test": 1} if test else None))
        self._add_body(body, node, owner, block, context, target=label == "body")

    def _statements(self, block: ModelBlockSchema) -> Optional[StatementIndex]:
        """The statement index of a block's source, shared by the blocks of one source (every layer)."""
        sig = block.signature
        if sig is None or not sig.source:
            return None
        key = (sig.filename, sig.firstlineno, sig.source)
        if key not in self._indexes:
            self._indexes[key] = StatementIndex.of_signature(sig)
        return self._indexes[key]

    def _add_body(self, body: Iterable[Instruction], parent: int, owner: int, block: ModelBlockSchema,
                  context: Any = None, target: bool = False) -> None:
        """Add a body's instructions, one row per source statement: a statement nested in `context`
        (the compound statement whose branch this is; None: the function) and lowered to several
        instructions gets a statement row holding them, one lowered to one instruction shows the
        statement's text on that instruction's row, and a compound statement stays its compound row.
        Instructions of no statement inside `context` (an `if` test, a `for` target, a lambda's
        body, the implicit `return None`) stay lowered rows, but for the unpacking of a `for` (or
        `with ... as`) target at the top of its body: a statement row named by the target."""
        index = self._statements(block)
        if index is None:
            for instr in body:
                self._add_instruction(instr, parent, owner, block, None)
            return
        for position, (stmt, instrs) in enumerate(_groups(body, index, context)):
            if stmt is context and context is not None:
                # `target`: the body of a for/with, whose first run may unpack the bound names
                names = index.target_text(context) if target and position == 0 and len(instrs) > 1 else ""
                if names:
                    self._add_statement(names, index.span(context)[0], 0, instrs, parent, owner, block, context)
                    continue
                stmt = None
            if stmt is None:
                for instr in instrs:
                    self._add_instruction(instr, parent, owner, block, context)
                continue
            text = self._statement_text(index, stmt)
            compound = next((i for i in instrs if index.is_compound_of(stmt, _compound_kind(i), i.location)), None)
            if compound is not None:  # a with's context or a def's decorators stay lowered rows beside it
                for instr in instrs:
                    self._add_instruction(instr, parent, owner, block, stmt if instr is compound else context,
                                          src=text if instr is compound else "")
            elif len(instrs) == 1 and _compound_kind(instrs[0]) == "":
                self._add_instruction(instrs[0], parent, owner, block, stmt, src=text)
            else:
                first, _, last, _ = index.span(stmt)
                self._add_statement(text, first, last, instrs, parent, owner, block, stmt)

    def _add_statement(self, text: str, first: int, last: int, instrs: list[Instruction], parent: int,
                       owner: int, block: ModelBlockSchema, stmt: Any) -> None:
        node = self._new(_Node(parent, "s", text, shape=_bound_shapes(instrs), line=first,
                               extra={"end": last} if last > first else None, block=owner))
        for instr in instrs:
            self._add_instruction(instr, node, owner, block, stmt)
            self.statement_nodes[self.instruction_nodes[id(instr)]] = node

    def _statement_text(self, index: StatementIndex, stmt: Any) -> str:
        key = (id(index), id(stmt))
        if key not in self._texts:
            self._texts[key] = index.text(stmt)
        return self._texts[key]

    def _add_instruction(self, instr: Instruction, parent: int, owner: int, block: ModelBlockSchema,
                         context: Any, src: str = "") -> None:
        kind, op = _kind_and_op(instr)
        line = instr.location.lineno if instr.location is not None else 0
        shape = shape_text(instr.resolved) if not isinstance(instr, ReturnInstruction) else ""
        node = self._new(_Node(parent, kind, instruction_text(instr), shape=shape, line=line, op=op, block=owner,
                               extra={"src": src} if src else None))
        self.instruction_nodes[id(instr)] = node
        if isinstance(instr, BlockInstruction) and not instr.callee_var and instr.block_ref.path:
            try:
                target = block.find(instr.block_ref.path)
            except KeyError:
                target = None
            if target is not None:
                if instr.block_ref.method and instr.block_ref.method in target.methods:
                    target = target.methods[instr.block_ref.method]
                self._pending_targets.append((node, target))
        if isinstance(instr, ControlInstruction):
            # the test as it runs (`prepare`, then `condition`): a named test runs nothing, has no node
            self._add_branch("iterable" if instr.kind == "for" else "condition", condition_instructions(instr), node,
                             owner, block, context, test=True)
            self._add_branch("body" if instr.kind != "if" else "then", instr.body, node, owner, block, context)
            self._add_branch("else", instr.else_body, node, owner, block, context)
        elif isinstance(instr, TryInstruction):
            self._add_branch("try", instr.body, node, owner, block, context)
            for classes, name, hbody in zip(instr.handlers, instr.handler_names, instr.handler_bodies):
                label = "except " + (", ".join(c.__name__ for c in classes) or "BaseException")
                self._add_branch(label + (f" as {name}" if name else ""), hbody, node, owner, block, context)
            self._add_branch("else", instr.else_body, node, owner, block, context)
            self._add_branch("finally", instr.final_body, node, owner, block, context)
        elif isinstance(instr, WithInstruction):
            self._add_body(instr.body, node, owner, block, context, target=True)
        elif isinstance(instr, FunctionInstruction) and instr.function is not None:
            self._add_body(instr.function.body, node, owner, block, context)

    # -- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def count(self, kinds: Optional[str] = None) -> int:
        """How many nodes there are (of the given kind codes, e.g. "ocifwtWdrkx" = instructions)."""
        if kinds is None:
            return len(self.nodes)
        return sum(1 for node in self.nodes if node.kind in kinds)

    def row(self, index: int) -> list:
        node = self.nodes[index]
        row = [index, node.parent, node.kind, node.text, node.shape, node.line, len(node.children), node.op]
        if node.extra:
            row.append(node.extra)
        return row

    def rows(self, indices: Iterable[int]) -> list[list]:
        return [self.row(i) for i in indices]

    def children_rows(self, index: int) -> list[list]:
        """The rows of the direct children of node `index`."""
        if not 0 <= index < len(self.nodes):
            raise KeyError(f"no tree node {index}; the tree has nodes 0..{len(self.nodes) - 1}")
        return self.rows(self.nodes[index].children)

    def initial(self, max_bytes: int = INITIAL_TREE_BYTES) -> dict:
        """The first rows, breadth first, a node's children all or none, under `max_bytes` of JSON."""
        rows = [self.row(0)]
        size = len(json.dumps(rows[0], ensure_ascii=False)) + 40  # the envelope: keys, total, root
        queue = deque([0])
        while queue:
            index = queue.popleft()
            children = self.nodes[index].children
            if not children:
                continue
            chunk = self.rows(children)
            chunk_size = sum(len(json.dumps(r, ensure_ascii=False)) + 2 for r in chunk)
            if size + chunk_size > max_bytes:
                continue  # a later, smaller sibling may still fit; this one is fetched on expansion
            rows.extend(chunk)
            size += chunk_size
            queue.extend(children)
        return {"rows": rows, "total": len(self.nodes), "root": 0}

    def ancestors(self, index: int) -> list[int]:
        """The node ids from the root down to the parent of `index`."""
        chain = []
        parent = self.nodes[index].parent if 0 <= index < len(self.nodes) else -1
        while parent >= 0:
            chain.append(parent)
            parent = self.nodes[parent].parent
        return chain[::-1]

    def node_of_instruction(self, instr: Instruction) -> int:
        return self.instruction_nodes.get(id(instr), -1)

    def node_of_block(self, block: ModelBlockSchema) -> int:
        return self.block_nodes.get(id(block), -1)

    def block_of(self, index: int) -> int:
        """The block node whose source holds node `index`."""
        return self.nodes[index].block if 0 <= index < len(self.nodes) else -1

    def block_path(self, index: int) -> str:
        block = self.blocks.get(index)
        return block.path if block is not None else ""

    def source(self, index: int) -> dict:
        """The forward source of the block holding node `index`: file, first line number and text."""
        block = self.blocks.get(self.block_of(index))
        if block is None:
            raise KeyError(f"no block holds tree node {index}")
        sig = block.signature
        if sig is None or not sig.source:
            reason = block.skip_reason or "the block has no lowered source"
            return {"block": self.block_of(index), "file": "", "first": 0, "text": "", "note": reason}
        return {"block": self.block_of(index), "file": sig.filename, "first": sig.firstlineno, "text": sig.source}

    # -- search and navigation -----------------------------------------------------------------

    def search_index(self) -> list[tuple[str, str]]:
        """Per node: (its block path if it is a block row, lower-case; the text searched: that path, the
        row's text, op and shape). An instruction is found by its own text, not by its block's path."""
        index = getattr(self, "_search_index", None)
        if index is None:
            index = []
            for node in self.nodes:
                path = (node.extra or {}).get("path", "") if node.kind == "B" else ""
                src = (node.extra or {}).get("src", "")
                index.append((path.lower(), " ".join((path, node.text, src, node.op, node.shape)).lower()))
            self._search_index = index
        return index

    def ancestor_set(self, index: int) -> frozenset:
        """The ancestors of node `index` as a set (cached: breakpoints ask per step)."""
        cache = self.__dict__.setdefault("_ancestor_sets", {})
        found = cache.get(index)
        if found is None:
            found = cache[index] = frozenset(self.ancestors(index))
        return found

    def describe(self, index: int) -> dict:
        """One node for a search result or a breakpoint list: its row fields (`source`: the text the
        source view shows for it, "" where that is `text`), block and ancestors."""
        node = self.nodes[index]
        owner = self.blocks.get(node.block)
        return {"node": index, "kind": KINDS.get(node.kind, node.kind), "text": node.text,
                "source": self.source_text(index), "op": node.op,
                "shape": node.shape, "line": node.line, "block": owner.path if owner is not None else "",
                "path": (node.extra or {}).get("path", "") if node.kind == "B" else "",
                "ancestors": self.ancestors(index), "source_block": node.block}

    def source_text(self, index: int) -> str:
        """The source text a row shows in the source view: a statement row's own text, the statement
        text of a one-instruction statement or compound row, "" for the others (they show `text`)."""
        node = self.nodes[index]
        if node.kind == "s":
            return node.text
        return (node.extra or {}).get("src", "")

    def source_words(self, index: int) -> str:
        """What a user reads for node `index`: a block's path, else the source text of the statement
        (or compound row) holding it, never a lowered instruction's `$t` temporaries or intrinsics
        (a row with no source text anywhere above it falls back to its text, temporaries elided)."""
        node = self.nodes[index]
        if node.kind == "B":
            return (node.extra or {}).get("path", "") or "the root"
        at = self.statement_nodes.get(index, index)
        while at >= 0:
            text = self.source_text(at)
            if text:
                return text
            if self.nodes[at].kind == "B":
                break
            at = self.nodes[at].parent
        return _TEMP.sub("…", node.text)

    def in_source_words(self, index: int, text: str) -> str:
        """`text` (an error message, a table cell) with the lowering's temporaries replaced: a quoted
        `'$tN'` becomes "the value of `<source words of node index>`", a bare one "…"."""
        if not _TEMP.search(text):
            return text
        words = self.source_words(index) if 0 <= index < len(self.nodes) else ""
        named = f"the value of `{words}`" if words else "this value"
        text = _QUOTED_TEMP.sub(lambda _: named, text)
        return _TEMP.sub("…", text)

    def var_words(self, index: int, var: str) -> str:
        """A table's variable cell: a temporary `$tN` is shown as the source words of node `index`
        (the statement that computes it), any other name as it is."""
        if not _TEMP.search(var or ""):
            return var
        if _TEMP.fullmatch(var) and 0 <= index < len(self.nodes):
            return self.source_words(index)
        return _TEMP.sub("…", var)

    def shown_row(self, index: int) -> int:
        """The row that shows node `index` in the source view: the statement (or compound row) holding
        a lowered instruction, else the node itself."""
        node = self.nodes[index]
        if node.kind == "B" or self.source_text(index):
            return index
        at = self.statement_nodes.get(index, -1)
        if at >= 0:
            return at
        at = node.parent
        while at >= 0 and self.nodes[at].kind != "B":
            if self.source_text(at):
                return at
            at = self.nodes[at].parent
        return index

    def find_block(self, path: str) -> int:
        """The node of the block at `path`, or of the one block whose path ends with `.path`."""
        if path in self.path_nodes:
            return self.path_nodes[path]
        matches = [p for p in self.path_nodes if p.endswith("." + path)]
        if len(matches) == 1:
            return self.path_nodes[matches[0]]
        if matches:
            raise KeyError(f"{path!r} names {len(matches)} blocks ({', '.join(sorted(matches)[:4])}...); "
                           "give the full path")
        raise KeyError(f"no block at {path!r}; block paths look like "
                       f"{', '.join(sorted(p for p in self.path_nodes if p)[:3]) or '(the root only)'}")

    def untaken_branches(self, entered: set[int], executed: set[int]) -> list[int]:
        """Branch rows (then/else/body/except...) of entered blocks in which no instruction ran."""
        taken: set[int] = set()
        for node in executed:
            for ancestor in self.ancestor_set(node):
                if self.nodes[ancestor].kind == "b":
                    taken.add(ancestor)
        return [index for index, node in enumerate(self.nodes)
                if node.kind == "b" and node.block in entered and index not in taken]

    def block_status(self, entered: set[int], executed: set[int]) -> dict[int, str]:
        """For every interpreted block not entered by any run: "live" when a call to it ran (so it ran
        as the real module, outside the schema), else "never". Skipped blocks and the blocks inside a
        skipped or live one are left out: they run as real modules, where the schema cannot see."""
        called = {target for call, target in self.call_targets.items() if call in executed}
        status: dict[int, str] = {}
        opaque: set[int] = set()  # skipped or live blocks: what is below them is not observed
        for index in sorted(self.blocks):  # depth-first ids: a parent comes before its children
            block = self.blocks[index]
            if self._inside(index, opaque):
                continue
            if block.skip_reason is not None:
                opaque.add(index)
            elif index not in entered:
                status[index] = "live" if index in called else "never"
                if index in called:
                    opaque.add(index)
        return status

    def _inside(self, index: int, blocks: set[int]) -> bool:
        parent = self.nodes[index].parent
        while parent >= 0:
            if parent in blocks:
                return True
            parent = self.nodes[parent].parent
        return False


def _compound_kind(instr: Instruction) -> str:
    """The compound statement kind an instruction with nested rows stands for ("" for the others)."""
    if isinstance(instr, ControlInstruction):
        return instr.kind
    if isinstance(instr, TryInstruction):
        return "try"
    if isinstance(instr, WithInstruction):
        return "with"
    if isinstance(instr, FunctionInstruction):
        return "def"
    return ""


def _groups(body: Iterable[Instruction], index: StatementIndex, context: Any) -> list[tuple[Any, list[Instruction]]]:
    """A body's instructions as runs of one statement each: (statement, instructions); the statement
    is `context` itself for instructions of it (a test, a `for` target), None for an instruction of
    no statement inside `context` (each one a run of its own). An instruction without a location
    joins the run before it."""
    runs: list[tuple[Any, list[Instruction]]] = []
    for instr in body:
        if instr.location is None and runs:
            runs[-1][1].append(instr)
            continue
        stmt = index.of(instr.location)
        if stmt is not None and stmt is not context and not index.inside(stmt, context):
            stmt = None
        if stmt is not None and runs and runs[-1][0] is stmt:
            runs[-1][1].append(instr)
        else:
            runs.append((stmt, [instr]))
    return runs


def _bound_shapes(instrs: list[Instruction]) -> str:
    """The shapes of the source variables a statement binds (its last value of each), in order."""
    bound: dict[str, str] = {}
    for instr in instrs:
        name = instr.out_var
        if name and not name.startswith("$") and not isinstance(instr, ReturnInstruction):
            bound.pop(name, None)
            bound[name] = shape_text(instr.resolved)
    return ", ".join(shape for shape in bound.values() if shape)


def _kind_and_op(instr: Instruction) -> tuple[str, str]:
    if isinstance(instr, OpInstruction):
        name = instr.qualified_name
        return "o", instr.display_name if not name or name.startswith("$") else name
    if isinstance(instr, BlockInstruction):
        ref = instr.block_ref
        callee = instr.callee_var or ref.path or "self"
        return "c", f"{callee}.{ref.method}" if ref.method else callee
    if isinstance(instr, ControlInstruction):
        return _CONTROL_KINDS.get(instr.kind, "x"), ""
    if isinstance(instr, TryInstruction):
        return "t", ""
    if isinstance(instr, WithInstruction):
        return "W", ""
    if isinstance(instr, FunctionInstruction):
        return "d", ""
    if isinstance(instr, ReturnInstruction):
        return "r", ""
    if isinstance(instr, (BreakInstruction, ContinueInstruction)):
        return "k", ""
    return "x", ""
