"""Dispatch-bound real models: run, step_run and capture_run against eager, side by side in one process.

    python bench/bench_dispatch.py [--rounds N] [--quick] [--models llama,mixtral,vit,resnet] [--no-memory]
                                   [--timer wall|cpu]

The suite (bench/models.py): a 32-layer tiny `transformers` Llama (hidden 64, 16 tokens), a 12-layer
tiny Mixtral (4 experts, top-2 routing in Python), a tiny ViT (12 layers, hidden 64, 65 tokens) and
a 24-block ResNet-style CNN at batch 1; small configs with many layers and lots of Python around
the ops (decorators, kwargs, masks), built from their config classes with eager attention.

One thread (`torch.set_num_threads(1)`), torch.no_grad(). For each model the candidates are timed in
interleaved rounds; a ratio is the median over rounds of the candidate's time divided by eager's
time in the same round (so it holds up on a machine whose load drifts), and the spread is the
lowest and highest of those per-round ratios:

  eager        model(**inputs)
  run          SchemaInterpreter().call(schema, **inputs): the plain program
  step_run     every step of SchemaInterpreter().step_run(schema, inputs), iterated to the end
  capture_run  nnschemaparser.capture_run: one TraceStep per intermediate tensor, values kept
  hooks+clone  a forward hook on every module cloning its tensor outputs (bench_capture.HookCapture)
  TorchLens    torchlens.trace saving every layer, where torchlens is installed
  nnsight      saving the output of every module of the first ModuleList, where nnsight is installed

Before timing, the outputs of run, step_run and capture_run are checked torch.equal to eager's.
Targets: run <= 1.10x, capture_run <= 2.0x (and <= 1.5x hooks+clone), step_run <= 2.5x.

Memory: capture_run and hooks+clone are repeated in a fresh subprocess that samples the C heap in
use (glibc mallinfo2, as bench_capture.py does); the table gives the growth still in use with the
result alive over the bytes of the distinct storages the result holds (target <= 1.1x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture import HookCapture, _distinct_bytes, _heap_reader, sampled_call, same, torchlens_runner  # noqa: E402
from models import small_resnet, tiny_llama, tiny_mixtral, tiny_vit  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.traces.record import capture_run  # noqa: E402

MODELS = {"llama": ("Llama 32x64, 16 tokens", tiny_llama, 3),
          "mixtral": ("Mixtral 12x64, 4 experts, 16 tok", tiny_mixtral, 3),
          "vit": ("ViT 12x64, 32x32 image", tiny_vit, 3),
          "resnet": ("ResNet 24 blocks, 32x32, batch 1", small_resnet, 3)}
TARGETS = {"run": 1.10, "step_run": 2.5, "capture_run": 2.0}
CAPTURE_OVER_HOOKS = 1.5
MEMORY_TARGET = 1.1


def build(key: str):
    _, factory, inner = MODELS[key]
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    return model, inputs, schema, inner


def single(result):
    return result[0] if len(result) == 1 else tuple(result)


def step_through(interpreter: SchemaInterpreter, schema, inputs: dict):
    steps = 0
    for _ in interpreter.step_run(schema, dict(inputs)):
        steps += 1
    return interpreter.step_outputs, steps


def nnsight_runner(model, inputs):
    """Save every module output of the model's first ModuleList with nnsight, where it is installed."""
    try:
        from nnsight import NNsight
    except ImportError:
        return None
    layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), None)
    if layers is None:
        return None
    wrapped = NNsight(model)
    names = [name for name, m in model.named_modules() if m is layers]
    proxy_layers = wrapped
    for part in names[0].split("."):
        proxy_layers = getattr(proxy_layers, part)

    def run():
        with wrapped.trace(**inputs):
            saved = [layer.output.save() for layer in proxy_layers]
        return saved

    return run


def candidates_for(model, inputs, schema):
    interpreter = SchemaInterpreter()
    stepper = SchemaInterpreter()
    hooks = HookCapture(model)
    found = {"eager": lambda: model(**inputs),
             "run": lambda: interpreter.call(schema, **inputs),
             "step_run": lambda: step_through(stepper, schema, inputs),
             "capture_run": lambda: capture_run(schema, dict(inputs)),
             "hooks+clone": lambda: hooks.run(inputs)}
    return found, hooks


CLOCK = time.perf_counter  # --timer cpu: time.thread_time, the CPU time of this (the only working) thread


def timed(fn, inner: int) -> float:
    start = CLOCK()
    for _ in range(inner):
        fn()
    return (CLOCK() - start) / inner


def interleaved(candidates: dict, rounds: int, inner: int) -> dict:
    """Per candidate: median time, and the median, lowest and highest of its per-round ratio to eager."""
    for fn in candidates.values():
        timed(fn, 1)
    samples = {k: [] for k in candidates}
    for _ in range(rounds):
        for key, fn in candidates.items():
            samples[key].append(timed(fn, inner))
    out = {}
    for key, times in samples.items():
        ratios = [x / e for x, e in zip(times, samples["eager"])]
        out[key] = {"median": statistics.median(times), "ratio": statistics.median(ratios),
                    "low": min(ratios), "high": max(ratios)}
    return out


def bench(key: str, rounds: int, with_others: bool) -> dict:
    model, inputs, schema, inner = build(key)
    candidates, hooks = candidates_for(model, inputs, schema)
    with torch.no_grad():
        eager_out = model(**inputs)
        record = capture_run(schema, dict(inputs))
        run_out = SchemaInterpreter().call(schema, **inputs)
        step_out, steps = step_through(SchemaInterpreter(), schema, inputs)
        exact = {"run": same(eager_out, run_out), "step_run": same(eager_out, single(step_out)),
                 "capture_run": same(eager_out, single(record.outputs))}
        captured = len(record.trace)
        del record
        results = interleaved(candidates, rounds, inner)
        hooked = len(hooks.values)
        if with_others:
            for name, make in (("TorchLens", torchlens_runner), ("nnsight", nnsight_runner)):
                try:
                    runner = make(model, inputs)
                    if runner is not None:
                        other = interleaved({"eager": candidates["eager"], name: runner}, max(1, rounds // 3), 1)
                        results[name] = other[name]
                except Exception as exc:  # a third-party tool failing on a model is a finding, not a crash
                    results[name] = {"error": f"{type(exc).__name__}: {exc}"[:80]}
    return {"key": key, "name": MODELS[key][0], "exact": exact, "steps": steps, "captured": captured,
            "hooked": hooked, "results": results, "blocks": sum(1 for _ in schema.iter_blocks()),
            "skipped": len(schema.skipped)}


# --- memory probe (runs in a child process) ----------------------------------------------------

def memory_probe(key: str, method: str) -> dict:
    model, inputs, schema, _ = build(key)
    candidates, hooks = candidates_for(model, inputs, schema)
    run = candidates[method]
    reading, what = _heap_reader()
    with torch.no_grad():
        run()  # warm-up: lazy initialisation and compiled programs are not part of the capture
        hooks.values = []
        result, peak_growth, retained = sampled_call(run, reading)
    if method == "capture_run":
        kept = _distinct_bytes(step.tensor.value for step in result.trace.steps)
    else:
        kept = _distinct_bytes(hooks.values)
    return {"peak_growth": peak_growth, "retained": retained, "distinct_bytes": kept, "measure": what}


def probe_in_child(key: str, method: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--memory-probe", key, method], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cell(results: dict, name: str) -> str:
    entry = results.get(name)
    if entry is None:
        return f"{'n/a':>17s}"
    if "error" in entry:
        return f"{'failed':>17s}"
    return f"{entry['ratio']:5.2f}x ({entry['low']:.2f}-{entry['high']:.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-others", action="store_true", help="skip TorchLens and nnsight even if installed")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--timer", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter (default); cpu: time.thread_time, which leaves out the time "
                             "the process waits for a core on a shared machine (one thread does all the work)")
    parser.add_argument("--memory-probe", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    global CLOCK
    CLOCK = time.thread_time if args.timer == "cpu" else time.perf_counter
    if args.memory_probe:
        print(json.dumps(memory_probe(*args.memory_probe)))
        return 0
    rounds = 3 if args.quick else args.rounds
    keys = [k for k in args.models.split(",") if k]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    load_start = os.getloadavg()[0]
    rows = [bench(key, rounds, not args.no_others) for key in keys]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, {rounds} rounds, torch.no_grad(), "
          f"{args.timer} time, 1-minute load average {load_start:.2f} before / {os.getloadavg()[0]:.2f} after; "
          "ratio to eager: median over rounds (lowest-highest)")
    columns = ["run", "step_run", "capture_run", "hooks+clone", "TorchLens", "nnsight"]
    print(f"{'model':33s} {'eager ms':>8s} " + " ".join(f"{c:>17s}" for c in columns) + "  exact  steps/captured/hooked")
    ok = True
    for row in rows:
        res = row["results"]
        ok = ok and all(row["exact"].values())
        print(f"{row['name']:33s} {res['eager']['median'] * 1e3:8.2f} " + " ".join(cell(res, c) for c in columns)
              + f"  {str(all(row['exact'].values())):5s}  {row['steps']}/{row['captured']}/{row['hooked']}")
    print()
    print("targets: " + ", ".join(f"{k} <= {v:.2f}x" for k, v in TARGETS.items())
          + f", capture_run <= {CAPTURE_OVER_HOOKS}x hooks+clone")
    for row in rows:
        res = row["results"]
        missed = [f"{k} {res[k]['ratio']:.2f}x" for k, v in TARGETS.items() if res[k]["ratio"] > v]
        over_hooks = res["capture_run"]["median"] / res["hooks+clone"]["median"]
        if over_hooks > CAPTURE_OVER_HOOKS:
            missed.append(f"capture_run {over_hooks:.2f}x hooks+clone")
        bad = [k for k, v in row["exact"].items() if not v]
        print(f"  {row['name']:33s} " + ("meets every target" if not missed else "MISSES " + "; ".join(missed))
              + (f"; NOT EXACT: {', '.join(bad)}" if bad else ""))
    if not args.no_memory:
        print()
        print(f"{'model':33s} {'method':12s} {'peak MiB':>9s} {'retained':>9s} {'distinct':>9s} {'ratio':>6s}   "
              "(C heap growth over its size before the call; retained = still in use with the result alive; "
              "distinct = bytes of the distinct storages the result keeps; ratio = retained / distinct)")
        for row in rows:
            for method in ("hooks+clone", "capture_run"):
                mem = probe_in_child(row["key"], method)
                if mem["measure"] != "C heap in use":
                    print(f"  (measured as {mem['measure']}: mallinfo2 is not available here)")
                ratio = mem["retained"] / mem["distinct_bytes"] if mem["distinct_bytes"] else float("nan")
                flag = "" if method != "capture_run" or ratio <= MEMORY_TARGET else "  MISSES <= 1.1x"
                print(f"{row['name']:33s} {method:12s} {mem['peak_growth'] / 2**20:9.3f} {mem['retained'] / 2**20:9.3f} "
                      f"{mem['distinct_bytes'] / 2**20:9.3f} {ratio:5.2f}x{flag}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
