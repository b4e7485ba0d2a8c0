"""The floor under capture_dataset: what its per-step statistics cost before anything is written.

    python bench/bench_dataset_floor.py [--model llama|gpt2] [--rounds N] [--inputs N]

capture_dataset writes statistics of every step, so each input's run must record every tensor it
binds, where capture_run(keep=...) records only what the keep names. This bench times, side by side
in interleaved rounds of one process (one torch thread, torch.no_grad(), process CPU time, each
candidate over the same round's `capture_run(keep)`, the median over rounds, lowest-highest), the
stages from that kept capture up to a whole store:

  eager                  model(**inputs), each input
  capture_run(keep)      capture_run(schema, inputs, keep=KEEP), each input: the target's reference
  capture_run            capture_run(schema, inputs): every step, its trace's records built when read (issue
                         41's first target is this <= 1.5x eager on the Llama)
  logged run, dropped    the logged program of every step (runtime/step_log.py) whose log keeps no value:
                         what writing each step down costs when the values are freed as in eager
  logged run             the logged program of every step, every value held until the run ends
  columns                the same run read as the store reads it (traces/logged_columns.py: its memory
                         check, the recorder, values, shapes and dtypes as lists)
  columns + statistics   and the statistics of every step (store/statistics.py, the C kernel), as
                         capture_dataset computes them: nothing written
  capture_dataset        the store's writer with that input (its turn: the time until it asks for the next);
                         the store's other work (commits, Parquet, shards' files, the manifest, the reader it
                         returns) is the time of a plain store of the same inputs, timed whole in the same
                         round, beyond its inputs' median turn. Then a plain store over the inputs'
                         capture_run(keep) timed whole, back to back: the target's ratio measured directly

`--model llama`: bench/models.py's tiny Llama (32 layers x 64, 16 tokens), KEEP "layers.1", 32
inputs; `--model gpt2`: GPT-2 small at 64 tokens, KEEP "h.1", 8 inputs. Issue 41's targets are
capture_dataset <= 1.3x capture_run(keep) on the Llama and <= 1.1x on GPT-2: the `columns` row is
the part of that no writer can avoid while it records every step.
"""

from __future__ import annotations

import argparse
import os
import resource
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
from bench_gpt2_small import measure  # noqa: E402
from models import gpt2_small, tiny_llama  # noqa: E402

from nnschemaparser import NNParser, capture_dataset, capture_run  # noqa: E402
from nnschemaparser.runtime.step_log import LoggingProgram, run_logged  # noqa: E402
from nnschemaparser.store.step_names import StepNames  # noqa: E402
from nnschemaparser.traces.selection import keep_selector  # noqa: E402

MODELS = {"llama": (tiny_llama, "layers.1", 32, 256), "gpt2": (gpt2_small, "h.1", 8, 50257)}


class _Unkept(list):
    """A log that keeps each step's instruction only: the value is dropped as it is appended."""

    __slots__ = ()

    def append(self, entry: tuple) -> None:
        list.append(self, entry[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--inputs", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    factory, keep, count, vocab = MODELS[args.model]
    count = args.inputs or count
    model, example = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    generator = torch.Generator().manual_seed(0)
    shape = tuple(example["input_ids"].shape)
    inputs = [dict(example, input_ids=torch.randint(0, vocab, shape, generator=generator)) for _ in range(count)]
    dropped = LoggingProgram(schema)
    dropped.log.steps = _Unkept()  # before its first run: the generated code appends to this list
    names = StepNames(keep_selector(keep), schema)
    scratch = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    stores = iter(range(10 ** 6))

    def run_dropped(scope: dict) -> None:
        dropped.run_root(scope)
        dropped.log.clear()

    def with_statistics(scope: dict) -> None:
        _, fields = names.fields(schema, scope)
        names.summarise(fields[6], dtypes=names.dtypes)

    each = {"eager": lambda s: model(**s), "capture_run(keep)": lambda s: capture_run(schema, dict(s), keep=keep),
            "capture_run": lambda s: capture_run(schema, dict(s)),
            "logged run, dropped": lambda s: run_dropped(dict(s)), "logged run": lambda s: run_logged(schema, dict(s)),
            "columns": lambda s: names.logged.capture(dict(s)), "columns + statistics": with_statistics}
    samples: dict[str, list] = {k: [] for k in list(each) + ["capture_dataset"]}  # (CPU s, faults, system s)
    # a plain store's time beyond its inputs' median turn (in the paired store of the same round): the manifest,
    # commits, Parquet, the reader, and what its first input pays more than the others (a new summariser's plan)
    fixed: list = []
    wholes: list = []  # (a plain store of the inputs, capture_run(keep) of each of them), each timed whole

    def paired():
        """The inputs, each one's other candidates timed just before the store's writer is handed it; the
        writer's turn with it is the time until it asks for the next."""
        turns = []
        for scope in inputs:
            for key, fn in each.items():
                samples[key].append(measure(lambda: fn(scope)))
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.process_time()
            yield scope
            took = time.process_time() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            turns.append((took, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime))
        samples["capture_dataset"].extend(turns)

    try:
        with torch.no_grad():
            for fn in each.values():
                fn(inputs[0])
            load = os.getloadavg()[0]
            for round_ in range(args.rounds + 1):
                path = scratch / f"s{next(stores)}"
                if round_ == 0:  # a warm-up store
                    capture_dataset(schema, inputs, path, keep=keep, progress=False)
                    shutil.rmtree(path)
                    continue
                capture_dataset(schema, paired(), path, keep=keep, progress=False)
                shutil.rmtree(path)
                turns = [t for t, _, _ in samples["capture_dataset"][-count:]]
                # then, back to back, a plain store of the inputs and their kept captures, each timed whole
                path = scratch / f"s{next(stores)}"
                whole = measure(lambda: capture_dataset(schema, inputs, path, keep=keep, progress=False))[0]
                shutil.rmtree(path)
                kept = measure(lambda: [capture_run(schema, dict(s), keep=keep) for s in inputs])[0]
                wholes.append((whole, kept))
                fixed.append(whole - count * statistics.median(turns))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = [t for t, _, _ in samples["capture_run(keep)"]]
    eager = [t for t, _, _ in samples["eager"]]
    keep_ms = statistics.median(base)
    print(f"{args.model}: {count} inputs, keep={keep!r}, {args.rounds} rounds, torch {torch.__version__}, 1 thread, "
          f"process CPU time; 1-minute load {load:.2f} before, {os.getloadavg()[0]:.2f} after; eager "
          f"{statistics.median(eager) * 1e3:.2f} ms an input, capture_run(keep) {keep_ms * 1e3:.2f} (medians)")
    print(f"{'':22s} {'ms/input':>9s}  {'over capture_run(keep)':>24s}  {'over eager':>10s}  {'system ms':>9s}  "
          f"{'faults':>7s}  (an input, medians of {len(base)} pairs)")
    for key, rows in samples.items():
        took = [t for t, _, _ in rows]
        ratios = sorted(t / b for t, b in zip(took, base))
        low, high = ratios[len(ratios) // 10], ratios[-1 - len(ratios) // 10]
        over_eager = statistics.median(t / e for t, e in zip(took, eager))
        print(f"{key:22s} {statistics.median(took) * 1e3:9.2f}  {statistics.median(ratios):6.2f}x "
              f"({low:.2f}-{high:.2f}){'':5s}  {over_eager:8.2f}x  "
              f"{statistics.median(s for _, _, s in rows) * 1e3:9.2f}  {statistics.median(f for _, f, _ in rows):7.0f}")
    share = statistics.median(fixed) / count
    turn = statistics.median(t / b for (t, _, _), b in zip(samples["capture_dataset"], base))
    whole = sorted(w / k for w, k in wholes)
    print(f"capture_dataset beyond its inputs' median turns (manifest, commits, Parquet, shards, reader, first input): "
          f"{statistics.median(fixed) * 1e3:.1f} ms a store, {share * 1e3:.2f} ms an input, {share / keep_ms:.2f}x "
          f"capture_run(keep); in all {turn + share / keep_ms:.2f}x capture_run(keep) (the turns' median ratio plus "
          f"that share). Timed whole, a store over its inputs' capture_run(keep) in the same round: "
          f"{statistics.median(whole):.2f}x ({whole[0]:.2f}-{whole[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
