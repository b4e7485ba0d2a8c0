"""Full capture (every intermediate tensor) against eager, side by side in one process.

    python bench/bench_capture.py [--rounds N] [--quick] [--no-torchlens] [--no-memory]

For each of the core benchmark's two models (64 x Linear(64,64)+relu at batch 1; a GPT-2-small-sized
GPT2Model, 64 tokens) this times, under torch.no_grad(), in interleaved rounds; a ratio is the
median over rounds of a candidate's time divided by eager's time in the same round:

  eager        model(**inputs)
  hooks+clone  model(**inputs) with a forward hook on every module that clones its tensor outputs
  capture_run  nnschemaparser.capture_run: one TraceStep per intermediate tensor, values kept
  TorchLens    torchlens.trace(model, ...) saving every layer, where torchlens is installed; timed in
               its own rounds next to eager, with torch unwrapped after each call so that eager
               timings are not affected by its wrapping

and checks that capture_run's outputs are torch.equal to eager. Targets: capture_run at most 5x
eager on the MLP stack and at most 1.5x on GPT-2 small.

Memory: each capture is repeated in a fresh subprocess that samples the bytes in use in the C
heap (glibc's mallinfo2, where torch's CPU tensors live) while the capture runs. The table reports
the peak growth over the size before the call and the bytes of the distinct storages the capture
holds (what any capture keeping every value must keep).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import gpt2_small, linear_stack  # noqa: E402

from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.traces.record import capture_run  # noqa: E402

MODELS = {"mlp": ("64 x Linear(64,64)+relu, batch 1", linear_stack, 50),
          "gpt2": ("GPT-2 small (12x768), 64 tokens", gpt2_small, 1)}
TARGETS = {"mlp": 5.0, "gpt2": 1.5}


def flat_tensors(value, depth: int = 0) -> list:
    """Every tensor reachable from an output: containers, ModelOutputs, and caches' attributes."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 6 or value is None or isinstance(value, (int, float, str, bool)):
        return []
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flat_tensors(item, depth + 1)]
    return [t for item in vars(value).values() for t in flat_tensors(item, depth + 1)] if hasattr(value, "__dict__") \
        else []


def same(a, b) -> bool:
    """torch.equal on every tensor of the two outputs, in order (a KV cache compares its tensors)."""
    left, right = flat_tensors(a), flat_tensors(b)
    return len(left) == len(right) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(left, right))


class HookCapture:
    """The usual baseline: a forward hook on every module, cloning each tensor it outputs."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.values: list[torch.Tensor] = []

    def _hook(self, module, args, output) -> None:
        stack = [output]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                self.values.append(item.detach().clone())
            elif isinstance(item, (tuple, list)):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend(item.values())

    def run(self, inputs: dict):
        self.values = []
        handles = [m.register_forward_hook(self._hook) for m in self.model.modules()]
        try:
            return self.model(**inputs)
        finally:
            for handle in handles:
                handle.remove()


def torchlens_runner(model, inputs):
    try:
        import torchlens
        from torchlens.options import CaptureOptions
    except ImportError:
        return None
    options = CaptureOptions(unwrap_when_done=True)
    return lambda: torchlens.trace(model, list(inputs.values()), capture=options)


def timed(fn, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def interleaved(candidates: dict, rounds: int, inner: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median time of each candidate, and the median over rounds of its time / eager's in that round.

    The per-round ratio compares runs made seconds apart, so it holds up on a machine whose load
    drifts; it is the figure checked against the targets.
    """
    for fn in candidates.values():
        timed(fn, 1)
    samples = {k: [] for k in candidates}
    for _ in range(rounds):
        for key, fn in candidates.items():
            samples[key].append(timed(fn, inner))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {k: statistics.median(x / e for x, e in zip(v, samples["eager"])) for k, v in samples.items()}
    return medians, ratios


def bench(key: str, rounds: int, with_torchlens: bool) -> dict:
    label, factory, inner = MODELS[key]
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    hooks = HookCapture(model)
    with torch.no_grad():
        record = capture_run(schema, dict(inputs))
        eager_out = model(**inputs)
        exact = same(eager_out, record.outputs[0] if len(record.outputs) == 1 else tuple(record.outputs))
        steps = len(record.trace)
        del record
        medians, ratios = interleaved({"eager": lambda: model(**inputs), "hooks+clone": lambda: hooks.run(inputs),
                                       "capture_run": lambda: capture_run(schema, dict(inputs))}, rounds, inner)
        hooked = len(hooks.values)
        tl_ratio = None
        if with_torchlens:
            runner = torchlens_runner(model, inputs)
            if runner is not None:
                tl_rounds = max(1, min(3, rounds // 3))
                _, tl = interleaved({"eager": lambda: model(**inputs), "TorchLens": runner}, tl_rounds, 1)
                tl_ratio = tl["TorchLens"]
    return {"key": key, "name": label, "exact": exact, "steps": steps, "hooked": hooked, "medians": medians,
            "ratios": ratios, "torchlens_ratio": tl_ratio}


# --- memory probe (runs in a child process) ----------------------------------------------------

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_reader():
    """Bytes in use in the C heap (glibc mallinfo2: arena chunks in use + mmapped chunks), or RSS.

    Torch's CPU tensors live in the C heap, so this follows what is allocated and freed, unlike the
    resident set size, which keeps memory glibc has not yet handed back.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
        mallinfo2.restype = _MallInfo2

        def in_use() -> int:
            info = mallinfo2()
            return info.uordblks + info.hblkhd

        in_use()
        return in_use, "C heap in use"
    except (OSError, AttributeError):
        def rss() -> int:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096

        return rss, "resident set"


def sampled_call(run, reading):
    """(result of run(), peak growth of reading() over its value before the call, growth still held after).

    A thread samples reading() every 0.1 ms while run() runs; shared by every bench that measures memory.
    """
    before = reading()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], reading())
            time.sleep(0.0001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    result = run()
    done.set()
    sampler.join()
    peak[0] = max(peak[0], reading())
    return result, peak[0] - before, reading() - before


def _distinct_bytes(tensors) -> int:
    seen = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def memory_probe(key: str, method: str) -> dict:
    _, factory, _ = MODELS[key]
    model, inputs = factory()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    hooks = HookCapture(model)
    run = {"eager": lambda: model(**inputs), "hooks+clone": lambda: hooks.run(inputs),
           "capture_run": lambda: capture_run(schema, dict(inputs))}[method]
    reading, what = _heap_reader()
    with torch.no_grad():
        model(**inputs)  # warm-up: lazy initialisation is not part of the capture
        result, peak_growth, retained = sampled_call(run, reading)
    if method == "capture_run":
        kept = _distinct_bytes(step.tensor.value for step in result.trace.steps)
    elif method == "hooks+clone":
        kept = _distinct_bytes(hooks.values)
    else:
        kept = 0
    return {"peak_growth": peak_growth, "retained": retained, "distinct_bytes": kept, "measure": what}


def probe_in_child(key: str, method: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--memory-probe", key, method], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(n: int) -> str:
    return f"{n / 2**20:9.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--no-torchlens", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--models", default="mlp,gpt2")
    parser.add_argument("--memory-probe", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        print(json.dumps(memory_probe(*args.memory_probe)))
        return 0
    rounds = 3 if args.quick else args.rounds
    keys = [k for k in args.models.split(",") if k]
    rows = [bench(key, rounds, not args.no_torchlens) for key in keys]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} rounds, torch.no_grad()")
    print(f"{'model':34s} {'eager ms':>9s} {'hooks+clone':>12s} {'capture_run':>12s} {'TorchLens':>10s} "
          f"{'target':>7s}  exact  steps")
    ok = True
    for row in rows:
        m, r = row["medians"], row["ratios"]
        ratio = r["capture_run"]
        target = TARGETS[row["key"]]
        ok = ok and row["exact"]
        tl = f"{row['torchlens_ratio']:9.1f}x" if row["torchlens_ratio"] is not None else f"{'n/a':>10s}"
        print(f"{row['name']:34s} {m['eager'] * 1e3:9.3f} {r['hooks+clone']:11.2f}x "
              f"{ratio:11.2f}x {tl} {'<=' + format(target, '.1f') + 'x':>7s}  {str(row['exact']):5s}  "
              f"{row['steps']} (hooks: {row['hooked']} tensors)  {'meets target' if ratio <= target else 'MISSES'}")
    if not args.no_memory:
        print()
        print(f"{'model':34s} {'method':12s} {'peak MiB':>9s} {'retained':>9s} {'distinct':>9s}   (growth of the "
              "C heap in use over its size before the call, sampled every 0.1 ms; retained = still in use "
              "with the result alive; distinct = bytes of the distinct storages the result keeps)")
        for row in rows:
            for method in ("eager", "hooks+clone", "capture_run"):
                mem = probe_in_child(row["key"], method)
                if mem["measure"] != "C heap in use":
                    print(f"  (measured as {mem['measure']}: mallinfo2 is not available here)")
                print(f"{row['name']:34s} {method:12s} {mib(mem['peak_growth'])}  {mib(mem['retained'])}  "
                      f"{mib(mem['distinct_bytes'])}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
