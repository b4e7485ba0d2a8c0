"""A sharded transformers model for the Logical view in JupyterLab (tests/browser/e2e_logical.ipynb).

A tiny Llama (built from `LlamaConfig`, random weights, offline) sharded with FSDP2 over a gloo group
of 2 on 127.0.0.1. The notebook kernel is rank 0: `start_group(port)` spawns rank 1 as a child
process (`python -m tests.support.logical_lab RANK WORLD PORT`), then both ranks run `run_rank`:
parse, `capture_logical` on this rank's batch, a one-process reference run of the unsharded model
on the whole batch, `widget.show_logical(trace, reference=...)` (a collective), a barrier, and the
group is torn down. Rank 1 then leaves; rank 0's widget keeps the view.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

WORLD = 2
TIMEOUT = datetime.timedelta(seconds=60)
ROOT = Path(__file__).resolve().parents[2]


def build_model():
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def rank_ids(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(200 + rank)
    return torch.randint(0, 64, (1, 6), generator=generator)


def shard(model):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return mesh


def run_rank(rank: int, port: int):
    """Join the group as `rank`, capture and show the logical view; returns (widget, record)."""
    from nnschemaparser import NNParser, capture_run
    from nnschemaparser.distributed import capture_logical
    from nnschemaparser.widget import InspectorWidget

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=TIMEOUT)
    try:
        model = build_model()
        mesh = shard(model)
        mine = rank_ids(rank)
        whole = torch.cat([rank_ids(r) for r in range(WORLD)])
        schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": mine})
        record = capture_logical(schema, {"input_ids": mine}, mesh=mesh)
        reference = capture_run(NNParser.parse_model(build_model(), inputs_tensors_values={"input_ids": whole}),
                                {"input_ids": whole})
        widget = InspectorWidget(schema, scope={"input_ids": mine}, title="tiny Llama, FSDP2 over 2 ranks")
        widget.show_logical(record.trace, reference=reference.trace)  # a collective: every rank calls it
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return widget, record


def start_group(port: int) -> subprocess.Popen:
    """Rank 1 as a child process of the notebook kernel (rank 0)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "tests.support.logical_lab", "1", str(port)], cwd=str(ROOT), env=env)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_rank(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)  # gloo's destructors can abort a normal exit (tests/support/distributed_logical.py)
