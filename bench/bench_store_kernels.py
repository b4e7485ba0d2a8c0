"""The store's C kernels alone (store/_statistics.c) on large arrays, against a copy of the same bytes.

    python bench/bench_store_kernels.py [--rounds N]

GPT-2 small's kept block at 64 tokens, 8 inputs a unit: 23 variables of 49,152 float32 elements and 11 of
196,608, 8 occurrences each (what `capture_dataset(keep="h.1")` folds: 4.9 M elements an input). Times, the
least of `--rounds` (process CPU time, one torch thread): `nsp_fold` (`Kernel.fold`: per-element mean and M2 in
float64 and the histogram counts; its float64 outputs are new arrays each call, as in the writer), the
statistics kernel (`Kernel.figures`: nine figures of each occurrence), and `copy_` of every occurrence into one
reused buffer (what reading the bytes costs on this machine), each per element and in GB/s of input read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nnschemaparser.store import native  # noqa: E402


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kernel = native.kernel()
    if kernel is None:
        print(f"the statistics kernel is not built here: {native.problem()}", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(0)
    k = 8
    groups = [(23, 49152), (11, 196608)]
    values = {size: [torch.randn(size, generator=g) * 2 for _ in range(count * k)] for count, size in groups}
    elements = sum(count * k * size for count, size in groups)
    buffer = torch.empty(max(size for _, size in groups))

    def fold():
        for count, size in groups:
            kernel.fold(values[size], count, k, 64, -8.0, 8.0)

    def figures():
        for _, size in groups:
            kernel.figures(values[size], torch.float32)

    def copy():
        for _, size in groups:
            for v in values[size]:
                buffer[:size].copy_(v)

    print(f"{elements / 1e6:.1f} M float32 elements ({elements * 4 / 1e6:.0f} MB), the least of {args.rounds} rounds; "
          f"1-minute load {os.getloadavg()[0]:.2f}")
    for name, fn in (("fold (nsp_fold)", fold), ("statistics (nsp_summary)", figures), ("copy_ of the same", copy)):
        seconds = best(fn, args.rounds)
        print(f"  {name:26s} {seconds * 1e3:8.2f} ms  {seconds * 1e9 / elements:6.3f} ns/element  "
              f"{elements * 4 / seconds / 1e9:6.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
