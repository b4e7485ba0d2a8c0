"""What reading one fact of a tensor costs from Python, per tensor, read with `map` over a list of them.

    python bench/bench_tensor_reads.py [--count 1853] [--repeat 200]

A store reads a few facts of every value a run binds (1,853 on the tiny Llama of bench/models.py), so
each read's cost is paid thousands of times an input. `count` float32 tensors of 16 x 64 (the Llama's
hidden states), each fact read with `list(map(getter, tensors))`, the best of five timings of `repeat`
such lists, in nanoseconds a tensor. The `size()` method returns the torch.Size that the `.shape`
property gives, 50-100 ns a tensor sooner here (141-161 against 209-249 in three runs): the store and
the captures read `size()` (traces/logged_columns.py, traces/logged.py, traces/recorder.py, store/statistics.py).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

T = torch.Tensor
READS = {"shape (property)": T.shape.__get__, "size()": T.size, "dtype": T.dtype.__get__,
         "requires_grad": T.requires_grad.__get__, "_version": T._version.__get__, "is_cpu": T.is_cpu.__get__,
         "is_neg()": T.is_neg, "is_contiguous()": T.is_contiguous, "data_ptr()": T.data_ptr, "numel()": T.numel,
         "stride()": T.stride, "id": id, "type": type}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1853)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    tensors = [torch.randn(16, 64) for _ in range(args.count)]
    assert list(map(T.size, tensors)) == list(map(T.shape.__get__, tensors))
    print(f"torch {torch.__version__}: ns a tensor, {args.count} tensors, best of 5 x {args.repeat}")
    for name, getter in READS.items():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(args.repeat):
                list(map(getter, tensors))
            best = min(best, time.perf_counter() - start)
        print(f"  {name:18s} {best / args.repeat / args.count * 1e9:6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
