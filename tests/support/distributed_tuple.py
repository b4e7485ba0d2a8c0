"""The worker of tests/distributed/test_logical_tuple_results.py: an FSDP2 block whose forward splits
a tensor with an op that returns a tuple (`chunk`, as a gated MLP does; transformers' `q, k =
apply_rotary_pos_emb(...)` is the same shape of code), captured with `capture_logical` on 2 gloo
ranks and compared with one process on the whole batch. Run by tests.support.collective_group."""

from __future__ import annotations

import torch
from torch import nn

BATCH, SEQ, WIDTH = 2, 4, 16


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(torch.sigmoid(gate) * value)


def _model() -> Gated:
    torch.manual_seed(0)
    return Gated()


def _inputs(rank: int) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, WIDTH, generator=torch.Generator().manual_seed(300 + rank))


def tuple_parts(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from nnschemaparser import NNParser, capture_run
    from nnschemaparser.distributed import capture_logical, compare_logical

    model = _model()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    fully_shard(model.up, mesh=mesh)
    fully_shard(model, mesh=mesh)
    mine = _inputs(rank)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": mine})
    record = capture_logical(schema, {"x": mine}, mesh=mesh)
    whole = torch.cat([_inputs(r) for r in range(world)])
    reference = capture_run(NNParser.parse_model(_model(), inputs_tensors_values={"x": whole}), {"x": whole})
    table = compare_logical(record.trace, reference.trace)
    trace = record.trace
    return {"steps": [{"var": s.out_var, "badge": trace.placements[s.step].badge(),
                       "source": trace.placements[s.step].source} for s in trace.steps],
            "table": table[["variable", "placement", "exact", "max_abs_diff", "reason"]].to_dict(orient="records")}
