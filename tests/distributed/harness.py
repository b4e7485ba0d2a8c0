"""Spawns a gloo group on 127.0.0.1 for one test: a free port, a hard timeout, every process killed
by its pid when the group fails or runs late, and each rank's JSON result read back."""

from __future__ import annotations

from pathlib import Path

import torch.multiprocessing as mp

from tests.support.collective_group import free_port, require_gloo, wait_for_ranks


def run_group(kind: str, world: int, out_dir: Path, timeout: float = 180.0) -> list[dict]:
    require_gloo()
    from tests.support.distributed_logical import worker

    context = mp.start_processes(worker, args=(world, free_port(), kind, str(out_dir)), nprocs=world, join=False,
                                 start_method="spawn")
    return wait_for_ranks(context, world, out_dir, timeout, f"the {kind} group of {world}")
