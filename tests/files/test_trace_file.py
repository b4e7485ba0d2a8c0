"""save_trace / load_trace: activation and gradient traces come back field for field, bit for bit."""

import dataclasses
import json
import struct

import pytest
import safetensors.torch
import torch

from tests.support.fixture_models import FIXTURES

from nnschemaparser import NNParser, TensorContainer
from nnschemaparser.inspection.capture import CaptureLimits
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import FormatVersionError
from nnschemaparser.traces.record import capture_run
from nnschemaparser.files.trace_file import load_trace, save_trace
from nnschemaparser.traces.trace import ActivationTrace, GradientTrace, TraceStep

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a, b):
    """torch.equal, except that NaNs with the same payload count as equal."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        if a.dtype.is_complex:
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        return torch.equal(a.contiguous().view(_BITS[a.element_size()]), b.contiguous().view(_BITS[b.element_size()]))
    return torch.equal(a, b)


def assert_same_trace(original, loaded):
    assert type(loaded) is type(original)
    assert loaded.root == original.root
    assert len(loaded.steps) == len(original.steps)
    for mine, theirs in zip(original.steps, loaded.steps):
        for f in dataclasses.fields(TraceStep):
            if f.name == "sample":  # NaN != NaN: compare types and reprs
                assert [(type(v), repr(v)) for v in theirs.sample] == [(type(v), repr(v)) for v in mine.sample]
                assert type(theirs.sample) is tuple
            elif f.name != "tensor":
                assert getattr(theirs, f.name) == getattr(mine, f.name), (mine.container_id, f.name)
        for f in dataclasses.fields(TensorContainer):
            if f.name != "value":
                assert getattr(theirs.tensor, f.name) == getattr(mine.tensor, f.name), (mine.container_id, f.name)
        if isinstance(mine.tensor.value, torch.Tensor):
            assert _same_bits(mine.tensor.value, theirs.tensor.value), mine.container_id
            assert not theirs.tensor.value.requires_grad
        else:
            assert theirs.tensor.value == mine.tensor.value


def _record(name, limits=None):
    model, inputs = FIXTURES[name]()
    model.eval()
    schema = NNParser.parse_model(model, inputs_tensors_values={k: v.detach().clone() for k, v in inputs.items()})
    scope = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    record = capture_run(block=schema, scope=scope, capture_grads=True, limits=limits)
    outputs = [o for o in record.outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    sum(o.double().sum() for o in outputs).backward()
    return record


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_activation_and_gradient_traces_round_trip_exactly(name, tmp_path):
    record = _record(name)
    for trace in (record.trace, record.gradients):
        loaded = load_trace(save_trace(trace, tmp_path / "trace.safetensors"))
        assert_same_trace(trace, loaded)


def test_omitted_values_and_samples_round_trip(tmp_path):
    record = _record("mlp", limits=CaptureLimits(max_tensors=3, max_samples_per_tensor=4))
    trace = record.trace
    assert any(step.omitted for step in trace.steps) and any(step.sample for step in trace.steps)
    assert_same_trace(trace, load_trace(save_trace(trace, tmp_path / "trace.safetensors")))
    gradients = record.gradients
    assert any(step.tensor.value is None for step in gradients.steps)
    assert_same_trace(gradients, load_trace(save_trace(gradients, tmp_path / "grads.safetensors")))


def _trace_of(values, kind=ActivationTrace):
    steps = []
    for index, value in enumerate(values, start=1):
        cid = f"blk_{index:04d}"
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
        dtype = str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__
        container = TensorContainer(shape=shape, dtype=dtype, value=value, container_id=cid, slot_type="activation")
        steps.append(TraceStep(index, cid, "a step", "activation", f"v{index}", "torch.add", "blk", container,
                               frame_depth=index % 3, sample=(1.5, float("nan"), True, -2)))
    return kind(steps, root="Blk")


def test_every_safetensors_dtype_and_odd_layout_round_trips(tmp_path):
    base = torch.linspace(-3, 3, 24).reshape(4, 6)
    values = [base.to(dtype) for dtype in (torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)]
    values += [base.t(), base[1:3, ::2], torch.tensor(3.5), torch.empty(0, 4), base.expand(2, 4, 6),
               torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]), base.conj(),
               torch.complex(base, base).conj()]
    trace = _trace_of(values)
    assert_same_trace(trace, load_trace(save_trace(trace, tmp_path / "t.safetensors")))


def test_a_tensor_held_by_two_steps_is_stored_once_and_shared_again(tmp_path):
    shared = torch.arange(6.0)
    trace = _trace_of([shared, shared, shared[:3]], GradientTrace)
    path = save_trace(trace, tmp_path / "t.safetensors")
    assert len(safetensors.torch.load_file(path)) == 2
    loaded = load_trace(path)
    assert_same_trace(trace, loaded)
    assert loaded.steps[0].tensor.value is loaded.steps[1].tensor.value


def test_a_non_tensor_value_and_an_omitted_value_round_trip(tmp_path):
    trace = _trace_of([torch.ones(2), 7, None])
    assert_same_trace(trace, load_trace(save_trace(trace, tmp_path / "t.safetensors")))


def test_the_trace_metadata_is_readable_json_in_the_safetensors_header(tmp_path):
    path = save_trace(_trace_of([torch.ones(2)]), tmp_path / "t.safetensors")
    data = path.read_bytes()
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    document = json.loads(header["__metadata__"]["trace"])
    assert document["format"] == "nnschemaparser-trace" and document["kind"] == "activation"
    assert document["steps"][0]["tensor"]["tensor_key"] == "blk_0001"
    assert header["blk_0001"]["dtype"] == "F32"


def test_save_refuses_what_safetensors_cannot_hold(tmp_path):
    with pytest.raises(SchemaFormatError, match="safetensors has no torch.complex128"):
        save_trace(_trace_of([torch.zeros(2, dtype=torch.complex128)]), tmp_path / "t.safetensors")
    with pytest.raises(SchemaFormatError, match="sparse"):
        save_trace(_trace_of([torch.eye(3).to_sparse()]), tmp_path / "t.safetensors")
    with pytest.raises(SchemaFormatError, match="only plain values"):
        save_trace(_trace_of([object()]), tmp_path / "t.safetensors")
    with pytest.raises(SchemaFormatError, match="ActivationTrace or a GradientTrace"):
        save_trace([], tmp_path / "t.safetensors")


def test_a_safetensors_file_without_trace_metadata_is_refused(tmp_path):
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, path)
    with pytest.raises(FormatVersionError, match="write traces with save_trace"):
        load_trace(path)
