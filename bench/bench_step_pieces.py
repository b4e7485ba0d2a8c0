"""What the pieces of a stepped run cost inside the run itself, side by side in one process.

    python bench/bench_step_pieces.py [--rounds N]

The 32-layer tiny Llama of bench_step_run.py (16 tokens, 3,780 steps), torch.no_grad(), one thread,
CPU time of the thread, interleaved rounds of 3 calls. A piece costs more inside the run than in a
timeit loop, because the run's thousands of instruction objects (and the weights, the tensors) are
cold in the cache by the time a step reaches them. Each candidate is the stepped run's own program,
observer and greenlet with one thing changed; "us/step" is the median over rounds of its time less
the stepped run's in the same round, per step (negative: cheaper than it).

  step_run                   every step of SchemaInterpreter().step_run, iterated to the end
  stepped run                the same program, observer, greenlet and generator, driven by this
                             script (what the candidates below change one thing of)
  instruction read per step  the step reads `out_var` off its instruction and `frame.get`s it, and
                             holds the instruction itself, as `after` did before issue 41 point 6
  bare switch as __next__    the consumer's generator replaced by an iterator whose `__next__` is the
                             run's greenlet's `switch`: no check of which greenlet or thread asks
                             (so not a replacement: a resume from another greenlet would be lost)
  + 10 C levels              the run started under 10 more nested `f(*args)` calls (C evaluation
                             levels; greenlet saves and restores about 5 KB more at each pause)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import greenlet
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import tiny_llama  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.runtime.listeners import RETURN_SLOT  # noqa: E402
from nnschemaparser.runtime.program import Program  # noqa: E402
from nnschemaparser.runtime.stepping import Stepper, SteppingObserver, StepInfo  # noqa: E402
from nnschemaparser.schema.model import ReturnInstruction  # noqa: E402

_new = object.__new__
_FINISHED = object()


class InstructionRead(SteppingObserver):
    """`after` as it was: the value read off the instruction, the instruction held by the step."""

    def after(self, sites, site, frame, value):
        stepper = self._stepper
        if self.conditions:
            return
        instr = sites[site]
        stepper.index = index = stepper.index + 1
        out = instr.out_var
        if out:
            value = frame.get(out)
        elif instr.__class__ is ReturnInstruction or isinstance(instr, ReturnInstruction):
            value = frame.get(RETURN_SLOT)
        else:
            value = None
        frames = self._frames_tuple
        if frames is None:
            frames = self.frames_tuple()
        info = _new(StepInfo)
        info.step_index = index
        info.value = value
        info.scope_frames = frames
        info._sites = (instr,)
        info._site = 0
        info.block_path = self.path
        info._run = stepper
        stepper.switch(info)


def _nest(depth, body):
    if depth == 0:
        return body()
    args = (depth - 1, body)
    return _nest(*args)  # a C evaluation level each


def stepped(schema, inputs, observer_class=SteppingObserver, depth=0, bare=False):
    """The stepped run's program and observer in a greenlet, consumed by today's generator (or by
    an iterator whose `__next__` is the greenlet's switch, `bare`)."""
    observer = observer_class()
    program = Program(schema, observer)

    def run_once():
        stepper = Stepper(None)
        observer.configure([stepper])

        def run():
            _nest(depth, lambda: program.run_root(dict(inputs)))
            if bare:
                raise StopIteration
            return _FINISHED

        runner = greenlet.greenlet(run)
        if bare:
            stepper.attach(greenlet.getcurrent())
            steps = type("Steps", (), {"__next__": staticmethod(runner.switch), "__iter__": lambda self: self})()
        else:
            def generator():
                current = greenlet.getcurrent
                consumer = current()
                stepper.attach(consumer)
                resume = runner.switch
                item = resume()
                while item is not _FINISHED:
                    yield item
                    if current() is not consumer:
                        raise RuntimeError("resumed from another greenlet")
                    item = resume()
            steps = generator()
        for _ in steps:
            pass
        observer.reset()
    return run_once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = tiny_llama()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    interpreter = SchemaInterpreter()

    def step_run():
        for _ in interpreter.step_run(schema, dict(inputs)):
            pass

    candidates = {
        "eager": lambda: model(**inputs),
        "step_run": step_run,
        "stepped run": stepped(schema, inputs),
        "instruction read per step": stepped(schema, inputs, InstructionRead),
        "bare switch as __next__": stepped(schema, inputs, bare=True),
        "+ 10 C levels": stepped(schema, inputs, depth=10),
    }
    with torch.no_grad():
        steps = sum(1 for _ in interpreter.step_run(schema, dict(inputs)))
        load = os.getloadavg()[0]
        for fn in candidates.values():
            fn()
        samples: dict = {k: [] for k in candidates}
        for _ in range(args.rounds):
            for key, fn in candidates.items():
                start = time.thread_time()
                for _ in range(3):
                    fn()
                samples[key].append((time.thread_time() - start) / 3)
    print(f"llama: {steps} steps, {args.rounds} rounds, CPU time, 1-minute load average {load:.2f} before / "
          f"{os.getloadavg()[0]:.2f} after; eager {statistics.median(samples['eager']) * 1e3:.2f} ms")
    for key, times in samples.items():
        ratios = [t / e for t, e in zip(times, samples["eager"])]
        extra = ""
        if key not in ("eager", "step_run", "stepped run"):
            extra = f"  {statistics.median([(t - s) / steps * 1e6 for t, s in zip(times, samples['stepped run'])]):+.2f} " \
                    "us/step against the stepped run"
        print(f"  {key:26s} {statistics.median(times) * 1e3:7.2f} ms {statistics.median(ratios):6.3f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}){extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
