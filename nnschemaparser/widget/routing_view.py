"""The inspector's MoE routing view: per experts call, a token x expert matrix of router weights.

`routing_frame(state, run)` is `traces.routing.moe_routing` on the inputs of the inspector (one run
with a listener on every experts block; cached per inputs object), and `routing_view` turns it into
the browser's reply to a `routing` message: per experts call (one per layer in a decoder) a matrix
`weights[token][expert]` holding the weight the router gave that expert for that token, 0 where the
token did not go to it, with the token labels the attention view uses and the expert indices.

The routing is read from a fresh run of the inputs, so a run's queued edits are not replayed in it;
the reply's `note` says so when the run asked for has edits.

Depends on traces.routing and the state's `run`, `scope`, `schema` and `tokens` only.
"""

from __future__ import annotations

from typing import Any, Optional

from ..schema.errors import NNSchemaError
from ..traces.routing import experts_blocks, moe_routing

__all__ = ["has_experts", "routing_frame", "routing_view", "token_route", "MAX_ROUTING_TOKENS", "RoutingViewError"]

#: The most tokens (rows) one routing matrix carries to the browser.
MAX_ROUTING_TOKENS = 128


class RoutingViewError(NNSchemaError):
    """The routing view cannot be shown (no experts block in the schema)."""


def has_experts(schema: Any) -> bool:
    """Whether the schema has an experts block (the widget shows its Routing tab only then)."""
    return bool(experts_blocks(schema))


def _edits_note(record: Any) -> str:
    if record.edits:
        return (f"run {record.name!r} replays {len(record.edits)} edit(s); the routing shown is that of the "
                f"inputs without edits")
    return ""


def routing_frame(state: Any, run: Optional[str] = None) -> Any:
    """The moe_routing DataFrame of the inspector's inputs (`run` is checked to exist; see the module
    docstring for edits); `frame.attrs["run"]` and `frame.attrs["note"]` say which run and what."""
    record = state.run(run)
    if not has_experts(state.schema):
        raise RoutingViewError("this schema has no experts block (a forward taking top_k_index and top_k_weights); "
                               "the routing view shows transformers' MoE experts modules (Mixtral, Qwen2-MoE, ...)")
    cached = getattr(state, "_routing_cache", None)
    if cached is not None and cached[0] is state.scope:
        frame = cached[1]
    else:
        # on the run thread, as every run of the state (the paused run, if any, waits there untouched)
        frame = state.run_thread.call(lambda: moe_routing(state.schema, state.scope))
        state._routing_cache = (state.scope, frame)
    frame = frame.copy()
    frame.attrs.update(run=record.name, note=_edits_note(record))
    return frame


def _expert_count(schema: Any, block_path: str, seen: int) -> int:
    for block in experts_blocks(schema):
        if block.path == block_path:
            count = getattr(block.module, "num_experts", None)
            if isinstance(count, int) and not isinstance(count, bool) and count >= seen:
                return count
    return seen


def _labels(tokens: Optional[list], rows: int) -> list[str]:
    """A label per flattened token row: the input id of that position when known, else the row number."""
    if tokens and rows % len(tokens) == 0:
        return [str(tokens[r % len(tokens)]) for r in range(rows)]
    return [str(r) for r in range(rows)]


def routing_view(state: Any, run: Optional[str] = None, max_tokens: int = MAX_ROUTING_TOKENS) -> dict:
    """The reply to a `routing` message: {"run", "note", "summary", "layers": [{"block", "layer",
    "call", "tokens" (labels `position:id`), "n_tokens" (all of them), "experts" (indices), "counts"
    (tokens routed to each expert), "weights"
    (token x expert), "top_k", "name", "caption", "label" (the map's accessible name), "routes" (each
    token's routing as text, read out on Enter)}]}; at most `max_tokens` rows per matrix (the note
    says when cut). The texts are made here, so the browser bundle stays small."""
    frame = routing_frame(state, run)
    tokens = state.tokens()
    layers, notes = [], [frame.attrs["note"]] if frame.attrs["note"] else []
    cut = False
    for (block, call), group in frame.groupby(["block", "call"], sort=False):
        n_tokens = int(group["token"].max()) + 1
        n_experts = _expert_count(state.schema, block, int(group["expert"].max()) + 1)
        shown = min(n_tokens, max_tokens)
        cut = cut or shown < n_tokens
        weights = [[0.0] * n_experts for _ in range(shown)]
        for token, expert, weight in zip(group["token"], group["expert"], group["weight"]):
            if token < shown:
                weights[token][expert] += float(weight)  # one rank per expert: the router's top-k are distinct
        layer = group["layer"].iloc[0]
        layer = None if layer is None or layer != layer else int(layer)
        labels = [f"{r}:{t}" for r, t in enumerate(_labels(tokens, n_tokens)[:shown])]
        name = block if layer is None else f"layer {layer}"
        top_k = int(group["rank"].max()) + 1
        counts = [0] * n_experts  # tokens routed to each expert (all tokens of the call, not only those shown)
        for expert in group["expert"]:
            counts[int(expert)] += 1
        layers.append({"counts": counts,"block": block, "layer": layer, "call": int(call), "tokens": labels, "n_tokens": n_tokens,
                       "experts": list(range(n_experts)), "weights": weights, "top_k": top_k, "name": name,
                       "caption": f"{name} · {block}" + (f" · first {shown} of {n_tokens} tokens" if cut else ""),
                       "label": f"{name} routing: {shown} tokens x {n_experts} experts, top {top_k}; "
                                f"press Enter to read it",
                       "routes": [f"token {labels[r]}: {token_route(weights[r])}" for r in range(shown)]})
    if cut:
        notes.append(f"first {max_tokens} tokens of each call")
    summary = (f"{len(layers)} experts calls · tokens down, experts across · colour: the router's weight over "
               f"the chosen experts (grey: not routed) · under each map, the tokens per expert"
               + "".join(f" · {n}" for n in notes))
    return {"run": frame.attrs["run"], "note": "; ".join(notes), "summary": summary, "layers": layers}


def token_route(row: list) -> str:
    """One token's routing as text: the experts it went to, highest weight first ("expert 3 (0.5232), ...")."""
    chosen = sorted(((w, e) for e, w in enumerate(row) if w != 0), key=lambda item: -item[0])
    return ", ".join(f"expert {e} ({w:.4g})" for w, e in chosen)
