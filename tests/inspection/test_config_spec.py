"""inspect_config: a Pydantic (or transformers) configuration tree, walked without building its target."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, Optional

import pytest

pydantic = pytest.importorskip("pydantic")
from pydantic import BaseModel  # noqa: E402

from nnschemaparser import ConfigFieldSpec, ModelStructureSpec, inspect_config  # noqa: E402


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


@dataclasses.dataclass
class Schedule:
    warmup: int = 10


class Target:
    """What the root configuration would build; building it is an error here."""

    built = 0

    def __init__(self, config):
        Target.built += 1


class LayerConfig(BaseModel):
    width: int = 8
    activation: Activation = Activation.RELU


class EncoderConfig(BaseModel):
    depth: int = 2
    layers: list[LayerConfig] = [LayerConfig(), LayerConfig(width=16, activation=Activation.GELU)]


class ModelConfig(BaseModel):
    target_type: ClassVar[type] = Target
    name: str = "tiny"
    dropout: Optional[float] = None
    encoder: EncoderConfig = EncoderConfig()
    extras: dict[str, LayerConfig] = {"head": LayerConfig()}
    schedule: Schedule = Schedule()
    sizes: tuple[int, ...] = (1, 2)

    def setup_target(self):
        raise AssertionError("inspect_config must never call setup_target")


def paths(spec: ModelStructureSpec) -> list[str]:
    return [".".join(f.path) for f in spec.fields]


def test_walk_is_depth_first_through_nested_models_and_models_in_sequences():
    spec = inspect_config(ModelConfig())
    assert paths(spec) == ["name", "dropout", "encoder", "encoder.depth", "encoder.layers",
                           "encoder.layers.0", "encoder.layers.0.width", "encoder.layers.0.activation",
                           "encoder.layers.1", "encoder.layers.1.width", "encoder.layers.1.activation",
                           "extras", "schedule", "sizes"]


def test_records_name_declared_and_configured_types_and_scalar_values():
    spec = inspect_config(ModelConfig())
    by_path = {f.path: f for f in spec.fields}
    assert by_path[("name",)] == ConfigFieldSpec(("name",), "str", "builtins.str", "tiny")
    assert by_path[("dropout",)] == ConfigFieldSpec(("dropout",), "Optional[float]", "builtins.NoneType", None)
    assert by_path[("encoder", "layers", "1", "activation")].value is Activation.GELU
    assert by_path[("encoder", "layers", "1", "activation")].configured_type == f"{__name__}.Activation"
    assert by_path[("encoder", "layers", "1", "width")].value == 16
    layers = by_path[("encoder", "layers")]
    assert (layers.declared_type, layers.configured_type, layers.value) == (
        "list[LayerConfig]", "builtins.list", "<builtins.list>")
    element = by_path[("encoder", "layers", "0")]
    assert element.configured_type == f"{__name__}.LayerConfig" and element.value == f"<{__name__}.LayerConfig>"
    assert element.declared_type == "LayerConfig"


def test_mappings_and_dataclasses_are_recorded_but_not_traversed():
    spec = inspect_config(ModelConfig())
    by_path = {f.path: f for f in spec.fields}
    assert by_path[("extras",)].configured_type == "builtins.dict"
    assert by_path[("schedule",)].value == f"<{__name__}.Schedule>"
    assert not any(f.path[0] in ("extras", "schedule") and len(f.path) > 1 for f in spec.fields)


def test_root_type_and_target_type_are_qualified_and_target_is_never_built():
    Target.built = 0
    spec = inspect_config(ModelConfig())
    assert spec.config_type == f"{__name__}.ModelConfig"
    assert spec.target_type == f"{__name__}.Target"
    assert Target.built == 0
    assert inspect_config(LayerConfig()).target_type is None


def test_repeated_calls_give_equal_frozen_records_and_follow_changes():
    config = ModelConfig()
    first, second = inspect_config(config), inspect_config(config)
    assert first == second and first is not second
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.fields[0].value = "other"  # type: ignore[misc]
    config.encoder.layers[0].width = 99
    changed = {f.path: f.value for f in inspect_config(config).fields}
    assert changed[("encoder", "layers", "0", "width")] == 99
    assert first != inspect_config(config)


def test_a_configuration_holding_itself_is_recorded_once_not_walked_forever():
    class Node(BaseModel):
        label: str = "n"
        child: Optional["Node"] = None

    node = Node()
    node.child = node  # assignment is not validated: a cycle
    spec = inspect_config(node)
    assert paths(spec) == ["label", "child"]


def test_transformers_config_walks_its_nested_sub_configs():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlavaConfig(text_config={"model_type": "llama", "hidden_size": 32},
                                      vision_config={"model_type": "clip_vision_model", "hidden_size": 24})
    spec = inspect_config(config)
    assert spec.config_type == "transformers.models.llava.configuration_llava.LlavaConfig"
    by_path = {f.path: f for f in spec.fields}
    assert by_path[("text_config",)].configured_type.endswith("LlamaConfig")
    assert by_path[("text_config", "hidden_size")].value == 32
    assert by_path[("vision_config", "hidden_size")].value == 24
    assert by_path[("image_token_index",)].declared_type == "int"
    assert not any(part.startswith("_") for f in spec.fields for part in f.path)
    assert inspect_config(config) == spec


def test_non_configuration_is_refused_with_a_typed_error():
    with pytest.raises(TypeError, match=r"needs a Pydantic model or a transformers PreTrainedConfig, got builtins.dict"):
        inspect_config({"width": 8})
    with pytest.raises(TypeError, match=r"construct it first: inspect_config\(ModelConfig\(...\)\)"):
        inspect_config(ModelConfig)


def test_transformers_config_inside_a_pydantic_model_is_walked_too():
    transformers = pytest.importorskip("transformers")

    class Wrapper(BaseModel):
        backbone: Any  # a dataclass annotation would make pydantic validate it field by field
        lr: float = 1e-3

    spec = inspect_config(Wrapper(backbone=transformers.BertConfig(hidden_size=48, num_attention_heads=4)))
    by_path = {f.path: f for f in spec.fields}
    assert by_path[("backbone",)].configured_type == "transformers.models.bert.configuration_bert.BertConfig"
    assert by_path[("backbone", "hidden_size")].value == 48
    assert list(by_path)[-1] == ("lr",)  # depth first: the backbone's fields come before lr
