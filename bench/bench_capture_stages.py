"""Where a capture's time goes: capture_run with one stage at a time replaced by a no-op, side by side.

    python bench/bench_capture_stages.py [--model llama|mixtral|vit|resnet] [--rounds N]

One thread, torch.no_grad(), CPU time of the thread (time.thread_time, so waiting for a core on a
shared machine does not count), interleaved rounds of 3 calls each; a ratio is the median over
rounds of the candidate's time over eager's in the same round. The candidates, each adding a stage:

  run                              the plain program (no observer)
  observer, listener does nothing  the observed program; its one listener's direct hook returns at once
  recorder without records         ActivationRecorder with `_add` a no-op (descriptions, frame, path)
  records, values not kept         the record per tensor is written, its value dropped at once
  capture_run                      everything (the GC paused, as capture_run does)
  capture_run + trace.steps        and the TraceSteps built by reading the trace
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import small_resnet, tiny_llama, tiny_mixtral, tiny_vit  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.runtime.listeners import TraceListener  # noqa: E402
from nnschemaparser.traces.record import capture_run  # noqa: E402
from nnschemaparser.traces.recorder import ActivationRecorder  # noqa: E402

FACTORIES = {"llama": tiny_llama, "mixtral": tiny_mixtral, "vit": tiny_vit, "resnet": small_resnet}


class Nothing(TraceListener):
    every_instruction = False

    def tensor_result_hook(self):
        return lambda instr, frame, observer: None


class NoRecords(ActivationRecorder):
    def _add(self, *args):
        pass


class NoValues(ActivationRecorder):
    def _add(self, tensor, *args):
        super()._add(tensor, *args)
        self._records[-1][6] = None  # the value slot of the record (see ActivationRecorder._add)


def observed(schema, inputs, make):
    def run():
        gc.disable()
        try:
            SchemaInterpreter(listeners=[make()]).run(block=schema, scope=dict(inputs))
        finally:
            gc.enable()
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(FACTORIES), default="llama")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = FACTORIES[args.model]()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    candidates = {
        "eager": lambda: model(**inputs),
        "run": lambda: SchemaInterpreter().call(schema, **inputs),
        "observer, listener does nothing": observed(schema, inputs, Nothing),
        "recorder without records": observed(schema, inputs, NoRecords),
        "records, values not kept": observed(schema, inputs, NoValues),
        "capture_run": lambda: capture_run(schema, dict(inputs)),
        "capture_run + trace.steps": lambda: capture_run(schema, dict(inputs)).trace.steps,
    }
    load = os.getloadavg()[0]
    with torch.no_grad():
        for fn in candidates.values():
            fn()
        samples: dict = {k: [] for k in candidates}
        for _ in range(args.rounds):
            for key, fn in candidates.items():
                start = time.thread_time()
                for _ in range(3):
                    fn()
                samples[key].append((time.thread_time() - start) / 3)
    print(f"{args.model}: {args.rounds} rounds, CPU time, 1-minute load average {load:.2f} before / "
          f"{os.getloadavg()[0]:.2f} after; eager {statistics.median(samples['eager']) * 1e3:.2f} ms")
    for key, times in samples.items():
        ratios = [t / e for t, e in zip(times, samples["eager"])]
        print(f"  {key:34s} {statistics.median(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
