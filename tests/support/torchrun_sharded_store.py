"""Run by tests/store/test_sharded_store.py under `torchrun --nproc-per-node 2`: a tiny Llama sharded by
transformers' own tensor parallelism (`from_pretrained(folder, tp_plan="auto")`, offline) fills a store
with `capture_sharded_dataset`; each rank notes what it returned, and rank 0 the placement of every
step of the first input (container id -> whether a sum over shards made it), for the comparison.
Then the same weights sharded by FSDP2 fill a second store (`STORE.fsdp`).

usage: torchrun --nproc-per-node 2 torchrun_sharded_store.py MODEL_FOLDER STORE OUT_PREFIX
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
warnings.filterwarnings("ignore")

from transformers import AutoModel  # noqa: E402

from nnschemaparser import NNParser, capture_dataset, capture_logical, capture_sharded_dataset  # noqa: E402
from tests.support.sharded_store import KEEP, batches  # noqa: E402

folder, store, out = sys.argv[1:4]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = AutoModel.from_pretrained(folder, tp_plan="auto").eval()
data = batches()
schema = NNParser.parse_model(model, inputs_tensors_values=data[0])
try:  # capture_dataset would split the inputs over the ranks: refused, naming what to call
    capture_dataset(schema, data, store + ".refused", keep=KEEP, progress=False)
    refused = "nothing raised"
except Exception as exc:  # noqa: BLE001 - the test reads what it was
    refused = f"{type(exc).__name__}: {exc}"
if rank == 0:
    with open(out + ".refused", "w") as handle:
        handle.write(refused)
written = capture_sharded_dataset(schema, data, store, keep=KEEP, block_size=2, progress=False)
with torch.no_grad():
    trace = capture_logical(schema, data[0]).trace
if rank == 0:
    reduced = {s.container_id: trace.placement(s.container_id).reduced for s in trace.steps}
    with open(out + ".reduced.json", "w") as handle:
        json.dump(reduced, handle)
# the same store from the unsharded weights under FSDP2 (every rank given the same rows, replicated)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

fsdp = AutoModel.from_pretrained(folder).eval()
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
for layer in fsdp.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(fsdp, mesh=mesh)
fsdp_schema = NNParser.parse_model(fsdp, inputs_tensors_values=data[0])
capture_sharded_dataset(fsdp_schema, data, store + ".fsdp", keep=KEEP, block_size=2, progress=False)
with open(f"{out}.rank{rank}", "w") as handle:  # not stdout: torchrun interleaves it
    handle.write(str(len(written)))
dist.barrier()
os._exit(0)  # as the project's gloo workers do: no gloo thread destructors at exit
