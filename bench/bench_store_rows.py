"""Rows as samples and token reads, side by side in one process (CPU time, one torch thread).

    python bench/bench_store_rows.py [--rounds N] [--batches N] [--batch N]

1. write: a GPT-2 of 4 layers x 128 (random weights, 32 tokens), `--batches` DataLoader-style batches of
   `--batch` rows, right-padded with an attention mask, in interleaved rounds: eager on the batches,
   forward hooks on every layer cloning each layer's output row by row (the baseline a researcher writes),
   capture_dataset of the batches as rows (`batch_axis=0`, `mask="attention_mask"`, keep="call=h.*"),
   the same without the mask,
   the same batches each kept whole (`batch_axis=None`, no mask), and the same rows given one by one
   (batches of 1). Ratios to eager, median over rounds.
2. tokens: from the rows store, every unmasked token of `h.3:output` read through `store.tokens` in
   shuffled batches of 256, against the same tokens gathered from one `store.stack` in memory by the same
   permutation; tokens per second of CPU time, median over rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nnschemaparser import NNParser, capture_dataset  # noqa: E402


def _model():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=64, vocab_size=512)
    config._attn_implementation = "eager"
    return GPT2Model(config).eval()


def _batches(count: int, rows: int, width: int = 32) -> list:
    generator = torch.Generator().manual_seed(3)
    out = []
    for _ in range(count):
        lengths = torch.randint(width // 2, width + 1, (rows,), generator=generator)
        ids = torch.randint(1, 512, (rows, width), generator=generator)
        mask = (torch.arange(width) < lengths.unsqueeze(1)).long()
        out.append({"input_ids": ids * mask, "attention_mask": mask})
    return out


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model()
    batches = _batches(args.batches, args.batch)
    singles = [{k: v[r:r + 1] for k, v in b.items()} for b in batches for r in range(args.batch)]
    schema = NNParser.parse_model(model=model, inputs_tensors_values=batches[0])
    scratch = Path(tempfile.mkdtemp(prefix="bench_rows_"))

    def eager():
        with torch.no_grad():
            for b in batches:
                model(**b)

    def hooks():
        kept = []
        handles = [layer.register_forward_hook(
            lambda _m, _a, out: kept.extend(row.clone() for row in out[0].split(1))) for layer in model.h]
        try:
            eager()
        finally:
            for h in handles:
                h.remove()

    def store(name, data, **options):
        def run():
            shutil.rmtree(scratch / name, ignore_errors=True)
            capture_dataset(schema, data, scratch / name, keep="call=h.*", progress=False, **options)
        return run

    candidates = {"eager": eager, "hooks cloning each row of each layer": hooks,
                  "capture_dataset, rows + mask": store("rows", batches, mask="attention_mask"),
                  "capture_dataset, rows, no mask": store("plain", batches),
                  "capture_dataset, batches whole (batch_axis=None)": store("whole", batches, batch_axis=None),
                  "capture_dataset, the rows one by one": store("single", singles)}
    times: dict[str, list] = {name: [] for name in candidates}
    for name, fn in candidates.items():  # warm up
        fn()
    for _ in range(args.rounds):
        for name, fn in candidates.items():
            times[name].append(_cpu(fn))
    base = statistics.median(times["eager"])
    print(f"write: {args.batches} batches of {args.batch} rows, 32 tokens, GPT-2 4x128; median of {args.rounds} "
          f"rounds, CPU s (eager {base * 1000:.1f} ms)")
    for name, values in times.items():
        ratios = sorted(v / e for v, e in zip(values, times["eager"]))
        print(f"  {name:52s} {statistics.median(values) * 1000:8.1f} ms  {statistics.median(ratios):5.2f}x "
              f"(rounds {ratios[0]:.2f}-{ratios[-1]:.2f})")

    capture_dataset(schema, batches, scratch / "tok", keep="call=h.*", mask="attention_mask", progress=False)
    from nnschemaparser import TraceStore

    rows = TraceStore(scratch / "tok")
    total = rows.tokens("h.3:output", 256).tokens

    def streamed():
        for _ in rows.tokens("h.3:output", 256, seed=1):
            pass

    def in_memory():
        stacked = rows.stack("h.3:output")
        masks = torch.cat([rows.mask(s) for s in rows.samples]).reshape(-1)
        flat = stacked.reshape(-1, stacked.shape[-1])[masks]
        order = torch.randperm(len(flat), generator=torch.Generator().manual_seed(1))
        for start in range(0, len(order), 256):
            flat.index_select(0, order[start:start + 256])

    speeds: dict[str, list] = {"store.tokens": [], "stack, then a permutation in memory": []}
    for _ in range(args.rounds):
        speeds["store.tokens"].append(total / _cpu(streamed))
        speeds["stack, then a permutation in memory"].append(total / _cpu(in_memory))
    print(f"tokens: {total} unmasked tokens of h.3:output (of {args.batches * args.batch * 32}), batches of 256")
    for name, values in speeds.items():
        print(f"  {name:52s} {statistics.median(values):12.0f} tokens/s")
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
