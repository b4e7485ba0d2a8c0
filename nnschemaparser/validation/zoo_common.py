"""The zoo's common parts: the case record, tiny configs, and the builders of example inputs.

`zoo_cases_text` and `zoo_cases_media` define the cases with these; `zoo` assembles the registry.
``transformers`` is imported lazily, inside the builders, so importing this module works without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

FAMILIES: tuple[str, ...] = (
    "encoder",
    "decoder",
    "decoder-kv-cache",
    "encoder-decoder",
    "vision-vit",
    "vision-conv",
    "audio-encoder",
    "audio-seq2seq",
    "multimodal",
    "moe",
    "ssm",
)


@dataclass(frozen=True)
class ZooCase:
    name: str
    family: str
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[torch.nn.Module], dict[str, Any]]
    notes: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: unknown family {self.family!r}")


# Cases that are defined but cannot be built / run eagerly here, with the reason.
# They are excluded from zoo_cases(); the sweep reports them.
REFUSED: dict[str, str] = {
    "reformer": (
        "backward in eval mode raises AssertionError: reversible residual layers recompute activations "
        "and transformers asserts model.train() before any backward"
    ),
}

SEED = 0
BATCH = 2
SEQ = 8
VOCAB = 128
IMAGE = 32
AUDIO_SAMPLES = 1600


# --------------------------------------------------------------------------- builders


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    return transformers


def hf(
    model_cls: str,
    config_cls: str,
    *,
    moe: bool | str = False,
    eager_attn: bool = True,
    post: Callable[[Any], None] | None = None,
    **config_kwargs: Any,
) -> Callable[[], torch.nn.Module]:
    """A build() for ``transformers.<model_cls>(transformers.<config_cls>(**config_kwargs))``.

    Sets ``torch.manual_seed(0)`` first, asks for eager attention (propagated to
    sub-configs by transformers) and, for MoE models, the eager (per-expert loop)
    experts implementation unless ``moe="<impl>"`` names another one.
    ``post(config)`` may tweak the config before the model is made.
    """

    def build() -> torch.nn.Module:
        tf = _transformers()
        torch.manual_seed(SEED)
        config = getattr(tf, config_cls)(**config_kwargs)
        if eager_attn:
            config._attn_implementation = "eager"
        if moe:
            config._experts_implementation = "eager" if moe is True else moe
        if post is not None:
            post(config)
        model = getattr(tf, model_cls)(config)
        return model.eval()

    build.__qualname__ = f"build[{model_cls}]"
    return build


# Common tiny config fragments.
BERT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
BART = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)
VIT = dict(
    image_size=IMAGE,
    patch_size=8,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)
# 3 conv feature layers: 1600 samples -> 19 frames.
WAV2VEC2 = dict(
    vocab_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    conv_dim=(16, 16, 16),
    conv_stride=(5, 4, 4),
    conv_kernel=(10, 4, 4),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    # SpecAugment draws its masks from numpy's RNG: keep train mode reproducible.
    apply_spec_augment=False,
    mask_time_prob=0.0,
)


# --------------------------------------------------------------------------- inputs


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def _ids(g: torch.Generator, vocab: int, seq: int = SEQ, low: int = 4) -> torch.Tensor:
    return torch.randint(low, vocab, (BATCH, seq), generator=g)


def _mask(seq: int = SEQ, pad: int = 0) -> torch.Tensor:
    """All ones, except the last ``pad`` positions of the second row (right padding)."""
    m = torch.ones(BATCH, seq, dtype=torch.long)
    if pad:
        m[1, seq - pad :] = 0
    return m


def text_inputs(
    vocab: int = VOCAB,
    seq: int = SEQ,
    *,
    mask: bool = True,
    pad: int = 0,
    token_types: bool = False,
    **extra: Any,
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out: dict[str, Any] = {"input_ids": _ids(g, vocab, seq)}
        if mask:
            out["attention_mask"] = _mask(seq, pad)
        if token_types:
            out["token_type_ids"] = (torch.arange(seq) >= seq // 2).long().expand(BATCH, seq).clone()
        out.update(extra)
        return out

    return make_inputs


def seq2seq_inputs(
    vocab: int = VOCAB, seq: int = SEQ, dec_seq: int = 6, *, pad: int = 1, **extra: Any
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out = {
            "input_ids": _ids(g, vocab, seq),
            "attention_mask": _mask(seq, pad),
            "decoder_input_ids": _ids(g, vocab, dec_seq),
        }
        out.update(extra)
        return out

    return make_inputs


def image_inputs(size: int = IMAGE, channels: int = 3, **extra: Any) -> Callable[[torch.nn.Module], dict[str, Any]]:
    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out = {"pixel_values": torch.randn(BATCH, channels, size, size, generator=g)}
        out.update(extra)
        return out

    return make_inputs


def audio_inputs(samples: int = AUDIO_SAMPLES, *, mask: bool = False, **extra: Any) -> Callable[[torch.nn.Module], dict[str, Any]]:
    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out: dict[str, Any] = {"input_values": torch.randn(BATCH, samples, generator=g)}
        if mask:
            m = torch.ones(BATCH, samples, dtype=torch.long)
            m[1, samples * 3 // 4 :] = 0
            out["attention_mask"] = m
        out.update(extra)
        return out

    return make_inputs


def features_inputs(
    shape: tuple[int, ...], *, decoder_vocab: int | None = None, dec_seq: int = 6, **extra: Any
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    """``input_features`` of shape (BATCH, *shape) (+ ``decoder_input_ids`` for seq2seq)."""

    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out: dict[str, Any] = {"input_features": torch.randn(BATCH, *shape, generator=g)}
        if decoder_vocab is not None:
            out["decoder_input_ids"] = _ids(g, decoder_vocab, dec_seq)
        out.update(extra)
        return out

    return make_inputs


def text_image_inputs(
    vocab: int = VOCAB, seq: int = SEQ, size: int = IMAGE, *, pad: int = 1, **extra: Any
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        out = {
            "input_ids": _ids(g, vocab, seq),
            "attention_mask": _mask(seq, pad),
            "pixel_values": torch.randn(BATCH, 3, size, size, generator=g),
        }
        out.update(extra)
        return out

    return make_inputs


def image_token_inputs(
    image_token_id: int, n_image_tokens: int, vocab: int = VOCAB, seq: int = SEQ, size: int = IMAGE, **extra: Any
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    """LLaVA-style: ``n_image_tokens`` placeholder ids followed by ``seq`` text ids."""

    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        text = _ids(g, vocab, seq)
        text[text == image_token_id] = 5
        img = torch.full((BATCH, n_image_tokens), image_token_id, dtype=torch.long)
        ids = torch.cat([text[:, :1], img, text[:, 1:]], dim=1)
        out = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(BATCH, 3, size, size, generator=g),
        }
        out.update(extra)
        return out

    return make_inputs


def prefilled_cache_inputs(
    vocab: int = VOCAB, prefix: int = 6, new: int = 2, **extra: Any
) -> Callable[[torch.nn.Module], dict[str, Any]]:
    """A second decoding step: ``past_key_values`` from an eager, no-grad, eval-mode first step.

    The returned cache is mutated in place by the forward it is given to: call
    ``make_inputs`` afresh for every run (it is deterministic).
    """

    def make_inputs(model: torch.nn.Module) -> dict[str, Any]:
        g = _gen()
        ids = _ids(g, vocab, prefix + new)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                first = model(input_ids=ids[:, :prefix], attention_mask=_mask(prefix), use_cache=True)
        finally:
            model.train(was_training)
        out = {
            "input_ids": ids[:, prefix:],
            "attention_mask": _mask(prefix + new),
            "past_key_values": first.past_key_values,
            "use_cache": True,
        }
        out.update(extra)
        return out

    return make_inputs
