"""Interpreted run time against eager, side by side in one process.

    python bench/bench_interpreter.py [--rounds N] [--quick] [--timer wall|cpu]

For each model: parse once, check the schema output is torch.equal to eager, then time eager and
the interpreter alternately (interleaved rounds, median of per-round times) under torch.no_grad().
Prints one table row per model with the ratio interpreted / eager; torch.fx's Interpreter on the
MLP stack is timed too, for reference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import gpt2_small, linear_stack  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.parser.equality import first_mismatch  # noqa: E402


CLOCK = time.perf_counter  # --timer cpu: time.thread_time on one torch thread (waiting for a core does not count)


def timed(fn, inner: int) -> float:
    start = CLOCK()
    for _ in range(inner):
        fn()
    return (CLOCK() - start) / inner


def same(a, b) -> bool:
    return first_mismatch(a, b) is None


def bench(name: str, factory, rounds: int, inner: int, with_fx: bool = False) -> dict:
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    interpreter = SchemaInterpreter()
    with torch.no_grad():
        exact = same(model(**inputs), interpreter.call(schema, **inputs))
        candidates = {"eager": lambda: model(**inputs), "schema": lambda: interpreter.call(schema, **inputs)}
        if with_fx:
            import torch.fx as fx

            graph_module = fx.symbolic_trace(model)
            fx_interp = fx.Interpreter(graph_module)
            candidates["torch.fx Interpreter"] = lambda: fx_interp.run(*inputs.values())
        for fn in candidates.values():  # warm-up
            timed(fn, max(1, inner // 4))
        samples = {k: [] for k in candidates}
        for _ in range(rounds):
            for key, fn in candidates.items():
                samples[key].append(timed(fn, inner))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return {"name": name, "exact": exact, "medians": medians,
            "blocks": sum(1 for _ in schema.iter_blocks()), "skipped": len(schema.skipped)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--timer", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter (default); cpu: time.thread_time with torch on one thread")
    args = parser.parse_args()
    global CLOCK
    if args.timer == "cpu":
        CLOCK = time.thread_time
        torch.set_num_threads(1)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    rounds = 3 if args.quick else args.rounds
    rows = [
        bench("64 x Linear(64,64)+relu, batch 1", linear_stack, rounds, 200, with_fx=True),
        bench("GPT-2 small (12x768), 64 tokens", gpt2_small, rounds, 3),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.timer} time")
    print(f"{'model':36s} {'eager ms':>9s} {'schema ms':>9s} {'ratio':>6s}  exact  other")
    for row in rows:
        m = row["medians"]
        extra = ""
        if "torch.fx Interpreter" in m:
            extra = f"torch.fx Interpreter {m['torch.fx Interpreter'] / m['eager']:.2f}x"
        print(f"{row['name']:36s} {m['eager'] * 1e3:9.3f} {m['schema'] * 1e3:9.3f} {m['schema'] / m['eager']:6.2f}x"
              f"  {str(row['exact']):5s}  {extra} (blocks {row['blocks']}, skipped {row['skipped']})")
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
