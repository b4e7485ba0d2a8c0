"""The parse-time state guard copies only what a run writes, and puts all of it back exactly.

`preserved_state` keeps every parameter and buffer as an alias and copies a tensor's memory only
when an op is about to write it (issue 25, point 4: no second copy of the weights at parse time).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from nnschemaparser.parser import NNParser, preserved_state
from nnschemaparser.parser.state_guard import StateNotRestoredError


def _state(model: nn.Module) -> dict:
    """Each registered tensor's object, its memory address and a copy of its value."""
    out = {}
    for module_path, module in model.named_modules():
        for store in ("_parameters", "_buffers"):
            for name, value in getattr(module, store).items():
                if value is not None:
                    key = f"{module_path}.{name}".strip(".")
                    out[key] = (value, value.data_ptr(), value.detach().clone())
    return out


def _assert_restored(model: nn.Module, before: dict) -> None:
    after = _state(model)
    assert after.keys() == before.keys()
    for key, (value, pointer, saved) in before.items():
        now, now_pointer, _ = after[key]
        assert now is value, f"{key}: another tensor object is registered"
        assert now_pointer == pointer, f"{key}: its memory moved"
        assert torch.equal(now.detach(), saved), f"{key}: its value changed"


class WritesBufferInPlace(nn.Module):
    """A forward that updates a running statistic and a counter in place (as BatchNorm does)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        hidden = self.fc(x)
        with torch.no_grad():
            self.running.mul_(0.9).add_(hidden.mean(0), alpha=0.1)
            self.running[0] = 7.0  # a write through a view
        self.steps += 1
        return hidden + self.running


class WritesParameterData(nn.Module):
    """A forward that rewrites weights through `.data`: in place (a new version counter, so version
    counters alone miss it) and by replacing the tensor's memory."""

    def __init__(self) -> None:
        super().__init__()
        self.scaled = nn.Linear(4, 4)
        self.replaced = nn.Linear(4, 4)
        self.untouched = nn.Linear(4, 4)

    def forward(self, x):
        self.scaled.weight.data.mul_(0.5)
        self.replaced.weight.data = self.replaced.weight.data * 3
        return self.untouched(self.replaced(self.scaled(x)))


class TrainingNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_guard_restores_buffers_a_forward_writes_in_place_and_copies_only_those():
    torch.manual_seed(0)
    model = WritesBufferInPlace()
    before = _state(model)
    with preserved_state(model) as guard:
        model(torch.randn(3, 4))
        assert not torch.equal(model.running, before["running"][2])  # the run did write it
    _assert_restored(model, before)
    assert sorted(guard.copied) == ["running", "steps"]
    assert guard.copied_bytes == 4 * 4 + 8


def test_guard_restores_weights_written_through_data_in_place_and_replaced():
    torch.manual_seed(0)
    model = WritesParameterData()
    before = _state(model)
    with preserved_state(model) as guard:
        model(torch.randn(3, 4))
        assert model.replaced.weight.data_ptr() != before["replaced.weight"][1]
    _assert_restored(model, before)
    # a replaced tensor gets its own memory back (nothing to copy); only the in-place write copies
    assert guard.copied == ["scaled.weight"]


def test_parse_of_models_that_write_state_in_forward_leaves_them_exactly_as_they_were():
    for model in (WritesBufferInPlace(), WritesParameterData(), TrainingNorm().train()):
        torch.manual_seed(0)
        before = _state(model)
        NNParser.parse_model(model, inputs_tensors_shapes={"x": (3, 4)})
        _assert_restored(model, before)


def test_guard_copies_nothing_for_a_forward_that_writes_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.BatchNorm1d(8).eval())
    before = _state(model)
    with preserved_state(model) as guard:
        model(torch.randn(2, 8))
    assert guard.copied == [] and guard.copied_bytes == 0
    _assert_restored(model, before)


def test_batch_norm_statistics_are_copied_only_when_training():
    torch.manual_seed(0)
    model = TrainingNorm().train()
    with preserved_state(model) as guard:
        model(torch.randn(5, 4))
    # native_batch_norm writes them though its schema does not say so: the guard knows it does
    assert sorted(guard.copied) == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    model.eval()
    with preserved_state(model) as guard:
        model(torch.randn(5, 4))
    assert guard.copied == []


def test_parse_holds_no_copy_of_weights_the_forward_does_not_write():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    clones = []
    original_clone = torch.Tensor.clone

    def counting_clone(self, *args, **kwargs):
        if any(self.data_ptr() == p.data_ptr() for p in model.parameters()):
            clones.append(tuple(self.shape))
        return original_clone(self, *args, **kwargs)

    before = _state(model)
    torch.Tensor.clone = counting_clone
    try:
        NNParser.parse_model(model, inputs_tensors_shapes={"input": (2, 64)})
    finally:
        torch.Tensor.clone = original_clone
    assert clones == [], f"parse cloned weights it never wrote: {clones}"
    _assert_restored(model, before)


def test_guard_restores_tied_weights_written_in_place_once():
    torch.manual_seed(0)

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            with torch.no_grad():
                self.b.weight.add_(1.0)
            return self.a(x)

    model = Tied()
    before = _state(model)
    with preserved_state(model) as guard:
        model(torch.randn(2, 4))
    _assert_restored(model, before)
    assert sorted(guard.copied) == ["a.weight", "b.weight"] and guard.copied_bytes == 4 * 4 * 4


def test_a_write_the_guard_cannot_see_is_an_error_naming_the_tensor():
    model = nn.Linear(3, 3)
    with pytest.raises(StateNotRestoredError, match="bias"):
        with preserved_state(model):
            with torch.no_grad():
                torch._C._autograd._unsafe_set_version_counter((model.bias,), (model.bias._version + 5,))
                model.bias.numpy()[0] = 99.0  # numpy writes the memory; no op is dispatched


def test_guard_works_on_meta_tensors():
    with torch.device("meta"):
        model = WritesBufferInPlace()
    with preserved_state(model) as guard:
        model(torch.randn(3, 4, device="meta"))
    assert sorted(guard.copied) == ["running", "steps"]
    assert model.running.is_meta


def test_state_survives_a_forward_that_raises_after_writing():
    class Fails(WritesBufferInPlace):
        def forward(self, x):
            super().forward(x)
            raise ValueError("after the write")

    torch.manual_seed(0)
    model = Fails()
    before = _state(model)
    with pytest.raises(ValueError, match="after the write"):
        with preserved_state(model):
            model(torch.randn(3, 4))
    _assert_restored(model, before)


def test_guard_leaves_a_deep_copy_equal_model_after_a_training_step_like_forward():
    torch.manual_seed(0)
    model = TrainingNorm().train()
    reference = copy.deepcopy(model)
    with preserved_state(model):
        for _ in range(3):
            model(torch.randn(6, 4))
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.fixture
def one_rank_group():
    """A one-process gloo group on 127.0.0.1 (a DTensor needs a device mesh), destroyed after."""
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class ShardedWeights(nn.Module):
    """Weights held as DTensors (as FSDP2 and tensor parallel hold them); one written in forward."""

    def __init__(self, mesh) -> None:
        super().__init__()
        from torch.distributed.tensor import Shard, distribute_tensor
        self.kept = nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))
        self.written = nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))

    def forward(self, x):
        with torch.no_grad():
            self.written.mul_(0.5)
        return (x @ self.kept.full_tensor()) @ self.written.full_tensor()


def test_guard_copies_a_dtensor_shard_only_when_the_run_writes_it(one_rank_group):
    torch.manual_seed(0)
    model = ShardedWeights(one_rank_group)
    locals_before = {name: (param._local_tensor, param._local_tensor.data_ptr(), param._local_tensor.clone())
                     for name, param in model.named_parameters()}
    with preserved_state(model) as guard:
        model(torch.randn(3, 4))
        assert not torch.equal(model.written._local_tensor, locals_before["written"][2])
    # only the written shard was copied (before: every DTensor was cloned up front)
    assert guard.copied == ["written"]
    assert guard.copied_bytes == 4 * 4 * 4
    for name, param in model.named_parameters():
        shard, pointer, value = locals_before[name]
        assert param._local_tensor is shard and param._local_tensor.data_ptr() == pointer
        assert torch.equal(param._local_tensor, value), name
