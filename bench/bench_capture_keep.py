"""A capture of two layers (`capture_run(keep=...)`) against eager and forward hooks, side by side in one process.

    python bench/bench_capture_keep.py [--rounds N] [--inner N] [--layers 3,17] [--before PATH]

On the 32-layer tiny Llama of bench/models.py (hidden 64, 16 tokens), under torch.no_grad(), in
interleaved rounds of CPU time (`time.process_time`); a ratio is the median over rounds of a
candidate's time over eager's time in the same round. Two pairs keep the same tensors two ways:

  eager                  model(**inputs)
  hooks on 2 layers      forward hooks on the two layers, each cloning its first output (what
                         nnsight's `.save()` of a layer output keeps)
  keep 2 layer outputs   capture_run(schema, inputs, keep="call=layers.3, call=layers.17"): the same
                         two tensors, through the kept logged program (traces/keep_plan.py): plain
                         code that counts every tensor and appends the two kept ones
  hooks in 2 layers      forward hooks on every module inside the two layers (and the layers), each
                         cloning its first output: every module output, no functional op's result
  keep 2 layers          capture_run(..., keep="layers.3, layers.17"): every step of the two layers
                         (ops and module outputs alike, 112 tensors); the other 30 layers counted
  keep, all observed     the same with observe_all=True (every block observed, as before issue 24.4)
  capture all            capture_run(schema, inputs): every step of every block

With --before PATH (a checkout of the package, e.g. `git worktree add --detach /tmp/before main`),
that checkout is imported too (`nnschemaparser_before`, bench_step_run.load_before), parses the
model itself, and its two kept captures are timed in the same rounds ("... (before)").

Before timing it checks that every capture's outputs are torch.equal to eager's, that each kept
capture holds exactly the full capture's steps it names (numbers, container ids, values) and that
the two layer outputs kept are torch.equal to what the hooks on the two layers saw.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import tiny_llama  # noqa: E402

from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.traces.record import capture_run  # noqa: E402


class LayerHooks:
    """Forward hooks on some layers, cloning their first tensor output."""

    def __init__(self, layers):
        self.layers, self.values = layers, []

    def run(self, model, inputs):
        self.values = []

        def hook(module, args, output):
            first = output[0] if isinstance(output, tuple) else output
            self.values.append(first.detach().clone())

        handles = [layer.register_forward_hook(hook) for layer in self.layers]
        try:
            return model(**inputs)
        finally:
            for handle in handles:
                handle.remove()


def interleaved(candidates: dict, rounds: int, inner: int, warm_each: bool = False) -> dict[str, list[float]]:
    """CPU time of `inner` calls of each candidate, one candidate after another, `rounds` times over
    (each called once first, untimed: programs compiled, caches filled; `warm_each`: also once,
    untimed, before its timed calls of every round, so none pays for caches the one before left cold)."""
    for fn in candidates.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            if warm_each:
                fn()
            start = time.process_time()
            for _ in range(inner):
                fn()
            samples[name].append(time.process_time() - start)
    return samples


def ratio_lines(samples: dict[str, list[float]], width: int = 30, digits: int = 2, quartiles: bool = False) -> list[str]:
    """One line per candidate: the median over rounds of its time over eager's in the same round,
    with the range of those ratios (`quartiles`: their interquartile range)."""
    lines = []
    for name, times in samples.items():
        if name == "eager":
            continue
        ratios = sorted(t / e for t, e in zip(times, samples["eager"]))
        cut = len(ratios) // 4 if quartiles else 0
        spread = f"{'interquartile' if quartiles else 'rounds'} {ratios[cut]:.{digits}f}-{ratios[-1 - cut]:.{digits}f}"
        lines.append(f"  {name:{width}s} {statistics.median(ratios):{digits + 3}.{digits}f}x eager  ({spread})")
    return lines


def _same(got, expected) -> None:
    got = list(got)
    assert [(s.step, s.container_id) for s in got] == [(s.step, s.container_id) for s in expected]
    assert all(torch.equal(a.value, b.value) for a, b in zip(got, expected)), "a kept value differs"


def check(model, schema, inputs, keep: str, outputs: str, hooks: LayerHooks, layers: list[int]) -> str:
    eager = model(**inputs).last_hidden_state
    full = capture_run(schema, dict(inputs))
    kept = capture_run(schema, dict(inputs), keep=keep)
    observed = capture_run(schema, dict(inputs), keep=keep, observe_all=True)
    calls = capture_run(schema, dict(inputs), keep=outputs)
    for record in (full, kept, observed, calls):
        assert torch.equal(record.outputs[0].last_hidden_state, eager), "a capture's output differs from eager"
    names = tuple(f"layers.{n}" for n in layers)
    expected = [s for s in full.trace if s.block_path in names or s.block_path.startswith(tuple(n + "." for n in names))]
    for record in (kept, observed):
        _same(record.trace, expected)
    _same(calls.trace, [s for s in full.trace if s.op_name in names])
    hooks.run(model, inputs)
    assert len(hooks.values) == len(layers) and all(torch.equal(a, s.value) for a, s in zip(hooks.values, calls.trace))
    return (f"{len(kept.trace)} of {len(full.trace)} steps kept by {keep!r}, {len(calls.trace)} by {outputs!r}, "
            f"equal to the full capture's (and the layer outputs to the hooks')")


def timed_llama(doc: str, rounds: int, inner: int, **more: Any) -> tuple:
    """(arguments, model, inputs, schema) of a benchmark of the 32-layer tiny Llama on one torch
    thread: `--rounds` and `--inner` with these defaults, `more` as further `--name` options."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--inner", type=int, default=inner, help="timed calls per candidate per round")
    for name, default in more.items():
        parser.add_argument(f"--{name}", default=default)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = tiny_llama()
    return args, model, inputs, NNParser.parse_model(model=model, inputs_tensors_values=inputs)


def main() -> None:
    args, model, inputs, schema = timed_llama(__doc__, 7, 20, layers="3,17", before="")
    layers = [int(n) for n in args.layers.split(",")]
    keep = ", ".join(f"layers.{n}" for n in layers)
    outputs = ", ".join(f"call=layers.{n}" for n in layers)
    hooks = LayerHooks([model.layers[n] for n in layers])
    inside = LayerHooks([module for n in layers for module in model.layers[n].modules()])
    candidates = {
        "eager": lambda: model(**inputs),
        "hooks on 2 layers": lambda: hooks.run(model, inputs),
        "keep 2 layer outputs": lambda: capture_run(schema, dict(inputs), keep=outputs),
        "hooks in 2 layers": lambda: inside.run(model, inputs),
        "keep 2 layers": lambda: capture_run(schema, dict(inputs), keep=keep),
        "keep, all observed": lambda: capture_run(schema, dict(inputs), keep=keep, observe_all=True),
        "capture all": lambda: capture_run(schema, dict(inputs)),
    }
    if args.before:
        from bench_step_run import load_before

        before = load_before(args.before)
        old = before.NNParser.parse_model(model=model, inputs_tensors_values=inputs)
        candidates["keep 2 layer outputs (before)"] = lambda: before.capture_run(old, dict(inputs), keep=outputs)
        candidates["keep 2 layers (before)"] = lambda: before.capture_run(old, dict(inputs), keep=keep)
    with torch.no_grad():
        print(check(model, schema, inputs, keep, outputs, hooks, layers))
        samples = interleaved(candidates, args.rounds, args.inner)
    eager = samples["eager"]
    print(f"tiny Llama 32 layers x 64, 16 tokens, keep={keep!r}; eager {statistics.median(eager) / args.inner * 1e3:.2f} "
          f"ms per call (median of {args.rounds} rounds of {args.inner})")
    print("\n".join(ratio_lines(samples)))


if __name__ == "__main__":
    main()
