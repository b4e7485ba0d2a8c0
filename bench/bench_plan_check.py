"""The store's plan check and statistics of one input (store/statistics.py), this checkout's against another's.

    python bench/bench_plan_check.py [--before PATH] [--rounds N]

The tiny Llama of bench/models.py (32 layers, 16 tokens): four inputs captured as the store's logged columns
(`LoggedColumns.capture`: 1,853 values), a `Summariser` planned on the first; then, in interleaved rounds, the
plan check (`_Plan.matches`) and the whole call (check, kernel and table) on the others, CPU time per input,
the median and the lowest over `--rounds` rounds of 20 calls each. This checkout's summariser is handed what
its store hands it (`ColumnReads`: the columns' dtypes and shapes) when it has it. With `--before PATH` (a
checkout, e.g. /work/main), that checkout's statistics.py is loaded beside it (its C kernel built from its own
source) and timed in the same rounds, given the dtypes alone; both give the same figures (checked first).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics as stats
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import tiny_llama  # noqa: E402

import nnschemaparser.store  # noqa: E402,F401
from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.store import statistics as ours  # noqa: E402
from nnschemaparser.traces.logged_columns import LoggedColumns  # noqa: E402


def load_before(path: str):
    """The other checkout's statistics.py and native.py, as modules of this package (their relative imports of
    torch_figures and runtime resolve here; their kernel is built from their own _statistics.c)."""
    store = Path(path) / "nnschemaparser" / "store"
    modules = {}
    for name in ("native", "statistics"):
        spec = importlib.util.spec_from_file_location(f"nnschemaparser.store._before_{name}", store / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        if name == "statistics":  # its `from . import native` / `from .native import ...` take the other's native
            sys.modules["nnschemaparser.store.native"], saved = modules["native"], sys.modules["nnschemaparser.store.native"]
            try:
                spec.loader.exec_module(module)
            finally:
                sys.modules["nnschemaparser.store.native"] = saved
        else:
            spec.loader.exec_module(module)
        modules[name] = module
    return modules["statistics"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, example = tiny_llama()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    columns = LoggedColumns(schema)
    g = torch.Generator().manual_seed(0)
    runs = []
    with torch.no_grad():
        for _ in range(4):
            scope = dict(example, input_ids=torch.randint(0, model.config.vocab_size, tuple(example["input_ids"].shape),
                                                         generator=g))
            _, fields = columns.capture(scope)
            runs.append((fields[6], fields[10], fields[9]))
    reads = getattr(ours, "ColumnReads", None)
    candidates = {"this checkout": (ours.Summariser(), [(v, reads(d, s) if reads else list(d)) for v, d, s in runs])}
    if args.before:
        before = load_before(args.before)
        candidates["before"] = (before.Summariser(), [(v, list(d)) for v, d, _ in runs])
    for summariser, inputs in candidates.values():
        summariser(inputs[0][0], dtypes=inputs[0][1])
    for k in range(1, 4):  # the same figures
        tables = [s(inputs[k][0], dtypes=inputs[k][1]).table.tobytes() for s, inputs in candidates.values()]
        assert all(t == tables[0] for t in tables), "the checkouts' figures differ"
    times = {(name, what): [] for name in candidates for what in ("plan check", "statistics")}
    for r in range(args.rounds):
        k = 1 + r % 3
        for name, (summariser, inputs) in candidates.items():
            plan, (values, dtypes) = summariser.plan, inputs[k]
            shapes = getattr(dtypes, "shapes", None)
            check = (lambda: plan.matches(values, dtypes, shapes)) if shapes is not None else \
                (lambda: plan.matches(values, dtypes))
            for what, fn in (("plan check", check), ("statistics", lambda: summariser(values, dtypes=dtypes))):
                start = time.process_time()
                for _ in range(20):
                    fn()
                times[(name, what)].append((time.process_time() - start) / 20)
            plan._checked = None
    print(f"tiny Llama, {len(runs[0][0])} values an input, {args.rounds} rounds; 1-minute load {os.getloadavg()[0]:.2f}")
    for (name, what), got in times.items():
        print(f"  {name:14s} {what:11s} median {stats.median(got) * 1e3:6.3f} ms  lowest {min(got) * 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
