"""The ranks of tests/distributed/test_diverge_logical.py: `diverge_logical` on a 2-process gloo group.

Every rank builds the same `Block` (tests/support/distributed_models.py, same seed), shards it, and
builds the unsharded reference with the same weights; rank 0 returns its report's table as JSON-ready
rows. Kinds:

- `tp`: ColwiseParallel / RowwiseParallel, fault-free;
- `tp_bf16_reduce`: the MLP's row-parallel `down` rounds its partial sums to bfloat16 before they
  are all-reduced (`Bf16ReduceRowwise`): the planted fault is in the sharded side only;
- `tp_scaled_rank`: rank 1's part of the MLP's column-parallel `hidden` is scaled by 1.01 (a forward
  hook on `mlp.up` of rank 1, the sharded side only);
- `fsdp`: FSDP2 over 2 ranks, each rank its own half of the batch (gathered as the reference's inputs).

`budget_ranks` runs kinds twice, with no memory budget and with a tiny one, for
tests/distributed/test_diverge_logical_memory.py.
"""

from __future__ import annotations

import math

import torch

from tests.support.distributed_models import block, tp_plan

BATCH, SEQ, WIDTH = 2, 4, 32


def _inputs(seed: int) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(seed))


def _bf16_reduce_rowwise():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import RowwiseParallel

    class Bf16ReduceRowwise(RowwiseParallel):
        """RowwiseParallel whose partial sums are rounded to bfloat16 before the all-reduce."""

        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            rounded = outputs.to_local().to(torch.bfloat16).to(outputs.dtype)
            outputs = DTensor.from_local(rounded, device_mesh, outputs.placements, run_check=False)
            outputs = outputs.redistribute(placements=output_layouts)
            return outputs.to_local() if use_local_output else outputs

    return Bf16ReduceRowwise()


def diverge_ranks(rank: int, world: int, kinds: list) -> dict:
    """Each kind in turn on this rank (one spawned group for all): {kind: what rank 0 saw}."""
    return {kind: diverge_rank(rank, world, kind) for kind in kinds}


def budget_ranks(rank: int, world: int, kinds: list, budget: int) -> dict:
    """Each kind with `memory_budget=None` and `memory_budget=budget`: {kind: {"held", "spilled"}},
    rank 0's with its report's `memory`."""
    out = {kind: {name: diverge_rank(rank, world, kind, memory_budget=limit)
                  for name, limit in (("held", None), ("spilled", budget))} for kind in kinds}
    try:  # refused on every rank before any collective: nothing hangs
        diverge_rank(rank, world, "tp", memory_budget=-1)
        out["bad"] = "accepted"
    except ValueError as error:
        out["bad"] = str(error)
    return out


def diverge_rank(rank: int, world: int, kind: str, **options) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from nnschemaparser import NNParser
    from nnschemaparser.distributed import diverge_logical

    if kind.startswith("llama"):
        return _llama_rank(rank, world, kind, **options)
    model = block().eval()
    reference = block().eval()
    if kind == "2d":  # FSDP2 x tensor parallel on a 2 x 2 mesh (4 ranks)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan())
        for layer in (model.attn, model.mlp):
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        x = _inputs(100 + mesh["dp"].get_local_rank())
        whole = torch.cat([_inputs(100 + r) for r in range(2)])
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        for layer in (model.attn, model.mlp):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x = _inputs(100 + rank)  # each rank its own batch: the reference runs on both
        whole = torch.cat([_inputs(100 + r) for r in range(world)])
    else:
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        plan = tp_plan()
        if kind == "tp_bf16_reduce":
            plan["mlp.down"] = _bf16_reduce_rowwise()
        parallelize_module(model, mesh, plan)
        if kind == "tp_scaled_rank" and rank == 1:
            model.mlp.up.register_forward_hook(lambda module, args, out: out * 1.01)
        x = whole = _inputs(100)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    report = diverge_logical(schema, {"x": x}, reference, mesh=mesh, **options)
    out = _result(rank, report)
    if rank == 0 and kind in ("fsdp", "2d"):  # the reference saw the whole batch: the two halves joined
        out["whole_shape"] = list(report.side_a["inputs"]["x"].shape)
        out["whole_equal"] = bool(torch.equal(report.side_a["inputs"]["x"], whole))
    return out


def _llama_rank(rank: int, world: int, kind: str, **options) -> dict:
    """A tiny transformers Llama (tests/support/logical_lab.py): FSDP2 per layer (`llama_fsdp`, each
    rank its own ids), or tensor parallel on q/k/v/o and gate/up/down of both layers (`llama_tp`),
    layer 1's `down_proj` rounding its partial sums to bfloat16 (`llama_tp_bf16_reduce`)."""
    from torch.distributed.device_mesh import init_device_mesh

    from nnschemaparser import NNParser
    from nnschemaparser.distributed import diverge_logical
    from tests.support.logical_lab import build_model, rank_ids

    model, reference = build_model(), build_model()
    if kind == "llama_fsdp":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ids = rank_ids(rank)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        plan = {}
        for i in range(len(model.model.layers)):
            for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
                plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
        if kind == "llama_tp_bf16_reduce":
            plan["model.layers.1.mlp.down_proj"] = _bf16_reduce_rowwise()
        parallelize_module(model, mesh, plan)
        ids = rank_ids(0)
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    report = diverge_logical(schema, {"input_ids": ids}, reference, mesh=mesh, **options)
    return _result(rank, report)


def _result(rank: int, report) -> dict:
    """What a rank returns: rank 0 its report's rows (NaN as None), first and summary."""
    if rank != 0:
        return {"rank": rank, "report": report is None}
    rows = []
    for row in report.table.to_dict(orient="records"):
        rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    first = report.first
    return {"rank": rank, "rows": rows, "first": None if first is None else
            {"block_path": first.block_path, "line": first.line, "source": first.source, "out_var": first.out_var,
             "file": first.file}, "summary": report.summary(), "memory": report.memory}
