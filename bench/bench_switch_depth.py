"""What a pair of greenlet switches costs at a given depth of nested C evaluation levels.

    python bench/bench_switch_depth.py [--depths 0,10,20,40] [--switches 200000]

A stepped run pauses by switching from the run's greenlet to its consumer and back, and greenlet
copies the run's C stack out and back on each pair. A Python-to-Python call made with positional or
keyword arguments is inlined by CPython 3.11 (no C frame); a call made through `f(*args, **kwargs)`
(CALL_FUNCTION_EX: decorators' wrappers, invokers that splat) nests a C evaluation level. This times
a pair of switches from under `depth` levels of each kind (best of 5 blocks, CPU time of the thread),
and prints the bytes of C stack one nested level takes (the greenlet's saved stack, `_stack_saved`).
"""

from __future__ import annotations

import argparse
import sys
import time

import greenlet


def _leaf(main, count):
    switch = main.switch
    for _ in range(count):
        switch()


def _nest_splat(depth, main, count):
    if depth == 0:
        return _leaf(main, count)
    args = (depth - 1, main, count)
    return _nest_splat(*args)  # a C evaluation level each


def _nest_plain(depth, main, count):
    if depth == 0:
        return _leaf(main, count)
    return _nest_plain(depth - 1, main, count)  # inlined


def pair_cost(nest, depth: int, switches: int) -> tuple[float, int]:
    """(seconds per pair of switches, bytes of C stack saved at a pause) under `depth` levels."""
    main = greenlet.getcurrent()
    runner = greenlet.greenlet(lambda: nest(depth, main, 10 ** 12))
    resume = runner.switch
    resume()
    saved = runner._stack_saved
    block = switches // 5
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(block):
            resume()
        best = min(best, (time.thread_time() - start) / block)
    runner.throw(greenlet.GreenletExit)
    return best, saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="0,10,20,40")
    parser.add_argument("--switches", type=int, default=200000)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    for name, nest in (("plain calls (inlined)", _nest_plain), ("f(*args) calls (C levels)", _nest_splat)):
        for depth in depths:
            seconds, saved = pair_cost(nest, depth, args.switches)
            print(f"  {name:26s} depth {depth:3d}: {seconds * 1e9:6.0f} ns a pair of switches, {saved:6d} bytes saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
