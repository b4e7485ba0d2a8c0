"""The docs/DISTRIBUTED.md recipe as a script: a tensor-parallel Block under torchrun, its logical
capture, and the comparison with one process; rank 0 writes the table as JSON to argv[1].

    torchrun --nproc-per-node 2 tests/support/torchrun_logical.py table.json
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from nnschemaparser import NNParser, capture_run
from nnschemaparser.distributed import capture_logical, compare_logical
from tests.support.distributed_models import block, tp_plan

dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; nccl on GPUs
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
model = block(seed=0)  # the same weights on every rank
parallelize_module(model, mesh, tp_plan())
x = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(1))  # the same batch on every rank
schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
record = capture_logical(schema, {"x": x}, mesh=mesh)  # every rank calls it
reference = capture_run(NNParser.parse_model(block(seed=0), inputs_tensors_values={"x": x}), {"x": x})
table = compare_logical(record.trace, reference.trace)  # a collective too: the same table on every rank
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump(table.to_dict(orient="records"), out, default=str)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # as the project's gloo workers do: no gloo thread destructors at exit
