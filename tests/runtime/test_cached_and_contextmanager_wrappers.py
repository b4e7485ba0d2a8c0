"""Decorators whose one wrapper code serves many functions.

`contextlib.contextmanager`'s `helper` is one code object for every function it decorates (the
package's own `lending` included): a call of another context manager is not a call of a decorated
method the schema has a block for, so it must not be reported as that method's decorator
dispatching elsewhere. Caching decorators: tests/runtime/test_cached_functions_interpreted.py."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter


@contextlib.contextmanager
def _other_scope():
    yield


class ScopedMethodUnreached(nn.Module):
    """A `@contextmanager` method the forward names in a branch not taken, and another context
    manager the forward does use."""

    def __init__(self, use_scope: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.use_scope = use_scope
        self.entered = 0

    @contextlib.contextmanager
    def _scope(self):
        self.entered += 1
        yield

    def forward(self, x):
        if self.use_scope:
            with self._scope():
                return self.fc(x) * 2
        with _other_scope():
            return self.fc(x)


def test_another_context_manager_is_not_reported_as_a_contextmanager_methods_decorator():
    torch.manual_seed(0)
    model = ScopedMethodUnreached().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skipped == {}
    assert schema.coverage().empty
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


def test_peft_prompt_learning_roots_run_interpreted_and_report_nothing_live():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    for peft_config in (peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
                        peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)):
        model = peft.get_peft_model(transformers.GPT2LMHeadModel(config).eval(), peft_config).eval()
        values = {"input_ids": torch.randint(0, 50, (1, 6)), "attention_mask": torch.ones(1, 6, dtype=torch.long)}
        schema = NNParser.parse_model(model, inputs_tensors_values=values)
        assert schema.skipped == {}, schema.skipped
        assert schema.coverage().empty
        with torch.no_grad():
            expected = model(**values).logits
            got = SchemaInterpreter().run(block=schema, scope=dict(values))[0].logits
        assert torch.equal(got, expected)

