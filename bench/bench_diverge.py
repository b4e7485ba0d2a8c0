"""Planted faults for `diverge`: does `report.first` name the planted line, and do fault-free pairs flag nothing?

    PYTHONPATH=. python bench/bench_diverge.py [--seeds N] [--quick] [--only KIND,...] [--cost]
    PYTHONPATH=. python bench/bench_diverge.py --memory [--budget BYTES]

Cases come from `CASE_BUILDERS`, a list of functions `builder(seed) -> list[Case]`; add one to add
a kind (the compile helper's `compile_cases` is such a builder, run when
`nnschemaparser.traces.diverge_compile` is installed). A `Case` holds both sides, the keyword
arguments of `diverge`, and the planted line `(file, line)` (None: a fault-free pair).

Planted faults (toy block of tests/support/diverge_models.py, one seed per case: weights, inputs,
the size of the fault): an unscaled fp16 overflow (attention scores times a gain past 65504, fp32
against fp16), a softmax without upcast (`exp(s) / exp(s).sum()` in fp16, version b), a removed
`.float()` (the norm's `x.pow(2)` in fp16 on large inputs, version b), a changed `eps` (version b,
float32), a reassociated reduction that cancels (`(y + c).sum() - c * n`, version b, float32), an inserted
line putting a value through bf16 or fp16 (version b, float32); on
tiny Llama a changed RMSNorm eps and on tiny GPT-2 a residual put through bfloat16 (versions b). An
op a user backend computes differently is the compile builder's (skipped when the compile module is
absent). Fault-free pairs: bf16 and fp16 copies, autocast bf16, CPU settings (threads,
deterministic algorithms with mkldnn off), an identical copy of the code in another file, a renamed
variable, a benign reordered reduction, a harmless inserted line (toy, GPT-2 and Llama).

Timing (one torch thread, CPU time): each case runs `diverge` once cold (parses both sides), then
again on the parsed schemas (warm, best of 2); the eager forward of both sides under their settings
is timed beside it (best of 3). The cost ratio is the warm `diverge` over the two eager runs.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nnschemaparser import diverge  # noqa: E402
from nnschemaparser.traces.diverge_runs import cast_inputs, model_place, side_context  # noqa: E402
from tests.support.diverge_models import (gpt2, import_source, llama, same_weights, toy, toy_line,  # noqa: E402
                                          toy_module, variant_module)


@dataclass
class Case:
    name: str
    kind: str  # dtype, version, settings, compile
    model_a: Any
    model_b: Any
    inputs: dict
    planted: Optional[tuple[str, int]] = None
    options: dict = field(default_factory=dict)


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 + seed)


def _uniform(gen: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * torch.rand((), generator=gen).item()


# --- planted faults ---------------------------------------------------------------------------------

def fp16_overflow(seed: int) -> list[Case]:
    gen = _rng(seed)
    base = toy_module()
    a, inputs = toy(base, seed=seed, gain=10 ** _uniform(gen, 5.3, 6.0), amplitude=_uniform(gen, 0.5, 2.0))
    return [Case(f"fp16 overflow s{seed}", "dtype", a, copy.deepcopy(a).half(), inputs,
                 (base.__file__, toy_line(base, "scores =")))]


def softmax_without_upcast(seed: int) -> list[Case]:
    gen = _rng(seed)
    base = toy_module()
    variant = toy_module(SOFTMAX="torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)")
    gain = 10 ** _uniform(gen, 1.5, 2.0)
    a, inputs = toy(base, seed=seed, gain=gain)
    b, _ = toy(variant, seed=seed, gain=gain, state=a.state_dict())
    return [Case(f"softmax without upcast s{seed}", "version", a.half(), b.half(), inputs,
                 (variant.__file__, toy_line(variant, "probs =")))]


def removed_float(seed: int) -> list[Case]:
    gen = _rng(seed)
    base = toy_module()
    variant = toy_module(NORM="variance = x.pow(2).mean(-1, keepdim=True)")
    a, inputs = toy(base, seed=seed, amplitude=_uniform(gen, 300.0, 1000.0))
    b, _ = toy(variant, seed=seed, state=a.state_dict())
    return [Case(f"removed .float() s{seed}", "version", a.half(), b.half(), inputs,
                 (variant.__file__, toy_line(variant, "variance =")))]


def changed_eps(seed: int) -> list[Case]:
    gen = _rng(seed)
    base = toy_module()
    variant = toy_module(EPS=f"self.eps * {10 ** _uniform(gen, 3.0, 5.0):.1f}")
    a, inputs = toy(base, seed=seed, amplitude=_uniform(gen, 0.5, 2.0))
    b, _ = toy(variant, seed=seed, state=a.state_dict())
    return [Case(f"changed eps s{seed}", "version", a, b, inputs, (variant.__file__, toy_line(variant, "scale =")))]


def cancelling_reduction(seed: int) -> list[Case]:
    gen = _rng(seed)
    base = toy_module()
    offset = f"{10 ** _uniform(gen, 3.5, 5.0):.1f}"
    variant = toy_module(REDUCE=f"(y + {offset}).sum(-1, keepdim=True) - {offset} * y.shape[-1]")
    a, inputs = toy(base, seed=seed)
    b, _ = toy(variant, seed=seed, state=a.state_dict())
    return [Case(f"reordered reduction s{seed}", "version", a, b, inputs, (variant.__file__, toy_line(variant, "total =")))]


def inserted_downcast(seed: int) -> list[Case]:
    base = toy_module()
    source = Path(base.__file__).read_text()
    line = "        k = self.k(h)\n"
    low = ("torch.bfloat16", "torch.float16")[seed % 2]
    variant = import_source(source.replace(line, f"        h = h.to({low}).to(x.dtype)\n" + line), "toy_inserted")
    gen = _rng(seed)
    a, inputs = toy(base, seed=seed, amplitude=_uniform(gen, 0.5, 2.0))
    b, _ = toy(variant, seed=seed, state=a.state_dict())
    return [Case(f"inserted downcast s{seed}", "version", a, b, inputs, (variant.__file__, toy_line(variant, "h = h.to(")))]


def llama_eps(seed: int) -> list[Case]:
    from transformers.models.llama import modeling_llama

    old = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    new = f"hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon * {10 ** (3 + seed % 3)})"
    variant, lines = variant_module(modeling_llama, {old: new})
    a, inputs = llama(seed=seed)
    return [Case(f"llama changed eps s{seed}", "version", a, same_weights(a, variant, "LlamaForCausalLM"), inputs,
                 (variant.__file__, lines[new]))]


def gpt2_downcast(seed: int) -> list[Case]:
    from transformers.models.gpt2 import modeling_gpt2

    new = "hidden_states = residual + feed_forward_hidden_states.to(torch.bfloat16).float()"
    variant, lines = variant_module(modeling_gpt2, {"hidden_states = residual + feed_forward_hidden_states": new})
    a, inputs = gpt2(seed=seed)
    return [Case(f"gpt2 residual downcast s{seed}", "version", a, same_weights(a, variant, "GPT2LMHeadModel"), inputs,
                 (variant.__file__, lines[new]))]


def compile_cases(seed: int) -> list[Case]:
    """An op a user backend computes differently (the relu of the toy block, scaled by 1 + 1e-3)."""
    try:
        import nnschemaparser.traces.diverge_compile  # noqa: F401
    except ImportError:
        return []
    base = toy_module()

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in (torch.relu, torch.nn.functional.relu):
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(torch.mul, (node, 1.0 + 1e-3))
                node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
        gm.recompile()
        return gm.forward

    a, inputs = toy(base, seed=seed)
    return [Case(f"user backend relu s{seed}", "compile", a, torch.compile(copy.deepcopy(a), backend=backend),
                 inputs, (base.__file__, toy_line(base, "m = torch.relu(m)")))]


FAULTS = [fp16_overflow, softmax_without_upcast, removed_float, changed_eps, cancelling_reduction, inserted_downcast]
REAL_FAULTS = [llama_eps, gpt2_downcast]


# --- fault-free pairs --------------------------------------------------------------------------------

def clean_pairs(build: Callable[[int], tuple], label: str, version: Callable[[Any], Any]) -> Callable[[int], list[Case]]:
    def builder(seed: int) -> list[Case]:
        a, inputs = build(seed)
        cases = [Case(f"{label} bf16 s{seed}", "dtype", a, copy.deepcopy(a).to(torch.bfloat16), inputs),
                 Case(f"{label} fp16 s{seed}", "dtype", a, copy.deepcopy(a).half(), inputs),
                 Case(f"{label} autocast bf16 s{seed}", "dtype", a, a, inputs, options={"autocast_b": torch.bfloat16}),
                 Case(f"{label} threads 2 s{seed}", "settings", a, a, inputs, options={"settings_b": {"threads": 2}}),
                 Case(f"{label} deterministic, no mkldnn s{seed}", "settings", a, a, inputs,
                      options={"settings_b": {"deterministic": True, "mkldnn": False}})]
        for name, other in version(a):
            cases.append(Case(f"{label} {name} s{seed}", "version", a, other, inputs))
        return cases
    return builder


def _toy_versions(a: Any) -> list:
    same = toy_module()
    source = Path(same.__file__).read_text()
    renamed = import_source(source.replace("mixed", "attended"), "toy_renamed")
    benign = toy_module(REDUCE="y.flip(-1).sum(-1, keepdim=True)")
    inserted = import_source(source.replace("        k = self.k(h)\n", "        h = h.contiguous()\n        k = self.k(h)\n"),
                             "toy_inserted_harmless")
    out = []
    for name, module in (("same code, other file", same), ("renamed variable", renamed), ("benign reorder", benign),
                         ("harmless inserted line", inserted)):
        b = module.ToyModel(a.blocks[0].q.in_features, len(a.blocks), a.blocks[0].gain).eval()
        b.load_state_dict(a.state_dict())
        out.append((name, b))
    return out


def _hf_version(module: Any, class_name: str) -> Callable[[Any], list]:
    def versions(a: Any) -> list:
        variant, _ = variant_module(module, {})
        return [("same code, other file", same_weights(a, variant, class_name))]
    return versions


def _clean_builders() -> list:
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.llama import modeling_llama

    return [clean_pairs(lambda s: toy(toy_module(), seed=s, amplitude=1.0), "toy", _toy_versions),
            clean_pairs(lambda s: gpt2(seed=s), "gpt2", _hf_version(modeling_gpt2, "GPT2LMHeadModel")),
            clean_pairs(lambda s: llama(seed=s), "llama", _hf_version(modeling_llama, "LlamaForCausalLM"))]


def wide_cases() -> list[Case]:
    """Fault-free dtype and version pairs on wider models (the cost figure of real sizes)."""
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.llama import modeling_llama

    cases = []
    a, inputs = llama(layers=4, seq=128, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=1024)
    variant, _ = variant_module(modeling_llama, {})
    cases += [Case("wide llama bf16", "dtype", a, copy.deepcopy(a).to(torch.bfloat16), inputs),
              Case("wide llama same code, other file", "version", a, same_weights(a, variant, "LlamaForCausalLM"),
                   inputs)]
    a, inputs = gpt2(layers=4, seq=128, n_embd=512, n_head=8, vocab_size=1024)
    variant, _ = variant_module(modeling_gpt2, {})
    cases += [Case("wide gpt2 bf16", "dtype", a, copy.deepcopy(a).to(torch.bfloat16), inputs),
              Case("wide gpt2 same code, other file", "version", a, same_weights(a, variant, "GPT2LMHeadModel"), inputs)]
    return cases


CASE_BUILDERS: list = [*FAULTS, *REAL_FAULTS, compile_cases]


# --- running ----------------------------------------------------------------------------------------

def _eager_cpu(case: Case) -> float:
    best = float("inf")
    sides = []
    for model, key in ((case.model_a, "a"), (case.model_b, "b")):
        device, dtype = model_place(model)
        sides.append((model, cast_inputs(case.inputs, device, dtype),
                      case.options.get(f"settings_{key}"), case.options.get(f"autocast_{key}"), device))
    for _ in range(3):
        start = time.process_time()
        with torch.no_grad():
            for model, inputs, settings, autocast, device in sides:
                with side_context(settings, autocast, device):
                    model(**inputs)
        best = min(best, time.process_time() - start)
    return best


def run_case(case: Case) -> dict:
    start = time.process_time()
    report = diverge(case.model_a, case.model_b, case.inputs, **case.options)
    cold = time.process_time() - start
    warm = float("inf")
    if case.kind != "compile":
        for _ in range(2):
            start = time.process_time()
            diverge(case.model_a, case.model_b, case.inputs, schema_a=report.schema_a, schema_b=report.schema_b,
                    **case.options)
            warm = min(warm, time.process_time() - start)
    eager = _eager_cpu(case)
    first = report.first
    if case.planted is None:
        ok = first is None
    else:
        ok = first is not None and (first.file, first.line) == case.planted
    return {"case": case.name, "kind": case.kind, "planted": case.planted is not None, "ok": ok, "cold_s": cold,
            "warm_s": warm, "eager_s": eager, "ratio": warm / eager if eager > 0 else float("nan"),
            "first": str(first) if first is not None else "-"}


# --- memory --------------------------------------------------------------------------------------

MEMORY_MODES = ("eager", "diverge", "diverge unbounded")


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_child(mode: str, budget: int) -> None:
    """One mode in a fresh process: its peak resident memory above the process after setup (models built)."""
    torch.set_num_threads(1)
    a, inputs = memory_model()
    b = copy.deepcopy(a).to(torch.bfloat16)
    base = _rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    start = time.process_time()
    extra = {}
    if mode == "eager":
        with torch.no_grad():
            a(**inputs)
            b(**cast_inputs(inputs, *model_place(b)))
    else:
        report = diverge(a, b, inputs, memory_budget=budget if mode == "diverge" else None)
        extra = report.memory
    print({"mode": mode, "base": base, "peak": _rss("VmHWM") - base, "cpu_s": time.process_time() - start, **extra})


def memory_model() -> tuple:
    """A Llama where activations, not weights, take the memory: 1024 tokens (attention scores 32 MiB a row)."""
    return llama(layers=4, seq=1024, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=1024)


def memory_report(budget: int) -> None:
    import ast
    import subprocess

    rows = []
    for mode in MEMORY_MODES:
        # glibc's mmap threshold held at 128 KiB: a freed tensor leaves resident memory at once, so the
        # peak is what was alive, not what glibc's heap kept after raising its threshold to 32 MiB
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
        done = subprocess.run([sys.executable, __file__, "--memory-child", mode, "--budget", str(budget)],
                              capture_output=True, text=True, check=True, env=env)
        rows.append(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    eager = rows[0]["peak"]
    print(f"memory (llama hidden 512, 4 layers, 1024 tokens, fp32 against bf16; peak resident memory above the "
          f"process with both models built): budget {budget / 2 ** 20:.0f} MiB")
    for row in rows:
        more = f", held at most {row['peak_held'] / 2 ** 20:.0f} MiB, {row['written'] / 2 ** 20:.0f} MiB to disk" \
            if "peak_held" in row else ""
        print(f"  {row['mode']:<18} peak {row['peak'] / 2 ** 20:7.0f} MiB ({row['peak'] / eager:4.1f}x the two eager "
              f"runs), CPU {row['cpu_s']:.2f}s{more}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6, help="seeds per planted toy fault (default 6: 30 toy faults)")
    parser.add_argument("--clean-seeds", type=int, default=2, help="seeds per fault-free family (default 2)")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 1 clean seed")
    parser.add_argument("--cost", action="store_true",
                        help="also time wider models (hidden 512, 4 layers, 128 tokens), where ops, not Python, take the time")
    parser.add_argument("--only", default="", help="comma-separated kinds: dtype, version, settings, compile")
    parser.add_argument("--memory", action="store_true",
                        help="peak memory of diverge (with --budget, and with no limit) against the two eager runs, "
                             "each in a fresh process (Linux), then exit")
    parser.add_argument("--budget", type=int, default=256 * 2 ** 20, help="memory_budget for --memory (bytes)")
    parser.add_argument("--memory-child", choices=MEMORY_MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        warnings.filterwarnings("ignore", message="TF32 acceleration")
        memory_child(args.memory_child, args.budget)
        return
    if args.memory:
        memory_report(args.budget)
        return
    if args.quick:
        args.seeds, args.clean_seeds = 2, 1
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="TF32 acceleration")
    cases: list[Case] = []
    for builder in FAULTS + [compile_cases]:
        for seed in range(args.seeds):
            cases.extend(builder(seed))
    for builder in REAL_FAULTS:
        for seed in range(max(1, args.seeds // 3)):
            cases.extend(builder(seed))
    for builder in _clean_builders():
        for seed in range(args.clean_seeds):
            cases.extend(builder(seed))
    if args.cost:
        cases.extend(wide_cases())
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    if only:
        cases = [c for c in cases if c.kind in only]
    results = []
    for case in cases:
        row = run_case(case)
        results.append(row)
        print(f"{'ok ' if row['ok'] else 'MISS'} {row['case']:<40} cold {row['cold_s']:6.2f}s warm {row['warm_s']:6.3f}s "
              f"eager {row['eager_s']:6.4f}s ratio {row['ratio']:5.2f}x  first: {row['first'][:90]}", flush=True)
    faults = [r for r in results if r["planted"]]
    clean = [r for r in results if not r["planted"]]
    print()
    if faults:
        print(f"planted faults: {sum(r['ok'] for r in faults)}/{len(faults)} named the planted line "
              f"({100 * sum(r['ok'] for r in faults) / len(faults):.1f}%)")
    if clean:
        print(f"fault-free pairs: {sum(r['ok'] for r in clean)}/{len(clean)} flagged nothing "
              f"({100 * sum(r['ok'] for r in clean) / len(clean):.1f}%)")
    for kind in ("dtype", "version", "settings", "compile", "wide"):
        rows = [r for r in results if (r["kind"] == kind and not r["case"].startswith("wide")
                                       or kind == "wide" and r["case"].startswith("wide"))
                and r["ratio"] == r["ratio"] and r["warm_s"] < float("inf")]
        if rows:
            print(f"{kind:>8}: {len(rows)} cases, time per case cold {statistics.median(r['cold_s'] for r in rows):.2f}s "
                  f"(median, parse included), warm {statistics.median(r['warm_s'] for r in rows):.3f}s; cost against the "
                  f"two eager runs median {statistics.median(r['ratio'] for r in rows):.1f}x "
                  f"(max {max(r['ratio'] for r in rows):.1f}x)")


if __name__ == "__main__":
    main()
