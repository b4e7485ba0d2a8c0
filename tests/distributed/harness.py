"""Spawns a gloo group on 127.0.0.1 for one test: a free port, a hard timeout, every process killed
by its pid when the group fails or runs late, and each rank's JSON result read back."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(kind: str, world: int, out_dir: Path, timeout: float = 180.0) -> list[dict]:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.fail("this torch build has no gloo backend for torch.distributed")
    from tests.support.distributed_logical import worker

    context = mp.start_processes(worker, args=(world, free_port(), kind, str(out_dir)), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                raise AssertionError(f"the {kind} group of {world} did not finish within {timeout:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(world)]
