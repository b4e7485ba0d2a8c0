"""What a capture's page faults cost, and the ways around them that were measured (issue 41, point 6).

    python bench/bench_heap_faults.py [--rounds N] [--mib N] [--thp-capture]

Part 1, the faults alone: an anonymous region of `--mib` MiB (80: about what a GPT-2-small capture
grows the heap by) is written once, fresh, in four ways, each round a new region: first touch (what
the capture's values do), `madvise(MADV_POPULATE_WRITE)` first (the kernel fills the pages in one
call), `madvise(MADV_HUGEPAGE)` first (2 MiB pages, where /sys/kernel/mm/transparent_hugepage/enabled
allows `madvise`), and both. Wall time of the write, minor faults (`ru_minflt`) and system time,
median over rounds; a write into resident memory for scale.

Part 2 (`--thp-capture`): `bench_gpt2_small.py --mode no-pin` under
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc advises huge pages on every heap extension: a
process-wide setting, given before the process starts), for comparison with its plain `--mode no-pin`
and `--mode default` (the pin of traces/capture_memory.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23
HUGE = 2 << 20

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def write_fresh(size: int, advice: tuple[int, ...]) -> tuple[float, int, float]:
    """Seconds, minor faults and system seconds of advising then writing a fresh region of `size` bytes."""
    base = libc.mmap(None, size + HUGE, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    start = (base + HUGE - 1) & ~(HUGE - 1)  # 2 MiB aligned, so huge pages can back all of it
    try:
        before, clock = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for code in advice:
            if libc.madvise(start, size, code) != 0:
                raise OSError(ctypes.get_errno(), f"madvise({code}) refused (kernel too old, or THP off?)")
        ctypes.memset(start, 1, size)
        spent, after = time.perf_counter() - clock, resource.getrusage(resource.RUSAGE_SELF)
        return spent, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime
    finally:
        libc.munmap(base, size + HUGE)


def faults_alone(mib: int, rounds: int) -> None:
    size = mib << 20
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"{mib} MiB written fresh, {rounds} rounds, median; THP {thp.read_text().strip() if thp.exists() else '?'}")
    for name, advice in (("first touch", ()), ("MADV_POPULATE_WRITE", (MADV_POPULATE_WRITE,)),
                         ("MADV_HUGEPAGE", (MADV_HUGEPAGE,)),
                         ("both", (MADV_HUGEPAGE, MADV_POPULATE_WRITE))):
        try:
            rows = [write_fresh(size, advice) for _ in range(rounds)]
        except OSError as error:
            print(f"  {name:20s} not available: {error}")
            continue
        print(f"  {name:20s} {statistics.median(r[0] for r in rows) * 1e3:7.1f} ms  "
              f"{statistics.median(r[1] for r in rows):7.0f} faults  "
              f"{statistics.median(r[2] for r in rows) * 1e3:6.1f} sys ms")
    region = libc.mmap(None, size, 3, 0x22, -1, 0)
    ctypes.memset(region, 1, size)
    clock = time.perf_counter()
    for _ in range(rounds):
        ctypes.memset(region, 2, size)
    print(f"  {'resident (no fault)':20s} {(time.perf_counter() - clock) / rounds * 1e3:7.1f} ms")
    libc.munmap(region, size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=80)
    parser.add_argument("--thp-capture", action="store_true")
    args = parser.parse_args()
    faults_alone(args.mib, args.rounds)
    if args.thp_capture:
        env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
        print("bench_gpt2_small.py --mode no-pin under GLIBC_TUNABLES=glibc.malloc.hugetlb=1:", flush=True)
        subprocess.run([sys.executable, str(HERE / "bench_gpt2_small.py"), "--mode", "no-pin", "--rounds",
                        str(args.rounds), "--inputs", "8"], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
