"""A tiny transformers Llama split into 2 pipeline stages, for tests/store/test_pipeline_store.py.

Stage 0 holds the embedding, the rotary table and layers 0-1, and hands layer 1's output and the
rotary cos and sin to stage 1, which holds layers 2-3 and the final norm: the unsplit `LlamaModel`'s
forward cut in two (sdpa attention without a padding mask, which the unsplit model runs with no mask
too). Each stage holds the whole model's own modules: stage 0 maps them by identity (`paths=model`),
stage 1 by path prefixes (`{"layers.0": "layers.2", ...}`). Each
rank (a spawned process of `tests/support/collective_group.run_group`) builds the same model from the
same seed, runs `ScheduleGPipe` over 2 micro-batches and fills one store with
`capture_pipeline_dataset`; what it saw comes back as JSON.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

CONFIG = dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128, use_cache=False)  # the stages hand on no KV cache: neither does the unsplit model
KEEP = "call=layers.*, call=layers.*.mlp.*, layers.*.self_attn:query_states, call=norm, call=embed_tokens"
ROWS, TOKENS, MICROBATCHES = 4, 8, 2


def llama():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(**CONFIG)).eval()


def batches() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 128, (ROWS, TOKENS), generator=generator)} for _ in range(3)]


class FirstStage(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.embed_tokens, self.rotary_emb = model.embed_tokens, model.rotary_emb
        self.layers = nn.ModuleList(model.layers[:2])

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        cos, sin = self.rotary_emb(hidden_states, position_ids=position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=None, position_embeddings=(cos, sin),
                                  position_ids=position_ids)
        return hidden_states, cos, sin


class LastStage(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.layers = nn.ModuleList(model.layers[2:])
        self.norm = model.norm

    def forward(self, hidden_states, cos, sin):
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=None, position_embeddings=(cos, sin),
                                  position_ids=position_ids)
        return self.norm(hidden_states)


class BranchingLastStage(LastStage):
    """LastStage with a branch on its input's values: micro-batches can take different statements."""

    def __init__(self, model, threshold: float):
        super().__init__(model)
        self.threshold = threshold

    def forward(self, hidden_states, cos, sin):
        if hidden_states[0, 0, 0] > self.threshold:
            hidden_states = hidden_states * 2
        return super().forward(hidden_states, cos, sin)


def _stage(rank: int, world: int, branching: bool = False, **options):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from nnschemaparser import NNParser
    from nnschemaparser.distributed import SchemaStage

    model = llama()
    data = batches()
    rows = ROWS // MICROBATCHES
    ids = data[0]["input_ids"][:rows]
    first = FirstStage(model)
    hidden, cos, sin = first(ids)
    part = first if rank == 0 else LastStage(model)
    if branching and rank == 1:  # a threshold between micro-batch 0's first value and micro-batch 1's
        low, high = sorted(float(first(data[0]["input_ids"][r:r + rows])[0][0, 0, 0]) for r in (0, rows))
        part = BranchingLastStage(model, (low + high) / 2)
    example = {"input_ids": ids} if rank == 0 else {"hidden_states": hidden, "cos": cos, "sin": sin}
    schema = NNParser.parse_model(part, inputs_tensors_values=example)
    module = SchemaStage(part, schema, rank, name=f"stage {rank}", microbatches=MICROBATCHES, **options)
    inputs = (ids,) if rank == 0 else (hidden, cos, sin)
    outputs = (hidden, cos, sin) if rank == 0 else (hidden,)
    stage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=inputs, output_args=outputs)
    return model, module, ScheduleGPipe(stage, n_microbatches=MICROBATCHES)


def pipeline_store(rank: int, world: int, folder: str) -> dict:
    from nnschemaparser.distributed import LogicalCaptureError, PlacedEdit, capture_pipeline_dataset

    warnings.filterwarnings("ignore")
    refused = {}
    edits = [PlacedEdit("", "hidden_states", torch.zeros(1))] if rank == 1 else []
    model, module, schedule = _stage(rank, world, edits=edits)
    try:  # every rank refuses together: stage 1's edits are found before any input runs
        capture_pipeline_dataset(module, schedule, batches(), Path(folder, "edited"), keep=KEEP, paths=model,
                                 progress=False)
        refused["edits"] = "nothing raised"
    except LogicalCaptureError as exc:
        refused["edits"] = str(exc)
    model, module, schedule = _stage(rank, world)
    try:  # rank 1 names a model that does not hold its stage's modules: refused on both ranks
        capture_pipeline_dataset(module, schedule, batches(), Path(folder, "elsewhere"), keep=KEEP,
                                 paths=model if rank == 0 else llama(), progress=False)
        refused["paths"] = "nothing raised"
    except LogicalCaptureError as exc:
        refused["paths"] = str(exc)
    try:  # 2 rows in 2 micro-batches: a [1, ...] value could be a row or a broadcast
        capture_pipeline_dataset(module, schedule, [{"input_ids": batches()[0]["input_ids"][:2]}],
                                 Path(folder, "one-row"), keep=KEEP, paths=model, progress=False)
        refused["one_row"] = "nothing raised"
    except LogicalCaptureError as exc:
        refused["one_row"] = str(exc)
    # stage 0 maps its modules by identity, stage 1 by its path prefixes: the same store either way
    paths = model if rank == 0 else {"layers.0": "layers.2", "layers.1": "layers.3"}
    store = capture_pipeline_dataset(module, schedule, batches(), Path(folder, "pipeline"), keep=KEEP, paths=paths,
                                     block_size=2, progress=False)
    # a second call resumes (stage 1's paths now given as the model: the same split, the same store): every input is
    # committed, none runs again
    again = capture_pipeline_dataset(module, schedule, batches(), Path(folder, "pipeline"), keep=KEEP, paths=model,
                                     block_size=2, progress=False)
    model, module, schedule = _stage(rank, world, branching=True)
    try:  # stage 1 takes another branch in micro-batch 1: refused on rank 1 after the schedule, said on both
        capture_pipeline_dataset(module, schedule, batches(), Path(folder, "branching"), keep=KEEP, paths=model,
                                 progress=False)
        refused["branching"] = "nothing raised"
    except LogicalCaptureError as exc:
        refused["branching"] = str(exc)
    dist.barrier()
    return {"samples": len(store), "again": len(again), "refused": refused}
