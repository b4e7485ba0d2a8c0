"""A forward that calls cached functions, eager against the schema's plain run, side by side in one process.

    python bench/bench_cached_calls.py [--rounds N] [--inner N]

diffusers' QwenImage transformer (a tiny config: 1 layer, 2 heads of 16) computes its rotary
frequencies in `pos_embed` through two `lru_cache_unless_export` methods; every call after the
first is a hit. The schema calls the user's own caches through `runtime/caching.py` (a trampoline
`__code__` swapped in for the length of each call, so that a miss runs the lowered body). This
runs, in interleaved rounds of CPU time under torch.no_grad() on one thread, eager and a plain run
of the whole transformer and of `pos_embed` alone. A ratio is the median over rounds of a
candidate's time over eager's in the same round. Outputs are checked torch.equal to eager's first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_capture_keep import interleaved, ratio_lines  # noqa: E402  (interleaved rounds, ratios to eager)

from nnschemaparser import NNParser  # noqa: E402
from nnschemaparser.runtime.program import Program  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--inner", type=int, default=50)
    args = parser.parse_args()
    import diffusers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=8, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4)).eval()
    inputs = {"hidden_states": torch.randn(1, 16, 8), "encoder_hidden_states": torch.randn(1, 5, 16),
              "encoder_hidden_states_mask": torch.ones(1, 5), "timestep": torch.tensor([0.5]),
              "img_shapes": [(1, 4, 4)], "return_dict": False}
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs)
    assert schema.skipped == {}, schema.skipped
    rope = {"video_fhw": [(1, 4, 4)], "device": torch.device("cpu"), "max_txt_seq_len": 5}
    rope_schema = NNParser.parse_model(model.pos_embed, inputs_tensors_values=rope)
    whole, alone = Program(schema), Program(rope_schema)
    with torch.no_grad():
        assert torch.equal(whole.run_root(dict(inputs))[0], model(**inputs)[0])
        assert all(torch.equal(a, b) for a, b in zip(alone.run_root(dict(rope)), model.pos_embed(**rope)))
        for title, candidates in (
                ("QwenImageTransformer2DModel (tiny), forward", {"eager": lambda: model(**inputs),
                                                                 "plain run": lambda: whole.run_root(dict(inputs))}),
                ("its pos_embed alone (two cache hits a call)", {"eager": lambda: model.pos_embed(**rope),
                                                                 "plain run": lambda: alone.run_root(dict(rope))})):
            samples = interleaved(candidates, args.rounds, args.inner)
            print(title)
            print("\n".join(ratio_lines(samples)))


if __name__ == "__main__":
    main()
