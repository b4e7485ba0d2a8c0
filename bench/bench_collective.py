"""The cost of collective stepping (issue 25): one all_reduce per step, against a local stepped run.

    python bench/bench_collective.py [--rounds 2000] [--repeat 3]

Two gloo processes on 127.0.0.1 each run a loop of `--rounds` steps three ways, side by side in one
launch: a plain schema run, a local `step_run` iterated to the end, and a `collective_step_run` three
ways: `finish()` (one agreement, at the end), `continue_()` to a place breakpoint on the last step
(agreed at the start of the Continue and at the stop) and `continue_()` with a NaN breakpoint (a
breakpoint on values: every step agreed by both ranks). Prints, per rank, the medians over
`--repeat` of CPU time (this process) and wall time per step in microseconds, and the ratios to the
local stepped run. The machine may be shared: read it with its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nnschemaparser import NNParser, SchemaInterpreter, collective_step_run  # noqa: E402


class Loop(nn.Module):
    def __init__(self, rounds: int):
        super().__init__()
        self.rounds = rounds

    def forward(self, x):
        h = x
        for _ in range(self.rounds):
            h = h * 0.5 + 1.0
        return h


def _timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def _rank(rank: int, port: int, rounds: int, repeat: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    x = torch.rand(4, 4)
    schema = NNParser.parse_model(Loop(rounds), inputs_tensors_values={"x": x})

    def local():
        for _ in SchemaInterpreter().step_run(schema, {"x": x}):
            pass

    def collective(kind: str):
        def go():
            with collective_step_run(schema, {"x": x}, name="bench") as run:
                if kind == "finish":
                    run.finish()
                    return
                if kind == "nan":
                    run.break_on_nonfinite()  # on values: every step agreed
                else:
                    run.break_at(step=steps)  # on a place, the same on both ranks: agreed at the stop only
                while run.continue_() is not None:
                    pass
        return go

    steps = sum(1 for _ in SchemaInterpreter().step_run(schema, {"x": x}))
    figures = {}
    for name, fn in (("plain run", lambda: SchemaInterpreter().run(schema, {"x": x})), ("local step_run", local),
                     ("collective finish", collective("finish")), ("continue, place bp", collective("place")),
                     ("continue, NaN bp", collective("nan"))):
        dist.barrier()
        runs = [_timed(fn) for _ in range(repeat)]
        figures[name] = {"cpu_us_per_step": statistics.median(c for c, _ in runs) / steps * 1e6,
                         "wall_us_per_step": statistics.median(w for _, w in runs) / steps * 1e6}
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": steps, "figures": figures}))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(port, args.rounds, args.repeat, out), nprocs=2, start_method="spawn")
        for rank in range(2):
            result = json.loads(Path(out, f"rank{rank}.json").read_text())
            figures = result["figures"]
            print(f"rank {rank}: {result['steps']} steps")
            for name, f in figures.items():
                print(f"  {name:20s} {f['cpu_us_per_step']:8.1f} us CPU/step  {f['wall_us_per_step']:8.1f} us wall/step")
            local = figures["local step_run"]["cpu_us_per_step"]
            ratios = ", ".join(f"{name} {figures[name]['cpu_us_per_step'] / local:.1f}x"
                               for name in ("collective finish", "continue, place bp", "continue, NaN bp"))
            print(f"  against the local stepped run (CPU): {ratios}")


if __name__ == "__main__":
    main()
