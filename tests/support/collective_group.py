"""Run one function on every rank of a local `gloo` group (127.0.0.1) with a hard deadline.

`run_group(target, world, out_dir, timeout)` spawns `world` processes running
`target(rank, world, out_dir, *args)` inside an initialised process group; each rank writes
`rank<N>.json` (what it saw) into `out_dir`, read back and returned in rank order. A group that does
not finish within `timeout` seconds is killed, process by process, by pid, and the test fails
saying so; a rank that exits without its file fails the test with its exit code. Nothing here can
hang CI.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.multiprocessing as mp

#: The process group's own timeout: the backstop for a wait inside a collective of the model.
GROUP_TIMEOUT = datetime.timedelta(seconds=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, target: Callable, world: int, port: int, out_dir: str, args: tuple) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=GROUP_TIMEOUT)
    result = target(rank, world, *args)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    # No destroy_process_group: a scenario may leave a collective pending on purpose (a rank that
    # failed), and a normal interpreter exit can abort in gloo's destructors. Leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_group(target: Callable, world: int, out_dir: Path, timeout: float = 120.0, args: tuple = ()) -> list[Any]:
    require_gloo()
    context = mp.start_processes(_entry, args=(target, world, free_port(), str(out_dir), args), nprocs=world,
                                 join=False, start_method="spawn")
    return wait_for_ranks(context, world, out_dir, timeout, f"the {world}-process group")


def require_gloo() -> None:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.fail("this torch build has no gloo backend for torch.distributed")


def wait_for_ranks(context: Any, world: int, out_dir: Path, timeout: float, label: str) -> list[Any]:
    """Wait for spawned ranks under a hard deadline, kill each by its pid past it, read each rank's JSON."""
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=2):
            if time.monotonic() > deadline:
                raise AssertionError(f"{label} did not finish within {timeout:.0f} s (killed)")
    finally:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, 9)
                process.join(10)
    missing = [rank for rank in range(world) if not Path(out_dir, f"rank{rank}.json").exists()]
    assert not missing, f"ranks {missing} wrote no result (exit codes {[p.exitcode for p in context.processes]})"
    return [json.loads(Path(out_dir, f"rank{rank}.json").read_text()) for rank in range(world)]
