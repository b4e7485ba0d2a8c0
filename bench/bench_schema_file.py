"""Saving and loading schema and trace files, against parsing the model anew, side by side in one run.

    python bench/bench_schema_file.py [--repeats N] [--zoo gpt2,bert,t5]

For each model: parse it, check that the schema loaded with the model runs torch.equal to eager, then
time (median of N interleaved rounds) `parse_model` (the reference), `save_schema`, `load_schema`
without the model and `load_schema(model=...)`, and print the file size and the ratio of a bound
load to a fresh parse. Then times save_trace / load_trace of an activation trace in MB/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.fixture_models import FIXTURES  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.parser.equality import first_mismatch  # noqa: E402
from nnschemaparser.traces.record import capture_run  # noqa: E402
from nnschemaparser.files.schema_file import load_schema, save_schema  # noqa: E402
from nnschemaparser.files.trace_file import load_trace, save_trace  # noqa: E402


def _clock(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_model(name: str, model, make_inputs, repeats: int, folder: Path) -> dict:
    path = folder / f"{name}.json"
    schema = NNParser.parse_model(model, inputs_tensors_values=make_inputs())
    save_schema(schema, path)
    bound = load_schema(path, model=model)
    with torch.no_grad():
        torch.manual_seed(0)
        expected = model(**make_inputs())
        torch.manual_seed(0)
        got = SchemaInterpreter().call(bound, **make_inputs())
    mismatch = first_mismatch(expected, got)
    if mismatch is not None:
        raise SystemExit(f"{name}: the loaded schema differs from eager: {mismatch}")
    times: dict[str, list[float]] = {"parse": [], "save": [], "load": [], "bind": []}
    for _ in range(repeats):
        times["parse"].append(_clock(lambda: NNParser.parse_model(model, inputs_tensors_values=make_inputs())))
        times["save"].append(_clock(lambda: save_schema(schema, path)))
        times["load"].append(_clock(lambda: load_schema(path)))
        times["bind"].append(_clock(lambda: load_schema(path, model=model)))
    row = {key: statistics.median(values) for key, values in times.items()}
    row["kib"] = path.stat().st_size / 1024
    return row


def bench_trace(repeats: int, folder: Path) -> tuple[float, float, float]:
    model, inputs = FIXTURES["unet"]()
    schema = NNParser.parse_model(model.eval(), inputs_tensors_values=inputs)
    trace = capture_run(block=schema, scope=dict(inputs)).trace
    path = folder / "trace.safetensors"
    save_trace(trace, path)
    mib = path.stat().st_size / 2 ** 20
    save = statistics.median(_clock(lambda: save_trace(trace, path)) for _ in range(repeats))
    load = statistics.median(_clock(lambda: load_trace(path)) for _ in range(repeats))
    return mib, mib / save, mib / load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--zoo", default="gpt2,bert,t5", help="comma-separated zoo case names ('' for none)")
    args = parser.parse_args()
    cases = []
    for name in sorted(FIXTURES):
        model, inputs = FIXTURES[name]()
        model.eval()
        cases.append((name, model, lambda i=inputs: {k: v.detach().clone() for k, v in i.items()}))
    if args.zoo:
        from nnschemaparser.validation.zoo import get_case

        for name in args.zoo.split(","):
            case = get_case(name)
            model = case.build()
            cases.append((name, model, lambda c=case, m=model: c.make_inputs(m)))
    print(f"{'model':14} {'KiB':>7} {'parse ms':>9} {'save ms':>8} {'load ms':>8} {'bind ms':>8} {'bind/parse':>10}")
    with tempfile.TemporaryDirectory() as folder:
        for name, model, make_inputs in cases:
            row = bench_model(name, model, make_inputs, args.repeats, Path(folder))
            print(f"{name:14} {row['kib']:7.0f} {row['parse'] * 1e3:9.1f} {row['save'] * 1e3:8.1f} "
                  f"{row['load'] * 1e3:8.1f} {row['bind'] * 1e3:8.1f} {row['bind'] / row['parse']:10.2f}")
        mib, save_rate, load_rate = bench_trace(args.repeats, Path(folder))
        print(f"trace (unet activations, {mib:.2f} MiB): save {save_rate:.0f} MiB/s, load {load_rate:.0f} MiB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
