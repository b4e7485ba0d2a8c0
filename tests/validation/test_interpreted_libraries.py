"""Real `transformers` models whose computation used to run as opaque calls are interpreted
through: BERT-family feed-forwards behind `apply_chunking_to_forward`, and MoE experts behind
`use_experts_implementation`. Each is exact, the coverage report shows no live call, and the
steps are there (per routed expert where the implementation loops over experts)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from nnschemaparser import NNParser, capture_run, moe_routing

_TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32)

_ENCODERS = {
    "bert": (tf.BertConfig, tf.BertModel, dict(_TINY), "encoder.layer.0.intermediate"),
    "roberta": (tf.RobertaConfig, tf.RobertaModel, dict(_TINY, pad_token_id=1), "encoder.layer.0.intermediate"),
    "electra": (tf.ElectraConfig, tf.ElectraModel, dict(_TINY, embedding_size=32), "encoder.layer.0.intermediate"),
    "xlm-roberta": (tf.XLMRobertaConfig, tf.XLMRobertaModel, dict(_TINY, pad_token_id=1),
                    "encoder.layer.0.intermediate"),
    "distilbert": (tf.DistilBertConfig, tf.DistilBertModel,
                   dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=32),
                   "transformer.layer.0.ffn.lin1"),
    "albert": (tf.AlbertConfig, tf.AlbertModel, dict(_TINY, embedding_size=16),
               "encoder.albert_layer_groups.0.albert_layers.0.ffn"),
}


@pytest.mark.parametrize("name", sorted(_ENCODERS))
def test_bert_family_feed_forward_runs_as_schema_with_steps_and_no_live_call(name):
    config_cls, model_cls, kwargs, ffn_path = _ENCODERS[name]
    torch.manual_seed(0)
    model = model_cls(config_cls(**kwargs)).eval()
    ids = torch.randint(3, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    assert schema.coverage().empty, schema.coverage().to_string()
    assert schema.skipped == {}
    record = capture_run(schema, {"input_ids": ids}, coverage=True)
    with torch.no_grad():
        expected = model(ids).last_hidden_state
    assert torch.equal(record.outputs[0].last_hidden_state, expected)
    assert record.coverage().empty
    assert any(step.block_path.startswith(ffn_path) for step in record.trace.steps)


def _mixtral(**extra):
    config = tf.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                              **extra)
    return tf.MixtralForCausalLM(config).eval()


def _router_top_k(model, ids):
    """The router's own top-k per layer, from forward hooks on the gates of an eager run."""
    chosen = {}

    def keep(index):
        def hook(module, args, out):
            chosen.setdefault(index, (out[2].clone(), out[1].clone()))  # (top-k experts, their weights)
        return hook

    hooks = [layer.mlp.gate.register_forward_hook(keep(i)) for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return chosen


@pytest.mark.parametrize("implementation", ["grouped_mm", "eager"])
def test_mixtral_experts_run_the_implementation_the_config_picks_as_schema(implementation):
    torch.manual_seed(0)
    model = _mixtral(experts_implementation=implementation)
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    assert schema.coverage().empty, schema.coverage().to_string()
    assert schema.skipped == {}
    record = capture_run(schema, {"input_ids": ids})
    with torch.no_grad():
        assert torch.equal(record.outputs[0].logits, model(ids).logits)
    steps = [s for s in record.trace.steps if s.block_path == "model.layers.0.mlp.experts"]
    assert steps
    if implementation == "eager":
        # one pass of the per-expert loop for each expert the router used: its index, then its work
        routed = set(_router_top_k(model, ids)[0][0].flatten().tolist())
        indices = [s for s in steps if s.out_var == "expert_idx" and s.op_name == "_operator.getitem"]
        assert len(indices) == len(routed)
        assert sorted(int(s.value) for s in indices) == sorted(routed)
        linears = [s for s in steps if s.op_name == "torch._C._nn.linear"]
        assert len(linears) == 2 * len(routed)  # gate_up and down, inside each routed expert
    else:
        assert any(s.op_name.endswith("_grouped_linear") for s in steps)


def test_moe_routing_equals_the_routers_top_k():
    torch.manual_seed(0)
    model = _mixtral()
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    routing = moe_routing(schema, {"input_ids": ids})
    expected = _router_top_k(model, ids)
    assert sorted(set(routing["layer"])) == [0, 1]
    for layer, (index, weights) in expected.items():
        rows = routing[routing["layer"] == layer].sort_values(["token", "rank"])
        assert rows["expert"].tolist() == index.flatten().tolist()
        assert torch.equal(torch.tensor(rows["weight"].tolist(), dtype=torch.float64),
                           weights.flatten().to(torch.float64))


def test_qwen2_moe_experts_are_interpreted_with_no_live_call():
    torch.manual_seed(0)
    config = tf.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)
    model = tf.Qwen2MoeForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    assert schema.coverage().empty and schema.skipped == {}
    record = capture_run(schema, {"input_ids": ids})
    with torch.no_grad():
        assert torch.equal(record.outputs[0].logits, model(ids).logits)
    assert any(s.block_path == "model.layers.0.mlp.experts" for s in record.trace.steps)


def test_diffusers_attention_processors_are_lowered_and_call_interpreted_modules():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8).eval()
    inputs = {"sample": torch.randn(1, 4, 8, 8), "timestep": torch.tensor(3), "encoder_hidden_states": torch.randn(1, 5, 16)}
    schema = NNParser.parse_model(unet, inputs_tensors_values=inputs)
    assert schema.coverage().empty, schema.coverage().to_string()
    record = capture_run(schema, dict(inputs), coverage=True)
    with torch.no_grad():
        assert torch.equal(record.outputs[0].sample, unet(**inputs).sample)
    assert record.coverage().empty
    assert schema.coverage(helpers=True).empty  # the processors' own code is lowered too
    attn = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"
    assert "processor.call" in schema.find(attn).methods
    names = [(s.out_var, s.op_name) for s in record.trace.steps if s.block_path == attn]
    assert ("hidden_states", "torch._C._nn.scaled_dot_product_attention") in names
    assert {"query", "key", "value"} <= {name for name, _ in names}
    steps = {s.block_path for s in record.trace.steps}
    attention = [p for p in steps if p.endswith(("to_q", "to_k", "to_v", "to_out.0"))]
    from diffusers.models.attention_processor import Attention

    count = sum(isinstance(module, Attention) for module in unet.modules())
    assert count == 8 and len(attention) == 4 * count  # every attention's 4 projections ran as schema


def test_x_transformers_wrapper_with_a_call_default_is_interpreted():
    x_transformers = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    model = x_transformers.TransformerWrapper(num_tokens=64, max_seq_len=16,
                                              attn_layers=x_transformers.Decoder(dim=32, depth=2, heads=4)).eval()
    x = torch.randint(0, 64, (1, 8))
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None and schema.skipped == {}
    assert schema.coverage().empty
    record = capture_run(schema, {"x": x})
    with torch.no_grad():
        assert torch.equal(record.outputs[0], model(x))


def test_peft_lora_model_and_its_hook_context_manager_are_interpreted():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2)).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)).eval()
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    assert schema.coverage().empty
    assert schema.skipped == {}  # the @contextmanager hook method is interpreted too
    assert "_enable_peft_forward_hooks" in schema.methods
    record = capture_run(schema, {"input_ids": ids})
    with torch.no_grad():
        assert torch.equal(record.outputs[0].logits, model(input_ids=ids).logits)
    assert any(s.block_path.endswith("q_proj.lora_A.default") for s in record.trace.steps)


def test_the_inspector_tree_shows_the_experts_loop_where_a_capture_steps():
    from nnschemaparser.widget.tree import BlockTree

    torch.manual_seed(0)
    model = _mixtral(experts_implementation="eager")
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    tree = BlockTree(schema)
    node = tree.path_nodes["model.layers.0.mlp.experts"]
    rows = [tree.nodes[child].text for child in tree.nodes[node].children]
    assert "FOR expert_idx IN expert_hit:" in rows and "skip" not in tree.nodes[node].extra
    record = capture_run(schema, {"input_ids": ids})
    inside = [s for s in record.trace.steps if s.block_path == "model.layers.0.mlp.experts"]
    assert {"current_state", "current_hidden_states", "top_k_pos", "token_idx"} <= {s.out_var for s in inside}
