"""GradientTrace: ids, cross references, and gradients equal to eager autograd's for the same tensors."""

import pytest
import torch

from tests.support.fixture_models import FIXTURES
from nnschemaparser import SchemaInterpreter
from nnschemaparser.traces.record import capture_run
from nnschemaparser.traces.recorder import ActivationRecorder
from nnschemaparser.traces.trace import GradientTrace
from tests.support.trace_models import InPlace, parse, spec_mlp


def _mlp_gradients():
    model, x, schema = spec_mlp()
    recorder = ActivationRecorder(capture_grads=True)
    outputs = SchemaInterpreter(listeners=[recorder]).run(block=schema, scope={"x": x.clone().requires_grad_(True)})
    outputs[0].pow(2).sum().backward()
    return model, x, recorder


def test_gradient_steps_mirror_activation_steps_with_prefixed_ids():
    _, _, recorder = _mlp_gradients()
    gradients = recorder.collect_gradients()
    assert isinstance(gradients, GradientTrace)
    activations = recorder.trace
    assert [g.container_id for g in gradients] == ["grad_" + a.container_id for a in activations]
    assert [g.source_container_id for g in gradients] == activations.container_ids
    assert [g.step for g in gradients] == [a.step for a in activations]
    assert all(g.slot_type == "gradient" and g.tensor.slot_type == "gradient" for g in gradients)
    assert gradients.by_container("grad_MLP_0004").out_var == "activated"
    assert gradients.for_activation("MLP_0004") is gradients.by_container("grad_MLP_0004")
    assert gradients.by_container("grad_MLP_0004").line().endswith("| source: MLP_0004")


def test_mlp_gradients_equal_autograd_for_every_step():
    model, x, recorder = _mlp_gradients()
    leaf = x.clone().requires_grad_(True)
    hidden = model.fc1(leaf)
    activated = hidden.relu()
    out = model.fc2(activated)
    wanted = torch.autograd.grad(out.pow(2).sum(), [leaf, hidden, activated, out])
    by_id = {g.source_container_id: g.value for g in recorder.collect_gradients()}
    expected = {"input_0001": wanted[0], "fc1_0002": wanted[1], "MLP_0003": wanted[1], "MLP_0004": wanted[2],
                "fc2_0005": wanted[3], "MLP_0006": wanted[3], "output_0007": wanted[3]}
    assert by_id.keys() == expected.keys()
    for cid, grad in expected.items():
        assert torch.equal(by_id[cid], grad), cid


def test_gradient_is_taken_with_respect_to_the_value_before_a_later_in_place_op():
    torch.manual_seed(0)
    model = InPlace().eval()
    x = torch.randn(4, 4, requires_grad=True)
    schema = parse(model, {"x": x.detach()})
    record = capture_run(schema, {"x": x}, capture_grads=True)
    z, h = record.outputs
    (z.sum() + h.pow(2).sum()).backward()

    leaf = x.detach().clone().requires_grad_(True)
    eager = {}
    y = leaf * 2
    y.register_hook(lambda g: eager.__setitem__("y", g))
    y.add_(1)
    y[0] = 0.5
    z_ref = y @ y.t()
    z_ref.register_hook(lambda g: eager.__setitem__("z", g))
    z_ref += 1
    proj = model.proj(leaf)
    proj.register_hook(lambda g: eager.__setitem__("proj", g))
    h_ref = torch.nn.functional.relu(proj, inplace=True)
    (z_ref.sum() + h_ref.pow(2).sum()).backward()

    gradients = record.gradients
    assert torch.equal(gradients.by_container("grad_InPlace_0002").value, eager["y"])
    assert torch.equal(gradients.by_container("grad_InPlace_0005").value, eager["z"])
    assert torch.equal(gradients.by_container("grad_proj_0007").value, eager["proj"])
    assert torch.equal(gradients.by_container("grad_input_0001").value, leaf.grad)


def test_gradients_accumulate_over_two_backward_passes_like_grad_does():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x.clone().requires_grad_(True)}, capture_grads=True)
    loss = record.outputs[0].sum()
    loss.backward(retain_graph=True)
    once = record.gradients.by_container("grad_MLP_0004").value.clone()
    loss.backward()
    assert torch.equal(record.gradients.by_container("grad_MLP_0004").value, once * 2)


def test_steps_no_gradient_reached_have_none_and_say_why():
    _, x, schema = spec_mlp()
    record = capture_run(schema, {"x": x}, capture_grads=True)
    gradients = record.gradients  # no backward yet
    assert len(gradients) == 6, "the input does not require grad, every other step does (weights do)"
    assert all(g.value is None and "backward()" in g.omitted for g in gradients)


def test_no_grad_runs_have_no_gradient_steps():
    _, x, schema = spec_mlp()
    with torch.no_grad():
        record = capture_run(schema, {"x": x}, capture_grads=True)
    assert len(record.gradients) == 0


def test_collect_gradients_without_capture_grads_says_how_to_enable_it():
    _, x, schema = spec_mlp()
    recorder = ActivationRecorder()
    SchemaInterpreter(listeners=[recorder]).run(schema, {"x": x})
    with pytest.raises(RuntimeError, match="capture_grads=True"):
        recorder.collect_gradients()
    with pytest.raises(Exception, match="capture_grads=True"):
        capture_run(schema, {"x": x}).gradients


def _loss(outputs):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return sum(out.pow(2).sum() for out in outputs)


def _module_output_grads(model, inputs):
    """Eager: the gradient of each tensor-returning module call, in call order, for loss = sum(out**2)."""
    names = {id(m): n for n, m in model.named_modules()}
    grads: dict = {}
    order = []

    def hook(module, args, out):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            slot = (names[id(module)], sum(1 for p, _ in order if p == names[id(module)]))
            order.append(slot)
            out.register_hook(lambda g, slot=slot: grads.__setitem__(slot, g))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        _loss(model(**inputs)).backward()
    finally:
        for handle in handles:
            handle.remove()
    return grads


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet", "autoencoder", "gnn", "unet"])
def test_sub_block_output_gradients_equal_eager_autograd(name):
    model, inputs = FIXTURES[name]()
    model.eval()
    schema = parse(model, inputs)
    if schema.is_skipped:
        pytest.skip(f"the parser runs this root as its real module: {schema.skip_reason}")
    expected = _module_output_grads(model, inputs)
    model.zero_grad(set_to_none=True)
    record = capture_run(schema, dict(inputs), capture_grads=True)
    _loss(tuple(record.outputs)).backward()
    gradients = {g.source_container_id: g for g in record.gradients}
    seen: dict = {}
    compared = 0
    for step in record.trace:
        if not step.description.startswith("Call to sub-block"):
            continue
        slot = (step.op_name, seen.get(step.op_name, 0))
        seen[step.op_name] = slot[1] + 1
        if slot in expected:
            assert torch.equal(gradients[step.container_id].value, expected[slot]), step.container_id
            compared += 1
    root = expected.pop(("", 0), None)
    assert compared == len(expected) > 0
    if root is not None:
        output = next(s for s in record.trace if s.slot_type == "output")
        assert torch.equal(gradients[output.container_id].value, root)
