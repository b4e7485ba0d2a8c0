"""Workers for tests/distributed/test_logical_hf_tp.py: a tiny transformers Llama sharded by
transformers' own tensor parallelism (`from_pretrained(folder, tp_plan="auto")`, offline from a
folder the test saved with random weights), captured with `capture_logical` and compared with one
process."""

from __future__ import annotations

import os

import torch

CONFIG = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128)


def save_llama(folder: str) -> None:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    LlamaModel(LlamaConfig(**CONFIG)).save_pretrained(folder)


def ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))


def hf_tp_placements(rank: int, world: int, folder: str) -> dict:
    import warnings

    from transformers import AutoModel

    from nnschemaparser import NNParser, capture_run
    from nnschemaparser.distributed import capture_logical, compare_logical

    warnings.filterwarnings("ignore")
    # what torchrun sets: transformers applies tp_plan only in a launched group (its own init reads these)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    model = AutoModel.from_pretrained(folder, tp_plan="auto").eval()
    x = ids()
    trace = capture_logical(NNParser.parse_model(model, inputs_tensors_values={"input_ids": x}),
                            {"input_ids": x}).trace
    reference = AutoModel.from_pretrained(folder).eval()
    one = capture_run(NNParser.parse_model(reference, inputs_tensors_values={"input_ids": x}), {"input_ids": x}).trace
    table = compare_logical(trace, one)
    by_op = {s.op_name: trace.placement(s.container_id) for s in trace.steps}
    return {"steps": len(trace.steps), "unknown": [s.container_id for s in trace.steps
                                                   if not trace.placement(s.container_id).known],
            "q_proj": [by_op["layers.0.self_attn.q_proj"].badge(), by_op["layers.0.self_attn.q_proj"].source],
            "o_proj": [by_op["layers.0.self_attn.o_proj"].badge(), by_op["layers.0.self_attn.o_proj"].reduced],
            "gate_reduced": by_op["layers.1.mlp.gate_proj"].reduced, "embed_reduced": by_op["embed_tokens"].reduced,
            "exact": int(table["exact"].fillna(False).astype(bool).sum()), "rows": len(table),
            "compared": int(table["exact"].notna().sum()),
            "not_exact_reasons": sorted(set(table.loc[table["exact"] != True, "reason"].astype(str))),  # noqa: E712
            "mesh": list(model._device_mesh.mesh_dim_names)}
