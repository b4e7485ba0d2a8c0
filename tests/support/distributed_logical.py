"""The worker of tests/distributed: one rank of a gloo group on 127.0.0.1 (2 or 4 processes).

Each kind builds the same `Block` on every rank (same seed), shards it (tensor parallel on a 1-D
mesh, FSDP2, or FSDP2 x TP on a 2-D mesh), parses it, runs `capture_logical` on this rank's inputs
and compares the gathered values with a one-process capture of the unsharded model on the whole
inputs. A rank that finishes writes `rank<N>.json` into `out_dir`; any failure raises (and the
process exits non-zero); `run_group` in tests/distributed reports it.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from tests.support.distributed_models import block, tp_plan

TIMEOUT = datetime.timedelta(seconds=60)
BATCH, SEQ, WIDTH = 2, 4, 32


def rank_inputs(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, SEQ, WIDTH, generator=generator)


def shard(kind: str, model, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    if kind in ("tp", "widget", "diverge"):
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, tp_plan())
        return mesh
    from torch.distributed.fsdp import fully_shard

    if kind == "fsdp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        for layer in (model.attn, model.mlp):  # the norm's weights stay with the root's group
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], tp_plan())
    for layer in (model.attn, model.mlp):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return mesh


def worker(rank: int, world: int, port: int, kind: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=TIMEOUT)
    code = 0
    try:
        result = run(kind, rank, world)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, default=str))
        dist.barrier()  # no rank tears its group down while another still talks to it
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        dist.destroy_process_group()
    # A rank leaves at once (see tests/support/fidelity_distributed.py: gloo's C++ destructors
    # sometimes abort a process that exits normally after its work is done).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(kind: str, rank: int, world: int) -> dict:
    from nnschemaparser import NNParser, capture_run
    from nnschemaparser.distributed import capture_logical, compare_logical

    model = block()
    mesh = shard(kind, model, world)
    if kind in ("tp", "widget", "diverge"):
        mine = rank_inputs(0)  # tensor parallel: every rank sees the same batch
        whole = mine
    else:
        dp = mesh["dp"].get_local_rank() if mesh.ndim > 1 else rank
        groups = mesh.shape[0] if mesh.ndim > 1 else world
        mine = rank_inputs(dp)
        whole = torch.cat([rank_inputs(r) for r in range(groups)])
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": mine})
    if kind == "diverge":  # a rank whose input differs: the input is not replicated, as the check finds
        mine = rank_inputs(rank)
    record = capture_logical(schema, {"x": mine}, mesh=mesh)
    reference = capture_run(NNParser.parse_model(block(), inputs_tensors_values={"x": whole}), {"x": whole})
    result = {"skipped": schema.skipped, "skip_reason": schema.skip_reason, "world": world,
              "mesh": list(mesh.mesh.shape)}
    if kind == "diverge":
        trace = record.trace
        result["placements"] = {s.container_id: [trace.placement(s.container_id).badge(),
                                                 trace.placement(s.container_id).source] for s in trace.steps}
        try:
            trace.logical("input_0001")
            result["gather_error"] = None
        except Exception as exc:
            result["gather_error"] = f"{type(exc).__name__}: {exc}"
        return result
    table = compare_logical(record.trace, reference.trace)
    result["table"] = table.to_dict(orient="records")
    frame = record.trace.logical_dataframe()
    result["frame"] = frame[["container_id", "shape", "local_shape", "placement", "mean"]].to_dict(orient="records")
    last = record.trace.steps[-1].container_id
    if record.trace.placement(last).known:
        result["output_equal"] = bool(torch.equal(record.trace.logical(last), reference.outputs[0]))
    result["sources"] = {s.container_id: record.trace.placement(s.container_id).source for s in record.trace.steps}
    if kind == "widget":
        from nnschemaparser.widget import InspectorWidget
        from nnschemaparser.widget.messages import handle_message

        widget = InspectorWidget(schema, scope={"x": mine})
        before = handle_message(widget.state, {"type": "logical", "id": 1})
        shown_before = widget.logical
        widget.show_logical(record.trace, reference=reference.trace)  # a collective, like logical(): every rank calls it
        if rank == 0:  # rank 0's widget is the one a notebook shows
            result["before"] = before
            result["logical_trait"] = [shown_before, widget.logical]
            result["widget"] = handle_message(widget.state, {"type": "logical", "id": 2})
            result["reference"] = {s.container_id: list(s.tensor.shape) for s in reference.trace.steps}
            result["reference_mean"] = {s.container_id: float(s.value.double().mean()) for s in reference.trace.steps}
    return result
