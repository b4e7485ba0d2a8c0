"""MoE routing as data: which tokens went to which expert, with which weight, per layer.

`moe_routing(schema, scope)` runs the schema once with a listener on every experts block (a block
whose forward takes the router's choice as `top_k_index` and `top_k_weights`, as the experts
modules of `transformers` 5 do: Mixtral, Qwen2-MoE, ...) and returns one row per (layer, token,
rank): the expert the router chose and the weight the experts block applied. The values are the
arguments the experts block received in the run, so they are the router's top-k exactly.

Depends on the schema and the runtime's interpreter and listener interface.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..runtime.interpreter import SchemaInterpreter
from ..runtime.listeners import BlockEvent, TraceListener
from ..schema.errors import SchemaRunError
from ..schema.model import ModelBlockSchema

__all__ = ["moe_routing", "experts_blocks"]

_INDEX, _WEIGHTS = "top_k_index", "top_k_weights"
_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def experts_blocks(schema: ModelBlockSchema) -> list[ModelBlockSchema]:
    """The interpreted blocks whose forward takes the router's choice (`top_k_index`, `top_k_weights`)."""
    found = []
    for block in schema.iter_blocks():
        sig = block.signature
        if block.method_name is None and sig is not None and {_INDEX, _WEIGHTS} <= set(sig.params) | set(sig.kwonly):
            found.append(block)
    return found


class _Routing(TraceListener):
    every_instruction = False

    def __init__(self, paths: set):
        self.paths = paths
        self.calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def on_block_enter(self, event: BlockEvent) -> None:
        if event.block.path in self.paths and event.block.method_name is None:
            frame = event.frame
            self.calls.append((event.block.path, frame[_INDEX].detach().clone(), frame[_WEIGHTS].detach().clone()))

    def on_instruction(self, event: Any) -> None:
        pass


def moe_routing(schema: ModelBlockSchema, scope: dict):
    """A DataFrame with one row per experts call, token and rank: `block` (the experts block's
    path), `layer` (the first number in that path, or None), `call` (0 for the first call of that
    block in the run), `token` (the row of the flattened tokens), `rank` (0 for the router's first
    choice), `expert` and `weight`."""
    import pandas as pd

    paths = {block.path for block in experts_blocks(schema)}
    if not paths:
        raise SchemaRunError("this schema has no experts block (a forward taking top_k_index and top_k_weights); "
                             "moe_routing reads the routing of transformers' MoE experts modules")
    listener = _Routing(paths)
    with torch.no_grad():
        SchemaInterpreter(listeners=[listener]).run(block=schema, scope=scope)
    rows = []
    seen: dict[str, int] = {}
    for path, index, weights in listener.calls:
        call = seen.get(path, 0)
        seen[path] = call + 1
        match = _LAYER.search(path)
        layer = int(match.group(1)) if match else None
        index2 = index.reshape(-1, index.shape[-1])
        weights2 = weights.reshape(-1, weights.shape[-1])
        for token in range(index2.shape[0]):
            for rank in range(index2.shape[1]):
                rows.append({"block": path, "layer": layer, "call": call, "token": token, "rank": rank,
                             "expert": int(index2[token, rank]), "weight": float(weights2[token, rank])})
    return pd.DataFrame(rows, columns=["block", "layer", "call", "token", "rank", "expert", "weight"])
