"""The activation store against captures kept in memory, side by side in one process (CPU time).

    python bench/bench_store.py [--rounds N] [--inputs N] [--gb G | --big] [--rows N] [--quick] [--scratch DIR]
                                [--only write,keep,read,query] [--breakdown]

1. write: for GPT-2 small (12x768, 64 tokens) and a 32-layer tiny Llama (16 tokens), over the same
   inputs, in interleaved rounds: eager, capture_run of every input kept in memory (a list of
   records), capture_dataset into a fresh store (keep="<one attention's output per layer>": every
   step's statistics, those tensors, their reductions). Ratio: the store over the in-memory capture,
   median over rounds (target: at most 1.3x).
2. keep: on the 32-layer tiny Llama, eager, forward hooks on two layers cloning their outputs (the
   nnsight-style baseline), capture_run(keep="call=layers.3, call=layers.17") keeping the same two
   tensors, capture_run(keep="layers.3, layers.17") keeping every step of the two layers, and
   capture_run of everything; ratios to eager, median over rounds. `--breakdown` also times a plain
   run, a run of the counting program everywhere, a capture observing the root alone and one
   observing the two layers without recording, and prints their ratios to eager (each adds one
   piece to the one before); `--wider` runs it on the same 32 layers at hidden 256 and 64 tokens,
   where ops take time.
3. read: a store of about G GB (`--big`: 10 GB, the target's size; float32 tensors of 4 MiB, 256 MiB
   shards), then up to 200 different tensors of random inputs, each read and summed (every byte
   touched) three ways: its first read through a store object opened afresh, with its shard evicted
   from the page cache first (posix_fadvise DONTNEED: only pages no mapping holds can be dropped, hence
   the fresh store object), so its bytes come from the disk; the same tensor read again (its pages in
   memory); and, as the floor under the first, the disk's own time for those bytes (one pread after
   evicting them again). Median and 95th percentile (target: under 10 ms).
4. query: a store of about N steps (a 4-layer tiny Llama), and two DuckDB queries over its
   statistics (the NaN question and the top-20 by norm); median of 5 (target: under 1 s).

Everything runs on one torch thread: the CPU time of one thread is the work done, whatever the load.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture_keep import LayerHooks  # noqa: E402  (forward hooks cloning two layers' outputs)
from models import gpt2_small, tiny_llama, wider_llama  # noqa: E402

from nnschemaparser import NNParser, TraceStore, capture_dataset, capture_run  # noqa: E402
from nnschemaparser.files.file_format import FileLimits  # noqa: E402
from nnschemaparser.runtime.program import Program  # noqa: E402
from nnschemaparser.store import native  # noqa: E402
from nnschemaparser.store.shards import ShardFile, direct_writes  # noqa: E402


def cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def rounds_of(candidates: dict, rounds: int) -> dict[str, list[float]]:
    for fn in candidates.values():  # warm-up (compiles the schema's functions, fills caches)
        fn()
    samples = {k: [] for k in candidates}
    for _ in range(rounds):
        for key, fn in candidates.items():
            samples[key].append(cpu(fn))
    return samples


def ratio(samples: dict, over: str, under: str) -> float:
    return statistics.median(a / b for a, b in zip(samples[over], samples[under]))


def bench_write(name: str, factory, keep: str, count: int, rounds: int, scratch: Path) -> None:
    model, example = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    inputs = [dict(example, input_ids=torch.randint(0, vocab, tuple(example["input_ids"].shape), generator=generator))
              for _ in range(count)]
    stores = iter(range(10 ** 6))

    def eager():
        with torch.no_grad():
            for scope in inputs:
                model(**scope)

    def memory():
        with torch.no_grad():
            kept = [capture_run(schema, dict(scope)) for scope in inputs]
        return kept

    def store():
        path = scratch / f"{name}-{next(stores)}"
        capture_dataset(schema, inputs, path, keep=keep, progress=False)
        shutil.rmtree(path)

    def store_torch():  # the same with torch's reductions for the statistics (NNSCHEMAPARSER_NATIVE=0)
        os.environ["NNSCHEMAPARSER_NATIVE"] = "0"
        try:
            store()
        finally:
            del os.environ["NNSCHEMAPARSER_NATIVE"]

    candidates = {"eager": eager, "capture_run": memory, "store": store}
    if native.kernel() is not None:
        candidates["store_torch"] = store_torch
    else:
        print(f"write  (the statistics kernel is not in use: {native.problem()}; the store uses torch's reductions)")
    samples = rounds_of(candidates, rounds)
    med = {k: statistics.median(v) / count * 1e3 for k, v in samples.items()}
    for key, engine in (("store", "kernel" if "store_torch" in samples else "torch"), ("store_torch", "torch")):
        if key not in samples:
            continue
        r = ratio(samples, key, "capture_run")
        each = sorted(a / b for a, b in zip(samples[key], samples["capture_run"]))
        print(f"write  {name:28s} eager {med['eager']:8.1f} ms/input  capture_run {med['capture_run']:8.1f}  "
              f"store ({engine} statistics) {med[key]:8.1f}  store/capture_run {r:5.2f}x (rounds {each[0]:.2f}-"
              f"{each[-1]:.2f})  {'meets' if r <= 1.3 else 'MISSES'} the 1.3x target  (keep={keep!r}, {count} "
              f"inputs, {rounds} rounds)")


def bench_keep(rounds: int, breakdown: bool = False, wider: bool = False) -> None:
    model, inputs = wider_llama() if wider else tiny_llama()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    hooks = LayerHooks([model.layers[3], model.layers[17]])
    inner = 2 if wider else 20

    def repeat(fn):
        return lambda: [fn() for _ in range(inner)]

    candidates = {"eager": repeat(lambda: model(**inputs)),
                  "hooks on 2 layers": repeat(lambda: hooks.run(model, inputs)),
                  "keep 2 layer outputs": repeat(lambda: capture_run(schema, dict(inputs),
                                                                     keep="call=layers.3, call=layers.17")),
                  "keep 2 layers": repeat(lambda: capture_run(schema, dict(inputs), keep="layers.3, layers.17")),
                  "capture everything": repeat(lambda: capture_run(schema, dict(inputs)))}
    if breakdown:
        # what keep= pays for, piece by piece: each candidate adds one thing to the one before it
        plain, counted = Program(schema), Program(schema, counter=[0])
        candidates.update({
            "plain run": repeat(lambda: plain.run_root(dict(inputs))),
            "counted run": repeat(lambda: counted.run_root(dict(inputs))),
            # the selector keeps nothing: the root observed, every layer counted, a capture's set-up
            "observe root": repeat(lambda: capture_run(schema, dict(inputs), keep="no_such_block")),
            # the two layers observed and described, nothing recorded (no variable has that name)
            "observe 2 layers": repeat(lambda: capture_run(schema, dict(inputs),
                                                          keep="layers.3:no_such_var, layers.17:no_such_var")),
        })
    with torch.no_grad():
        kept = capture_run(schema, dict(inputs), keep="layers.3, layers.17")
        full = capture_run(schema, dict(inputs))
        samples = rounds_of(candidates, rounds)
    main = ["hooks on 2 layers", "keep 2 layer outputs", "keep 2 layers", "capture everything"]
    figures = "  ".join(f"{k} {ratio(samples, k, 'eager'):5.2f}x" for k in main)
    eager_ms = statistics.median(samples["eager"]) / inner * 1e3
    name = "Llama 32 layers x 256, 64 tokens" if wider else "tiny Llama 32 layers, 16 tokens"
    print(f"keep   {name}: eager {eager_ms:.2f} ms; "
          f"{figures}  (steps recorded: {len(kept.trace)} of {len(full.trace)})")
    if breakdown:  # each adds one piece to the one before it; ratios to eager, as above
        order = ["plain run", "counted run", "observe root", "observe 2 layers", "keep 2 layers"]
        print("       piece by piece: " + "  ".join(f"{k} {ratio(samples, k, 'eager'):5.3f}x" for k in order))


class Wide(nn.Module):
    """Three 1024x1024 linear layers on a (1024, 1024) input: 4 MiB float32 tensors."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(1024, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 1024)

    def forward(self, x):
        h = self.a(x)
        h = torch.relu(h)
        h = self.b(h)
        return self.c(h)


def bench_read(gb: float, scratch: Path) -> None:
    torch.manual_seed(0)
    model = Wide().eval()
    example = {"x": torch.randn(1024, 1024)}
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    steps = capture_run(schema, dict(example)).trace.steps  # keep="*": every step's tensor is written
    per_input = sum(s.value.numel() * s.value.element_size() for s in steps if s.value is not None)
    count = max(1, int(gb * 2 ** 30 / per_input))
    generator = torch.Generator().manual_seed(1)
    scopes = ({"x": torch.randn(1024, 1024, generator=generator)} for _ in range(count))
    path = scratch / "read"
    start = time.perf_counter()
    capture_dataset(schema, scopes, path, keep="*", block_size=16, progress=False)
    built = time.perf_counter() - start
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    opened = time.perf_counter()
    store = TraceStore(path)
    opened = time.perf_counter() - opened
    store_shards = store._shards
    ids = store.steps[store.steps["kept"]][["sample", "container_id"]].values.tolist()
    del store
    pick = random.Random(0)
    first, again, disk = [], [], []
    evicts = hasattr(os, "posix_fadvise")
    for sample, cid in pick.sample(ids, min(200, len(ids))):
        # a fresh store object each time (opening it is not timed): no mapping of an earlier read holds the
        # tensor's pages, so evicting its shard from the page cache works and the first read is a cold one
        store = TraceStore(path, check_shards=False)
        name = store._where[f"{int(sample)}/{cid}"]
        if evicts:
            _evict(path / name)
        start = time.perf_counter()
        store.tensor(int(sample), cid).sum()  # every byte read
        first.append(time.perf_counter() - start)
        start = time.perf_counter()
        store.tensor(int(sample), cid).sum()  # the same tensor again: its pages are in memory now
        again.append(time.perf_counter() - start)
        if evicts:  # the disk's own time for the same bytes: one pread, after the pages are dropped again
            del store
            _evict(path / name)
            shard = ShardFile(path / name, FileLimits())
            dtype, shape, offset = shard.layout[f"{int(sample)}/{cid}"]
            buffer = bytearray(math.prod(shape) * dtype.itemsize)
            with open(path / name, "rb") as handle:
                start = time.perf_counter()
                os.preadv(handle.fileno(), [buffer], offset)
                disk.append(time.perf_counter() - start)
    how = "direct writes" if direct_writes() else "buffered writes"
    for label, times in (("first read after the write (its shard evicted from the page cache first)", first),
                         ("read again (its pages in memory)", again),
                         ("the disk's own read of the same bytes (one pread after eviction: the floor)", disk)):
        if not times:
            continue
        times.sort()
        p50, p95 = times[len(times) // 2] * 1e3, times[int(len(times) * 0.95)] * 1e3
        verdict = ("meets" if p95 < 10 else "MISSES") + " the 10 ms target (p95)" if times is not disk else ""
        print(f"read   a store of {size / 2 ** 30:.2f} GB ({count} inputs, {len(store_shards)} shards, written in "
              f"{built:.0f} s with {how}, opened in {opened * 1e3:.0f} ms): one 4 MiB tensor read and summed, {label}: "
              f"median {p50:.2f} ms, p95 {p95:.2f} ms  {verdict}")
    shutil.rmtree(path)


def _evict(file: Path) -> None:
    with open(file, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def bench_query(rows: int, scratch: Path) -> None:
    model, example = tiny_llama(layers=4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=example)
    per_input = len(capture_run(schema, dict(example)).trace)
    count = max(1, rows // per_input + 1)
    generator = torch.Generator().manual_seed(2)
    scopes = [dict(example, input_ids=torch.randint(0, 256, (1, 16), generator=generator)) for _ in range(count)]
    path = scratch / "query"
    store = capture_dataset(schema, scopes, path, keep="layers.*.self_attn:attn_output", progress=False)
    questions = {
        "inputs whose layers.3.mlp output has a NaN":
            "select distinct sample from steps where block_path = 'layers.3.mlp' and n_nan > 0",
        "top 20 inputs by the norm of attn_output in layer 3":
            "select sample, max(l2) as norm from steps where block_path = 'layers.3.self_attn' and "
            "out_var = 'attn_output' group by sample order by norm desc limit 20",
    }
    total = int(store.query("select count(*) as n from steps")["n"][0])
    for label, sql in questions.items():
        times = []
        for _ in range(5):
            start = time.perf_counter()
            store.query(sql)
            times.append(time.perf_counter() - start)
        best = statistics.median(times)
        print(f"query  {total} steps, {label}: median {best * 1e3:.0f} ms  {'meets' if best < 1 else 'MISSES'} "
              "the 1 s target")
    shutil.rmtree(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=8)
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--big", action="store_true", help="read from a 10 GB store (built in a temporary folder "
                        "under --scratch, deleted after): the target's size")
    parser.add_argument("--scratch", default=None, help="the folder for the temporary stores (default: the system's)")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 inputs, a 0.2 GB store, 10,000 steps")
    parser.add_argument("--only", default="write,keep,read,query", help="the parts to run, comma-separated")
    parser.add_argument("--breakdown", action="store_true", help="keep: also time a plain run, a counted run, "
                        "the root observed alone and the two layers observed without recording, and print "
                        "their ratios to eager")
    parser.add_argument("--wider", action="store_true", help="keep: the 32 layers at hidden 256 and 64 tokens "
                        "(ops that take time) instead of the tiny Llama")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.inputs, args.gb, args.rows = 1, 2, 0.2, 10_000
    if args.big:
        args.gb = 10.0
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)  # CPU time of one thread is the work's own; spinning pool threads would add to it
    with tempfile.TemporaryDirectory(prefix="bench_store_", dir=args.scratch) as folder:
        scratch = Path(folder)
        parts = set(args.only.split(","))
        if "write" in parts:
            bench_write("GPT-2 small, 64 tokens", lambda: gpt2_small(64), "h.*.attn:attn_output", args.inputs,
                        args.rounds, scratch)
            bench_write("tiny Llama 32 layers", tiny_llama, "layers.*.self_attn:attn_output", args.inputs * 4,
                        args.rounds, scratch)
        if "keep" in parts:
            bench_keep(args.rounds, args.breakdown, args.wider)
        if "read" in parts:
            bench_read(args.gb, scratch)
        if "query" in parts:
            bench_query(args.rows, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
