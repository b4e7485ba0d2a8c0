"""Attention heads of fused attention calls, recomputed from the call's own inputs.

With `sdpa` or flash attention, the attention weights never exist as a tensor: the kernel returns
only its output. So that the inspector can still show a pattern per head, a run's `StepLog` notes
each call of an attention function as it runs (`capture_call`): the query, key and mask tensors it
got (aliases, as the trace keeps values), the scale, whether it was causal, and the module it was
given. `recompute_weights` then computes, on demand, what an eager attention would have returned:

    softmax(query @ repeat_kv(key).T * scale + mask, dim=-1, dtype=float32).to(query.dtype)

the same operations, in the same order and dtypes, as `transformers`' `eager_attention_forward`
(grouped-query keys repeated per head, an additive float mask cut to the keys' length, a boolean
mask as "where True, keep", a causal triangle where the call was causal without a mask). Dropout
is not replayed (the widget's runs are normally in eval mode; the result says so when it was not).

Calls recognised: `torch.nn.functional.scaled_dot_product_attention` and any function whose name
ends in `attention_forward` taking (module, query, key, value, attention_mask, ...), which is how
`transformers` dispatches `sdpa`, `flash_attention_2`, `flex_attention` and `eager`.

Depends on the schema's operands and torch only.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Optional

import torch

from ..runtime.instructions import operand_reader
from ..schema.model import OpInstruction, VarRef

__all__ = ["capture_call", "recompute_weights", "attention_function_name"]

_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def attention_function_name(fn: Any) -> str:
    """The function's name when it is an attention call this module can recompute, else ""."""
    name = getattr(fn, "__name__", "") or ""
    if name == "scaled_dot_product_attention" or name.endswith("attention_forward"):
        return name
    return ""


def _callee(instr: OpInstruction, frame: dict) -> Any:
    target = instr.target
    if isinstance(target, VarRef):
        return frame.get(target.name)
    return target


def _arguments(instr: OpInstruction, frame: dict) -> tuple[list, dict]:
    args = []
    for position, op in enumerate(instr.args):
        value = operand_reader(op)(frame)
        if position in instr.star_args:
            args.extend(value)
        else:
            args.append(value)
    if instr.args_var:
        args.extend(frame.get(instr.args_var) or ())
    kwargs = {key: operand_reader(op)(frame) for key, op in instr.kwargs.items()}
    if instr.kwargs_var:
        kwargs.update(frame.get(instr.kwargs_var) or {})
    return args, kwargs


def capture_call(instr: Any, frame: dict) -> Optional[dict]:
    """The inputs of an attention call `instr` that has just run over `frame`, or None when `instr`
    is not one (or its arguments cannot be read back)."""
    if not isinstance(instr, OpInstruction):
        return None
    fn = _callee(instr, frame)
    name = attention_function_name(fn)
    if not name:
        return None
    try:
        args, kwargs = _arguments(instr, frame)
    except (KeyError, TypeError):
        return None
    if name == "scaled_dot_product_attention":
        named = dict(zip(_SDPA_NAMES, args))
        named.update(kwargs)
        query, key, mask = named.get("query"), named.get("key"), named.get("attn_mask")
        scale, causal, module = named.get("scale"), bool(named.get("is_causal", False)), None
        dropout = named.get("dropout_p", 0.0)
    else:
        try:
            bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return None
        extra = bound.get("kwargs", {}) if isinstance(bound.get("kwargs"), dict) else {}
        module, query, key = bound.get("module"), bound.get("query"), bound.get("key")
        mask = bound.get("attention_mask")
        scale = bound.get("scaling", extra.get("scaling"))
        dropout = bound.get("dropout", extra.get("dropout", 0.0))
        explicit = bound.get("is_causal", extra.get("is_causal"))
        if explicit is not None:
            causal = bool(explicit) and mask is None
        else:  # transformers' sdpa and flash: causal when there is no mask and the module says so
            causal = mask is None and bool(getattr(module, "is_causal", True))
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key)):
        return None
    training = bool(getattr(module, "training", False)) if module is not None else False
    return {"function": name, "query": query, "key": key, "mask": mask if isinstance(mask, torch.Tensor) else None,
            "scale": float(scale) if isinstance(scale, (int, float)) else None, "causal": bool(causal),
            "dropout": float(dropout) if isinstance(dropout, (int, float)) else 0.0, "training": training}


def recompute_weights(call: dict) -> torch.Tensor:
    """The attention weights [batch, heads, q, k] of a captured call (see the module docstring)."""
    query, key, mask = call["query"].detach(), call["key"].detach(), call["mask"]
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:  # grouped-query attention: each key head serves heads // kv_heads query heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads cannot share {kv_heads} key heads evenly")
        batch, _, length, dim = key.shape
        key = key[:, :, None, :, :].expand(batch, kv_heads, heads // kv_heads, length, dim).reshape(
            batch, heads, length, dim)
    scale = call["scale"] if call["scale"] is not None else 1.0 / math.sqrt(query.shape[-1])
    weights = torch.matmul(query, key.transpose(2, 3)) * scale
    if mask is not None:
        mask = mask.detach()
        if mask.dtype == torch.bool:
            weights = weights.masked_fill(~mask[..., : key.shape[-2]], float("-inf"))
        else:
            weights = weights + mask[:, :, :, : key.shape[-2]]
    elif call["causal"]:
        n_q, n_k = weights.shape[-2], weights.shape[-1]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=weights.device).tril(diagonal=n_k - n_q)
        weights = weights.masked_fill(~keep, float("-inf"))
    return torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
