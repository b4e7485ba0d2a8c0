"""The memory a capture takes, measured, against `estimate_capture` (issue 25, point 4: within 15%).

    python bench/bench_capture_memory.py [--case NAME ...] [--repeat 3] [--grad]

Each case runs in a fresh subprocess: build the model (random weights, from its config), parse it,
estimate the capture (`estimate_capture(schema, keep=..., scope=...)`, its `peak_bytes`), collect
garbage, trim the heap (glibc `malloc_trim(0)`), read VmRSS, reset the kernel's high-water mark of
resident memory (`/proc/self/clear_refs` with "5" resets VmHWM, Linux), run
`capture_run(schema, scope, keep=...)`, read VmHWM. The capture's *peak growth*
is VmHWM minus the VmRSS before it; its *retained growth* is VmRSS after it (the record alive)
minus the same. Reported per case: the estimate, the peak growth and the estimate's error against
it (target: within 15%), with the retained growth and `kept_bytes(trace)` (what the trace holds)
beside them. Medians over --repeat fresh processes, with the range.

`--no-trim` leaves out the heap trim: the memory the parse freed and the allocator kept is then in the
VmRSS before the capture, which reuses it, so the growth reads low (GPT-2: 845 MiB for 1076 MiB).

Cases (eval mode, eager attention, no cache; `--grad` runs the capture with autograd on, as a
notebook does by default, the default is under `torch.no_grad()`):
llama-full  LlamaModel, 4 layers, hidden 256, 8 heads, 1024 tokens, every value kept
llama-keep2 the same model, keep="layers.1, layers.2"
gpt2-512    GPT2Model, 12 layers, 768 wide, 512 tokens, every value kept
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def _status(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _trim() -> None:
    """Give the heap's free memory back to the system (glibc `malloc_trim`): memory the parse freed
    but the allocator kept would otherwise count in the VmRSS before the capture, which reuses it."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def _case(name: str):
    import torch

    if name.startswith("llama"):
        from transformers import LlamaConfig, LlamaModel

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
        config._attn_implementation = "eager"
        model = LlamaModel(config).eval()
        ids = torch.randint(0, 512, (1, 1024), generator=torch.Generator().manual_seed(0))
        keep = "layers.1, layers.2" if name == "llama-keep2" else None
        return model, {"input_ids": ids, "use_cache": False}, keep
    if name == "gpt2-512":
        sys.path.insert(0, str(ROOT))
        from bench.models import gpt2_small

        model, inputs = gpt2_small(512)
        return model, inputs, None
    raise SystemExit(f"unknown case {name!r}")


def measure(name: str, grad: bool, trim: bool = True) -> dict:
    import torch

    from nnschemaparser import NNParser, capture_run, estimate_capture
    from nnschemaparser.traces.estimate import kept_bytes

    torch.set_num_threads(1)
    model, inputs, keep = _case(name)
    schema = NNParser.parse_model(model, inputs_tensors_values=dict(inputs))
    with torch.set_grad_enabled(grad):
        estimate = estimate_capture(schema, keep=keep, scope=dict(inputs))
    gc.collect()
    if trim:
        _trim()
    before = _status("VmRSS")
    _reset_peak()
    with torch.set_grad_enabled(grad):
        record = capture_run(schema, dict(inputs), keep=keep)
    peak = _status("VmHWM")
    after = _status("VmRSS")
    return {"case": name, "estimate": estimate.peak_bytes, "estimate_kept": estimate.total_bytes, "estimate_method": estimate.method,
            "peak_growth": peak - before, "retained_growth": after - before, "kept": kept_bytes(record.trace),
            "steps": len(record.trace), "breakdown": getattr(estimate, "parts", None)}


def _fresh(name: str, grad: bool, trim: bool) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, __file__, "--part", name] + (["--grad"] if grad else []) + ([] if trim else ["--no-trim"])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"case {name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=["llama-full", "llama-keep2", "gpt2-512"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--grad", action="store_true", help="capture with autograd on")
    parser.add_argument("--no-trim", action="store_true",
                        help="leave the heap untrimmed before the capture (the memory the parse freed is reused)")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        print(json.dumps(measure(args.part, args.grad, not args.no_trim)))
        return 0
    for name in args.case or ["llama-full", "llama-keep2", "gpt2-512"]:
        runs = [_fresh(name, args.grad, not args.no_trim) for _ in range(args.repeat)]
        estimate = runs[0]["estimate"]
        errors = [(estimate - run["peak_growth"]) / run["peak_growth"] for run in runs]
        peaks = [run["peak_growth"] / MIB for run in runs]
        retained = [run["retained_growth"] / MIB for run in runs]
        error = statistics.median(errors)
        print(f"{name}{' (grad)' if args.grad else ''}{' (no trim)' if args.no_trim else ''}: estimate {estimate / MIB:.1f} MiB ({runs[0]['estimate_method']}, "
              f"{runs[0]['steps']} steps); peak growth median {statistics.median(peaks):.1f} MiB "
              f"[{min(peaks):.1f}, {max(peaks):.1f}]; error {error:+.1%} [{min(errors):+.1%}, {max(errors):+.1%}]  "
              f"target within 15%: {'ok' if max(abs(e) for e in errors) <= 0.15 else 'OVER'}; retained "
              f"{statistics.median(retained):.1f} MiB, kept_bytes {runs[0]['kept'] / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
