"""A generated function's own code object against one shared by identical blocks, side by side in one process.

    python bench/bench_codegen_sharing.py [--rounds N] [--inner N]

Identical blocks (the 32 layers of the tiny Llama of bench/models.py, hidden 64, 16 tokens)
generate identical source, compiled once. Each generated function now gets its own copy of the code
object; before, they shared one. CPython (3.11+) specializes a code object's global reads
(LOAD_GLOBAL) for one globals dict, and each layer's function has its own (`env`), so with a shared
object the inline caches miss at every layer. This runs, in interleaved rounds of CPU time under
torch.no_grad() on one thread, eager, a plain run and a counted run (the program a `keep=` capture
runs unobserved blocks with) as they are now, and the same two with every group of functions of one
text set back to one shared code object (`__code__` assigned). A ratio is the median over rounds of
a candidate's time over eager's in the same round. Outputs are checked torch.equal to eager's first.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture_keep import interleaved, ratio_lines, timed_llama  # noqa: E402  (interleaved rounds, ratios to eager)

from nnschemaparser.runtime.program import Program  # noqa: E402


def share_code(program: Program) -> int:
    """Give every function of `program` generated from the same text one code object (as before)."""
    first: dict = {}
    shared = 0
    for unit in program.units.values():
        code = unit.function.__code__
        key = (unit.source, code.co_filename, code.co_firstlineno, code.co_name)
        kept = first.setdefault(key, code)
        if kept is not code:
            unit.function.__code__ = kept
            shared += 1
    return shared


def main() -> None:
    args, model, inputs, schema = timed_llama(__doc__, 15, 20)
    programs = {"plain": Program(schema), "counted": Program(schema, counter=[0]),
                "plain, shared code": Program(schema), "counted, shared code": Program(schema, counter=[0])}
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
        for program in programs.values():  # compile every function
            assert torch.equal(program.run_root(dict(inputs)).last_hidden_state, eager)
        shared = [share_code(programs[name]) for name in ("plain, shared code", "counted, shared code")]
        distinct = len({id(u.function.__code__) for u in programs["plain"].units.values()})
        for program in programs.values():
            assert torch.equal(program.run_root(dict(inputs)).last_hidden_state, eager)
        candidates = {"eager": lambda: model(**inputs)}
        for name, program in programs.items():
            candidates[name] = lambda program=program: program.run_root(dict(inputs))
        samples = interleaved(candidates, args.rounds, args.inner)
    base = samples["eager"]
    print(f"tiny Llama 32 layers x 64, 16 tokens: eager {statistics.median(base) / args.inner * 1e3:.2f} ms per call; "
          f"{len(programs['plain'].units)} functions, {distinct} code objects now, {shared[0]} of them shared before "
          f"(median of {args.rounds} rounds of {args.inner})")
    print("\n".join(ratio_lines(samples, digits=3)))


if __name__ == "__main__":
    main()
