"""Zoo cases for text models: encoders, decoders, decoder with KV cache, MoE and SSM.

See :mod:`nnschemaparser.validation.zoo_common` for the helpers and the conventions.
"""

from __future__ import annotations

import torch

from .zoo_common import BATCH, BERT, LLAMA, SEQ, VOCAB, ZooCase, _gen, _ids, _mask, hf, prefilled_cache_inputs, seq2seq_inputs, text_inputs

E, D, KV, MOE, SSM = "encoder", "decoder", "decoder-kv-cache", "moe", "ssm"

# Decoder-only runs without a cache; the kv-cache family turns it on.
no_cache = text_inputs(use_cache=False)
with_cache = text_inputs(use_cache=True)
prefill = prefilled_cache_inputs()
PREFILL = "second step on a cache prefilled by an eager first step; the cache is mutated in place, call make_inputs per run"

GPT2 = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
GEMMA = dict(LLAMA, head_dim=8, num_key_value_heads=2)
# Small MoE: 4 experts, top-2, tiny expert MLPs.
MOE_LLAMA = dict(LLAMA, num_local_experts=4, num_experts_per_tok=2)
QWEN_MOE = dict(
    LLAMA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1, norm_topk_prob=True
)
DEEPSEEK = dict(
    LLAMA,
    num_key_value_heads=4,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=4,
    v_head_dim=8,
    n_group=2,
    topk_group=1,
)

def _layout_inputs() -> dict:
    g = _gen()
    xy0 = torch.randint(0, 32, (BATCH, SEQ, 2), generator=g)
    xy1 = xy0 + torch.randint(1, 32, (BATCH, SEQ, 2), generator=g)
    return {"input_ids": _ids(g, VOCAB), "attention_mask": _mask(SEQ, 2), "bbox": torch.cat([xy0, xy1], dim=-1)}


CASES: list[ZooCase] = [
    # ------------------------------------------------------------------ encoders
    ZooCase("bert", E, hf("BertForMaskedLM", "BertConfig", **BERT), text_inputs(pad=2, token_types=True)),
    ZooCase("bert-seqcls", E, hf("BertForSequenceClassification", "BertConfig", num_labels=3, **BERT), text_inputs(pad=2)),
    ZooCase("roberta", E, hf("RobertaForSequenceClassification", "RobertaConfig", **BERT), text_inputs(pad=2)),
    ZooCase("xlm-roberta", E, hf("XLMRobertaForTokenClassification", "XLMRobertaConfig", **BERT), text_inputs(pad=2)),
    ZooCase("camembert", E, hf("CamembertModel", "CamembertConfig", **BERT), text_inputs(pad=2)),
    ZooCase(
        "distilbert",
        E,
        hf("DistilBertForMaskedLM", "DistilBertConfig", vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
        text_inputs(pad=2),
    ),
    ZooCase("albert", E, hf("AlbertForMaskedLM", "AlbertConfig", embedding_size=16, **BERT), text_inputs(pad=2, token_types=True)),
    ZooCase("electra", E, hf("ElectraForPreTraining", "ElectraConfig", embedding_size=16, **BERT), text_inputs(pad=2)),
    ZooCase("deberta", E, hf("DebertaForMaskedLM", "DebertaConfig", relative_attention=True, pos_att_type=["c2p", "p2c"], **BERT), text_inputs(pad=2)),
    ZooCase(
        "deberta-v2",
        E,
        hf("DebertaV2Model", "DebertaV2Config", relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"], **BERT),
        text_inputs(pad=2),
        notes="relative attention with log buckets",
    ),
    ZooCase("mpnet", E, hf("MPNetForMaskedLM", "MPNetConfig", **BERT), text_inputs(pad=2)),
    ZooCase("roformer", E, hf("RoFormerModel", "RoFormerConfig", embedding_size=32, **BERT), text_inputs(pad=2)),
    ZooCase("convbert", E, hf("ConvBertModel", "ConvBertConfig", embedding_size=32, conv_kernel_size=3, **BERT), text_inputs(pad=2)),
    ZooCase(
        "modernbert",
        E,
        hf("ModernBertForMaskedLM", "ModernBertConfig", local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, **BERT),
        text_inputs(pad=2),
        notes="alternating global / local attention, rotary",
    ),
    ZooCase("ernie", E, hf("ErnieModel", "ErnieConfig", **BERT), text_inputs(pad=2)),
    ZooCase(
        "mobilebert",
        E,
        hf("MobileBertModel", "MobileBertConfig", embedding_size=16, intra_bottleneck_size=16, num_feedforward_networks=2, **BERT),
        text_inputs(pad=2),
    ),
    ZooCase("nystromformer", E, hf("NystromformerModel", "NystromformerConfig", num_landmarks=4, segment_means_seq_len=8, conv_kernel_size=3, **BERT), text_inputs(pad=0)),
    ZooCase("longformer", E, hf("LongformerModel", "LongformerConfig", attention_window=4, pad_token_id=1, bos_token_id=0, eos_token_id=2, sep_token_id=2, **BERT), text_inputs(pad=2), notes="sliding-window chunks"),
    ZooCase(
        "bigbird",
        E,
        hf("BigBirdModel", "BigBirdConfig", attention_type="block_sparse", block_size=2, num_random_blocks=1, **BERT),
        text_inputs(seq=16),
        notes="block-sparse attention (seq 16 > 7 blocks); random blocks only in train mode",
    ),
    ZooCase(
        "funnel",
        E,
        hf("FunnelModel", "FunnelConfig", vocab_size=VOCAB, block_sizes=[1, 1], num_decoder_layers=1, d_model=32, n_head=4, d_head=8, d_inner=64),
        text_inputs(pad=2),
        notes="pooled query blocks + upsampling decoder",
    ),
    ZooCase("xlnet", E, hf("XLNetLMHeadModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64, pad_token_id=5, bos_token_id=1, eos_token_id=2), text_inputs(pad=2), notes="two-stream relative attention"),
    ZooCase("esm", E, hf("EsmForMaskedLM", "EsmConfig", position_embedding_type="rotary", mask_token_id=3, pad_token_id=1, **BERT), text_inputs(pad=2), notes="rotary protein LM"),
    ZooCase("layoutlm", E, hf("LayoutLMModel", "LayoutLMConfig", max_2d_position_embeddings=64, **BERT), lambda m: _layout_inputs(), notes="text + 2-D box embeddings"),
    # ------------------------------------------------------------------ decoders (no cache)
    ZooCase("gpt2", D, hf("GPT2LMHeadModel", "GPT2Config", **GPT2), no_cache),
    ZooCase(
        "gpt-neo",
        D,
        hf("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64, attention_types=[[["global", "local"], 1]], window_size=4, bos_token_id=0, eos_token_id=0),
        no_cache,
        notes="global + local (window 4) layers",
    ),
    ZooCase("gpt-j", D, hf("GPTJForCausalLM", "GPTJConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4, bos_token_id=0, eos_token_id=0), no_cache),
    ZooCase("gpt-neox", D, hf("GPTNeoXForCausalLM", "GPTNeoXConfig", bos_token_id=0, eos_token_id=0, **{k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}), no_cache),
    ZooCase("gpt-bigcode", D, hf("GPTBigCodeForCausalLM", "GPTBigCodeConfig", multi_query=True, **GPT2), no_cache, notes="multi-query attention"),
    ZooCase("codegen", D, hf("CodeGenForCausalLM", "CodeGenConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64, rotary_dim=4, bos_token_id=0, eos_token_id=0), no_cache),
    ZooCase("llama", D, hf("LlamaForCausalLM", "LlamaConfig", **LLAMA), no_cache, notes="GQA 4q/2kv"),
    ZooCase("mistral", D, hf("MistralForCausalLM", "MistralConfig", sliding_window=4, **LLAMA), no_cache, notes="sliding window 4"),
    ZooCase("qwen2", D, hf("Qwen2ForCausalLM", "Qwen2Config", **LLAMA), no_cache),
    ZooCase("qwen3", D, hf("Qwen3ForCausalLM", "Qwen3Config", head_dim=8, **LLAMA), no_cache, notes="q/k norm"),
    ZooCase("gemma", D, hf("GemmaForCausalLM", "GemmaConfig", **GEMMA), no_cache),
    ZooCase(
        "gemma2",
        D,
        hf("Gemma2ForCausalLM", "Gemma2Config", sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, **GEMMA),
        no_cache,
        notes="sliding/global alternation, logit soft-capping",
    ),
    ZooCase("gemma3-text", D, hf("Gemma3ForCausalLM", "Gemma3TextConfig", sliding_window=4, **GEMMA), no_cache),
    ZooCase("phi", D, hf("PhiForCausalLM", "PhiConfig", partial_rotary_factor=0.5, **LLAMA), no_cache, notes="parallel attn/mlp, partial rotary"),
    ZooCase("phi3", D, hf("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA), no_cache),
    ZooCase(
        "falcon",
        D,
        hf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2, bos_token_id=0, eos_token_id=0),
        no_cache,
        notes="new decoder architecture (parallel, GQA)",
    ),
    ZooCase(
        "falcon-alibi",
        D,
        hf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True, multi_query=True, bos_token_id=0, eos_token_id=0),
        no_cache,
        notes="ALiBi + multi-query",
    ),
    ZooCase(
        "opt",
        D,
        hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        no_cache,
    ),
    ZooCase("bloom", D, hf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0, pad_token_id=0), no_cache, notes="ALiBi"),
    ZooCase("stablelm", D, hf("StableLmForCausalLM", "StableLmConfig", **LLAMA), no_cache),
    ZooCase("olmo2", D, hf("Olmo2ForCausalLM", "Olmo2Config", pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA), no_cache),
    ZooCase("starcoder2", D, hf("Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=None, bos_token_id=0, eos_token_id=0, **LLAMA), no_cache),
    ZooCase("cohere", D, hf("CohereForCausalLM", "CohereConfig", pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA), no_cache),
    ZooCase("granite", D, hf("GraniteForCausalLM", "GraniteConfig", embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0, **LLAMA), no_cache),
    ZooCase(
        "mpt",
        D,
        hf("MptForCausalLM", "MptConfig", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, expansion_ratio=2, pad_token_id=0),
        no_cache,
        notes="ALiBi",
    ),
    ZooCase(
        "xglm",
        D,
        hf("XGLMForCausalLM", "XGLMConfig", vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
        no_cache,
        notes="sinusoidal positions",
    ),
    ZooCase("biogpt", D, hf("BioGptForCausalLM", "BioGptConfig", pad_token_id=1, bos_token_id=0, eos_token_id=2, **{k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}), no_cache),
    ZooCase("openai-gpt", D, hf("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", **{k: v for k, v in GPT2.items() if not k.endswith("token_id")}), text_inputs()),
    ZooCase("ctrl", D, hf("CTRLLMHeadModel", "CTRLConfig", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, dff=64, n_positions=64), no_cache),
    ZooCase("diffllama", D, hf("DiffLlamaForCausalLM", "DiffLlamaConfig", **LLAMA), no_cache, notes="differential attention"),
    ZooCase(
        "reformer",
        D,
        hf("ReformerModelWithLMHead", "ReformerConfig", vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, attention_head_size=16, feed_forward_size=64, attn_layers=["local", "lsh"], axial_pos_shape=[2, 4], axial_pos_embds_dim=[16, 16], max_position_embeddings=8, local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1, hash_seed=0, is_decoder=True, pad_token_id=0, eos_token_id=2),
        no_cache,
        notes="LSH + local attention, reversible residual layers (fixed hash_seed)",
    ),
    # ------------------------------------------------------------------ decoders with a KV cache
    ZooCase("llama-kv-prefill", KV, hf("LlamaForCausalLM", "LlamaConfig", **LLAMA), prefill, notes=PREFILL),
    ZooCase("gpt2-kv-prefill", KV, hf("GPT2LMHeadModel", "GPT2Config", **GPT2), prefill, notes=PREFILL),
    ZooCase("qwen2-kv-prefill", KV, hf("Qwen2ForCausalLM", "Qwen2Config", **LLAMA), prefill, notes=PREFILL),
    ZooCase("phi3-kv-prefill", KV, hf("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA), prefill, notes=PREFILL),
    ZooCase(
        "gpt-neox-kv-prefill",
        KV,
        hf("GPTNeoXForCausalLM", "GPTNeoXConfig", bos_token_id=0, eos_token_id=0, **{k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}),
        prefill,
        notes=PREFILL,
    ),
    ZooCase("mistral-kv", KV, hf("MistralForCausalLM", "MistralConfig", sliding_window=4, **LLAMA), with_cache, notes="cache created and returned"),
    ZooCase("gemma2-kv", KV, hf("Gemma2ForCausalLM", "Gemma2Config", sliding_window=4, **GEMMA), with_cache, notes="hybrid sliding/global cache"),
    ZooCase(
        "opt-kv",
        KV,
        hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        with_cache,
    ),
    ZooCase("bloom-kv-prefill", KV, hf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0, pad_token_id=0), prefill, notes=PREFILL),
    ZooCase(
        "falcon-kv",
        KV,
        hf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2, bos_token_id=0, eos_token_id=0),
        with_cache,
    ),
    # ------------------------------------------------------------------ mixture of experts
    ZooCase("mixtral", MOE, hf("MixtralForCausalLM", "MixtralConfig", moe=True, **MOE_LLAMA), no_cache, notes="softmax top-2 router"),
    ZooCase(
        "mixtral-grouped-mm",
        MOE,
        hf("MixtralForCausalLM", "MixtralConfig", moe="grouped_mm", **MOE_LLAMA),
        no_cache,
        notes="experts_implementation=grouped_mm (torch._grouped_mm)",
    ),
    ZooCase(
        "qwen2-moe",
        MOE,
        hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", moe=True, shared_expert_intermediate_size=32, **QWEN_MOE),
        no_cache,
        notes="gated shared expert",
    ),
    ZooCase("qwen3-moe", MOE, hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", moe=True, head_dim=8, **QWEN_MOE), no_cache),
    ZooCase("olmoe", MOE, hf("OlmoeForCausalLM", "OlmoeConfig", moe=True, num_experts=4, num_experts_per_tok=2, pad_token_id=1, bos_token_id=0, eos_token_id=2, **LLAMA), no_cache),
    ZooCase("deepseek-v2", MOE, hf("DeepseekV2ForCausalLM", "DeepseekV2Config", moe=True, topk_method="greedy", **DEEPSEEK), no_cache, notes="MLA + shared/routed experts"),
    ZooCase("deepseek-v3", MOE, hf("DeepseekV3ForCausalLM", "DeepseekV3Config", moe=True, **DEEPSEEK), no_cache, notes="MLA, sigmoid group-limited routing"),
    ZooCase(
        "switch-transformers",
        MOE,
        hf(
            "SwitchTransformersForConditionalGeneration",
            "SwitchTransformersConfig",
            moe=True,
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_sparse_encoder_layers=1,
            num_sparse_decoder_layers=1,
            num_heads=4,
            num_experts=4,
            expert_capacity=8,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        ),
        seq2seq_inputs(),
        notes="encoder-decoder, top-1 routing with expert capacity",
    ),
    ZooCase("granitemoe", MOE, hf("GraniteMoeForCausalLM", "GraniteMoeConfig", moe=True, **MOE_LLAMA), no_cache),
    ZooCase("phimoe", MOE, hf("PhimoeForCausalLM", "PhimoeConfig", moe=True, **MOE_LLAMA), no_cache, notes="sparsemixer routing"),
    ZooCase(
        "dbrx",
        MOE,
        hf(
            "DbrxForCausalLM",
            "DbrxConfig",
            moe=True,
            vocab_size=VOCAB,
            d_model=32,
            n_heads=4,
            n_layers=2,
            max_seq_len=64,
            attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
            ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
        ),
        no_cache,
        notes="attn_config.rope_theta given explicitly (transformers reads a field its config lacks)",
    ),
    ZooCase(
        "jetmoe",
        MOE,
        hf("JetMoeForCausalLM", "JetMoeConfig", moe=True, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8, intermediate_size=32, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2),
        no_cache,
        notes="mixture of attention heads + MoE MLP",
    ),
    ZooCase("gpt-oss", MOE, hf("GptOssForCausalLM", "GptOssConfig", moe=True, head_dim=8, sliding_window=4, **MOE_LLAMA), no_cache, notes="attention sinks, clamped swiglu"),
    ZooCase(
        "llama4-text",
        MOE,
        hf("Llama4ForCausalLM", "Llama4TextConfig", moe=True, head_dim=8, intermediate_size_mlp=64, attention_chunk_size=4, **{**MOE_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 1}),
        no_cache,
        notes="sigmoid top-1 + shared expert, chunked attention",
    ),
    ZooCase("ernie4.5-moe", MOE, hf("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", moe=True, moe_num_experts=4, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=1, **LLAMA), no_cache),
    ZooCase("glm4-moe", MOE, hf("Glm4MoeForCausalLM", "Glm4MoeConfig", moe=True, head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1, **LLAMA), no_cache),
    ZooCase("hunyuan-moe", MOE, hf("HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config", moe=True, num_experts=4, moe_topk=2, head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA), no_cache),
    ZooCase(
        "lfm2-moe",
        MOE,
        hf("Lfm2MoeForCausalLM", "Lfm2MoeConfig", moe=True, moe_intermediate_size=16, num_dense_layers=1, num_experts=4, num_experts_per_tok=2, layer_types=["conv", "full_attention"], **LLAMA),
        no_cache,
        notes="sigmoid routing with expert bias",
    ),
    ZooCase(
        "minimax",
        MOE,
        hf("MiniMaxForCausalLM", "MiniMaxConfig", moe=True, head_dim=8, num_local_experts=4, num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], block_size=4, **LLAMA),
        no_cache,
        notes="lightning (linear) attention + softmax attention + MoE",
    ),
    # ------------------------------------------------------------------ state-space / recurrent
    ZooCase("mamba", SSM, hf("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4), no_cache, notes="slow (pure torch) selective scan"),
    ZooCase(
        "mamba2",
        SSM,
        hf("Mamba2ForCausalLM", "Mamba2Config", vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, num_heads=4, head_dim=16, n_groups=1, chunk_size=4, conv_kernel=4),
        no_cache,
        notes="chunked SSD torch path",
    ),
    ZooCase("falcon-mamba", SSM, hf("FalconMambaForCausalLM", "FalconMambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4), no_cache),
    ZooCase(
        "jamba",
        SSM,
        hf("JambaForCausalLM", "JambaConfig", moe=True, use_mamba_kernels=False, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, **LLAMA),
        no_cache,
        notes="hybrid mamba/attention + MoE",
    ),
    ZooCase(
        "zamba2",
        SSM,
        hf("Zamba2ForCausalLM", "Zamba2Config", use_mamba_kernels=False, layers_block_type=["mamba", "hybrid"], mamba_d_state=8, mamba_expand=2, n_mamba_heads=4, mamba_ngroups=1, chunk_size=4, num_mem_blocks=1, adapter_rank=8, **LLAMA),
        no_cache,
        notes="mamba2 + shared attention block",
    ),
    ZooCase(
        "bamba",
        SSM,
        hf("BambaForCausalLM", "BambaConfig", attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4, **LLAMA),
        no_cache,
        notes="mamba2 + attention hybrid",
    ),
    ZooCase(
        "falcon-h1",
        SSM,
        hf("FalconH1ForCausalLM", "FalconH1Config", mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4, **LLAMA),
        no_cache,
        notes="parallel mamba2 + attention",
    ),
    ZooCase(
        "granitemoe-hybrid",
        SSM,
        hf("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", moe=True, layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4, **LLAMA),
        no_cache,
    ),
    ZooCase("rwkv", SSM, hf("RwkvForCausalLM", "RwkvConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, context_length=64), no_cache, notes="WKV recurrence in torch"),
    ZooCase(
        "recurrent-gemma",
        SSM,
        hf("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, lru_width=32, attention_window_size=4, conv1d_width=4, block_types=["recurrent", "attention"]),
        no_cache,
        notes="RG-LRU + local attention",
    ),
    ZooCase(
        "mamba-cache",
        SSM,
        hf("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
        with_cache,
        notes="use_cache=True: conv/ssm states created and returned",
    ),
    ZooCase(
        "zamba",
        SSM,
        hf("ZambaForCausalLM", "ZambaConfig", use_mamba_kernels=False, attention_hidden_size=64, attention_head_dim=16, n_mamba_heads=2, mamba_d_state=8, mamba_expand=2, layers_block_type=["hybrid", "hybrid"], **{**LLAMA, "num_key_value_heads": 4}),
        no_cache,
        notes="mamba + shared attention; both layers hybrid (transformers ties the shared block and needs >= 2)",
    ),
    ZooCase(
        "nemotron-h",
        SSM,
        hf("NemotronHForCausalLM", "NemotronHConfig", use_mamba_kernels=False, layers_block_type=["mamba", "attention"], head_dim=8, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=8, n_groups=1, chunk_size=4, expand=2, **LLAMA),
        no_cache,
    ),
    ZooCase(
        "xlstm",
        SSM,
        hf("xLSTMForCausalLM", "xLSTMConfig", eager_attn=False, vocab_size=VOCAB, hidden_size=32, embedding_dim=32, num_hidden_layers=2, num_blocks=2, num_heads=4, chunk_size=4, mode="train"),
        no_cache,
        notes="mLSTM, native torch chunkwise kernels",
    ),
    ZooCase("lfm2", SSM, hf("Lfm2ForCausalLM", "Lfm2Config", layer_types=["conv", "full_attention"], **LLAMA), no_cache, notes="short gated convolutions + attention"),
    ZooCase(
        "qwen3-next",
        SSM,
        hf("Qwen3NextForCausalLM", "Qwen3NextConfig", moe=True, head_dim=8, layer_types=["linear_attention", "full_attention"], linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16, **LLAMA),
        no_cache,
        notes="gated delta-net (torch chunked path) + attention + MoE",
    ),
]
