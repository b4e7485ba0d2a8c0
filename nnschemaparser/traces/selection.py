"""The `keep=` selector: which captured tensors a capture keeps, by block path, variable, op and slot.

One selector serves `capture_run(..., keep=...)` (the recorder records only the steps it names) and
`capture_dataset(..., keep=...)` (the store writes only their tensors; statistics of every step
are written anyway). A selector is built from text, from `KeepTerm`s, or from a list of both; a
step is kept when any term matches it. One term of text reads

    block_glob[:var_glob] [op=op_glob] [slot=input|activation|output]

with shell-style globs (`fnmatch`, case-sensitive; `*` also crosses dots):
`"transformer.h.*.attn:attn_output"`, `"model.layers.3"` (every variable of that block),
`"*:logits"`, `"op=*linear"`, `"slot=output"`. Several terms are joined by commas or given as a list.
A term's block glob is matched against the step's block path and covers the blocks inside the
blocks it names (`"model.layers.3"` keeps what `model.layers.3.mlp` computes too); the root's path
is its class name, and inputs have an empty one, so select them with `slot=input`.

Depends on the standard library only.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Iterable, Optional, Union

__all__ = ["KeepTerm", "KeepSelector", "keep_selector"]

SLOT_TYPES = ("input", "activation", "output")
_FIELD = re.compile(r"^(op|slot)=(.+)$")
# per schema root: {selector: the blocks a capture with it observes} (KeepSelector.blocks_to_observe)
_OBSERVED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_PARSED: dict[str, "KeepSelector"] = {}  # selector text -> its selector (keep_selector)


@dataclass(frozen=True)
class KeepTerm:
    """One alternative of a selector: every field given must match (None matches anything)."""

    block: Optional[str] = None
    var: Optional[str] = None
    op: Optional[str] = None
    slot: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("block", "var", "op", "slot"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"KeepTerm.{name} must be a non-empty glob string or None, got {value!r}")
        if self.slot is not None and not any(fnmatchcase(s, self.slot) for s in SLOT_TYPES):
            raise ValueError(f"KeepTerm.slot {self.slot!r} matches no slot type; use one of {', '.join(SLOT_TYPES)}")

    def matches(self, block_path: str, var: str, op: str, slot: str) -> bool:
        return ((self.slot is None or fnmatchcase(slot, self.slot))
                and (self.block is None or fnmatchcase(block_path, self.block)
                     or fnmatchcase(block_path, self.block + ".*"))
                and (self.var is None or fnmatchcase(var, self.var))
                and (self.op is None or fnmatchcase(op, self.op)))

    def text(self) -> str:
        head = (self.block or "*") + (f":{self.var}" if self.var is not None else "")
        parts = [head] if (self.block is not None or self.var is not None) else []
        parts += [f"op={self.op}"] if self.op is not None else []
        parts += [f"slot={self.slot}"] if self.slot is not None else []
        return " ".join(parts) or "*"


def _parse_term(text: str) -> KeepTerm:
    words = text.split()
    if not words:
        raise ValueError("an empty keep term; write e.g. 'transformer.h.*.attn:attn_output' or 'op=*linear'")
    fields: dict[str, str] = {}
    for word in words:
        found = _FIELD.match(word)
        if found:
            key, value = found.groups()
        else:
            key, value = "path", word
        if key in fields:
            raise ValueError(f"keep term {text!r} gives {key} twice")
        fields[key] = value
    block = var = None
    if "path" in fields:
        block, colon, var_text = fields["path"].partition(":")
        block = block or None
        var = var_text if colon else None
        if colon and not var_text:
            raise ValueError(f"keep term {text!r}: nothing after ':'; name a variable glob such as '*'")
    return KeepTerm(block=block, var=var, op=fields.get("op"), slot=fields.get("slot"))


class KeepSelector:
    """A union of `KeepTerm`s; `matches(block_path, var, op, slot)` says whether a step is kept."""

    __slots__ = ("terms", "_cache", "_blocks")

    def __init__(self, terms: Iterable[KeepTerm]):
        self.terms = tuple(terms)
        if not self.terms:
            raise ValueError("a keep selector needs at least one term")
        self._cache: dict[tuple[str, str, str, str], bool] = {}
        self._blocks: dict[str, bool] = {}  # block path -> may_keep_activations(path)

    def may_keep_activations(self, block_path: str) -> bool:
        """Whether some activation of the block at `block_path` can match (False: none of its
        activation steps is kept, whatever its variable or op), so a recorder can skip describing them."""
        hit = self._blocks.get(block_path)
        if hit is None:
            hit = self._blocks[block_path] = any(
                (t.slot is None or fnmatchcase("activation", t.slot))
                and (t.block is None or fnmatchcase(block_path, t.block) or fnmatchcase(block_path, t.block + ".*"))
                for t in self.terms)
        return hit

    def matches(self, block_path: str, var: str, op: str, slot: str) -> bool:
        key = (block_path, var, op, slot)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = any(t.matches(block_path, var, op, slot) for t in self.terms)
        return hit

    def blocks_to_observe(self, root: Any) -> Optional[frozenset]:
        """Ids of the blocks of the schema `root` a capture must observe to see every step this
        selector can keep: the blocks whose path a term's block glob names (with what is inside
        them), every block on the way to them (their ancestors by path, method blocks included) and
        the root. None when a term that can keep activations names no block (`op=...`, a bare
        `slot=activation`): then every block is observed. The answer is cached per schema."""
        cache = _OBSERVED.get(root)
        if cache is None:
            cache = _OBSERVED[root] = {}
        if self in cache:
            return cache[self]
        terms = [t for t in self.terms if t.slot is None or fnmatchcase("activation", t.slot)]
        if any(t.block is None for t in terms):
            cache[self] = None
            return None
        blocks = list(root.iter_blocks())
        matched = {b.path for b in blocks
                   if any(fnmatchcase(b.path or b.name, t.block) or fnmatchcase(b.path or b.name, t.block + ".*")
                          for t in terms)}
        observe = frozenset(id(b) for b in blocks if b is root or not b.path and matched or any(
            m == b.path or m.startswith(b.path + ".") for m in matched))
        cache[self] = observe
        return observe

    def text(self) -> str:
        """The selector as text that `keep_selector` reads back to an equal selector."""
        return ", ".join(term.text() for term in self.terms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeepSelector) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        return f"KeepSelector({self.text()!r})"


KeepSpec = Union[str, KeepTerm, KeepSelector, Iterable[Union[str, KeepTerm]]]


def keep_selector(keep: Any) -> Optional[KeepSelector]:
    """The KeepSelector of a `keep=` argument (None stays None); a bad argument raises a ValueError or TypeError."""
    if keep is None or isinstance(keep, KeepSelector):
        return keep
    if isinstance(keep, KeepTerm):
        return KeepSelector([keep])
    if isinstance(keep, str):
        known = _PARSED.get(keep)
        if known is not None:  # the same text, the same selector (and its cache of matches)
            return known
        selector = keep_selector(keep.split(","))
        if len(_PARSED) >= 256:
            _PARSED.clear()
        _PARSED[keep] = selector
        return selector
    if isinstance(keep, (list, tuple)):
        items = list(keep)
    else:
        raise TypeError(f"keep must be a string such as 'transformer.h.*.attn:attn_output', a KeepTerm, a list of "
                        f"them, or None; got {type(keep).__name__}")
    terms = []
    for item in items:
        if isinstance(item, KeepTerm):
            terms.append(item)
        elif isinstance(item, str):
            terms.append(_parse_term(item))
        else:
            raise TypeError(f"a keep term is a string or a KeepTerm, got {type(item).__name__}")
    return KeepSelector(terms)
