"""GPT-2 small: every capture verb against eager and forward hooks, with the page faults each one takes.

    python bench/bench_gpt2_small.py [--rounds N] [--inputs N] [--mode all|default|no-pin|retain]

GPT-2 small (bench/models.py: 124M parameters from its config, random weights, 64 tokens), one torch
thread, torch.no_grad(). Side by side in interleaved rounds of one process, each candidate's CPU time
(process time: the store's writer may use threads) over eager's in the same round, the median over
rounds (lowest-highest), and the minor page faults of one call (`ru_minflt`, median and most) and its
system time (the kernel's, mostly those faults' zeroed pages). The one-input candidates have their
rounds first, then the batch ones theirs:

  eager              model(**inputs)
  hooks+clone        a forward hook on every module cloning its tensor outputs (bench_capture.HookCapture)
  capture_run        capture_run(schema, inputs): every tensor (the logged program)
  every module out   capture_run(keep="call=**"): each module's output where its caller binds it
  step_run           every step of SchemaInterpreter().step_run, iterated to the end
  capture_run(keep)  `--inputs` inputs (8), capture_run(keep="h.1") of each, kept in memory
  capture_dataset    the same inputs and keep into a fresh store (per-step statistics of every step)

The last two are per input and also compared with each other (the target of issue 41 is
capture_dataset <= 1.3x capture_run(keep=...) on the tiny Llama). Before timing, the capture's
outputs are checked torch.equal to eager's.

`--mode default` is what a user gets: glibc's malloc as it is, and captures keeping the heap a
dropped capture freed for the next one while they run (traces/capture_memory.py: a block pinned
at the heap's top, released after 10 s without a capture or by `release_capture_memory()`);
`--mode no-pin` switches that off (`keep_capture_memory(False)`: glibc trims the freed values and the
next capture faults them in again); `--mode retain` calls `retain_freed_memory()` first
(traces/heap.py: two `mallopt` parameters, for the whole process, eager included, as a user's
process would). `--mode all` (the default) runs the three, each in a fresh process.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture import HookCapture, same  # noqa: E402
from models import gpt2_small  # noqa: E402

from nnschemaparser import (NNParser, SchemaInterpreter, capture_dataset, capture_memory_held, capture_run,  # noqa: E402
                            keep_capture_memory, retain_freed_memory)

KEEP = "h.1"


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(fn) -> tuple[float, int, float]:
    """CPU seconds, minor faults and system seconds of one call of fn."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.process_time()
    fn()
    spent = time.process_time() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return spent, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime


def candidates(model, inputs, schema, batch: list, scratch: Path) -> dict:
    hooks = HookCapture(model)
    stores = iter(range(10 ** 6))

    def step_run():
        for _ in SchemaInterpreter().step_run(schema, dict(inputs)):
            pass

    def dataset():
        path = scratch / f"s{next(stores)}"
        capture_dataset(schema, batch, path, keep=KEEP, progress=False)
        shutil.rmtree(path)

    return {"eager": (1, lambda: model(**inputs)),
            "hooks+clone": (1, lambda: hooks.run(inputs)),
            "capture_run": (1, lambda: capture_run(schema, dict(inputs))),
            "every module out": (1, lambda: capture_run(schema, dict(inputs), keep="call=**")),
            "step_run": (1, step_run),
            "eager (inputs)": (len(batch), lambda: [model(**scope) for scope in batch]),
            "capture_run(keep)": (len(batch), lambda: [capture_run(schema, dict(scope), keep=KEEP) for scope in batch]),
            "capture_dataset": (len(batch), dataset)}


def run(mode: str, rounds: int, count: int) -> None:
    torch.set_num_threads(1)
    retained = retain_freed_memory() if mode == "retain" else None
    if mode == "no-pin":
        keep_capture_memory(False)
    model, inputs = gpt2_small()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    generator = torch.Generator().manual_seed(1)
    batch = [{"input_ids": torch.randint(0, 50257, (1, 64), generator=generator)} for _ in range(count)]
    scratch = Path(tempfile.mkdtemp(prefix="bench-gpt2-"))
    try:
        with torch.no_grad():
            record = capture_run(schema, dict(inputs))
            exact = same(model(**inputs), record.outputs[0])
            steps = len(record.trace)
            del record
            table = candidates(model, inputs, schema, batch, scratch)
            samples = {key: [] for key in table}
            for group in (list(table)[:5], list(table)[5:]):  # one input, then the batch: each its own rounds
                for key in group:
                    table[key][1]()
                for _ in range(rounds):
                    for key in group:
                        per, fn = table[key]
                        spent, minflt, system = measure(fn)
                        samples[key].append((spent / per, minflt / per, system / per))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    held = capture_memory_held()
    setting = (f"retain_freed_memory() (mmap threshold {retained.mmap_threshold >> 20} MiB, trim threshold "
               f"{retained.trim_threshold >> 20} MiB)" if retained else
               "glibc malloc's defaults, keep_capture_memory(False)" if mode == "no-pin" else
               f"glibc malloc's defaults, captures' pin ({held.placed} placed, {held.placed_fails} not placed, "
               f"{held.retained_bytes / 2 ** 20:.0f} MiB kept below it at the end"
               f"{', ' + held.reason if held.reason else ''})")
    print(f"mode {mode}: {setting}; {steps} steps, capture outputs exact {exact}; 1-minute load {os.getloadavg()[0]:.2f}")
    print(f"  {'candidate':18s} {'ms':>8s}  {'over eager':>19s}  {'faults (most)':>15s}  {'sys ms':>6s}")
    for key, rows in samples.items():
        base = samples["eager (inputs)" if table[key][0] > 1 else "eager"]
        ratios = [row[0] / ref[0] for row, ref in zip(rows, base)]
        print(f"  {key:18s} {statistics.median(r[0] for r in rows) * 1e3:8.2f}  {statistics.median(ratios):5.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})  {statistics.median(r[1] for r in rows):7.0f} ({max(r[1] for r in rows):5.0f})  "
              f"{statistics.median(r[2] for r in rows) * 1e3:6.1f}")
    over = [a[0] / b[0] for a, b in zip(samples["capture_dataset"], samples["capture_run(keep)"])]
    print(f"  capture_dataset / capture_run(keep={KEEP!r}), {count} inputs: {statistics.median(over):.2f}x "
          f"({min(over):.2f}-{max(over):.2f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=8)
    parser.add_argument("--mode", choices=("all", "default", "no-pin", "retain"), default="all")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, process CPU time; ratios to eager in the "
          f"same round: median (lowest-highest); faults and sys ms: per call, median", flush=True)
    if args.mode != "all":
        run(args.mode, args.rounds, args.inputs)
        return 0
    for mode in ("default", "no-pin", "retain"):
        command = [sys.executable, __file__, "--mode", mode, "--rounds", str(args.rounds), "--inputs", str(args.inputs)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        print("\n".join(out.splitlines()[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
