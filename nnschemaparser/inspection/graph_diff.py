"""The diff of two `.neurarch.json` graphs: the design you are changing from (base) and the new one (head).

    diff = diff_graphs(base, head)
    diff["nodes"]   -> {"added": [ids], "removed": [ids], "changed": [{"id", "type", "params", "shapes"}]}
    diff["params"]  -> {"added": N, "removed": N, "changed": N}   parameter elements of those nodes
    diff["totals"]  -> {"params": {"base", "head", "delta"}, "flops": {...}, "layers": {...}}

Nodes are matched by `id` (the module path, `@1` for later calls), so a layer that keeps its name
and changes its type or hyperparameters is *changed*, one that is renamed is removed and added.
For a changed node, `type` is `[old, new]` when it differs, `params` maps each hyperparameter key
that was added, removed or changed to `[old, new]` (None for absent), and `shapes` does the same for
`inputShape`/`outputShape`. `params.changed` is the net change of parameter elements over the
changed nodes. `diff_summary` is the one line the card shows.

Depends on flops (format_count) only.
"""

from __future__ import annotations

from typing import Any, Optional

from .flops import format_count

__all__ = ["diff_graphs", "diff_summary"]


def _total(graph: dict[str, Any], key: str) -> Optional[int]:
    value = graph.get("totals", {}).get(key)
    return value if isinstance(value, int) else None


def _delta(old: Optional[int], new: Optional[int]) -> dict[str, Optional[int]]:
    return {"base": old, "head": new, "delta": None if old is None or new is None else new - old}


def _count(node: dict[str, Any]) -> int:
    value = node.get("paramCount", 0)
    return value if isinstance(value, int) else 0


def diff_graphs(base: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """What changed from `base` to `head` (both validated neurarch graphs); see the module docstring."""
    old = {n["id"]: n for n in base["nodes"]}
    new = {n["id"]: n for n in head["nodes"]}
    added = [i for i in new if i not in old]
    removed = [i for i in old if i not in new]
    changed = []
    for node_id in (i for i in new if i in old):
        a, b = old[node_id], new[node_id]
        entry: dict[str, Any] = {"id": node_id}
        if a.get("type") != b.get("type"):
            entry["type"] = [a.get("type"), b.get("type")]
        pa, pb = a.get("params") or {}, b.get("params") or {}
        params = {k: [pa.get(k), pb.get(k)] for k in dict.fromkeys([*pa, *pb]) if pa.get(k) != pb.get(k)}
        if params:
            entry["params"] = params
        shapes = {k: [a.get(k), b.get(k)] for k in ("inputShape", "outputShape") if a.get(k) != b.get(k)}
        if shapes:
            entry["shapes"] = shapes
        if _count(a) != _count(b):
            entry["paramCount"] = [_count(a), _count(b)]
        if len(entry) > 1:
            changed.append(entry)
    return {
        "base": base.get("name"),
        "head": head.get("name"),
        "nodes": {"added": added, "removed": removed, "changed": changed},
        "params": {"added": sum(_count(new[i]) for i in added), "removed": sum(_count(old[i]) for i in removed),
                   "changed": sum(_count(new[c["id"]]) - _count(old[c["id"]]) for c in changed)},
        "totals": {key: _delta(_total(base, key), _total(head, key)) for key in ("params", "flops", "layers")},
    }


def _signed(value: Optional[int]) -> str:
    if value is None:
        return "?"
    return ("+" if value >= 0 else "-") + format_count(abs(value))


def diff_summary(diff: dict[str, Any]) -> str:
    """`vs Base: 2 added, 1 removed, 3 changed; params 1.2K -> 1.5K (+300); FLOPs ...`"""
    nodes = diff["nodes"]
    parts = [f"vs {diff.get('base') or 'base'}: {len(nodes['added'])} added, {len(nodes['removed'])} removed, "
             f"{len(nodes['changed'])} changed"]
    for key, label in (("params", "params"), ("flops", "FLOPs")):
        t = diff["totals"][key]
        if t["base"] is not None and t["head"] is not None:
            parts.append(f"{label} {format_count(t['base'])} -> {format_count(t['head'])} ({_signed(t['delta'])})")
    return "; ".join(parts)
