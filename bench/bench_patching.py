"""Activation patching over every layer's residual, and attribution patching, against eager forwards.

    python bench/bench_patching.py [--rounds N] [--layers L] [--sizes 64x16,256x64]

On a tiny Llama and a tiny GPT-2 (L layers, default 8; each size `width x tokens`: width 64 with 16
tokens, where Python around the ops dominates a forward, and width 256 with 64 tokens; random
weights, eager attention, one torch thread, CPU time, `torch.no_grad()` for patching), side by side
in one process:

- eager: one `model(**clean)`;
- activation_patching over the L + 1 residual sites (the embedding's output and each layer's,
  `call=` selectors): the patched runs alone (the clean prefix reused, runtime/reuse.py), the same
  with `reuse=False`, and the whole call (which also makes the clean and the corrupted run);
- the same sweep written by hand with forward hooks: a corrupted run with hooks keeping the L + 1
  outputs, then one hooked run per site (patched runs alone, and with the two reference runs);
- nnsight's sweep (a trace per site) where nnsight can be imported (`pip install nnsight` in a
  throwaway venv with `--system-site-packages`; it is not a dependency);
- attribution_patching over the same sites (one clean forward and backward, one corrupted forward)
  against one eager forward and backward (`metric.backward()`).

Each figure is the median over rounds of a candidate's CPU time over the same round's eager forward
(or forward and backward); a sweep's figure is divided by L + 1, so 0.5 means the sweep cost half
of L + 1 forwards. Metrics are checked equal to the hand-written sweep's first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import nnschemaparser.traces.patching as patching  # noqa: E402
from nnschemaparser import NNParser, activation_patching, attribution_patching  # noqa: E402


def models(layers: int, width: int = 64):
    import transformers

    torch.manual_seed(0)
    llama = transformers.LlamaConfig(vocab_size=128, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    llama._attn_implementation = "eager"
    gpt2 = transformers.GPT2Config(vocab_size=128, n_embd=width, n_layer=layers, n_head=4, n_positions=128,
                                   bos_token_id=0, eos_token_id=0)
    gpt2._attn_implementation = "eager"
    llama_model = transformers.LlamaForCausalLM(llama).eval()
    gpt2_model = transformers.GPT2LMHeadModel(gpt2).eval()
    return {
        "llama": (llama_model, llama_model.model.embed_tokens, list(llama_model.model.layers),
                  "call=model.embed_tokens, call=model.layers.*"),
        "gpt2": (gpt2_model, gpt2_model.transformer.drop, list(gpt2_model.transformer.h),
                 "call=transformer.drop, call=transformer.h.*"),
    }


def metric(outputs) -> torch.Tensor:
    return outputs.logits[:, -1, 5].sum() - outputs.logits[:, -1, 9].sum()


def hook_sweep(model, modules, clean, corrupted, patched_only: bool = False) -> list:
    """The sweep by hand: the corrupted outputs by hooks, then one hooked clean run per site."""
    sources: list = []
    handles = [m.register_forward_hook(lambda _m, _a, out: sources.append(out[0] if isinstance(out, tuple) else out))
               for m in modules]
    with torch.no_grad():
        model(**corrupted)
        for handle in handles:
            handle.remove()
        if not patched_only:
            metric(model(**clean))
        out = []
        for module, source in zip(modules, sources):
            handle = module.register_forward_hook(
                lambda _m, _a, o, _s=source: (_s, *o[1:]) if isinstance(o, tuple) else _s)
            out.append(metric(model(**clean)).item())
            handle.remove()
    return out


class PatchedOnly:
    """Times activation_patching's runs by kind: the reference runs, and the patched runs (observed,
    `run_reusing`, or plain, `run_plain`)."""

    def __init__(self):
        self.patched = 0.0
        self.original = patching.run_reusing
        self.original_plain = patching.run_plain

    def __enter__(self):
        def timed(pair, *args, **kwargs):
            n, self.count = self.count, self.count + 1  # runs 0 and 1 are the clean and corrupted ones
            start = time.process_time()
            try:
                return self.original(pair, *args, **kwargs)
            finally:
                if n >= 2:
                    self.patched += time.process_time() - start

        def timed_plain(pair, *args, **kwargs):
            self.count += 1
            start = time.process_time()
            try:
                return self.original_plain(pair, *args, **kwargs)
            finally:
                self.patched += time.process_time() - start

        self.count = 0
        patching.run_reusing, patching.run_plain = timed, timed_plain
        return self

    def __exit__(self, *exc):
        patching.run_reusing, patching.run_plain = self.original, self.original_plain


def _envoy(root, name: str):
    for part in name.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def nnsight_sweep(model, modules_names, clean, corrupted):
    """nnsight's sweep (a trace keeping the corrupted outputs, then a trace per site), or None."""
    try:
        from nnsight import NNsight
    except ImportError:
        return None
    import copy

    wrapped = NNsight(copy.deepcopy(model))  # nnsight wraps the modules it is given: a copy of its own

    def sweep():
        saved = []
        with torch.no_grad():
            with wrapped.trace(**corrupted):
                for name in modules_names:
                    saved.append(_envoy(wrapped, name).output.save())
            out = []
            for name, value in zip(modules_names, saved):
                with wrapped.trace(**clean):
                    _envoy(wrapped, name).output = value
                    m = metric(wrapped.output).save()
                out.append(float(m))
        return out

    return sweep


def median_ratio(times, base) -> float:
    return statistics.median(t / b for t, b in zip(times, base))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--sizes", default="64x16,256x64", help="width x tokens, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for size in args.sizes.split(","):
        width, tokens = (int(n) for n in size.split("x"))
        bench_size(args.layers, width, tokens, args.rounds)


def bench_size(L: int, width: int, tokens: int, rounds: int) -> None:
    for name, (model, embed, layers, at) in models(L, width).items():
        ids = torch.randint(1, 128, (1, tokens), generator=torch.Generator().manual_seed(1))
        other = ids.clone()
        other[0, tokens // 2] = (ids[0, tokens // 2] + 1) % 127 + 1
        clean, corrupted = {"input_ids": ids, "use_cache": False}, {"input_ids": other, "use_cache": False}
        schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(clean))
        modules = [embed, *layers]
        expected = hook_sweep(model, modules, clean, corrupted)
        table = activation_patching(schema, clean, corrupted, metric, at=at)
        assert list(table["metric"]) == expected, "activation_patching differs from the hand-written sweep"
        names = [n for n, m in model.named_modules() if any(m is x for x in modules)]
        theirs = nnsight_sweep(model, names, clean, corrupted)
        if theirs is not None:
            assert theirs() == expected, "nnsight's sweep differs from the hand-written one"
        samples: dict = {k: [] for k in ("eager", "patched runs (reuse)", "patched runs (reuse=False)",
                                           "activation_patching, whole call", "hooks: patched runs",
                                           "hooks: whole sweep", "nnsight: whole sweep",
                                           "eager fwd+bwd", "attribution_patching")}
        for _ in range(rounds + 1):
            times = {}
            start = time.process_time()
            with torch.no_grad():
                model(**clean)
            times["eager"] = time.process_time() - start
            for label, reuse in (("patched runs (reuse)", True), ("patched runs (reuse=False)", False)):
                with PatchedOnly() as timer:
                    start = time.process_time()
                    activation_patching(schema, clean, corrupted, metric, at=at, reuse=reuse)
                    whole = time.process_time() - start
                times[label] = timer.patched
                if reuse:
                    times["activation_patching, whole call"] = whole
            for label, only in (("hooks: patched runs", True), ("hooks: whole sweep", False)):
                start = time.process_time()
                hook_sweep(model, modules, clean, corrupted, patched_only=only)
                times[label] = time.process_time() - start
            if theirs is not None:
                start = time.process_time()
                theirs()
                times["nnsight: whole sweep"] = time.process_time() - start
            start = time.process_time()
            metric(model(**clean)).backward()
            times["eager fwd+bwd"] = time.process_time() - start
            model.zero_grad(set_to_none=True)
            start = time.process_time()
            attribution_patching(schema, clean, corrupted, metric, at=at)
            times["attribution_patching"] = time.process_time() - start
            if _ > 0:  # the first round warms every candidate
                for key, value in times.items():
                    samples[key].append(value)
        print(f"{name}: {L} layers, width {width}, {tokens} tokens; {L + 1} residual sites; median of {rounds} rounds")
        for key in samples:
            if key in ("eager", "eager fwd+bwd") or not samples[key]:
                if not samples[key]:
                    print(f"  {key:34s} not run (nnsight is not importable here)")
                continue
            if key == "attribution_patching":
                print(f"  {key:34s} {median_ratio(samples[key], samples['eager fwd+bwd']):5.2f}x one eager forward+backward")
                continue
            ratio = median_ratio(samples[key], samples["eager"]) / (L + 1)
            print(f"  {key:34s} {ratio:5.2f} x (L+1) eager forwards")


if __name__ == "__main__":
    main()
