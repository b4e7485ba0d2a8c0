"""Zoo cases for encoder-decoder, vision, audio and multimodal models.

See :mod:`nnschemaparser.validation.zoo_common` for the helpers and the conventions.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .zoo_common import (
    SEQ,
    BART,
    BATCH,
    BERT,
    IMAGE,
    SEED,
    VIT,
    VOCAB,
    WAV2VEC2,
    ZooCase,
    _gen,
    _ids,
    _mask,
    _transformers,
    audio_inputs,
    features_inputs,
    hf,
    image_inputs,
    image_token_inputs,
    seq2seq_inputs,
    text_image_inputs,
)

ED, VIT_, CONV, AE, AS2S, MM = "encoder-decoder", "vision-vit", "vision-conv", "audio-encoder", "audio-seq2seq", "multimodal"

T5 = dict(
    vocab_size=VOCAB,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
SWIN = dict(image_size=IMAGE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)
CLIP_TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)
CLIP_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE, patch_size=8)
WHISPER = dict(
    vocab_size=VOCAB,
    num_mel_bins=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    d_model=32,
    max_source_positions=16,
    max_target_positions=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
    suppress_tokens=[],
    begin_suppress_tokens=[],
    apply_spec_augment=False,
)
seq2seq = seq2seq_inputs()
image = image_inputs()


def composite(
    model_cls: str, make_config: Callable[[Any], Any], *, tweak: Callable[[Any], None] | None = None
) -> Callable[[], torch.nn.Module]:
    """A build() for models whose config is assembled from other configs (``make_config(transformers)``)."""

    def build() -> torch.nn.Module:
        tf = _transformers()
        torch.manual_seed(SEED)
        config = make_config(tf)
        config._attn_implementation = "eager"
        model = getattr(tf, model_cls)(config)
        if tweak is not None:
            tweak(model)
        return model.eval()

    build.__qualname__ = f"build[{model_cls}]"
    return build


def _mae_inputs(model: torch.nn.Module) -> dict[str, Any]:
    g = _gen()
    n = (IMAGE // 8) ** 2
    # ViTMAE masks patches with torch.rand unless given the noise: pass it for determinism.
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), "noise": torch.rand(BATCH, n, generator=g)}


def _siglip2_inputs(model: torch.nn.Module) -> dict[str, Any]:
    g = _gen()
    patches, dim = 16, 3 * 8 * 8
    mask = torch.ones(BATCH, patches, dtype=torch.long)
    mask[1, 12:] = 0  # second image has only 3x4 patches
    return {
        "input_ids": _ids(g, VOCAB, 8),
        "attention_mask": _mask(8, 1),
        "pixel_values": torch.randn(BATCH, patches, dim, generator=g),
        "pixel_attention_mask": mask,
        "spatial_shapes": torch.tensor([[4, 4], [3, 4]]),
    }


def _vilt_inputs(model: torch.nn.Module) -> dict[str, Any]:
    inputs = text_image_inputs()(model)
    inputs["pixel_mask"] = torch.ones(BATCH, IMAGE, IMAGE, dtype=torch.long)
    return inputs


def _speech_enc_dec(tf: Any) -> Any:
    enc = tf.Wav2Vec2Config(**WAV2VEC2)
    dec = tf.BertConfig(**BERT, is_decoder=True, add_cross_attention=True)
    cfg = tf.SpeechEncoderDecoderConfig(encoder=enc.to_dict(), decoder=dec.to_dict())
    cfg.decoder_start_token_id = 2
    cfg.pad_token_id = 0
    return cfg


def _vision_enc_dec(tf: Any) -> Any:
    enc = tf.ViTConfig(**VIT)
    dec = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, add_cross_attention=True, is_decoder=True)
    cfg = tf.VisionEncoderDecoderConfig(encoder=enc.to_dict(), decoder=dec.to_dict())
    cfg.decoder_start_token_id = 0
    cfg.pad_token_id = 0
    return cfg


def _dual_encoder(tf: Any) -> Any:
    return tf.VisionTextDualEncoderConfig(vision_config=tf.ViTConfig(**VIT).to_dict(), text_config=tf.BertConfig(**BERT).to_dict(), projection_dim=16)


def _image_text_dec_inputs(model: torch.nn.Module) -> dict[str, Any]:
    g = _gen()
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), "decoder_input_ids": _ids(g, VOCAB, 6)}


def _speech_dec_inputs(model: torch.nn.Module) -> dict[str, Any]:
    g = _gen()
    return {"input_values": torch.randn(BATCH, 1600, generator=g), "decoder_input_ids": _ids(g, VOCAB, 6)}


def _qwen2_vl_inputs(model: torch.nn.Module) -> dict[str, Any]:
    # One 16x16 image per sample: 4x4 patches of 4px (temporal 2) merged 2x2 -> 4 image tokens each.
    g = _gen()
    text = _ids(g, 120, SEQ)
    img = torch.full((BATCH, 4), 124)
    ids = torch.cat([text[:, :1], torch.full((BATCH, 1), 122), img, torch.full((BATCH, 1), 123), text[:, 1:]], dim=1)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mm_token_type_ids": (ids == 124).int(),  # 0 text, 1 image
        "pixel_values": torch.randn(BATCH * 16, 3 * 2 * 4 * 4, generator=g),
        "image_grid_thw": torch.tensor([[1, 4, 4]] * BATCH),
    }


def _paligemma_inputs(model: torch.nn.Module) -> dict[str, Any]:
    inputs = image_token_inputs(127, 16)(model)
    inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    inputs["token_type_ids"][:, -3:] = 1  # suffix tokens (prefix-LM mask)
    return inputs


LLAVA_TEXT = dict(model_type="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LLAVA_VISION = dict(model_type="clip_vision_model", **CLIP_VISION)

CASES: list[ZooCase] = [
    # ------------------------------------------------------------------ encoder-decoder
    ZooCase("t5", ED, hf("T5ForConditionalGeneration", "T5Config", **T5), seq2seq, notes="relative position buckets"),
    ZooCase("mt5", ED, hf("MT5ForConditionalGeneration", "MT5Config", feed_forward_proj="gated-gelu", **T5), seq2seq),
    ZooCase("umt5", ED, hf("UMT5ForConditionalGeneration", "UMT5Config", feed_forward_proj="gated-gelu", **T5), seq2seq, notes="per-layer relative bias"),
    ZooCase(
        "long-t5",
        ED,
        hf("LongT5ForConditionalGeneration", "LongT5Config", encoder_attention_type="transient-global", local_radius=2, global_block_size=4, **T5),
        seq2seq,
        notes="transient-global encoder attention",
    ),
    ZooCase("bart", ED, hf("BartForConditionalGeneration", "BartConfig", **BART), seq2seq),
    ZooCase("mbart", ED, hf("MBartForConditionalGeneration", "MBartConfig", **BART), seq2seq, notes="pre-norm"),
    ZooCase("marian", ED, hf("MarianMTModel", "MarianConfig", **{**BART, "pad_token_id": 3, "decoder_start_token_id": 3}), seq2seq, notes="sinusoidal positions"),
    ZooCase("pegasus", ED, hf("PegasusForConditionalGeneration", "PegasusConfig", **{**BART, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}), seq2seq),
    ZooCase(
        "pegasus-x",
        ED,
        hf("PegasusXForConditionalGeneration", "PegasusXConfig", num_global_tokens=4, block_size=4, **{k: v for k, v in BART.items() if k != "bos_token_id"}),
        seq2seq,
        notes="block-local + global tokens",
    ),
    ZooCase(
        "led",
        ED,
        hf("LEDForConditionalGeneration", "LEDConfig", attention_window=4, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, **{k: v for k, v in BART.items() if k != "max_position_embeddings"}),
        seq2seq,
        notes="Longformer sliding-window encoder",
    ),
    ZooCase("blenderbot", ED, hf("BlenderbotForConditionalGeneration", "BlenderbotConfig", **BART), seq2seq),
    ZooCase("blenderbot-small", ED, hf("BlenderbotSmallForConditionalGeneration", "BlenderbotSmallConfig", **BART), seq2seq),
    ZooCase("plbart", ED, hf("PLBartForConditionalGeneration", "PLBartConfig", **BART), seq2seq),
    ZooCase("m2m100", ED, hf("M2M100ForConditionalGeneration", "M2M100Config", **BART), seq2seq),
    ZooCase(
        "fsmt",
        ED,
        hf("FSMTForConditionalGeneration", "FSMTConfig", langs=["en", "de"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, **{k: v for k, v in BART.items() if k != "vocab_size"}),
        seq2seq,
    ),
    ZooCase(
        "prophetnet",
        ED,
        hf("ProphetNetForConditionalGeneration", "ProphetNetConfig", vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4, max_position_embeddings=64, ngram=2, num_buckets=8, relative_max_distance=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0),
        seq2seq,
        notes="n-gram main/predict streams",
    ),
    # ------------------------------------------------------------------ vision transformers
    ZooCase("vit", VIT_, hf("ViTForImageClassification", "ViTConfig", num_labels=5, **VIT), image),
    ZooCase("deit", VIT_, hf("DeiTForImageClassificationWithTeacher", "DeiTConfig", **VIT), image, notes="cls + distillation tokens"),
    ZooCase("beit", VIT_, hf("BeitForImageClassification", "BeitConfig", use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.1, vocab_size=VOCAB, **VIT), image),
    ZooCase("data2vec-vision", VIT_, hf("Data2VecVisionModel", "Data2VecVisionConfig", use_shared_relative_position_bias=True, **VIT), image),
    ZooCase("dinov2", VIT_, hf("Dinov2Model", "Dinov2Config", mlp_ratio=2, **{k: v for k, v in VIT.items() if k != "intermediate_size"}), image, notes="layer scale, interpolated pos-emb"),
    ZooCase("ijepa", VIT_, hf("IJepaModel", "IJepaConfig", **VIT), image),
    ZooCase("vit-mae", VIT_, hf("ViTMAEForPreTraining", "ViTMAEConfig", decoder_hidden_size=32, decoder_num_hidden_layers=1, decoder_num_attention_heads=4, decoder_intermediate_size=64, **VIT), _mae_inputs, notes="random masking driven by the given noise"),
    ZooCase("swin", VIT_, hf("SwinForImageClassification", "SwinConfig", **SWIN), image, notes="shifted windows"),
    ZooCase("swinv2", VIT_, hf("Swinv2ForImageClassification", "Swinv2Config", **SWIN), image, notes="cosine attention, log-CPB"),
    ZooCase(
        "segformer",
        VIT_,
        hf("SegformerForSemanticSegmentation", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32),
        image,
    ),
    ZooCase(
        "pvt",
        VIT_,
        hf("PvtForImageClassification", "PvtConfig", image_size=IMAGE, num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
        image,
    ),
    ZooCase(
        "mobilevit",
        VIT_,
        hf("MobileViTForImageClassification", "MobileViTConfig", image_size=IMAGE, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2),
        image,
        notes="conv + unfold/fold transformer blocks",
    ),
    ZooCase("yolos", VIT_, hf("YolosForObjectDetection", "YolosConfig", num_detection_tokens=4, **{**VIT, "image_size": [IMAGE, IMAGE]}), image),
    # ------------------------------------------------------------------ convnets
    ZooCase("convnext", CONV, hf("ConvNextForImageClassification", "ConvNextConfig", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]), image),
    ZooCase("convnextv2", CONV, hf("ConvNextV2ForImageClassification", "ConvNextV2Config", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]), image, notes="GRN"),
    ZooCase("resnet", CONV, hf("ResNetForImageClassification", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"), image),
    ZooCase("resnet-bottleneck", CONV, hf("ResNetForImageClassification", "ResNetConfig", embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="bottleneck"), image),
    ZooCase("regnet", CONV, hf("RegNetForImageClassification", "RegNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8), image, notes="grouped conv + squeeze-excite"),
    ZooCase("mobilenet-v2", CONV, hf("MobileNetV2ForImageClassification", "MobileNetV2Config", image_size=IMAGE, depth_multiplier=0.25, finegrained_output=False), image, notes="TF padding, inverted residuals"),
    ZooCase("mobilenet-v1", CONV, hf("MobileNetV1ForImageClassification", "MobileNetV1Config", image_size=IMAGE, depth_multiplier=0.25), image),
    ZooCase(
        "efficientnet",
        CONV,
        hf("EfficientNetForImageClassification", "EfficientNetConfig", image_size=IMAGE, width_coefficient=0.1, depth_coefficient=0.25, hidden_dim=128),
        image,
        notes="depthwise + squeeze-excite, drop-connect",
    ),
    ZooCase("bit", CONV, hf("BitForImageClassification", "BitConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_groups=4, layer_type="preactivation"), image, notes="weight-standardised conv + group norm"),
    ZooCase(
        "poolformer",
        CONV,
        hf("PoolFormerForImageClassification", "PoolFormerConfig", num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]),
        image,
    ),
    ZooCase("focalnet", CONV, hf("FocalNetForImageClassification", "FocalNetConfig", image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3]), image, notes="focal modulation"),
    # ------------------------------------------------------------------ audio encoders
    ZooCase("wav2vec2", AE, hf("Wav2Vec2ForCTC", "Wav2Vec2Config", **WAV2VEC2), audio_inputs(), notes="SpecAugment off (numpy RNG)"),
    ZooCase(
        "wav2vec2-stable-ln",
        AE,
        hf("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", do_stable_layer_norm=True, feat_extract_norm="layer", **WAV2VEC2),
        audio_inputs(mask=True),
        notes="pre-norm, layer-norm feature extractor, padded batch",
    ),
    ZooCase("hubert", AE, hf("HubertForCTC", "HubertConfig", **WAV2VEC2), audio_inputs()),
    ZooCase("wavlm", AE, hf("WavLMModel", "WavLMConfig", num_buckets=32, max_bucket_distance=64, **WAV2VEC2), audio_inputs(), notes="gated relative position bias"),
    ZooCase("data2vec-audio", AE, hf("Data2VecAudioModel", "Data2VecAudioConfig", conv_pos_kernel_size=5, **{**WAV2VEC2, "num_conv_pos_embeddings": 2}), audio_inputs()),
    ZooCase("sew", AE, hf("SEWModel", "SEWConfig", squeeze_factor=2, **WAV2VEC2), audio_inputs()),
    ZooCase("sew-d", AE, hf("SEWDModel", "SEWDConfig", squeeze_factor=2, max_position_embeddings=64, position_buckets=16, **WAV2VEC2), audio_inputs(), notes="DeBERTa-style attention"),
    ZooCase("unispeech", AE, hf("UniSpeechModel", "UniSpeechConfig", **WAV2VEC2), audio_inputs()),
    ZooCase("unispeech-sat", AE, hf("UniSpeechSatModel", "UniSpeechSatConfig", **WAV2VEC2), audio_inputs()),
    ZooCase(
        "wav2vec2-conformer",
        AE,
        hf("Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig", position_embeddings_type="rotary", conv_depthwise_kernel_size=3, **WAV2VEC2),
        audio_inputs(),
        notes="rotary conformer",
    ),
    ZooCase(
        "wav2vec2-bert",
        AE,
        hf("Wav2Vec2BertModel", "Wav2Vec2BertConfig", feature_projection_input_dim=16, conv_depthwise_kernel_size=3, position_embeddings_type="relative_key", left_max_position_embeddings=8, right_max_position_embeddings=8, **{k: v for k, v in WAV2VEC2.items() if not k.startswith(("conv_", "num_conv"))}),
        features_inputs((20, 16)),
    ),
    ZooCase(
        "ast",
        AE,
        hf("ASTForAudioClassification", "ASTConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8, frequency_stride=8, time_stride=8, max_length=32, num_mel_bins=16),
        lambda m: {"input_values": torch.randn(BATCH, 32, 16, generator=_gen())},
        notes="spectrogram patches",
    ),
    ZooCase("whisper-encoder", AE, hf("WhisperForAudioClassification", "WhisperConfig", **WHISPER), features_inputs((16, 32))),
    # ------------------------------------------------------------------ audio seq2seq
    ZooCase("whisper", AS2S, hf("WhisperForConditionalGeneration", "WhisperConfig", **WHISPER), features_inputs((16, 32), decoder_vocab=VOCAB)),
    ZooCase(
        "speech2text",
        AS2S,
        hf("Speech2TextForConditionalGeneration", "Speech2TextConfig", max_source_positions=64, max_target_positions=32, conv_kernel_sizes=(5, 5), conv_channels=32, input_feat_per_channel=16, input_channels=1, **{k: v for k, v in BART.items() if k != "max_position_embeddings"}),
        features_inputs((40, 16), decoder_vocab=VOCAB),
    ),
    ZooCase(
        "moonshine",
        AS2S,
        hf("MoonshineForConditionalGeneration", "MoonshineConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=2, decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
        _speech_dec_inputs,
        notes="raw-audio conv stem, rotary",
    ),
    ZooCase(
        "speecht5-asr",
        AS2S,
        hf("SpeechT5ForSpeechToText", "SpeechT5Config", hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, max_speech_positions=256, max_text_positions=64, encoder_max_relative_position=16, vocab_size=VOCAB, apply_spec_augment=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
        _speech_dec_inputs,
    ),
    ZooCase("speech-encoder-decoder", AS2S, composite("SpeechEncoderDecoderModel", _speech_enc_dec), _speech_dec_inputs, notes="wav2vec2 encoder + BERT decoder"),
    # ------------------------------------------------------------------ multimodal
    ZooCase("clip", MM, hf("CLIPModel", "CLIPConfig", text_config=CLIP_TEXT, vision_config=CLIP_VISION, projection_dim=16), text_image_inputs()),
    ZooCase("siglip", MM, hf("SiglipModel", "SiglipConfig", text_config=CLIP_TEXT, vision_config=CLIP_VISION), text_image_inputs(pad=0)),
    ZooCase(
        "siglip2",
        MM,
        hf("Siglip2Model", "Siglip2Config", text_config=CLIP_TEXT, vision_config={**{k: v for k, v in CLIP_VISION.items() if k != "image_size"}, "num_patches": 16}),
        _siglip2_inputs,
        notes="NaFlex: flattened patches + spatial_shapes",
    ),
    ZooCase("altclip", MM, hf("AltCLIPModel", "AltCLIPConfig", text_config={**BERT, "project_dim": 16}, vision_config=CLIP_VISION, projection_dim=16), text_image_inputs()),
    ZooCase("chinese-clip", MM, hf("ChineseCLIPModel", "ChineseCLIPConfig", text_config=BERT, vision_config=CLIP_VISION, projection_dim=16), text_image_inputs()),
    ZooCase("owlvit", MM, hf("OwlViTModel", "OwlViTConfig", text_config=CLIP_TEXT, vision_config=CLIP_VISION, projection_dim=16), text_image_inputs()),
    ZooCase(
        "blip",
        MM,
        hf("BlipForConditionalGeneration", "BlipConfig", text_config={**BERT, "encoder_hidden_size": 32}, vision_config=CLIP_VISION, projection_dim=16, image_text_hidden_size=32),
        text_image_inputs(),
    ),
    ZooCase(
        "llava",
        MM,
        hf("LlavaForConditionalGeneration", "LlavaConfig", text_config=LLAVA_TEXT, vision_config=LLAVA_VISION, image_token_index=127, image_seq_length=16, vision_feature_select_strategy="default", vision_feature_layer=-1),
        image_token_inputs(127, 16),
        notes="CLIP vision tower + llama, 16 image tokens",
    ),
    ZooCase(
        "vilt",
        MM,
        hf("ViltModel", "ViltConfig", image_size=IMAGE, patch_size=8, max_image_length=-1, **BERT),
        _vilt_inputs,
        notes="single-stream text + patches; RNG IN EVAL: patches are shuffled with torch.multinomial on every forward, seed torch before each run",
    ),
    ZooCase("vision-text-dual-encoder", MM, composite("VisionTextDualEncoderModel", _dual_encoder), text_image_inputs()),
    ZooCase("vision-encoder-decoder", MM, composite("VisionEncoderDecoderModel", _vision_enc_dec), _image_text_dec_inputs, notes="ViT encoder + GPT-2 decoder"),
    ZooCase(
        "git",
        MM,
        hf("GitForCausalLM", "GitConfig", vision_config=CLIP_VISION, pad_token_id=0, bos_token_id=1, eos_token_id=2, **BERT),
        text_image_inputs(pad=0),
        notes="image tokens prepended to a causal text decoder",
    ),
    ZooCase(
        "paligemma",
        MM,
        hf(
            "PaliGemmaForConditionalGeneration",
            "PaliGemmaConfig",
            text_config=dict(model_type="gemma", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
            vision_config=dict(model_type="siglip_vision_model", **CLIP_VISION),
            image_token_index=127,
            projection_dim=32,
            hidden_size=32,
            vocab_size=VOCAB,
        ),
        _paligemma_inputs,
        notes="SigLIP tower + Gemma, prefix-LM mask from token_type_ids",
    ),
    ZooCase(
        "blip2",
        MM,
        hf(
            "Blip2ForConditionalGeneration",
            "Blip2Config",
            vision_config=CLIP_VISION,
            qformer_config=dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, encoder_hidden_size=32),
            text_config=dict(model_type="opt", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2),
            num_query_tokens=4,
            image_token_index=127,
        ),
        image_token_inputs(127, 4),
        notes="Q-Former (4 queries) between a ViT and OPT",
    ),
    ZooCase(
        "groupvit",
        MM,
        hf(
            "GroupViTModel",
            "GroupViTConfig",
            text_config=CLIP_TEXT,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, depths=[1, 1], num_group_tokens=[4, 0], num_output_groups=[4, 4], num_attention_heads=4, image_size=IMAGE, patch_size=8),
            projection_dim=16,
            projection_intermediate_dim=32,
        ),
        text_image_inputs(),
        notes="grouping blocks with gumbel-softmax (hard) assignment",
    ),
    ZooCase(
        "flava",
        MM,
        hf(
            "FlavaModel",
            "FlavaConfig",
            image_config=dict(VIT, vocab_size=64),
            text_config=BERT,
            multimodal_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
            hidden_size=32,
            projection_dim=16,
        ),
        text_image_inputs(),
        notes="image, text and fused multimodal encoders",
    ),
    ZooCase(
        "qwen2-vl",
        MM,
        hf(
            "Qwen2VLForConditionalGeneration",
            "Qwen2VLConfig",
            text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2])),
            vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            image_token_id=124,
            video_token_id=125,
            vision_start_token_id=122,
            vision_end_token_id=123,
        ),
        _qwen2_vl_inputs,
        notes="flattened patches + image_grid_thw, M-RoPE",
    ),
]
