"""What a capture of two layer outputs (`keep="call=..."`) pays over eager, piece by piece, in one process.

    python bench/bench_keep_pieces.py [--rounds N] [--inner N]

On the 32-layer tiny Llama of bench/models.py (hidden 64, 16 tokens), under torch.no_grad(), on one
thread, in interleaved rounds of CPU time; before each candidate's timed calls of a round it is
called once untimed, so no candidate pays for the caches the one before it left cold. Each
candidate adds one piece to the one before it:

  hooks             forward hooks on layers 3 and 17 cloning their outputs (the baseline)
  plain             the schema's plain generated code (`SchemaInterpreter().run`)
  counted           the counting program everywhere, the root too (the pair `keep=` borrows)
  observed root     the root observed (a listener that does nothing with its tensor results), the
                    layers counted: what `keep="call=layers.3, call=layers.17"` runs
  recorder          the same with the ActivationRecorder keeping the two layer outputs
  capture_run       `capture_run(schema, inputs, keep="call=layers.3, call=layers.17")`: the
                    recorder plus its own work (selector, memory check, the record)

A ratio is the median over rounds of a candidate's time over eager's in the same round, with the
interquartile range of those ratios. Before timing, the recorder's two values are checked
torch.equal to what the hooks saw.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture_keep import LayerHooks, interleaved, ratio_lines, timed_llama  # noqa: E402  (hooks, rounds, ratios)

from nnschemaparser import SchemaInterpreter, capture_run  # noqa: E402
from nnschemaparser.runtime.listeners import TraceListener  # noqa: E402
from nnschemaparser.runtime.partial import give_back_partial, partial_programs  # noqa: E402
from nnschemaparser.traces.recorder import ActivationRecorder  # noqa: E402
from nnschemaparser.traces.selection import keep_selector  # noqa: E402

KEEP = "call=layers.3, call=layers.17"


class Silent(TraceListener):
    """Hears of every tensor result of the observed blocks and does nothing with it."""

    every_instruction = False

    def tensor_result_hook(self):
        return lambda instr, frame, observer: None


def main() -> None:
    args, model, inputs, schema = timed_llama(__doc__, 31, 10)
    selector = keep_selector(KEEP)
    observe = selector.blocks_to_observe(schema)
    hooks = LayerHooks([model.layers[3], model.layers[17]])
    pair = partial_programs(schema, observe | {id(schema)})
    give_back_partial(pair)  # its counted program stays compiled; the runs below borrow the same pair
    silent = SchemaInterpreter(listeners=[Silent()], observe=observe)

    def recorded():
        recorder = ActivationRecorder(keep=selector)
        SchemaInterpreter(listeners=[recorder], observe=observe).run(schema, dict(inputs))
        return recorder

    candidates = {
        "eager": lambda: model(**inputs),
        "hooks": lambda: hooks.run(model, inputs),
        "plain": lambda: SchemaInterpreter().run(schema, dict(inputs)),
        "counted": lambda: pair.counted.run_root(dict(inputs)),
        "observed root": lambda: silent.run(schema, dict(inputs)),
        "recorder": recorded,
        "capture_run": lambda: capture_run(schema, dict(inputs), keep=KEEP),
    }
    with torch.no_grad():
        hooks.run(model, inputs)
        kept = list(recorded().trace)
        assert len(kept) == 2 and all(torch.equal(a, s.value) for a, s in zip(hooks.values, kept)), \
            "the recorded layer outputs differ from the hooks'"
        samples = interleaved(candidates, args.rounds, args.inner, warm_each=True)
    eager = samples["eager"]
    print(f"tiny Llama 32 layers x 64, 16 tokens, keep={KEEP!r}: eager {statistics.median(eager) / args.inner * 1e3:.2f} "
          f"ms per call ({args.rounds} rounds of {args.inner})")
    print("\n".join(ratio_lines(samples, width=14, digits=3, quartiles=True)))


if __name__ == "__main__":
    main()
