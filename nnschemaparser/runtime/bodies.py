"""A list of instructions spliced into one straight-line generated function over the frame dict.

`Program.compile_list` hands `fuse_body` one entry per instruction: the instruction's `Piece`
(source text, from `compile_calls`) or, for control flow and the rarer statements, its closure,
with the weights it reads. The result is one function `body(f)`: each piece's text in order (its
names suffixed so that pieces stay apart), the live weight reads before it, the observer's
`before`/`after` calls around it in an observed program, a closure called where a piece is
missing (`s = c(f)`, its signal passed up), the announcement of a sub-block call before it in a
program that reports calls, and `return RETURN` / `BREAK` / `CONTINUE` where the
instruction ends the list. These are the execution rules of the closures, written out once per
list instead of one call per instruction (the closure call, the run loop's signal test and the
weight-read wrapper were most of the per-instruction cost on dispatch-bound models).

Error reports read the running instruction from the default argument `_at` (line number →
(instruction, fused getattr)), as they read `_i` / `_r` in a closure. The source of identical
blocks (the 32 layers of a stack) is identical, so they share one code object.

Depends on torch, `operands` and `observer`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor

from .observer import BREAK, CONTINUE, RETURN, Observer
from .operands import Piece, _factory, renamed

__all__ = ["fuse_body", "BodyEntry", "IfPiece"]

_MISSING = object()


class BodyEntry:
    """One instruction of a list: its piece or closure, the fused getattr (if any), the weights it reads."""

    __slots__ = ("instr", "fetch", "item", "weights", "leaf", "mutates", "ends", "announce")

    def __init__(self, instr: Any, fetch: Any, item: Any, weights: tuple, leaf: bool, mutates: bool,
                 ends: Optional[str], announce: Optional[Callable[[dict], None]] = None):
        self.instr = instr
        self.fetch = fetch
        self.item = item
        self.weights = weights  # ((ref, attr), ...) read live before the instruction
        self.leaf = leaf  # an observed program reports it (`after`); control flow is not reported
        self.mutates = mutates
        self.ends = ends  # "return" / "break" / "continue" for the instructions that end the list
        # a sub-block call in a program that reports calls (`Program(calls=True)`): `announce(f)`
        # tells the observer what is about to be called, before anything of the call runs
        self.announce = announce


class IfPiece:
    """An `if` written out in the body: its condition's entries (a test, not a step: the observer's
    begin/end_condition around it), the live read of its condition variable, and both branches."""

    __slots__ = ("condition", "cond_var", "cond_weights", "body", "else_body")

    def __init__(self, condition: list, cond_var: str, cond_weights: tuple, body: list, else_body: list):
        self.condition = condition
        self.cond_var = cond_var
        self.cond_weights = cond_weights
        self.body = body
        self.else_body = else_body


def fuse_body(entries: list, observer: Optional[Observer], module: Any, direct_weights: bool,
              tensor_results: bool = False) -> Callable[[dict], Any]:
    """The function `body(f)` running `entries` in order; returns a signal (or None), as `run_list` does.

    With `tensor_results`, `after` is called only where the instruction returned or bound a tensor:
    the observer's own first test when its listeners want tensor results only (see `Program`).
    """
    env: dict = {"SR": RETURN, "SB": BREAK, "SC": CONTINUE, "UMOD": module}
    if direct_weights:
        env.update(UP=getattr(module, "_parameters", {}), UB=getattr(module, "_buffers", {}), UM=_MISSING)
    if observer is not None:
        env.update(UBEFORE=observer.before, UAFTER=observer.after, UT=Tensor,
                   UBEGIN=observer.begin_condition, UEND=observer.end_condition)
    lines: list[str] = []
    at: dict = {}
    first_line = 3  # line 1: `def factory`, line 2: `def body`
    counter = [0]

    def weights(pairs: tuple, pad: str) -> None:
        for ref, attr in pairs:
            k = counter[0]
            counter[0] += 1
            env[f"wr{k}"], env[f"wa{k}"] = ref, attr
            if direct_weights:  # what Module.__getattr__ returns, read from its dicts
                lines.append(f"{pad}w = UP.get(wa{k}, UM)")
                lines.append(f"{pad}if w is UM:")
                lines.append(f"{pad}    w = UB[wa{k}] if wa{k} in UB else getattr(UMOD, wa{k})")
                lines.append(f"{pad}f[wr{k}] = w")
            else:
                lines.append(f"{pad}f[wr{k}] = getattr(UMOD, wa{k})")

    def mark(entry: Any, line: str) -> None:
        at[first_line + len(lines)] = (entry.instr, entry.fetch)
        lines.append(line)

    def emit(items: list, pad: str) -> None:
        start = len(lines)
        for entry in items:
            k = counter[0]
            counter[0] += 1
            weights(entry.weights, pad)
            observed = observer is not None and entry.leaf
            if observed:
                env[f"o{k}"] = entry.instr
                if entry.announce is not None:
                    env[f"an{k}"] = entry.announce
                    lines.append(f"{pad}an{k}(f)")
                if entry.mutates:
                    lines.append(f"{pad}UBEFORE(o{k}, f)")
            item = entry.item
            if isinstance(item, IfPiece):
                if observer is not None and (item.condition or item.cond_weights):
                    lines.append(f"{pad}UBEGIN()")
                    lines.append(f"{pad}try:")
                    emit(item.condition, pad + "    ")
                    weights(item.cond_weights, pad + "    ")
                    lines.append(f"{pad}finally:")
                    lines.append(f"{pad}    UEND()")
                else:
                    emit(item.condition, pad)
                    weights(item.cond_weights, pad)
                env[f"cv{k}"] = item.cond_var
                mark(entry, f"{pad}if f[cv{k}]:")
                emit(item.body, pad + "    ")
                if item.else_body:
                    lines.append(f"{pad}else:")
                    emit(item.else_body, pad + "    ")
                continue
            if isinstance(item, Piece):
                names = frozenset(n for n in item.env if n not in ("_i", "_r"))
                text = renamed(item.text, names, f"_{k}") if names else item.text
                for name in names:
                    env[f"{name}_{k}"] = item.env[name]
                own = text.split("\n")
            else:
                env[f"c{k}"] = item
                own = [f"s = c{k}(f)", "if s is not None:", "    return s"] if not entry.leaf else [f"c{k}(f)"]
            for line in own:
                mark(entry, pad + line)
            if observed and tensor_results and entry.ends != "return":
                out = getattr(entry.instr, "out_var", None)
                if out:
                    env[f"ov{k}"] = out
                    lines.append(f"{pad}if isinstance(f.get(ov{k}), UT):")
                    lines.append(f"{pad}    UAFTER(o{k}, f)")
            elif observed:
                lines.append(f"{pad}UAFTER(o{k}, f)")
            if entry.ends is not None:
                lines.append(pad + "return " + {"return": "SR", "break": "SB", "continue": "SC"}[entry.ends])
                break  # nothing after it runs
        if len(lines) == start:
            lines.append(pad + "pass")

    emit(entries, "")
    env["_at"] = at
    body = "\n        ".join(lines)
    source = (f"def factory({', '.join(env)}):\n"
              f"    def body(f, _at=_at):\n"
              f"        {body}\n"
              f"    return body\n")
    return _factory(source)(**env)
