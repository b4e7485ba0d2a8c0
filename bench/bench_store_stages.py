"""Where a store's writing time goes: CPU time of each stage of the writer, per input.

    python bench/bench_store_stages.py [llama|gpt2] [KEEP [INPUTS [ROUNDS]]] [--retain]

Writes one store (64 tiny-Llama inputs or 16 GPT-2 small inputs, one block, the attention outputs kept,
as bench_store.py's write part; or `KEEP` kept, over `INPUTS` inputs: `llama layers.1 32` is
bench_logged_capture.py's `--dataset`) after a warm-up store (`ROUNDS` stores: the one of least CPU time), with the writer's stages wrapped by a CPU-time
counter: the capture, the step fields and metadata, the statistics (the plan check and the figures),
the clones (and the settling of the values held as they were), the queueing and folding of the reductions, the shards, the Parquet table and the commit.
The stages nest (the commit holds the fold of the last queues and the shard write), so the rows do not
add up to the total; the wrappers add about a microsecond a call. One torch thread. `--retain` calls
`retain_freed_memory()` first (as bench_gpt2_small.py's `--mode retain`). The C kernel's calls (statistics,
fold, merge) and the weights' digest are rows of their own.
"""

from __future__ import annotations

import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import gpt2_small, tiny_llama  # noqa: E402

import nnschemaparser.store.manifest as manifest  # noqa: E402
import nnschemaparser.store.native as native  # noqa: E402
import nnschemaparser.store.statistics as statistics  # noqa: E402
import nnschemaparser.store.step_names as step_names  # noqa: E402
import nnschemaparser.store.step_table as step_table  # noqa: E402
import nnschemaparser.store.writer as writer  # noqa: E402
from nnschemaparser import NNParser, capture_dataset, retain_freed_memory  # noqa: E402

STAGES = [(step_names.StepNames, "fields", "capture and step fields"), (step_names, "capture_run", "  capture_run (not logged)"),
          (step_names.LoggedColumns, "capture", "  logged capture, as columns"),
          (step_names.LoggedColumns, "fields", "    columns of the log"), (step_names, "step_fields", "  step fields (not logged)"),
          (step_names.StepNames, "steady", "metadata (steady)"), (statistics.Summariser, "__call__", "statistics"),
          (statistics._Plan, "__init__", "  a new plan"), (statistics._Plan, "matches", "  plan check"),
          (statistics._Plan, "figures", "  figures (torch)"), (statistics._Plan, "kernel_figures", "  figures (kernel)"),
          (native.Kernel, "raw", "    the C kernel's statistics"),
          (writer._Unit, "keep", "clones"), (writer._Unit, "settle", "settle (clones of values shared)"),
          (writer._Unit, "reduce", "queueing reductions"), (writer._Unit, "fold", "folding reductions"),
          (native.Kernel, "fold", "  the C kernel's fold"), (native.Kernel, "merge", "  the C kernel's merges"),
          (writer, "write_shard", "shards"), (step_table.StepColumns, "table", "Arrow table"),
          (writer._Unit, "commit", "commit (Parquet, shards, last fold)"),
          (manifest, "weights_fingerprint", "weights digest (once a store)")]


def main() -> int:
    torch.set_num_threads(1)
    if "--retain" in sys.argv:
        sys.argv.remove("--retain")
        retain_freed_memory()
    which = sys.argv[1] if len(sys.argv) > 1 else "llama"
    if which not in ("llama", "gpt2"):
        print("usage: python bench/bench_store_stages.py [llama|gpt2] [KEEP [INPUTS [ROUNDS]]] [--retain]", file=sys.stderr)
        return 2
    model, example = tiny_llama() if which == "llama" else gpt2_small()
    keep, count = ("layers.*.self_attn:attn_output", 64) if which == "llama" else ("h.*.attn:attn_output", 16)
    if len(sys.argv) > 2:
        keep = sys.argv[2]
    if len(sys.argv) > 3:
        count = int(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    inputs = [dict(example, input_ids=torch.randint(0, vocab, tuple(example["input_ids"].shape), generator=generator))
              for _ in range(count)]
    spent: collections.Counter = collections.Counter()

    def timed(fn, label):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - start
        return wrapper

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in STAGES]
    for owner, name, label in STAGES:
        setattr(owner, name, timed(getattr(owner, name), label))
    folder = Path(tempfile.mkdtemp())
    best: Optional[tuple[float, collections.Counter]] = None
    try:
        capture_dataset(schema, inputs, folder / "warm", keep=keep, progress=False)
        for round_ in range(rounds):
            spent.clear()
            start = time.process_time()
            capture_dataset(schema, inputs, folder / f"store{round_}", keep=keep, progress=False)
            total = time.process_time() - start
            shutil.rmtree(folder / f"store{round_}")
            if best is None or total < best[0]:
                best = (total, collections.Counter(spent))
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        shutil.rmtree(folder)
    total, spent = best
    print(f"{which}: {count} inputs, {total / count * 1e3:.2f} ms of CPU per input in all (the lowest of {rounds} "
          f"stores; 1-minute load {os.getloadavg()[0]:.2f})")
    for _, _, label in STAGES:
        print(f"  {label:38s} {spent[label] / count * 1e3:8.2f} ms/input")
    return 0


if __name__ == "__main__":
    sys.exit(main())
