"""Behaviour of `inspect_model`: registered-state counts read without running or changing the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nnschemaparser.inspection.metadata import ModelMetadata, ModuleMetadata, inspect_model


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.proj = nn.Linear(3, 2)  # 6 weights + 2 biases

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * self.scale)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)  # 40
        self.norm = nn.LayerNorm(4)  # 4 + 4
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def record(meta: ModelMetadata, path: str) -> ModuleMetadata:
    matches = [m for m in meta.modules if m.path == path]
    assert len(matches) == 1, f"expected one record for {path!r}, got {matches}"
    return matches[0]


def test_module_records_follow_named_modules_order_with_root_path():
    model = nn.Sequential(Block(), nn.ReLU(), nn.Linear(2, 1))
    meta = inspect_model(model)
    assert [m.path for m in meta.modules] == ["<root>", "0", "0.proj", "1", "2"]


def test_type_names_are_fully_qualified():
    model = nn.Sequential(Block())
    meta = inspect_model(model)
    assert meta.model_type == "torch.nn.modules.container.Sequential"
    assert record(meta, "0").module_type == f"{Block.__module__}.Block"
    assert record(meta, "0.proj").module_type == "torch.nn.modules.linear.Linear"


def test_direct_counts_exclude_child_modules_while_totals_include_them():
    meta = inspect_model(Block())
    root = record(meta, "<root>")
    assert root.direct_parameters == 3
    assert record(meta, "proj").direct_parameters == 8
    assert meta.total_parameters == 11


def test_frozen_parameters_are_not_trainable():
    model = Block()
    model.proj.weight.requires_grad_(False)
    meta = inspect_model(model)
    assert record(meta, "proj").direct_parameters == 8
    assert record(meta, "proj").trainable_parameters == 2
    assert record(meta, "<root>").trainable_parameters == 3
    assert meta.trainable_parameters == 5
    assert meta.total_parameters == 11


def test_tied_parameters_count_once_in_totals():
    meta = inspect_model(TiedLM())
    # Each owning module reports the shared tensor as its own...
    assert record(meta, "embed").direct_parameters == 40
    assert record(meta, "head").direct_parameters == 40
    # ...but the model holds it once.
    assert meta.total_parameters == 40 + 8
    assert meta.trainable_parameters == 40 + 8


def test_shared_module_is_listed_once_under_its_first_path():
    shared = nn.Linear(2, 2)
    model = nn.ModuleDict({"a": shared, "b": shared})
    meta = inspect_model(model)
    assert [m.path for m in meta.modules] == ["<root>", "a"]
    assert meta.total_parameters == 6


def test_buffers_are_counted_on_their_own_module_including_non_persistent():
    model = nn.Sequential(nn.BatchNorm1d(5))
    model.register_buffer("table", torch.zeros(2, 3), persistent=False)
    meta = inspect_model(model)
    assert record(meta, "<root>").direct_buffers == 6
    # running_mean + running_var + num_batches_tracked
    assert record(meta, "0").direct_buffers == 5 + 5 + 1
    assert record(meta, "0").direct_parameters == 10


def test_parameter_registered_as_none_is_skipped():
    linear = nn.Linear(3, 3, bias=False)
    assert "bias" in linear._parameters
    meta = inspect_model(linear)
    assert record(meta, "<root>").direct_parameters == 9


def test_lazy_module_is_not_initialized_by_inspection():
    model = nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2))
    meta = inspect_model(model)
    assert record(meta, "0").direct_parameters == 0
    assert meta.total_parameters == 10
    assert model[0].has_uninitialized_params()
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


def test_initialized_state_on_a_lazy_module_is_still_counted():
    bn = nn.LazyBatchNorm1d()
    meta = inspect_model(bn)
    root = record(meta, "<root>")
    # Lazy weight/bias/running stats count zero; num_batches_tracked is created eagerly.
    assert root.direct_parameters == 0
    assert root.direct_buffers == 1
    assert bn.has_uninitialized_params()


def test_training_mode_unchanged_and_reported_per_module():
    model = Block()
    model.train()
    model.proj.eval()
    meta = inspect_model(model)
    assert record(meta, "<root>").training is True
    assert record(meta, "proj").training is False
    assert model.training is True and model.proj.training is False


def test_inspection_runs_no_forward_and_no_hooks():
    calls = []
    model = Block()
    model.register_forward_pre_hook(lambda module, args: calls.append("pre"))
    model.register_forward_hook(lambda module, args, out: calls.append("post"))
    inspect_model(model)
    assert calls == []


def test_meta_device_model_is_counted_without_moving_it():
    with torch.device("meta"):
        model = nn.Linear(1000, 1000)
    meta = inspect_model(model)
    assert meta.total_parameters == 1000 * 1000 + 1000
    assert model.weight.device.type == "meta"


def test_records_are_frozen_equal_on_repeat_and_serializable():
    model = TiedLM()
    first, second = inspect_model(model), inspect_model(model)
    assert first == second
    assert first is not second
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.total_parameters = 0  # type: ignore[misc]
    as_dict = dataclasses.asdict(first)
    assert as_dict["modules"][0]["path"] == "<root>"


def test_non_module_input_raises_type_error_saying_what_was_passed():
    with pytest.raises(TypeError) as info:
        inspect_model(Block().state_dict())
    message = str(info.value)
    assert "collections.OrderedDict" in message
    assert "torch.nn.Module" in message


def test_module_class_instead_of_instance_is_refused_with_a_hint():
    with pytest.raises(TypeError) as info:
        inspect_model(nn.Linear)  # type: ignore[arg-type]
    assert "torch.nn.modules.linear.Linear" in str(info.value)
    assert "construct" in str(info.value)
