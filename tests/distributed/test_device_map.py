"""accelerate's device_map: a small Llama (random weights, built from its config) dispatched over
"cpu" and "disk" by `infer_auto_device_map`, or with every weight offloaded by `cpu_offload`; the
schema runs through accelerate's AlignDevicesHook (weights loaded in for each call and offloaded
again) and every captured value equals an undispatched twin's, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from nnschemaparser import NNParser, capture_run

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")


def _llama():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, copy.deepcopy(model), torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))


def _same_as_twin(model, twin, ids):
    with torch.no_grad():
        schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
        record = capture_run(schema, {"input_ids": ids})
        reference = capture_run(NNParser.parse_model(twin, inputs_tensors_values={"input_ids": ids}), {"input_ids": ids})
        eager = twin(input_ids=ids).logits
    assert schema.skipped == {} and schema.skip_reason is None
    assert torch.equal(record.outputs[0].logits, eager)
    assert [s.container_id for s in record.trace] == [s.container_id for s in reference.trace]
    for step, other in zip(record.trace, reference.trace):
        assert step.value.shape == other.value.shape and torch.equal(step.value, other.value), step.container_id
    paths = {s.block_path for s in record.trace}
    assert {"model.layers.0.self_attn", "model.layers.2.mlp", "lm_head"} <= paths, "the offloaded layers are interpreted"
    return record


def test_dispatch_model_over_cpu_and_disk_runs_the_schema_exactly(tmp_path):
    model, twin, ids = _llama()
    size = accelerate.utils.compute_module_sizes(model)[""]
    device_map = accelerate.infer_auto_device_map(model, max_memory={"cpu": int(size * 0.6), "disk": 10 * size},
                                                  no_split_module_classes=["LlamaDecoderLayer"])
    assert set(device_map.values()) == {"cpu", "disk"}, device_map
    accelerate.dispatch_model(model, device_map=device_map, offload_dir=str(tmp_path))
    offloaded = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    assert offloaded, "some weights live on disk (meta in the module)"
    _same_as_twin(model, twin, ids)
    assert all(p.device.type == "meta" for n, p in model.named_parameters() if n in offloaded), \
        "the hooks offloaded the weights again after the schema's run"


def test_cpu_offload_of_every_weight_runs_the_schema_exactly():
    model, twin, ids = _llama()
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert all(p.device.type == "meta" for p in model.parameters())
    _same_as_twin(model, twin, ids)
    assert all(p.device.type == "meta" for p in model.parameters())
