"""The inspector as a debugger on a 32-layer tiny Llama (issue 11): search, Continue to a breakpoint
in the last layer, the step round trip, and the initial widget state.

    python bench/bench_debugger.py [--layers 32] [--repeat 5]

Budgets: search < 100 ms; Continue to a breakpoint on entry of the last layer's attention at most
3x a plain `capture_run` of the whole model (no gradients); a step round trip (the Step message
handled with its histograms, the changed traits serialized) < 100 ms; initial state < 100 KB (the tree sent lazily, issue 22).
Medians over `--repeat` runs; the machine may be shared, so read the figures with its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.debugger_models import llama_case  # noqa: E402

from nnschemaparser.traces.record import capture_run  # noqa: E402
from nnschemaparser.widget import InspectorState, InspectorWidget  # noqa: E402


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    _, inputs, schema = llama_case(args.layers)
    last = f"model.layers.{args.layers - 1}.self_attn"

    state = InspectorState(schema, inputs)
    start = time.perf_counter()
    state.search(last)  # the first search also builds the tree's search index
    cold_ms = (time.perf_counter() - start) * 1e3
    queries = [last, "key_states", "softmax", "rotary", "layers.7.mlp"]
    search_ms = max(_median_ms(lambda q=q: state.search(q), args.repeat) for q in queries)
    print(f"search over {len(state.tree)} tree nodes: worst median {search_ms:.1f} ms over {queries}"
          f" (first search, index built: {cold_ms:.1f} ms)  budget 100 ms: "
          f"{'ok' if max(search_ms, cold_ms) < 100 else 'OVER'}")

    with torch.no_grad():
        capture_ms = _median_ms(lambda: capture_run(schema, dict(inputs)), args.repeat)

    def to_breakpoint() -> None:
        run = InspectorState(schema, inputs)
        run.break_at(last)
        run.continue_()
        assert run.current.block_path == last, run.current.block_path
        run.close()

    continue_ms = _median_ms(to_breakpoint, args.repeat)
    ratio = continue_ms / capture_ms
    print(f"Continue to entry of {last}: {continue_ms:.0f} ms; plain capture_run {capture_ms:.0f} ms; "
          f"ratio {ratio:.2f}  budget 3x: {'ok' if ratio <= 3 else 'OVER'}")

    widget = InspectorWidget(schema, inputs)
    widget.break_at(last)
    widget.continue_()
    times = []
    for index in range(60):
        before = widget.get_state()
        start = time.perf_counter()
        widget._on_message(widget, {"type": "step", "id": index, "with_hist": True}, [])
        after = widget.get_state()
        json.dumps({k: v for k, v in after.items() if before.get(k) != v}, ensure_ascii=False)
        times.append(time.perf_counter() - start)
    step_ms = statistics.median(times) * 1e3
    print(f"step round trip in {last}, kernel side: median {step_ms:.1f} ms, max {max(times) * 1e3:.1f} ms"
          f"  budget 100 ms: {'ok' if step_ms < 100 else 'OVER'}")
    widget.close()

    fresh = InspectorWidget(schema, inputs)
    size = sum(len(json.dumps(v, ensure_ascii=False)) for v in fresh.get_state().values())
    print(f"initial widget state: {size / 1e3:.1f} KB  budget 100 KB: {'ok' if size < 100_000 else 'OVER'}")
    fresh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
