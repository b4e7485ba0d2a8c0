"""The inputs and keep of tests/store/test_sharded_store.py, shared with its torchrun script."""

import torch

KEEP = "call=layers.*, call=layers.*.mlp.*, layers.*.self_attn:query_states, call=norm"


def batches() -> list[dict]:
    generator = torch.Generator().manual_seed(7)
    return [{"input_ids": torch.randint(0, 128, (2, 8), generator=generator)} for _ in range(3)]
