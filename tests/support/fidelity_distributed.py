"""The worker of the distributed wrapper tests: one rank of a 2-process `gloo` group on 127.0.0.1.

Each rank wraps the same `Small` model (DistributedDataParallel, or FSDP2's `fully_shard` on every
layer and the root), then checks parse, `run`, `capture_run`, `step_run` and the gradients after
backward (all-reduced or reduce-scattered by the wrapper) against eager, bit for bit. A rank that
finishes writes `rank<N>.json` into `out_dir`; any failure raises, and `spawn` reports it.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.support.fidelity_models import Small, gradients_match, run_every_way

TIMEOUT = datetime.timedelta(seconds=60)


def wrap(kind: str, model: nn.Module) -> nn.Module:
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    return model


def worker(rank: int, world: int, port: int, kind: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        torch.manual_seed(0)  # the same weights on every rank, as a real launch has
        model = wrap(kind, Small())
        torch.manual_seed(100 + rank)  # a different batch per rank
        inputs = {"x": torch.randn(3, 4, requires_grad=True)}
        schema, steps = run_every_way(model, inputs, twin=False)
        compared = gradients_match(model, inputs, schema=schema)
        interpreted = sorted({s.block_path for s in steps})
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
            "root": schema.name, "skipped": schema.skipped, "skip_reason": schema.skip_reason,
            "interpreted": interpreted, "gradients": compared}))
        dist.barrier()  # no rank tears its group down while the other still talks to it
    finally:
        dist.destroy_process_group()
    # A rank that finished leaves at once: a normal interpreter exit runs the C++ destructors of
    # gloo's threads, which now and then abort the process ("terminate called without an active
    # exception", SIGABRT) after its work is done and written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
