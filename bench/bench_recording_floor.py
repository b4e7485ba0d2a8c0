"""How cheap can recording a step be? The floor under a capture, measured in the running model.

    python bench/bench_recording_floor.py [--rounds N] [--layers N] [--model llama|gpt2]

On the 32-layer tiny Llama (16 tokens), side by side in interleaved rounds (CPU time of one torch
thread): eager; a plain run (`Program.run_root`); the plain generated code (fast locals, no frame
dict, no observer) with, after each instruction where an observed run reports a tensor, one call
that appends [instruction, value, shape, dtype, version] to a list (the least a recorder must do in
Python, what a "recording" flavour of the code generator could emit); the same call keeping no value
(what holding the tensors alive costs); `capture_run` of everything (the logged program,
traces/logged.py), and the same capture observed (`observe_all=True`, the path before logged runs). Per-round figures in ms
over eager, their median.

This is an experiment, not the product: the recording program is made by patching
`CodeGenerator.after` in this process (the counting hook of `runtime/partial.py`'s counted program,
turned into a call); captures, whose programs are observed, are not affected. The recording
program's steps are checked to be as many as a capture's activations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_store import cpu  # noqa: E402
from models import gpt2_small, tiny_llama  # noqa: E402

from nnschemaparser import NNParser, capture_run  # noqa: E402
from nnschemaparser.runtime import codegen  # noqa: E402
from nnschemaparser.runtime.instructions import never_tensor  # noqa: E402
from nnschemaparser.runtime.program import Program  # noqa: E402
from nnschemaparser.schema.model import BlockInstruction, OpInstruction  # noqa: E402


def patch_code_generator() -> None:
    """Make a counted program whose `record` attribute is set call it where it would count: with the
    tensor each instruction bound, where an observed run reports one (see the module text)."""
    original = codegen.CodeGenerator.after

    def after(self, instr):
        record = getattr(self.ctx, "record", None)
        if record is not None and not self.observed() and isinstance(
                instr, (OpInstruction, BlockInstruction)) and instr.out_var \
                and not never_tensor(instr):
            value = self.var(instr.out_var)
            self.line(f"if {self.is_tensor(value)}:")
            self.line(f"    {self.helper('record', record)}({self.instr_name(instr)}, {value})")
            return None
        return original(self, instr)

    codegen.CodeGenerator.after = after


def recording_program(schema, sink: list, keep_values: bool) -> Program:
    """A plain program (compiled lazily, as every program is) that records into `sink`."""
    append = sink.append
    if keep_values:
        def record(instr, value):
            append([instr, value, value.shape, value.dtype, value._version])
    else:
        def record(instr, value):
            append([instr, None, value.shape, value.dtype, value._version])
    program = Program(schema, counter=[0])
    program.record = record
    return program


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--model", choices=("llama", "gpt2"), default="llama",
                        help="the 32-layer tiny Llama (default) or GPT-2 small at 64 tokens")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    model, inputs = tiny_llama(layers=args.layers) if args.model == "llama" else gpt2_small()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    patch_code_generator()
    plain = Program(schema)
    kept: list = []
    dropped: list = []
    holding = recording_program(schema, kept, keep_values=True)
    holding_none = recording_program(schema, dropped, keep_values=False)
    steps = len([s for s in capture_run(schema, dict(inputs)).trace.steps if s.slot_type == "activation"])
    holding.run_root(dict(inputs))
    if len(kept) != steps:
        raise SystemExit(f"the recording program saw {len(kept)} tensor results, a capture {steps} activations")
    inner = 10 if args.model == "llama" else 1

    def record_with(program, sink):
        def run():
            for _ in range(inner):
                sink.clear()
                program.run_root(dict(inputs))
                sink.clear()
        return run

    candidates = {
        "eager": lambda: [model(**inputs) for _ in range(inner)],
        "plain run": lambda: [plain.run_root(dict(inputs)) for _ in range(inner)],
        "fast recording, values kept": record_with(holding, kept),
        "fast recording, no values": record_with(holding_none, dropped),
        "capture_run": lambda: [capture_run(schema, dict(inputs)) for _ in range(inner)],
        "capture_run, observed": lambda: [capture_run(schema, dict(inputs), observe_all=True) for _ in range(inner)],
    }
    for fn in candidates.values():
        fn()
    samples = {k: [] for k in candidates}
    for _ in range(args.rounds):
        for key, fn in candidates.items():
            samples[key].append(cpu(fn) / inner * 1e3)
    eager = statistics.median(samples["eager"])
    what = f"tiny Llama {args.layers} layers, 16 tokens" if args.model == "llama" else "GPT-2 small, 64 tokens"
    print(f"{what}, {steps} tensor steps; eager {eager:.2f} ms")
    for key in list(candidates)[1:]:
        extra = statistics.median(a - b for a, b in zip(samples[key], samples["eager"]))
        print(f"  {key:30s} +{extra:6.2f} ms  ({extra / steps * 1e3:5.2f} us a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
