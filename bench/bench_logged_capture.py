"""The write path at the recording floor: capture_run of everything, logged and observed, against eager and hooks.

    python bench/bench_logged_capture.py [--rounds N] [--models llama,mixtral,vit,resnet,gpt2] [--timer cpu|wall]
                                         [--dataset] [--inputs 32] [--before PATH]

For each model, side by side in interleaved rounds (one torch thread, torch.no_grad()), each
candidate's time over eager's in the same round, the median over rounds (lowest-highest):

  capture_run        capture_run(schema, inputs): every tensor, through the logged program (traces/logged.py)
  observed           capture_run(..., observe_all=True): the same capture, observed (the path before logged runs)
  hooks+clone        a forward hook on every module cloning its tensor outputs (bench_capture.HookCapture)
  every module out   capture_run(keep="call=**"): each block's output where its caller binds it, through
                     the kept logged program (traces/keep_plan.py)
  module out, observed  the same with observe_all=True (the observed path `keep=` ran before)

With --before PATH (a checkout of the package, e.g. `git worktree add --detach /tmp/before main`),
that checkout is imported too (bench_step_run.load_before), parses each model itself, and its
`keep="call=**"` capture is timed in the same rounds ("every module out (before)"); with `--dataset`,
its capture_dataset too ("capture_dataset (before)").

The models are bench/models.py's dispatch-bound suite (a 32-layer tiny Llama, 16 tokens; a 12-layer
tiny Mixtral; a tiny ViT; a 24-block ResNet at batch 1) and GPT-2 small at 64 tokens. Before timing,
the logged capture's outputs are checked torch.equal to eager's and its steps counted against the
observed capture's.

`--retain`: call `retain_freed_memory()` first (traces/heap.py), for the whole process, eager
included: glibc then keeps what a dropped capture freed, and the next capture reuses its pages.

`--dataset`: the tiny Llama, `--inputs` inputs (32): capture_dataset into a fresh store with
`keep="layers.1"` (statistics of every step, the layer's steps kept) against capture_run(keep="layers.1")
of the same inputs kept in memory, and against capture_run of everything (process CPU time);
`capture_dataset (records)` is the same store written the way it was before the logged run was read
as columns (capture_run and its trace's records: `LoggedColumns.capture` switched off).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture import HookCapture, same  # noqa: E402
from models import gpt2_small, small_resnet, tiny_llama, tiny_mixtral, tiny_vit  # noqa: E402

from nnschemaparser import NNParser, capture_dataset, capture_run, retain_freed_memory  # noqa: E402
from nnschemaparser.traces.logged_columns import LoggedColumns  # noqa: E402

MODELS = {"llama": ("Llama 32x64, 16 tokens", tiny_llama, 3),
          "mixtral": ("Mixtral 12x64, 4 experts", tiny_mixtral, 3),
          "vit": ("ViT 12x64", tiny_vit, 3),
          "resnet": ("ResNet 24 blocks, batch 1", small_resnet, 3),
          "gpt2": ("GPT-2 small, 64 tokens", gpt2_small, 1)}
CLOCK = time.thread_time


def timed(fn, inner: int) -> float:
    start = CLOCK()
    for _ in range(inner):
        fn()
    return (CLOCK() - start) / inner


def interleaved(candidates: dict, rounds: int, inner: int, base: str = "eager") -> dict:
    for fn in candidates.values():
        fn()
    samples = {k: [] for k in candidates}
    for _ in range(rounds):
        for key, fn in candidates.items():
            samples[key].append(timed(fn, inner))
    out = {}
    for key, times in samples.items():
        ratios = [x / e for x, e in zip(times, samples[base])]
        out[key] = (statistics.median(times), statistics.median(ratios), min(ratios), max(ratios), min(times))
    return out


BEFORE = None  # the package of --before PATH


def bench_model(key: str, rounds: int) -> None:
    name, factory, inner = MODELS[key]
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    hooks = HookCapture(model)
    with torch.no_grad():
        logged = capture_run(schema, dict(inputs))
        observed = capture_run(schema, dict(inputs), observe_all=True)
        exact = same(model(**inputs), logged.outputs[0] if len(logged.outputs) == 1 else tuple(logged.outputs))
        steps = (len(logged.trace), len(observed.trace))
        modules = len(capture_run(schema, dict(inputs), keep="call=**").trace)
        del logged, observed
        candidates = {"eager": lambda: model(**inputs),
                      "capture_run": lambda: capture_run(schema, dict(inputs)),
                      "observed": lambda: capture_run(schema, dict(inputs), observe_all=True),
                      "hooks+clone": lambda: hooks.run(inputs),
                      "every module out": lambda: capture_run(schema, dict(inputs), keep="call=**"),
                      "module out, observed": lambda: capture_run(schema, dict(inputs), keep="call=**",
                                                                  observe_all=True)}
        if BEFORE is not None:
            old = BEFORE.NNParser.parse_model(model=model, inputs_tensors_values=inputs)
            candidates["every module out (before)"] = lambda: BEFORE.capture_run(old, dict(inputs), keep="call=**")
        res = interleaved(candidates, rounds if key != "gpt2" else max(3, rounds // 2), inner)
    cells = "  ".join(f"{k} {r:5.2f}x ({lo:.2f}-{hi:.2f})" for k, (_, r, lo, hi, _) in list(res.items())[1:])
    print(f"{name:27s} eager {res['eager'][0] * 1e3:7.2f} ms  {cells}  exact {exact}  steps {steps[0]}/{steps[1]}, "
          f"module outputs {modules}, hooked {len(hooks.values)}", flush=True)


def bench_dataset(rounds: int, count: int) -> None:
    model, example = tiny_llama()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    generator = torch.Generator().manual_seed(0)
    inputs = [dict(example, input_ids=torch.randint(0, 256, tuple(example["input_ids"].shape), generator=generator))
              for _ in range(count)]
    scratch = Path(tempfile.mkdtemp(prefix="bench-logged-"))
    stores = iter(range(10 ** 6))
    keep = "layers.1"

    def store():
        path = scratch / f"s{next(stores)}"
        capture_dataset(schema, inputs, path, keep=keep, progress=False)
        shutil.rmtree(path)

    def records_store():
        capture = LoggedColumns.capture
        LoggedColumns.capture = lambda self, scope: None
        try:
            store()
        finally:
            LoggedColumns.capture = capture

    global CLOCK
    CLOCK = time.process_time  # the store's writer may work on other threads
    with torch.no_grad():
        candidates = {"eager": lambda: [model(**scope) for scope in inputs],
                      "capture_run(keep)": lambda: [capture_run(schema, dict(scope), keep=keep) for scope in inputs],
                      "capture_run": lambda: [capture_run(schema, dict(scope)) for scope in inputs],
                      "capture_dataset": store,
                      "capture_dataset (records)": records_store}
        if BEFORE is not None:
            old = BEFORE.NNParser.parse_model(model=model, inputs_tensors_values=example)

            def before_store():
                path = scratch / f"s{next(stores)}"
                BEFORE.capture_dataset(old, inputs, path, keep=keep, progress=False)
                shutil.rmtree(path)

            candidates["capture_dataset (before)"] = before_store
        try:
            res = interleaved(candidates, rounds, 1)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    over = res["capture_dataset"][0] / res["capture_run(keep)"][0]
    before = res["capture_dataset (records)"][0] / res["capture_run(keep)"][0]
    print(f"tiny Llama, {count} inputs, keep={keep!r}: eager {res['eager'][0] / count * 1e3:.2f} ms/input; over eager: "
          + "  ".join(f"{k} {r:5.2f}x ({lo:.2f}-{hi:.2f})" for k, (_, r, lo, hi, _) in list(res.items())[1:])
          + f"; capture_dataset / capture_run(keep) {over:.2f}x, with the records {before:.2f}x (medians), "
          f"{res['capture_dataset'][4] / res['capture_run(keep)'][4]:.2f}x (lowest times)", flush=True)
    if BEFORE is not None:
        print(f"  the checkout before: capture_dataset / capture_run(keep) "
              f"{res['capture_dataset (before)'][0] / res['capture_run(keep)'][0]:.2f}x; this one over it "
              f"{res['capture_dataset'][0] / res['capture_dataset (before)'][0]:.3f}x (medians), "
              f"{res['capture_dataset'][4] / res['capture_dataset (before)'][4]:.3f}x (lowest times)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--timer", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--dataset", action="store_true", help="capture_dataset against capture_run(keep=...)")
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--retain", action="store_true", help="retain_freed_memory() first (process-wide)")
    parser.add_argument("--before", metavar="PATH", help="a checkout whose keep='call=**' capture is timed alongside")
    args = parser.parse_args()
    if args.retain:
        print(f"retain_freed_memory(): {retain_freed_memory()}")
    global CLOCK, BEFORE
    if args.before:
        from bench_step_run import load_before

        BEFORE = load_before(args.before)
    CLOCK = time.thread_time if args.timer == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, {args.timer} time, 1-minute load "
          f"{os.getloadavg()[0]:.2f}; ratios to eager in the same round: median (lowest-highest)", flush=True)
    for key in [k for k in args.models.split(",") if k]:
        bench_model(key, args.rounds)
    if args.dataset:
        bench_dataset(args.rounds, args.inputs)
    print(f"1-minute load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
