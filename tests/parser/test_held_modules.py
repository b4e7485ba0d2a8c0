"""A module held as a plain attribute, set past `nn.Module`'s registration, has a block and runs
interpreted, whoever calls it.

TransformerLens 4.3's `TransformerBridge` keeps the HF model it wraps as
`self.__dict__["original_model"]` and calls it through a driver object; before, that model's
forward (and the modules only it holds, such as GPT-2's `transformer.drop`) ran live: `skipped` had
`<GPT2LMHeadModel from TransformerBridge>`, `<GPT2Model ...>` and `<Dropout ...>` with
`module None`. The mimic below copies the shapes of TransformerLens's code (file and lines named
on each class); the last test runs the real bridge when `transformer_lens` is installed."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run

transformers = pytest.importorskip("transformers")


class SetPastRegistration(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        object.__setattr__(self, "hidden", nn.ReLU())

    def forward(self, x):
        return self.hidden(self.fc(x))


def test_a_module_set_past_registration_has_a_block_and_runs_interpreted():
    torch.manual_seed(0)
    model = SetPastRegistration().eval()
    x = torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {} and schema.coverage().empty
    assert schema.find("hidden").module is model.hidden and "hidden" not in dict(model.named_modules())
    record = capture_run(schema, {"x": x}, coverage=True)
    assert torch.equal(record.outputs[0], model(x)) and record.coverage().empty
    assert "hidden" in {step.block_path for step in record.trace.steps}


class _WithBackReferences(nn.Module):
    """A child that holds its parent (and a sibling twice) past registration: no cycle, one block each."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.__dict__["owner"] = self  # itself
        self.inner.__dict__["parent"] = self  # the root, from below
        extra = nn.Tanh()
        self.__dict__["first"] = extra
        self.__dict__["second"] = extra

    def forward(self, x):
        return self.second(self.first(self.inner(x)))


def test_back_references_and_a_module_held_twice_give_one_block_each():
    torch.manual_seed(0)
    model = _WithBackReferences().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {} and schema.coverage().empty
    assert sorted(block.path for block in schema.iter_blocks()) == ["", "first", "inner"]
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


# --- TransformerLens's bridge, in its own shapes -----------------------------------------------------


class _Driver:
    """transformer_lens/model_bridge/sources/transformers_driver.py:17-62 (`TransformersDriver`):
    a plain object holding the HF model as `self._model`, calling it as `self._model(input_ids, **kwargs)`."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model

    def forward(self, input_ids: Any = None, **kwargs: Any) -> Any:
        if input_ids is not None:
            raw = self._model(input_ids, **kwargs)
        else:
            raw = self._model(**kwargs)
        return raw


class _ComponentBridge(nn.Module):
    """transformer_lens/model_bridge/generalized_components/base.py:314-320 (`set_original_component`
    registers the HF component as `_original_component`) and 435-461 (`forward`: hook the first
    tensor, call `original_component(*args, **kwargs)`, hook the output's first item)."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_in = nn.Identity()
        self.hook_out = nn.Identity()

    def set_original_component(self, original_component: nn.Module) -> None:
        self.add_module("_original_component", original_component)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        original_component = self._modules.get("_original_component", None)
        if len(args) > 0 and isinstance(args[0], torch.Tensor):
            args = (self.hook_in(args[0]),) + args[1:]
        output = original_component(*args, **kwargs)
        if isinstance(output, tuple):
            output = (self.hook_out(output[0]),) + output[1:]
        else:
            output = self.hook_out(output)
        return output


class _Bridge(nn.Module):
    """transformer_lens/model_bridge/transformer_bridge.py:194-214 (`__init__`: `nn.Module.__init__`,
    `self.__dict__["original_model"] = model`, a driver, then `set_original_components`, which per
    component_setup.py:80-100 puts each bridge component in the HF component's place with `setattr`)
    and 2373 (`forward`: `self._driver.forward(input_ids=input_ids)`, then the logits)."""

    def __init__(self, model: nn.Module) -> None:
        nn.Module.__init__(self)
        self.__dict__["original_model"] = model
        self._driver = _Driver(model)
        self.embed = _ComponentBridge()
        self.blocks = nn.ModuleList([_ComponentBridge() for _ in model.transformer.h])
        self.embed.set_original_component(model.transformer.wte)
        setattr(model.transformer, "wte", self.embed)
        for index, block in enumerate(self.blocks):
            block.set_original_component(model.transformer.h[index])
            setattr(model.transformer.h, str(index), block)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        result = self._driver.forward(input_ids=input)
        return result.logits


def _gpt2(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32, vocab_size=64, use_cache=False,
                                     bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(config).eval()


def _tokens() -> torch.Tensor:
    return torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))


def test_a_bridge_holding_the_hf_model_past_registration_runs_it_interpreted_with_every_dropout_by_path():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bridge = _Bridge(_gpt2(0)).eval()
    tokens = _tokens()
    with torch.no_grad():
        expected = bridge(tokens)
    schema = NNParser.parse_model(bridge, inputs_tensors_values={"input": tokens})
    assert schema.skipped == {} and schema.coverage().empty
    # the HF model and what only it holds are blocks under the attribute's name; a bridge component it
    # holds keeps its one block, at the bridge's path
    assert schema.find("original_model").module is bridge.original_model
    assert schema.find("original_model.transformer.drop").module is bridge.original_model.transformer.drop
    paths = [block.path for block in schema.iter_blocks()]
    assert not any(path.startswith("original_model.transformer.h.") for path in paths)
    assert not any(path.startswith("original_model.transformer.wte") for path in paths)
    record = capture_run(schema, {"input": tokens}, coverage=True)
    assert torch.equal(record.outputs[0], expected) and record.coverage().empty
    ran = {step.block_path for step in record.trace.steps}
    assert {"original_model", "original_model.transformer", "original_model.transformer.drop", "embed",
            "blocks.1._original_component.attn", "blocks.1._original_component.attn.resid_dropout"} <= ran
    with torch.no_grad():
        assert torch.equal(SchemaInterpreter().run(block=schema, scope={"input": tokens})[0], expected)


def test_a_held_model_replaced_after_parsing_runs_the_new_one_and_is_reported():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bridge = _Bridge(_gpt2(0)).eval()
    tokens = _tokens()
    schema = NNParser.parse_model(bridge, inputs_tensors_values={"input": tokens})
    other = _gpt2(1)
    bridge.__dict__["original_model"] = other  # what TransformerBridge's `original_model` setter does
    bridge._driver._model = other
    with torch.no_grad():
        expected = bridge(tokens)
        record = capture_run(schema, {"input": tokens}, coverage=True)
    assert torch.equal(record.outputs[0], expected)
    rows = record.coverage().to_dict("records")
    assert rows and rows[0]["module_type"] == "GPT2LMHeadModel" and rows[0]["module"] is None
    assert "held as the plain attribute self.original_model" in rows[0]["reason"]


def test_the_real_transformer_lens_bridge_runs_interpreted_with_nothing_skipped():
    pytest.importorskip("transformer_lens")
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32, vocab_size=64,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    bridge = build_bridge_from_module(transformers.GPT2LMHeadModel(config).eval(), "GPT2LMHeadModel",
                                      hf_config=config).eval()
    tokens = _tokens()
    with torch.no_grad():
        expected = bridge(tokens)
    schema = NNParser.parse_model(bridge, inputs_tensors_values={"input": tokens})
    assert schema.skipped == {} and schema.coverage().empty
    record = capture_run(schema, {"input": tokens}, coverage=True)
    assert torch.equal(record.outputs[0], expected) and record.coverage().empty
    assert {"original_model.transformer.drop", "blocks.1._original_component.attn"} <= \
        {step.block_path for step in record.trace.steps}
