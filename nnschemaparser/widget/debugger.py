"""Go anywhere in one action: search over the whole block tree, and breakpoints.

`search(tree, query)` matches a query against every node of a `BlockTree` (also the rows not yet
sent to the browser): block paths (`transformer.h.1.attn`), variable names and instruction text, op
names, shapes. A node whose block path is the query (or ends with it after a dot) comes first.

A `Breakpoint` is one place or condition where Continue (and step over/out) stops:

- `node`: a tree row; an instruction row stops at the step that runs it, a block row on entry (as
  `block`), a branch or compound
  row (if/for/while) at the first step inside it after a step outside it (entry);
- `line`: a source line (`file`, `line`): the first step of that line after a step on another line;
- `block`: a block path, on entry (the first step of a call of that block);
- `nonfinite`: the first step whose value is a floating tensor with a NaN or an Inf;
- `when`: a Python predicate on the StepInfo (`lambda step: step.value.abs().max() > 1e3`),
  evaluated in the kernel; a predicate that raises stops the run and says why.

`Breakpoints.check(step, previous)` gives the reason of the first breakpoint that hits, or None.
`Navigation` gives `InspectorState` its `break_at`, `break_on_nonfinite`, `clear_breakpoints`, `search`,
`step_out`, `call_stack` and the view of a pause before a sub-block call (`view_pause`: the callee,
the call site, its arguments) — a mixin over the state's `_advance`, `current`, `pause`, `tree` and
`breakpoints`.

Depends on the interpreter's StepInfo, the traces' statistics and the widget's tree only.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from ..runtime.interpreter import CallPause, StepInfo
from ..schema.model import VarRef
from .tree import BlockTree
from . import value_memo

__all__ = ["Breakpoint", "Breakpoints", "Navigation", "search", "SEARCH_LIMIT", "MAX_BREAKPOINTS"]

SEARCH_LIMIT = 200


def search(tree: BlockTree, query: str, limit: int = SEARCH_LIMIT) -> list[dict]:
    """The nodes matching `query` (case-insensitive substring), block paths first, at most `limit`."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("search needs some text: a block path (h.1.attn), a variable, an op or source text")
    needle = query.strip().lower()
    haystacks = tree.search_index()
    exact, rest = [], []
    for index, (path, text) in enumerate(haystacks):
        if needle in text:
            if path and (path == needle or path.endswith("." + needle)):
                exact.append(index)
            else:
                rest.append(index)
        if len(exact) >= limit:
            break
    found = (exact + rest)[:limit]
    return [tree.describe(index) for index in found]


def predicate_text(fn: Callable) -> str:
    """How a `when=` predicate reads in the breakpoint list: a lambda's own source text (from
    `inspect.getsource`, which gives its whole line(s): the longest expression from `lambda` on that
    parses, with the function's parameters), a function's name otherwise."""
    name = getattr(fn, "__name__", "") or type(fn).__name__
    code = getattr(fn, "__code__", None)
    if name != "<lambda>" or code is None:
        return name
    try:
        source = inspect.getsource(fn)[:4000]
    except (OSError, TypeError):
        return "a lambda (its source is not available)"
    params = list(code.co_varnames[:code.co_argcount])
    start = source.find("lambda")
    while start >= 0:
        text = source[start:]
        for end in range(len(text), 6, -1):
            try:
                node = ast.parse(text[:end].strip(), mode="eval").body
            except SyntaxError:
                continue
            if isinstance(node, ast.Lambda) and [a.arg for a in node.args.args] == params:
                return " ".join(text[:end].split())
            break
        start = source.find("lambda", start + 6)
    return "a lambda"


def _words(tree: BlockTree, node: int, line: int = 0) -> str:
    """A tree row as a stop reason names it: its source words (no `$t` temporaries, no row numbers)
    and its line."""
    text = tree.source_words(node)
    text = text if len(text) <= 60 else text[:59] + "…"
    return f"{text} (line {line})" if line else text


#: The most breakpoints one inspector keeps (identical ones count once).
MAX_BREAKPOINTS = 500


@dataclass
class Breakpoint:
    """One breakpoint (see the module docstring); `hits` counts the stops it caused."""

    kind: str
    node: int = -1
    file: str = ""
    line: int = 0
    block: str = ""
    when: Optional[Callable[[StepInfo], Any]] = None
    label: str = ""
    hits: int = 0
    enabled: bool = True
    run_hits: dict = field(default_factory=dict)  # run id -> the stops it caused in that run

    def to_dict(self, run_id: Optional[int] = None) -> dict:
        """The breakpoint as the browser lists it; `hits`: its stops in run `run_id` (all runs: None),
        `total_hits`: in every run."""
        hits = self.hits if run_id is None else self.run_hits.get(run_id, 0)
        return {"kind": self.kind, "node": self.node, "file": self.file, "line": self.line, "block": self.block,
                "label": self.label, "hits": hits, "total_hits": self.hits, "enabled": self.enabled}


def _nonfinite(value: Any) -> bool:
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    if value.numel() == 0 or value.is_meta:
        return False
    return not bool(torch.isfinite(value.detach()).all())


@dataclass
class Breakpoints:
    """The breakpoints of an inspector, and the hits so far."""

    tree: BlockTree
    items: list[Breakpoint] = field(default_factory=list)
    hits: list[dict] = field(default_factory=list)

    version: int = 0  # counts the changes of `items`, their hits and the active run: a reply for `since=version` leaves the list out

    def __bool__(self) -> bool:
        return any(b.enabled for b in self.items)

    def add(self, bp: Breakpoint) -> Breakpoint:
        """Add `bp`, or return the breakpoint already there with the same place (or predicate): an
        identical breakpoint is kept once. At most MAX_BREAKPOINTS."""
        same = (bp.kind, bp.node, bp.file, bp.line, bp.block, bp.when)
        for existing in self.items:
            if (existing.kind, existing.node, existing.file, existing.line, existing.block, existing.when) == same:
                return existing
        if len(self.items) >= MAX_BREAKPOINTS:
            raise ValueError(f"there are {len(self.items)} breakpoints already, the most an inspector keeps; "
                             "remove some first (clear_breakpoints removes all)")
        self.items.append(bp)
        self.version += 1
        return bp

    def pop(self, index: int) -> Breakpoint:
        self.version += 1
        return self.items.pop(index)

    def clear(self) -> None:
        if self.items:
            self.version += 1
        self.items.clear()

    def _inside(self, node: int, container: int) -> bool:
        return node == container or container in self.tree.ancestor_set(node)

    def check(self, step: StepInfo, previous: Optional[StepInfo], entry: bool = False,
              run_id: int = 0) -> Optional[tuple[int, str]]:
        """(index, reason) of the first enabled breakpoint that `step` hits, or None. `entry`: the step
        is the first own step of a call of its block (known from the run's block events: it may come
        after calls of the block's sub-blocks). The hit is noted as one of run `run_id`."""
        node = self.tree.node_of_instruction(step.instruction)
        prev_node = self.tree.node_of_instruction(previous.instruction) if previous is not None else -1
        for index, bp in enumerate(self.items):
            if not bp.enabled:
                continue
            reason = self._hit(bp, step, previous, node, prev_node, entry)
            if reason:
                bp.hits += 1
                bp.run_hits[run_id] = bp.run_hits.get(run_id, 0) + 1
                self.version += 1  # the counts listed changed
                loc = step.location
                self.hits.append({"breakpoint": index, "label": bp.label, "reason": reason, "run_id": run_id,
                                  "step": step.step_index,
                                  "block": step.block_path, "var": step.out_var,
                                  "line": loc.lineno if loc is not None else 0})
                return index, reason
        return None

    def _hit(self, bp: Breakpoint, step: StepInfo, previous: Optional[StepInfo], node: int,
             prev_node: int, entry: bool) -> str:
        kind = bp.kind
        if kind == "node":
            if node < 0 or not self._inside(node, bp.node):
                return ""
            if node == bp.node and not self.tree.nodes[bp.node].children:
                return f"reached {bp.label}"
            came_from_inside = prev_node >= 0 and self._inside(prev_node, bp.node)
            verb = "reached" if self.tree.nodes[bp.node].kind == "s" else "entered"  # a statement is reached
            return "" if came_from_inside else f"{verb} {bp.label}"
        if kind == "line":
            loc = step.location
            if loc is None or loc.lineno != bp.line or (bp.file and loc.filename != bp.file):
                return ""
            ploc = previous.location if previous is not None else None
            same = ploc is not None and ploc.lineno == loc.lineno and ploc.filename == loc.filename and \
                previous.frame_depth == step.frame_depth
            return "" if same else f"reached line {bp.line}"
        if kind == "block":
            if step.block_path != bp.block:
                return ""
            return f"entered {bp.block}" if entry else ""  # the first own step of each call of the block
        if kind == "nonfinite":
            if not _nonfinite(step.value):
                return ""
            var = step.out_var if step.out_var and not step.out_var.startswith("$") else ""
            what = var or (self.tree.source_words(node) if node >= 0 else "the value")
            return f"{what} has a NaN or an Inf"
        if kind == "when":
            try:
                result = bp.when(step)
            except SystemExit as exc:  # stop and say so; never the kernel's exit
                return f"the condition {bp.label} called sys.exit({exc.code!r})"
            except KeyboardInterrupt:
                return f"the condition {bp.label} was interrupted"
            except Exception as exc:  # stop and say so: a predicate that cannot be evaluated is news
                return f"the condition {bp.label} raised {type(exc).__name__}: {exc}"
            if isinstance(result, torch.Tensor):
                result = bool(result.all()) if result.numel() else False
            return f"{bp.label} is true" if result else ""
        return ""


class Navigation:
    """Search, breakpoints, step out and the call stack of an `InspectorState` (see the module docstring)."""

    navigation_error: type = ValueError

    def _advance_checked(self) -> bool:
        """One step; False when the run cannot go on or the new step hits a breakpoint."""
        previous = self.current
        if not self._advance():
            return False
        if self.breakpoints:
            hit = self.breakpoints.check(self.current, previous, self.current.step_index in self.active.entry_steps,
                                         run_id=self.active.id)  # a hit belongs to the run it stopped, by id
            if hit is not None:
                self.stop_reason = hit[1]
                return False
        return True

    def step_out(self) -> Optional[StepInfo]:
        """Run until the current block (or function) has returned: the first step in an outer frame.
        Stops earlier at a breakpoint hit."""
        self._new_action()
        position = self.pause if self.pause is not None else self.current
        if position is None:
            self._advance()
            return self.current
        depth = position.frame_depth  # before a call: the caller's frame, which the call is part of
        while self._advance_checked():
            if self.current.frame_depth < depth:
                break
        return self.current

    def break_at(self, where: Any = None, *, line: Optional[int] = None, file: str = "",
                 when: Optional[Callable[[StepInfo], Any]] = None) -> dict:
        """Add a breakpoint: a tree node id (int), a block path (str, on entry), a source `line`
        (optionally in `file`), or a predicate `when(step)`; Continue stops at its next hit."""
        if callable(where) and when is None:
            where, when = None, where
        if line is not None:
            if isinstance(line, bool) or not isinstance(line, int) or line < 1:
                raise self.navigation_error(f"line must be a line number >= 1, got {line!r}")
            bp = Breakpoint("line", file=str(file or ""), line=line, label=f"line {line}")
        elif isinstance(where, bool):
            raise self.navigation_error(f"break_at needs a tree node id, a block path, line= or when=, got {where!r}")
        elif isinstance(where, int):
            if not 0 <= where < len(self.tree):
                raise self.navigation_error(f"there is no tree node {where}; the tree has nodes 0..{len(self.tree) - 1}")
            if self.tree.nodes[where].kind == "B":  # a block row: on entry, as its block path
                path = self.tree.block_path(where)
                bp = Breakpoint("block", node=where, block=path, label=f"entry of {path or 'the root'}")
            else:
                bp = Breakpoint("node", node=where, label=_words(self.tree, where, self.tree.nodes[where].line))
        elif isinstance(where, str) and where.strip():
            try:
                node = self.tree.find_block(where.strip())
            except KeyError as exc:
                raise self.navigation_error(str(exc).strip('"')) from None
            path = self.tree.block_path(node)
            bp = Breakpoint("block", node=node, block=path, label=f"entry of {path or 'the root'}")
        elif when is not None:
            if not callable(when):
                raise self.navigation_error(f"when= must be a function of the step, got {type(when).__name__}")
            bp = Breakpoint("when", when=when, label=predicate_text(when))
        else:
            raise self.navigation_error("break_at needs a tree node id, a block path (e.g. 'h.1.attn'), line=N or "
                                 "when=lambda step: ...")
        if when is not None and bp.kind != "when":
            raise self.navigation_error("when= is a breakpoint of its own; give it without a place")
        return self._add_breakpoint(bp)

    def _add_breakpoint(self, bp: Breakpoint) -> dict:
        try:
            return self.breakpoints.add(bp).to_dict()
        except ValueError as exc:  # past MAX_BREAKPOINTS
            raise self.navigation_error(str(exc)) from None

    def run_to_here(self, node: Optional[int] = None, *, line: Optional[int] = None, file: str = "") -> Any:
        """Continue to tree row `node` (or source `line`) as a one-time breakpoint; the other
        breakpoints still stop the run on the way. From the start when the run is over."""
        bps = self.breakpoints
        before, version = len(bps.items), bps.version
        if line is not None:
            requested = self.break_at(line=line, file=file)
        elif node is not None:
            requested = self.break_at(node)
        else:
            raise self.navigation_error("run to here needs a tree row (node) or a source line")
        # a one-time breakpoint; when the same one is set already, that one stops the run and stays
        added = len(bps.items) > before
        target = bps.items.pop() if added else next(
            (bp for bp in bps.items if bp.to_dict() == requested), None)
        bps.version = version
        place = self._place()
        if self.status in ("finished", "error"):
            self.reset()
            place = (0, False)
        if added:
            bps.items.insert(before, target)
        try:
            self.continue_()
        finally:
            if added:
                bps.items.remove(target)
        if self.status == "finished" and target is not None:  # ran off the end: the target never came
            self._not_reached(place, self._target_text(target))
        return self.current

    def _target_text(self, bp: Breakpoint) -> str:
        """A run-to target as the "target not reached" message names it, with why when it is known."""
        if bp.kind == "line":
            return f"line {bp.line}"
        node = bp.node
        text = self.tree.source_words(node).strip()
        label = f"`{text[:60]}{'…' if len(text) > 60 else ''}`"
        untaken = set(getattr(self, "_untaken", ()))
        chain = set(self.tree.ancestor_set(node)) | {node}
        if chain & untaken:
            return f"{label} in an untaken branch"
        never = {n for n, s in getattr(self, "_block_status", {}).items() if s == "never"}
        if chain & never:
            return f"{label} in a block no run entered"
        return label

    def break_on_nonfinite(self) -> dict:
        """Stop at the first step whose value is a floating tensor holding a NaN or an Inf."""
        return self._add_breakpoint(Breakpoint("nonfinite", label="first NaN or Inf"))

    def run_to_trace_step(self, run: Optional[str], trace_step: int) -> Any:
        """Run the active run to the step matching trace step `trace_step` of run `run` (a trace or
        compare row): the StepInfo index that produced it there. Runs of one schema on one input take
        the same steps until their control flow differs, so the index is the matching step."""
        record = self.run(run)
        index = record.trace_index.get(int(trace_step))
        if index is None:
            raise self.navigation_error(f"run {record.name!r} has no trace step {trace_step}")
        if index == 0:  # an input of the run: before its first step
            raise self.navigation_error(f"trace step {trace_step} of {record.name!r} is an input; press Reset")
        return self.run_to(index)

    def inline_values(self, block: int, run: Optional[str] = None) -> dict:
        """What each source line of tree block `block` bound in its latest execution in the run so far,
        as a debugger's inline values: {line: "var dtype[shape] μ mean"} (named variables first; a
        line that bound only temporaries shows its last one)."""
        record = self.run(run)
        owner = self.tree.block_of(block)
        lines: dict[int, tuple[bool, str, Optional[int]]] = {}
        for row in record.steps:
            node, line = row["node"], row["line"]
            if node < 0 or not line or not row["shape"] or self.tree.block_of(node) != owner:
                continue
            named = bool(row["var"]) and not row["var"].startswith("$")
            previous = lines.get(line)
            if row["shape"] == "NoneType" and previous is not None:  # `x[i] = ...` binds None: keep what it stored
                continue
            if named or previous is None or not previous[0]:
                lines[line] = (named, f"{row['var'] if named else ''} {row['shape']}".strip(), row["trace_step"])
        out = {}
        steps = record.trace.steps
        for line, (_, text, trace_step) in sorted(lines.items()):
            if trace_step is not None and 1 <= trace_step <= len(steps):
                value = steps[trace_step - 1].tensor.value
                if isinstance(value, torch.Tensor) and value.numel() and value.is_floating_point():
                    text += f" μ {float(value.float().mean()):.4g}"
            out[str(line)] = text
        return {"block": owner, "run": record.name, "lines": out}

    def remove_breakpoint(self, index: int) -> dict:
        """Drop breakpoint `index` (its place in `view_breakpoints()["items"]`)."""
        items = self.breakpoints.items
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(items):
            raise self.navigation_error(f"there is no breakpoint {index!r}; there are {len(items)}")
        return self.breakpoints.pop(index).to_dict()

    def clear_breakpoints(self) -> None:
        self.breakpoints.clear()

    def view_breakpoints(self, since: Optional[int] = None) -> dict:
        """The breakpoints (`items`), the active run's last hits and the stop reason, with the list's
        `version`; `since`: the version the caller holds; when the list has not changed since,
        `items` is left out (the reply says `"unchanged": true`)."""
        bps = self.breakpoints
        run = self.active
        # the active run's own hits and counts, by its id (a later run may have the same name)
        hits = [dict(hit, run=run.name) for hit in bps.hits if hit.get("run_id") == run.id]
        view = {"version": bps.version, "hits": hits[-50:], "reason": self.stop_reason, "run": run.name,
                "run_id": run.id, "hits_total": len(hits)}
        if since is not None and since == bps.version:
            view["unchanged"] = True
        else:
            view["items"] = [bp.to_dict(run.id) for bp in bps.items]
        return view

    def hits_view(self) -> list[dict]:
        """Every breakpoint hit of the runs kept, each with its run's id (`run_id`) and current name (`run`)."""
        names = {run.id: run.name for run in self.runs}
        return [dict(hit, run=names.get(hit.get("run_id"), "")) for hit in self.breakpoints.hits]

    def search(self, query: str, limit: int = 200, lowered: bool = True) -> list[dict]:
        """Tree nodes matching `query`: block paths, variables, instruction text, ops (see debugger.search);
        each with `ran`: whether any run so far ran it (a block: entered; a statement or branch: some
        instruction inside it ran), and `where`: the full path of the row (its block path, then the
        row's own text for a row that is not a block). `lowered=False` (the tree's source view): a
        lowered instruction is listed as the statement row that shows it, once."""
        try:
            results = search(self.tree, query, limit)
        except ValueError as exc:
            raise self.navigation_error(str(exc)) from None
        if not lowered:
            rows: list[int] = []
            for result in results:
                row = self.tree.shown_row(result["node"])
                if row not in rows:
                    rows.append(row)
            results = [self.tree.describe(row) for row in rows]
        ran = self._ran_set()
        for result in results:
            result["ran"] = result["node"] in ran
            result["path"] = result["path"] or result["block"]  # every row says which layer it is in
        return results

    def _ran_set(self) -> set[int]:
        """Every tree node that ran in some run: entered blocks, executed rows and their containers."""
        entered, executed = self.ran_nodes()
        key = (len(entered), len(executed), tuple(id(r) for r in self.runs))
        cached = getattr(self, "_ran_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        ran = set(entered) | set(executed)
        for node in executed:
            ran |= self.tree.ancestor_set(node)
        self._ran_cache = (key, ran)
        return ran

    def call_stack(self) -> list[dict]:
        """The frames of the paused step, root first: block path, tree node, visible variables
        (name, type, shape and mean/std/min/max of tensors). Paused before a call, the callee comes
        last as a pending frame (`"pending": True`) holding the arguments it is about to get."""
        pause = self.pause
        step = pause if pause is not None else self.current
        if step is None or self.status != "paused":
            return []
        blocks = list(self.active.block_stack)
        frames = []
        for depth, frame in enumerate(step.scope_frames):
            path, node = blocks[depth] if depth < len(blocks) else (step.block_path, -1)
            frames.append({"depth": depth, "block": path, "node": node, "vars": _frame_vars(frame),
                           "current": depth == step.frame_depth})
        if pause is not None:
            callee = pause.callee
            node = self.tree.node_of_block(callee) if callee is not None else -1
            frames.append({"depth": len(frames), "block": pause.callee_path, "node": node, "pending": True,
                           "vars": _frame_vars(dict(pause.arguments()), hidden=False), "current": False})
        return frames

    # -- the pause before a sub-block call ---------------------------------------------------------

    def _argument_vars(self, pause: CallPause) -> dict[str, str]:
        """label -> the caller's variable each argument is read from (for its trace step)."""
        instr = pause.instruction
        out = {}
        for op in getattr(instr, "args", ()):
            if isinstance(op, VarRef):
                out[op.name] = op.name
        for key, op in getattr(instr, "kwargs", {}).items():
            if isinstance(op, VarRef):
                out[key] = op.name
        return out

    def pause_trace_step(self) -> Optional[int]:
        """Paused before a call: the trace step of its first tensor argument (what the histograms
        show there), or None."""
        pause = self.pause
        if pause is None:
            return None
        names = self._argument_vars(pause)
        log = self._driver.log
        for label, value in pause.arguments():
            if isinstance(value, torch.Tensor) and label in names:
                trace_step = log.trace_step_of(pause.frame_depth, names[label])
                if trace_step is not None:
                    return trace_step
        return None

    def view_pause(self) -> dict:
        """The paused-before-a-call state as the widget shows it: the call site's node and source
        line (what is highlighted), the callee, and each argument's type, shape and stats."""
        pause = self.pause
        tree = self.tree
        node = tree.node_of_instruction(pause.instruction)
        names = self._argument_vars(pause)
        log = self._driver.log
        args = []
        for label, value in pause.arguments():
            item = _value_view(label, value)
            if label in names and isinstance(value, torch.Tensor):
                item["trace_step"] = log.trace_step_of(pause.frame_depth, names[label])
            args.append(item)
        callee = pause.callee
        loc = pause.location
        view = {"index": self.step_index, "run": self.active.name, "pause": "call", "kind": "call",
                "var": pause.instruction.out_var, "block": pause.block_path, "depth": pause.frame_depth,
                "node": node, "ancestors": tree.ancestors(node) if node >= 0 else [],
                "source_block": tree.block_of(node) if node >= 0 else -1,
                "line": loc.lineno if loc is not None else 0, "file": loc.filename if loc is not None else "",
                "type": "call", "callee": pause.callee_path,
                "callee_node": tree.node_of_block(callee) if callee is not None else -1,
                "interpreted": pause.interpreted, "next_step": pause.after_step + 1, "args": args,
                "text": f"{pause.callee_path}({', '.join(a['name'] for a in args)})",
                "trace_step": self.pause_trace_step(), "edited": False}
        if loc is not None and loc.end_lineno:
            view.update(col=loc.col, end_line=loc.end_lineno, end_col=loc.end_col)
        return view


def _frame_vars(frame: Mapping[str, Any], limit: int = 40, hidden: bool = True) -> list[dict]:
    """The variables of a frame as the call stack lists them (`hidden`: leave out temporaries,
    modules and parameters)."""
    out = []
    for name, value in frame.items():
        if hidden and (name.startswith("$") or isinstance(value, torch.nn.Module) or
                       isinstance(value, torch.nn.Parameter)):
            continue
        out.append(_value_view(name, value))
        if len(out) >= limit:
            break
    return out


def _value_view(name: str, value: Any) -> dict:
    """name, type, and for a tensor its shape, dtype and stats; for a small scalar its repr."""
    item: dict[str, Any] = {"name": name, "type": type(value).__name__}
    if isinstance(value, torch.Tensor):
        item["shape"] = list(value.shape)
        item["dtype"] = str(value.dtype).replace("torch.", "")
        if value.numel() and (value.is_floating_point() or value.is_complex()):
            stats = value_memo.statistics(value)
            item["stats"] = {k: stats[k] for k in ("mean", "std", "min", "max")}
    elif isinstance(value, (bool, int, float, str)) or value is None:
        item["value"] = repr(value)[:80]
    return item
