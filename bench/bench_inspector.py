"""What an inspection costs against the eager forward, side by side in one process.

    python bench/bench_inspector.py [--rounds N]

For each model: time the eager forward, a plain schema run (parse done beforehand), and the whole
`ModelInspector` construction (parse, then the observed run with the call log, FlopCounterMode and
the producer/consumer recorder), in interleaved rounds under torch.no_grad(); report medians and
the ratios to eager. Also checks that the inspection run returns what eager returns and that the
ops' FLOPs add up to FlopCounterMode's count of the eager forward.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.parser.equality import first_mismatch  # noqa: E402
from nnschemaparser.inspection.flops import count_forward_flops  # noqa: E402
from nnschemaparser.inspection.inspector import ModelInspector  # noqa: E402
from nnschemaparser.inspection.target import load_target  # noqa: E402
from tests.support.fixture_models import FIXTURES  # noqa: E402


def bert():
    target = load_target("hf:bert")
    generator = torch.Generator().manual_seed(0)
    return target.model.eval(), {"input_ids": torch.randint(0, target.token_range, (1, 16), generator=generator)}


def fixture(name):
    def make():
        model, inputs = FIXTURES[name]()
        return model.eval(), inputs
    return make


def clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(name: str, factory, rounds: int) -> dict:
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    interpreter = SchemaInterpreter()
    inspector = ModelInspector(model, example_kwargs=inputs)
    flops, eager_result = count_forward_flops(model, kwargs=inputs)
    exact = first_mismatch(eager_result, inspector.result) is None
    flops_match = flops == sum(op.flops for op in inspector.ops) == inspector.total_flops
    times: dict[str, list[float]] = {"eager": [], "schema": [], "inspect": []}
    for _ in range(rounds):
        with torch.no_grad():
            times["eager"].append(clock(lambda: model(**inputs)))
            times["schema"].append(clock(lambda: interpreter.call(schema, **inputs)))
        times["inspect"].append(clock(lambda: ModelInspector(model, example_kwargs=inputs)))
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "ops": len(inspector.ops), "exact": exact, "flops_match": flops_match, **medians}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    cases = [("mlp", fixture("mlp")), ("resnet", fixture("resnet")), ("transformer", fixture("transformer")),
             ("hf:bert (2 layers, hidden 32)", bert)]
    print(f"{'model':32} {'ops':>5} {'exact':>6} {'flops=':>7} {'eager ms':>9} {'schema/eager':>13} "
          f"{'inspect/eager':>14}")
    ok = True
    for name, factory in cases:
        row = bench(name, factory, args.rounds)
        ok &= row["exact"] and row["flops_match"]
        print(f"{row['model']:32} {row['ops']:>5} {str(row['exact']):>6} {str(row['flops_match']):>7} "
              f"{row['eager'] * 1e3:>9.2f} {row['schema'] / row['eager']:>13.1f} {row['inspect'] / row['eager']:>14.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
