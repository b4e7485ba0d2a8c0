"""A tiny GPT-2 activation / attribution patching sweep for the Patch view's tests (tests/widget,
tests/browser): 2 layers, 6 tokens, clean and corrupted prompts that differ in token 2."""

from __future__ import annotations

import torch


def gpt2_patch_case(per: str = "position"):
    """(schema, clean, corrupted, activation table, attribution table) of a sweep over the
    embedding's and every layer's output, `per` position (or None: whole values)."""
    import transformers

    from nnschemaparser import NNParser, activation_patching, attribution_patching

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[:, 2] = (ids[:, 2] + 17) % 63 + 1
    clean, corrupted = {"input_ids": ids, "use_cache": False}, {"input_ids": other, "use_cache": False}
    schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(clean))

    def metric(outputs):
        logits = outputs.logits if hasattr(outputs, "logits") else outputs["logits"]
        return logits[:, -1, 5].sum() - logits[:, -1, 9].sum()

    at = "call=transformer.h.*"
    table = activation_patching(schema, clean, corrupted, metric, at=at, per=per)
    attribution = attribution_patching(schema, clean, corrupted, metric, at=at, per=per)
    return schema, clean, corrupted, table, attribution
