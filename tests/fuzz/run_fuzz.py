"""The long fuzz run: N seeded programs through the oracle, plus hypothesmith sources through the lowering.

    python -m tests.fuzz.run_fuzz --programs 10000 --seed 0 [--jobs 2] [--lowering 500] [--family names]
    python -m tests.fuzz.run_fuzz --show 1234            # print the program of seed 1234
    python -m tests.fuzz.run_fuzz --programs 1 --seed 1234 --minimize   # shrink a failing seed

Program i of a run is the program of seed `--seed + i`, so any finding is reproduced by its seed
alone (and `--family`: "names" writes programs whose forwards rebind module globals, a global
function, a module object's attribute and a class attribute mid-run and read them after). The summary counts programs, divergences, internal errors and refusals; the exit status is 1
unless divergences, internal errors and invalid programs are all zero.
"""

from __future__ import annotations

import argparse
import collections
import functools
import multiprocessing
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script path: make `tests.fuzz` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.fuzz"

import torch  # noqa: E402

from .minimizer import minimize  # noqa: E402
from .oracle import check_source  # noqa: E402
from .programs import program_for_seed  # noqa: E402

_FAILING = ("divergence", "internal_error", "invalid_program")


def _quiet() -> None:
    # Tiny tensors: one thread is ~100x faster than two on small CPUs, and both runs use the same.
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")


def _finding_key(description: str) -> str:
    """The first two lines of a finding, numbers masked, so one bug groups its seeds together."""
    lines = description.splitlines()[:2]
    return re.sub(r"\d+", "#", " | ".join(line.strip() for line in lines))[:200]


def check_seeds(seeds: range, family: str | None = None) -> list[tuple[int, str, str, bool, bool]]:
    """(seed, verdict, first line of the finding, refused, eager raised) for each seed."""
    _quiet()
    results = []
    with tempfile.TemporaryDirectory(prefix="nnschema_fuzz_") as directory:
        for seed in seeds:
            outcome = check_source(program_for_seed(seed, family).source, Path(directory))
            finding = _finding_key(outcome.describe()) if not outcome.ok else ""
            results.append((seed, outcome.verdict, finding, bool(outcome.refusals), outcome.eager_error is not None))
    return results


def run_programs(count: int, seed: int, jobs: int, report_every: int = 1000, family: str | None = None) -> dict:
    chunk = 100
    ranges = [range(start, min(start + chunk, seed + count)) for start in range(seed, seed + count, chunk)]
    counts: collections.Counter = collections.Counter()
    findings: dict[str, list[int]] = collections.defaultdict(list)
    started = time.perf_counter()
    # A fresh worker every 5 chunks: the parser's source caches keep every program's tree otherwise.
    pool = multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=5) if jobs > 1 else None
    try:
        check = functools.partial(check_seeds, family=family)
        batches = pool.imap(check, ranges) if pool else map(check, ranges)
        for batch in batches:
            for program_seed, verdict, finding, refused, raised in batch:
                counts["programs"] += 1
                counts[verdict] += 1
                counts["refused"] += refused
                counts["eager_raised"] += raised
                if verdict in _FAILING:
                    findings[finding].append(program_seed)
            if counts["programs"] % report_every < chunk:
                print(f"  {counts['programs']} programs, {sum(counts[v] for v in _FAILING)} failing, "
                      f"{time.perf_counter() - started:.0f}s", flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    counts["seconds"] = round(time.perf_counter() - started)
    return {"counts": counts, "findings": findings}


def run_lowering(count: int, seed: int) -> collections.Counter:
    from .lowering_crash import crash_fuzz

    return crash_fuzz(count, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=10000, help="how many seeded programs to check")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the first program")
    parser.add_argument("--jobs", type=int, default=min(2, multiprocessing.cpu_count()), help="worker processes")
    parser.add_argument("--lowering", type=int, default=0,
                        help="also feed this many hypothesmith sources to the lowering (crash fuzzing)")
    parser.add_argument("--show", type=int, help="print the program of this seed and exit")
    parser.add_argument("--minimize", action="store_true", help="shrink each failing program and print it")
    parser.add_argument("--family", choices=["names"], default=None,
                        help="a program family: 'names' rebinds module names mid-forward (default: the base programs)")
    args = parser.parse_args(argv)

    if args.show is not None:
        print(program_for_seed(args.show, args.family).source)
        return 0
    _quiet()
    family = f" of the {args.family} family" if args.family else ""
    print(f"differential fuzzing: {args.programs} programs{family} from seed {args.seed}, {args.jobs} job(s)",
          flush=True)
    result = run_programs(args.programs, args.seed, args.jobs, family=args.family)
    counts, findings = result["counts"], result["findings"]
    failing = sum(counts[v] for v in _FAILING)
    print(f"programs:        {counts['programs']}")
    print(f"matches:         {counts['match']}  (eager raised in {counts['eager_raised']}, "
          f"same exception through the schema)")
    print(f"divergences:     {counts['divergence']}")
    print(f"internal errors: {counts['internal_error']}")
    print(f"invalid programs: {counts['invalid_program']}")
    print(f"refusals:        {counts['refused']}  (programs with a block the lowering refused)")
    print(f"time:            {counts['seconds']}s")
    for finding, seeds in sorted(findings.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(seeds):5d} x {finding}   seeds {seeds[:8]}")
    if args.minimize and findings:
        with tempfile.TemporaryDirectory(prefix="nnschema_fuzz_min_") as directory:
            for seeds in findings.values():
                source, outcome = minimize(program_for_seed(seeds[0], args.family).source, Path(directory))
                print(f"\n# --- seed {seeds[0]}, minimized ---\n{source}\n# {outcome.describe()}")
    if args.lowering:
        crash = run_lowering(args.lowering, args.seed)
        print(f"lowering crash fuzzing: {crash['sources']} sources, {crash['lowered']} lowered, "
              f"{crash['refused']} refused, {crash['internal_error']} internal errors")
        failing += crash["internal_error"]
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
