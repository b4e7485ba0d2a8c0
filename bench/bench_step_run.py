"""Where a stepped run's time goes, and step_run before and after a change, side by side in one process.

    python bench/bench_step_run.py [--before PATH] [--model llama|mixtral|vit|resnet] [--rounds N]

The dispatch-bound models of bench_dispatch.py (bench/models.py; default the 32-layer tiny Llama,
16 tokens, 3,780 steps). One thread, torch.no_grad(), CPU time of the thread (time.thread_time),
interleaved rounds of 3 calls each; a ratio is the median over rounds of the candidate's time over
eager's in the same round, and "us/step" is the candidate's median time less the one above it,
per step. The candidates, each adding a piece of what a stepped run pays:

  eager                          model(**inputs)
  run                            the plain program
  observed, no-op step           the stepped run's observed program, its one listener's hook returning at once
  + two switches a step          that hook switching to the consumer's greenlet and back (a bare generator)
  steps built, no switch         the stepped run's observer and stepper, every StepInfo built, the switch a no-op
  step_run, greenlet             step_run through the greenlet run (`step_generators.GENERATOR_STEPS = False`):
                                 two switches a step
  step_run                       every step of SchemaInterpreter().step_run, iterated to the end (its blocks
                                 run as generators, runtime/step_generators.py)

Last, the bytes of C stack greenlet copies out and back at each pause (`stack_saved`).

With --before PATH (a checkout of the package, e.g. `git worktree add /tmp/before main`), that
checkout is imported too, under the name `nnschemaparser_before`, parses the model itself, and its
run, step_run and steps built are timed in the same rounds ("run (before)", "step_run (before)",
"steps built (before)").
"""

from __future__ import annotations

import argparse
import importlib.util
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
from models import small_resnet, tiny_llama, tiny_mixtral, tiny_vit  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.runtime.interpreter import _borrow, _give_back  # noqa: E402
from nnschemaparser.runtime.listeners import TraceListener  # noqa: E402
from nnschemaparser.runtime import step_generators  # noqa: E402

FACTORIES = {"llama": tiny_llama, "mixtral": tiny_mixtral, "vit": tiny_vit, "resnet": small_resnet}


class NoOpStep(TraceListener):
    """The stepper's place in the run, doing nothing: what the observed program costs."""

    def on_instruction(self, event):
        pass

    def instruction_hook(self):
        return lambda instr, frame, observer: None


class SwitchOnly(NoOpStep):
    """Pauses at every step as a stepped run does, handing the consumer the bare instruction."""

    def instruction_hook(self):
        def step(instr, frame, observer):
            if not observer.conditions:
                self.consumer.switch(instr)
        return step


def switches(schema, inputs):
    def run():
        listener = SwitchOnly()
        program, observer = _borrow(schema, [listener], False)
        runner = greenlet.greenlet(lambda: program.run_root(dict(inputs)))
        listener.consumer = greenlet.getcurrent()

        def steps():
            item = runner.switch()
            while not runner.dead:
                yield item
                item = runner.switch()

        for _ in steps():
            pass
        _give_back(schema, program, observer)
    return run


def stack_saved(schema, inputs) -> list:
    """Bytes of C stack greenlet saves (and later restores) at each pause of the run: the run's C
    stack from its start down to the switch, which nests one C level per call made through
    `f(*args, **kwargs)` (a decorator's wrapper, an invoker's splat) and not for a plain Python call."""
    listener = SwitchOnly()
    program, observer = _borrow(schema, [listener], False)
    runner = greenlet.greenlet(lambda: program.run_root(dict(inputs)))
    listener.consumer = greenlet.getcurrent()
    sizes = []
    runner.switch()
    while not runner.dead:
        sizes.append(runner._stack_saved)
        runner.switch()
    _give_back(schema, program, observer)
    return sorted(sizes)


def built(package, schema, inputs):
    """The stepped run's own observer and stepper with the switch a no-op: every StepInfo built, no pause."""
    stepping = importlib.import_module(package + ".runtime.stepping")
    borrow = importlib.import_module(package + ".runtime.interpreter")

    def run():
        stepper = stepping.Stepper(None)
        stepper.switch = lambda info: None
        program, observer = borrow._borrow(schema, [stepper], False, stepping=True)
        program.run_root(dict(inputs))
        borrow._give_back(schema, program, observer, stepping=True)
    return run


def stepped(interpreter, schema, inputs, generators=True):
    def run():
        step_generators.GENERATOR_STEPS = generators
        try:
            for _ in interpreter.step_run(schema, dict(inputs)):
                pass
        finally:
            step_generators.GENERATOR_STEPS = True
    return run


def load_before(path: str):
    """The package of the checkout at `path`, imported as `nnschemaparser_before`."""
    init = Path(path).resolve() / "nnschemaparser" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--before {path}: no nnschemaparser/__init__.py there; give the root of a checkout")
    spec = importlib.util.spec_from_file_location("nnschemaparser_before", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["nnschemaparser_before"] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(FACTORIES), default="llama")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--before", metavar="PATH", help="a checkout whose run and step_run are timed alongside")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = FACTORIES[args.model]()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    stepper = SchemaInterpreter()
    with torch.no_grad():
        steps = sum(1 for _ in stepper.step_run(schema, dict(inputs)))
    candidates = {
        "eager": lambda: model(**inputs),
        "run": lambda: SchemaInterpreter().call(schema, **inputs),
        "observed, no-op step": lambda: SchemaInterpreter(listeners=[NoOpStep()]).run(schema, dict(inputs)),
        "+ two switches a step": switches(schema, inputs),
        "steps built, no switch": built("nnschemaparser", schema, inputs),
        "step_run, greenlet": stepped(stepper, schema, inputs, generators=False),
        "step_run": stepped(stepper, schema, inputs),
    }
    if args.before:
        before = load_before(args.before)
        old_schema = before.NNParser.parse_model(model=model, inputs_tensors_values=inputs)
        old = before.SchemaInterpreter()
        candidates["run (before)"] = lambda: before.SchemaInterpreter().call(old_schema, **inputs)
        candidates["step_run (before)"] = stepped(old, old_schema, inputs)
        candidates["steps built (before)"] = built("nnschemaparser_before", old_schema, inputs)
    load = os.getloadavg()[0]
    with torch.no_grad():
        for fn in candidates.values():
            fn()
        samples: dict = {k: [] for k in candidates}
        for _ in range(args.rounds):
            for key, fn in candidates.items():
                start = time.thread_time()
                for _ in range(3):
                    fn()
                samples[key].append((time.thread_time() - start) / 3)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.model}: {steps} steps, {args.rounds} rounds, CPU time, 1-minute load average {load:.2f} before / "
          f"{os.getloadavg()[0]:.2f} after; eager {medians['eager'] * 1e3:.2f} ms")
    previous = None
    for key, times in samples.items():
        ratios = [t / e for t, e in zip(times, samples["eager"])]
        extra = ""
        if key == "step_run":
            extra = f"  +{(medians[key] - medians['steps built, no switch']) / steps * 1e6:.2f} us/step over steps built"
        elif key.startswith("steps built"):
            extra = f"  +{(medians[key] - medians['observed, no-op step']) / steps * 1e6:.2f} us/step over the no-op step"
        elif previous is not None and not key.endswith("(before)") and key != "run" and key != "observed, no-op step":
            extra = f"  +{(medians[key] - medians[previous]) / steps * 1e6:.2f} us/step"
        elif key == "observed, no-op step":
            extra = f"  +{(medians[key] - medians['run']) / steps * 1e6:.2f} us/step over run"
        print(f"  {key:24s} {medians[key] * 1e3:7.2f} ms {statistics.median(ratios):6.3f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}){extra}")
        previous = key
    with torch.no_grad():
        sizes = stack_saved(schema, inputs)
    print(f"  C stack saved and restored at a pause: median {sizes[len(sizes) // 2]} bytes "
          f"({sizes[0]}-{sizes[-1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
