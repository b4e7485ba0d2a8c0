"""A DTensor sharding rule for CPU attention, so the placement rules can follow a value through it.

`F.scaled_dot_product_attention` on CPU runs `aten._scaled_dot_product_flash_attention_for_cpu`, for
which torch registers no DTensor sharding strategy: the placement rules' second run of the op on
DTensors (recorder.py, rule 3) raised, and on a Llama under FSDP2 every value from the first
attention's output on had an unknown placement. Attention is computed independently per batch
element and per head, so its output (and logsumexp) is sharded as its inputs are on those dims:

- all of query, key, value (and the mask) replicated: outputs replicated;
- query, key, value sharded on dim 0 (batch) or dim 1 (heads), the mask sharded the same way or
  replicated (a mask broadcast over that dim): outputs sharded on that dim.

Only without dropout (dropout draws random numbers per element). `ensure_cpu_attention_rule()`
registers it once, through DTensor's own extension API (`register_sharding`), and only when torch
has no strategy of its own for the op; it then stays registered for the process (a rule torch lacks,
not a change to one it has). The rerun's result is still checked equal to what the rank computed.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ensure_cpu_attention_rule"]

_REGISTERED = False


def ensure_cpu_attention_rule() -> bool:
    """Register the rule if torch has none for the op; True when a rule (ours or torch's) is there."""
    global _REGISTERED
    if _REGISTERED:
        return True
    op = getattr(getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None), "default", None)
    if op is None:
        return False
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.experimental import register_sharding
        from torch.distributed.tensor.placement_types import Replicate, Shard
    except ImportError:  # a torch without DTensor's extension API
        return False
    propagator = DTensor._op_dispatcher.sharding_propagator
    if op in propagator.op_strategy_funcs or op in getattr(propagator, "op_to_rules", {}):
        _REGISTERED = True
        return True

    def strategy(query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False,
                 attn_mask: Any = None, scale: Any = None) -> list:
        def inputs(place: Any, mask: Any) -> list:
            # query, key, value, dropout_p, is_causal, attn_mask, scale (a non-tensor: None)
            return [place, place, place, None, None, mask, None]

        acceptable = [([Replicate(), Replicate()], inputs(Replicate(), None if attn_mask is None else Replicate()))]
        if dropout_p == 0.0:
            for dim in (0, 1):
                for mask in ([None] if attn_mask is None else [Shard(dim), Replicate()]):
                    acceptable.append(([Shard(dim), Shard(dim)], inputs(Shard(dim), mask)))
        return acceptable

    register_sharding(op)(strategy)
    _REGISTERED = True
    return True
