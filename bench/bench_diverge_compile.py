"""Planted faults in compiled models: does `compiled_local_errors` name the planted line?

    python bench/bench_diverge_compile.py [--only NAME] [--no-inductor]

Runs every case of `bench/diverge_compile_cases.py` once: parses model_a, runs
`nnschemaparser.traces.diverge_compile.compiled_local_errors`, and compares the first flagged row's
(file, line) with the planted one; a fault-free pair must flag nothing. Prints a line per case (what
was flagged, the smallest region, the time: total, of which compiling (regions, and model_b's own
first run), the model's eager run for scale) and the two fractions. Times are wall-clock seconds
on one torch thread (compiles are not CPU-bound alone: inductor runs a C++ compiler), each case
once, the parse not counted; the eager run is the fastest of 5.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from diverge_compile_cases import CASES  # noqa: E402

from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.traces.diverge_compile import compiled_local_errors  # noqa: E402


def run_case(case) -> dict:
    model_a, model_b, inputs, expected = case()
    schema = NNParser.parse_model(model=model_a, inputs_tensors_values=inputs)
    with torch.no_grad():
        model_a(**inputs)  # warm
        eager_s = math.inf
        for _ in range(5):
            start = time.perf_counter()
            model_a(**inputs)
            eager_s = min(eager_s, time.perf_counter() - start)
    timings: dict = {}
    rows = compiled_local_errors(schema, model_a, model_b, inputs, timings=timings)
    first = next((row for row in rows if row["flagged"]), None)
    got = (first["file"], first["line"]) if first is not None else None
    return {"name": case.__name__, "expected": expected, "got": got, "ok": got == expected,
            "region": first["region"] if first is not None else "", "total_s": timings["total_s"],
            "compile_s": timings["compile_s"] + timings["model_b_s"], "regions": timings["regions"], "eager_s": eager_s}


def where(place) -> str:
    return "nothing" if place is None else f"{os.path.basename(place[0])}:{place[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--no-inductor", action="store_true", help="leave out the inductor case (a minute cold)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models: a second thread only contends on a shared machine
    cases = [c for c in CASES if (args.only is None or args.only in c.__name__)
             and not (args.no_inductor and "inductor" in c.__name__)]
    results = []
    for case in cases:
        result = run_case(case)
        results.append(result)
        print(f"{result['name']:32s} {'ok ' if result['ok'] else 'BAD'} expected {where(result['expected']):24s} "
              f"flagged {where(result['got']):24s} {result['total_s']:6.1f} s (compile {result['compile_s']:5.1f} s, "
              f"{result['regions']:2d} regions; eager run {1e3 * result['eager_s']:.2f} ms)  {result['region']}",
              flush=True)
    faults = [r for r in results if r["expected"] is not None]
    clean = [r for r in results if r["expected"] is None]
    if faults:
        print(f"planted line named first: {sum(r['ok'] for r in faults)}/{len(faults)} "
              f"({100 * sum(r['ok'] for r in faults) / len(faults):.0f}%)")
    if clean:
        print(f"fault-free pairs with nothing flagged: {sum(r['ok'] for r in clean)}/{len(clean)} "
              f"({100 * sum(r['ok'] for r in clean) / len(clean):.0f}%)")
    if results:
        total = [r["total_s"] for r in results]
        rest = [r["total_s"] - r["compile_s"] for r in results]
        print(f"per case: median {statistics.median(total):.1f} s, max {max(total):.1f} s; "
              f"without compiling median {statistics.median(rest):.1f} s")


if __name__ == "__main__":
    main()
