"""Issue 14, item 14: wrappers users really have. Each one parses, and `call`, `run`, `capture_run`
and `step_run` each equal eager bit for bit (gradients too where the wrapper is about backward):
`torch.compile`, DistributedDataParallel and FSDP2 in a 2-process gloo group on 127.0.0.1,
accelerate's `cpu_offload` / `dispatch_model` hooks, `torch.utils.checkpoint` and
`quantize_dynamic`. A forward replaced on the instance without calling the class's runs live.
"""

from __future__ import annotations

import json
import socket
import time
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from tests.support.fidelity_models import Checkpointed, Small, gradients_match, run_every_way
from nnschemaparser import NNParser, SchemaInterpreter

# --- torch.compile -----------------------------------------------------------------------------------


def test_compiled_model_parses_the_module_it_wraps_and_runs_its_semantics():
    torch.manual_seed(0)
    original = Small()
    compiled = torch.compile(original)
    schema, steps = run_every_way(compiled, {"x": torch.randn(2, 4)}, eager=original)
    assert schema.module is original and schema.name == "Small" and schema.skipped == {}
    assert {s.block_path for s in steps} == {"Small", "fc1", "fc2"}
    x = torch.randn(2, 4, requires_grad=True)
    assert gradients_match(original, {"x": x}, schema=schema) == 5


def test_parsing_a_compiled_model_never_compiles_it():
    torch._dynamo.reset()
    torch.manual_seed(0)
    calls = []

    def backend(graph, example_inputs):
        calls.append(graph)
        return graph.forward

    compiled = torch.compile(Small(), backend=backend)
    schema = NNParser.parse_model(compiled, inputs_tensors_values={"x": torch.randn(2, 4)})
    SchemaInterpreter().call(schema, torch.randn(2, 4))
    assert calls == [], "parse and the schema's runs use the original module, not dynamo"
    compiled(torch.randn(2, 4))
    assert len(calls) == 1, "the compiled model still compiles when the user calls it"


# --- torch.utils.checkpoint --------------------------------------------------------------------------


@pytest.mark.parametrize("train", [False, True])
def test_checkpoint_inside_forward_is_exact_with_gradients(train):
    torch.manual_seed(0)
    model = Checkpointed().train(train)
    inputs = {"x": torch.randn(3, 4, requires_grad=True)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # checkpoint warns under parse's no_grad
        schema, steps = run_every_way(model, inputs, twin=False)
    # the forward is interpreted; the recomputation checkpoint makes in backward runs the real
    # modules, and is reported as such (phase "backward")
    frame = schema.coverage()
    assert (frame["phase"] == "backward").all()
    assert sorted(frame["module"]) == ["first", "second"] and list(frame["calls"]) == [1, 1]
    assert sorted(schema.skipped) == ["first (backward)", "second (backward)"]
    assert any(s.block_path == "Checkpointed" for s in steps)
    assert gradients_match(model, inputs, schema=schema) == 9  # 8 parameters and the input


# --- quantize_dynamic --------------------------------------------------------------------------------


def test_dynamically_quantised_model_is_exact_and_interpreted():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated
        model = torch.ao.quantization.quantize_dynamic(Small(), {nn.Linear}, dtype=torch.qint8)
        schema, steps = run_every_way(model, {"x": torch.randn(3, 4)})
    assert schema.skipped == {}
    assert schema.sub_blocks["fc1"].module_type.startswith("torch.ao.nn.quantized.dynamic")
    assert {"fc1", "fc2"} <= {s.block_path for s in steps}


# --- accelerate hooks --------------------------------------------------------------------------------


def _offloaded() -> nn.Module:
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = Small()
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    return model


def test_cpu_offload_hooks_run_around_the_schema():
    model = _offloaded()
    assert model.fc1.weight.device.type == "meta", "the weights live in accelerate's offload map"
    schema, steps = run_every_way(model, {"x": torch.randn(3, 4)}, twin=False)
    assert schema.skipped == {} and schema.skip_reason is None
    assert {"fc1", "fc2"} <= {s.block_path for s in steps}, "the offloaded layers are interpreted"
    weights = [s.value for s in steps if s.block_path == "fc1" and isinstance(s.value, torch.Tensor)]
    assert weights and all(w.device.type == "cpu" for w in weights)
    assert model.fc1.weight.device.type == "meta", "the hook offloaded the weights again after the schema"


def test_dispatch_model_hooks_run_around_the_schema():
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = Small()
    accelerate.dispatch_model(model, device_map={"fc1": "cpu", "fc2": "cpu"}, force_hooks=True)
    assert "forward" in model.fc1.__dict__ and hasattr(model.fc1, "_old_forward")
    schema, steps = run_every_way(model, {"x": torch.randn(3, 4)}, twin=False)
    assert schema.skipped == {} and {"fc1", "fc2"} <= {s.block_path for s in steps}


class Doubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


def test_forward_replaced_on_the_instance_runs_live_and_is_listed():
    torch.manual_seed(0)
    model = Doubled()
    model.fc.forward = lambda x: x * 5
    schema, _ = run_every_way(model, {"x": torch.randn(2, 4)}, twin=False)
    assert list(schema.skipped) == ["fc"] and "replaced on the instance" in schema.skipped["fc"]


def test_forward_replaced_after_parse_is_what_the_schema_calls():
    torch.manual_seed(0)
    model = Doubled()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    model.fc.forward = lambda x: x * 5
    assert torch.equal(SchemaInterpreter().call(schema, x), x * 5)
    del model.fc.forward
    assert torch.equal(SchemaInterpreter().call(schema, x), model.fc(x))


def test_forward_set_to_its_own_bound_forward_stays_interpreted():
    torch.manual_seed(0)
    model = Doubled()
    model.fc.forward = model.fc.forward  # some libraries do this in __init__
    schema, steps = run_every_way(model, {"x": torch.randn(2, 4)}, twin=False)
    assert schema.skipped == {} and any(s.block_path == "fc" for s in steps)


# --- DistributedDataParallel and FSDP2 on a 2-process gloo group -------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_group(kind: str, out_dir, timeout: float = 240.0) -> list[dict]:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend for torch.distributed")
    from tests.support.fidelity_distributed import worker

    context = mp.start_processes(worker, args=(2, _free_port(), kind, str(out_dir)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                raise AssertionError(f"the {kind} group did not finish within {timeout:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_distributed_data_parallel_model_is_exact_in_a_gloo_group(tmp_path):
    results = _run_group("ddp", tmp_path)
    for result in results:
        assert result["root"] == "DistributedDataParallel" and result["skip_reason"] is None
        assert {"module", "module.fc1", "module.fc2"} <= set(result["interpreted"])
        assert result["gradients"] == 5  # 4 parameters and the input, all-reduced by DDP
        # DDP's context manager `_inside_ddp_forward` (a generator method) is interpreted too
        assert result["skipped"] == {}


def test_fsdp2_fully_sharded_model_is_exact_in_a_gloo_group(tmp_path):
    results = _run_group("fsdp", tmp_path)
    for result in results:
        assert result["root"] == "FSDPSmall" and result["skip_reason"] is None and result["skipped"] == {}
        assert {"FSDPSmall", "fc1", "fc2"} <= set(result["interpreted"])
        assert result["gradients"] == 5  # 4 sharded parameters and the input
