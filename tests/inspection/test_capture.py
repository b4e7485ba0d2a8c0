"""Behaviour of `capture_model`: bounded, detached tensor snapshots that leave the model untouched."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from types import MappingProxyType

import pytest
import torch
from torch import nn

from nnschemaparser.inspection.capture import CaptureLimits, ModelCapture, TensorSnapshot, capture_model, sample_tensor


class Identity(nn.Module):
    def forward(self, *args, **kwargs):
        return args[0] if len(args) == 1 and not kwargs else (args, kwargs)


class Pair(nn.Module):
    """Returns a nested structure so output paths can be checked."""

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor):
        return x, {"x": x * mask, "rest": [x + 1]}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class Sink(nn.Module):
    """Consumes its input and returns nothing, so only inputs are recorded."""

    def forward(self, x: torch.Tensor) -> None:
        return None


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")


def hook_counts(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def only(snapshots, **where) -> TensorSnapshot:
    found = [s for s in snapshots if all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, f"expected one snapshot matching {where}, got {found}"
    return found[0]


# --- what gets recorded -----------------------------------------------------------------------


def test_inputs_and_outputs_recorded_per_module_in_call_order():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 4)
    with capture_model(model) as capture:
        out = model(x)
    order = [(s.module_path, s.direction) for s in capture.snapshots]
    assert order == [
        ("<root>", "input"), ("encoder", "input"), ("encoder.0", "input"), ("encoder.0", "output"),
        ("encoder.1", "input"), ("encoder.1", "output"), ("encoder", "output"),
        ("head", "input"), ("head", "output"), ("<root>", "output"),
    ]
    assert {s.tensor_path for s in capture.snapshots} == {"args[0]", "output"}
    root_out = only(capture.snapshots, module_path="<root>", direction="output")
    assert root_out.values == tuple(out.flatten().tolist())
    assert root_out.shape == (2, 2) and root_out.numel == 4
    assert root_out.dtype == "torch.float32" and root_out.device == "cpu"
    assert root_out.sampled_bytes == 16


def test_kwargs_and_nested_output_paths():
    model = Pair()
    x, mask = torch.arange(3.0), torch.tensor([1.0, 0.0, 1.0])
    with capture_model(model) as capture:
        model(x, mask=mask)
    paths = [(s.direction, s.tensor_path) for s in capture.snapshots]
    assert paths == [
        ("input", "args[0]"),
        ("input", "kwargs['mask']"),
        ("output", "output[0]"),
        ("output", "output[1]['x']"),
        ("output", "output[1]['rest'][0]"),
    ]
    assert only(capture.snapshots, tensor_path="output[1]['x']").values == (0.0, 0.0, 2.0)


def test_custom_mapping_output_is_traversed():
    class Model(nn.Module):
        def forward(self, x):
            # A read-only Mapping that is not a dict, like a ModelOutput-style record.
            return MappingProxyType({"logits": x * 2, "hidden": (x,)})

    model = Model()
    with capture_model(model) as capture:
        model(torch.ones(2))
    outputs = [s for s in capture.snapshots if s.direction == "output"]
    assert [s.tensor_path for s in outputs] == ["output['logits']", "output['hidden'][0]"]
    assert outputs[0].values == (2.0, 2.0)


def test_call_index_counts_repeated_calls_and_pairs_input_with_output():
    layer = nn.Linear(2, 2)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    with capture_model(model, module_paths=["0"]) as capture:
        model(torch.ones(1, 2))
    assert [(s.call_index, s.direction) for s in capture.snapshots] == [
        (0, "input"), (0, "output"), (1, "input"), (1, "output"),
    ]
    # The second call's input is the ReLU of the first call's output.
    assert capture.snapshots[2].values == tuple(max(v, 0.0) for v in capture.snapshots[1].values)


def test_reentrant_call_output_pairs_with_its_own_input():
    class Recursive(nn.Module):
        def forward(self, x, depth: int):
            return x if depth == 0 else self(x + 1, depth - 1) * 10

    model = Recursive()
    with capture_model(model) as capture:
        model(torch.zeros(1), 1)
    got = [(s.call_index, s.direction, s.values) for s in capture.snapshots]
    assert got == [(0, "input", (0.0,)), (1, "input", (1.0,)), (1, "output", (1.0,)), (0, "output", (10.0,))]


def test_call_that_raised_and_was_caught_leaves_no_stale_pairing():
    class Flaky(nn.Module):
        calls = 0

        def forward(self, x):
            type(self).calls += 1
            if self.calls == 1:
                raise RuntimeError("first call fails")
            return x * 3

    class Retry(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Flaky()

        def forward(self, x):
            try:
                return self.inner(x)
            except RuntimeError:
                return self.inner(x)

    model = Retry()
    with capture_model(model, module_paths=["inner"]) as capture:
        model(torch.ones(1))
    assert [(s.call_index, s.direction) for s in capture.snapshots] == [(0, "input"), (1, "input"), (1, "output")]
    assert capture.snapshots[-1].values == (3.0,)


def test_module_paths_restrict_hooks_to_the_named_modules():
    model = Net()
    with capture_model(model, module_paths=["head", "<root>"]) as capture:
        model(torch.ones(1, 4))
    assert {s.module_path for s in capture.snapshots} == {"head", "<root>"}


def test_values_are_row_major_prefix_of_non_contiguous_tensor():
    source = torch.arange(24.0).reshape(4, 6).t()[1:, ::2]  # non-contiguous, offset view
    assert not source.is_contiguous()
    model = Identity()
    with capture_model(model, limits=CaptureLimits(max_samples_per_tensor=5)) as capture:
        model(source)
    snap = capture.snapshots[0]
    assert snap.values == tuple(source.reshape(-1)[:5].tolist())
    assert snap.shape == tuple(source.shape) and snap.numel == source.numel()


def test_snapshot_does_not_alias_source():
    source = torch.ones(4, requires_grad=True)
    model = Identity()
    with capture_model(model) as capture:
        model(source * 1)
    with torch.no_grad():
        source.mul_(5)
    snap = capture.snapshots[0]
    assert snap.values == (1.0, 1.0, 1.0, 1.0)
    assert isinstance(snap.values, tuple)
    assert all(type(v) is float for v in snap.values)
    assert not any(isinstance(getattr(snap, f.name), torch.Tensor) for f in dataclasses.fields(snap))


def test_integer_bool_and_half_values_become_python_scalars():
    model = Identity()
    with capture_model(model) as capture:
        model((torch.tensor([1, 2], dtype=torch.int16), torch.tensor([True, False]), torch.tensor([0.5], dtype=torch.bfloat16)))
    ints, bools, halves = [s for s in capture.snapshots if s.direction == "input"]
    assert ints.values == (1, 2) and all(type(v) is int for v in ints.values) and ints.sampled_bytes == 4
    assert bools.values == (True, False) and bools.sampled_bytes == 2
    assert halves.values == (0.5,) and halves.dtype == "torch.bfloat16" and halves.sampled_bytes == 2


def test_scalar_tensor_is_sampled():
    model = Identity()
    with capture_model(model) as capture:
        model(torch.tensor(7))
    assert capture.snapshots[0].shape == () and capture.snapshots[0].values == (7,)


def test_snapshots_serialize_as_plain_dataclasses():
    model = Identity()
    with capture_model(model) as capture:
        model(torch.ones(2))
    payload = json.loads(json.dumps([dataclasses.asdict(s) for s in capture.snapshots]))
    assert payload[0]["values"] == [1.0, 1.0]
    assert payload[0]["sample_omission_reason"] is None


# --- tensors that are described but not sampled -----------------------------------------------


def capture_single_input(tensor: torch.Tensor) -> TensorSnapshot:
    model = Identity()
    with capture_model(model) as capture:
        model(tensor)
    return only(capture.snapshots, direction="input")


def test_complex_tensor_is_metadata_only():
    snap = capture_single_input(torch.tensor([1 + 2j, 3 - 1j]))
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.numel == 2 and snap.dtype == "torch.complex64"
    assert "complex" in snap.sample_omission_reason


def test_sparse_tensor_is_metadata_only():
    snap = capture_single_input(torch.eye(3).to_sparse())
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.shape == (3, 3) and snap.numel == 9
    assert "sparse_coo" in snap.sample_omission_reason


def test_quantized_tensor_is_metadata_only():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recent torch warns that these dtypes are deprecated
        quantized = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.qint8)
    snap = capture_single_input(quantized)
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.dtype == "torch.qint8" and snap.numel == 4
    assert "quantized" in snap.sample_omission_reason


def test_jagged_nested_tensor_is_metadata_only_with_ragged_dimension_marked():
    nested = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
    snap = capture_single_input(nested)
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.shape == (2, -1, 3) and snap.numel == 18
    assert "jagged" in snap.sample_omission_reason


def test_meta_device_tensor_is_metadata_only():
    snap = capture_single_input(torch.empty(2, 5, device="meta"))
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.device == "meta" and snap.shape == (2, 5) and snap.numel == 10
    assert "meta" in snap.sample_omission_reason


def test_empty_tensor_has_empty_sample_and_no_reason():
    snap = capture_single_input(torch.empty(0, 3))
    assert snap.values == () and snap.sampled_bytes == 0
    assert snap.shape == (0, 3) and snap.numel == 0
    assert snap.sample_omission_reason is None


# --- quotas -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(CaptureLimits)])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_capture_limits_reject_non_positive_int_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=field):
        CaptureLimits(**{field: bad})


def test_capture_limits_defaults():
    assert CaptureLimits() == CaptureLimits(64, 32, 16 * 1024, 4096, 32)


def test_per_tensor_sample_limit_truncates_values_but_not_metadata():
    model = Identity()
    with capture_model(model, limits=CaptureLimits(max_samples_per_tensor=3)) as capture:
        model(torch.arange(10))
    snap = capture.snapshots[0]
    assert snap.values == (0, 1, 2) and snap.sampled_bytes == 24
    assert snap.numel == 10 and snap.shape == (10,)


def test_tensor_quota_caps_snapshot_count_including_metadata_only_ones():
    model = Identity()
    items = [torch.empty(0), torch.tensor([1j]), torch.ones(1), torch.ones(1)]
    with capture_model(model, limits=CaptureLimits(max_tensors=3)) as capture:
        model(items)
        model(torch.ones(1))
    assert [s.tensor_path for s in capture.snapshots] == ["args[0][0]", "args[0][1]", "args[0][2]"]


def test_byte_quota_stops_sampling_and_keeps_metadata():
    model = nn.Sequential(Identity(), Identity())
    limits = CaptureLimits(max_bytes=10)
    with capture_model(model, limits=limits) as capture:
        model(torch.arange(8, dtype=torch.float32))
    assert len(capture.snapshots) == 1
    snap = capture.snapshots[0]
    assert snap.values == (0.0, 1.0)
    assert snap.sampled_bytes == 8 and capture.sampled_bytes == 8
    assert snap.shape == (8,) and snap.numel == 8 and snap.sample_omission_reason is None


def test_byte_quota_is_cumulative_across_reentry():
    model = Sink()
    capture = capture_model(model, limits=CaptureLimits(max_bytes=24))
    with capture:
        model(torch.ones(2, dtype=torch.float64))
    assert capture.sampled_bytes == 16
    with capture:
        model(torch.ones(2, dtype=torch.float64))
        model(torch.ones(2, dtype=torch.float64))
    # The second entrance has only 8 bytes left: one value, then recording stops.
    assert capture.sampled_bytes == 24
    assert [len(s.values) for s in capture.snapshots] == [2, 1]


def test_traversal_node_quota_ends_input_walk_and_restarts_for_output():
    model = Identity()
    inputs = [torch.full((1,), float(i)) for i in range(10)]
    # Nodes: args, args[0], args[0][0], args[0][1] -> the walk ends there.
    with capture_model(model, limits=CaptureLimits(max_traversal_nodes=4)) as capture:
        model(inputs)
    got = [(s.direction, s.tensor_path) for s in capture.snapshots]
    assert got == [
        ("input", "args[0][0]"), ("input", "args[0][1]"),
        # The output walk starts afresh: output, output[0], output[1], output[2].
        ("output", "output[0]"), ("output", "output[1]"), ("output", "output[2]"),
    ]


def test_container_depth_limit_skips_deeper_tensors_but_visits_siblings():
    model = Identity()
    nested = [[torch.zeros(1)], torch.ones(1)]
    with capture_model(model, limits=CaptureLimits(max_container_depth=2)) as capture:
        model(nested)
    assert [s.tensor_path for s in capture.snapshots if s.direction == "input"] == ["args[0][1]"]


def test_self_referencing_container_is_bounded():
    model = Identity()
    loop: list = [torch.ones(1)]
    loop.append(loop)
    with capture_model(model, limits=CaptureLimits(max_container_depth=5)) as capture:
        model(loop)
    inputs = [s.tensor_path for s in capture.snapshots if s.direction == "input"]
    assert inputs == ["args[0][0]", "args[0][1][0]", "args[0][1][1][0]", "args[0][1][1][1][0]"]


# --- hooks and model state --------------------------------------------------------------------


def test_outputs_are_unchanged_by_hooks():
    class ReturnsBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))

        def forward(self, x):
            return self.table

    model = ReturnsBuffer()
    with capture_model(model):
        out = model(torch.zeros(1))
    assert out is model.table


def test_capture_leaves_parameters_buffers_and_outputs_identical():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.0))
    twin = copy.deepcopy(model)
    x = torch.randn(3, 4)
    with capture_model(model):
        out = model(x)
    expected = twin(x)
    assert torch.equal(out, expected)
    for (name, a), (_, b) in zip(model.state_dict().items(), twin.state_dict().items()):
        assert torch.equal(a, b), name


def test_training_mode_unchanged():
    model = Net()
    model.train()
    model.encoder.eval()
    with capture_model(model):
        model(torch.ones(1, 4))
    assert [m.training for m in model.modules()] == [True, False, False, False, True]


def test_earlier_pre_hook_transformations_are_observed():
    model = Identity()
    model.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    with capture_model(model) as capture:
        model(torch.ones(2))
    assert only(capture.snapshots, direction="input").values == (2.0, 2.0)


def test_hooks_removed_on_normal_exit():
    model = Net()
    capture = capture_model(model)
    assert not capture.active and hook_counts(model) == 0
    with capture:
        assert capture.active and hook_counts(model) == 2 * 5
    assert not capture.active and hook_counts(model) == 0


def test_hooks_removed_when_forward_raises():
    model = nn.Sequential(nn.Identity(), Boom())
    with pytest.raises(ValueError, match="boom"):
        with capture_model(model) as capture:
            model(torch.ones(1))
    assert not capture.active and hook_counts(model) == 0
    boom = [(s.direction, s.call_index) for s in capture.snapshots if s.module_path == "1"]
    assert boom == [("input", 0)]
    assert not any(s.module_path == "<root>" and s.direction == "output" for s in capture.snapshots)


def test_close_is_idempotent_and_stops_recording():
    model = Identity()
    capture = capture_model(model).__enter__()
    model(torch.ones(1))
    capture.close()
    capture.close()
    model(torch.ones(1))
    assert not capture.active and hook_counts(model) == 0
    assert len(capture.snapshots) == 2


def test_capture_is_reusable_and_call_indices_accumulate():
    model = Identity()
    capture = capture_model(model)
    with capture:
        model(torch.ones(1))
    with capture:
        model(torch.ones(1))
    assert [(s.call_index, s.direction) for s in capture.snapshots] == [
        (0, "input"), (0, "output"), (1, "input"), (1, "output"),
    ]


def test_entering_an_active_capture_again_is_refused():
    model = Identity()
    capture = capture_model(model)
    with capture:
        with pytest.raises(RuntimeError, match="already active"):
            capture.__enter__()
        assert hook_counts(model) == 2


# --- bad arguments ----------------------------------------------------------------------------


def test_unknown_module_path_rejected_at_enter_with_close_matches():
    model = Net()
    capture = capture_model(model, module_paths=["encoder.O", "hed"])
    with pytest.raises(ValueError) as info:
        capture.__enter__()
    message = str(info.value)
    assert "'encoder.0'" in message and "'head'" in message
    assert not capture.active and hook_counts(model) == 0


def test_alias_of_shared_module_points_at_its_registered_path():
    shared = nn.Linear(2, 2)
    model = nn.ModuleDict({"a": shared, "b": shared})
    with pytest.raises(ValueError, match="'b' is another path to the module registered as 'a'"):
        with capture_model(model, module_paths=["b"]):
            pass


def test_empty_string_path_suggests_root():
    with pytest.raises(ValueError, match="<root>"):
        with capture_model(Identity(), module_paths=[""]):
            pass


def test_single_string_module_paths_is_refused():
    with pytest.raises(TypeError, match=r"\['head'\]"):
        capture_model(Net(), module_paths="head")


def test_non_module_model_is_refused():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        capture_model(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CaptureLimits"):
        ModelCapture(Identity(), limits={"max_tensors": 1})  # type: ignore[arg-type]


# --- sample_tensor on its own ------------------------------------------------------------------


def test_sample_tensor_respects_both_quotas():
    t = torch.arange(10, dtype=torch.int32)
    assert sample_tensor(t, 4, 100) == ((0, 1, 2, 3), 16, None)
    assert sample_tensor(t, 4, 11) == ((0, 1), 8, None)
    assert sample_tensor(t, 0, 100) == ((), 0, None)


def test_sample_tensor_does_not_build_autograd_graph():
    source = torch.ones(3, requires_grad=True)
    values, nbytes, reason = sample_tensor(source * 2, 3, 100)
    assert values == (2.0, 2.0, 2.0) and nbytes == 12 and reason is None
    assert source.grad is None


def test_sample_tensor_refuses_negative_quotas():
    with pytest.raises(ValueError, match="bytes_left"):
        sample_tensor(torch.ones(1), 1, -1)


def test_sample_tensor_skips_bit_packed_dtypes():
    packed = torch.zeros(4, dtype=torch.uint8).view(torch.bits8)
    values, nbytes, reason = sample_tensor(packed, 4, 100)
    assert (values, nbytes) == ((), 0)
    assert "bits8" in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_is_copied_to_cpu_with_source_device_recorded():
    source = torch.arange(6.0, device="cuda").reshape(2, 3).t()
    snap = capture_single_input(source)
    assert snap.device == str(source.device)
    assert snap.values == tuple(source.cpu().reshape(-1).tolist())
