"""Small constructs the transformers zoo found, each named for the behaviour it pins down."""

from __future__ import annotations

import torch
from torch import nn

from tests.support.exactness import assert_schema_matches_eager

from nnschemaparser import NNParser, SchemaInterpreter


class HookedChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.outer = nn.Linear(4, 4)

    def forward(self, x):
        return self.outer(self.inner(x).relu())


def test_forward_hooks_of_an_interpreted_child_fire_like_eager():
    # transformers collects hidden states with forward hooks registered during forward.
    torch.manual_seed(0)
    model = HookedChild().eval()
    x = torch.randn(2, 4)
    seen_eager, seen_schema = [], []
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    handle = model.inner.register_forward_hook(lambda m, args, out: seen_eager.append(out.clone()))
    expected = model(x)
    handle.remove()
    handle = model.inner.register_forward_hook(lambda m, args, out: seen_schema.append(out.clone()))
    actual = SchemaInterpreter().call(schema, x=x)
    handle.remove()
    assert torch.equal(expected, actual)
    assert len(seen_schema) == 1 and torch.equal(seen_eager[0], seen_schema[0])


def test_forward_pre_hook_and_hook_results_replace_inputs_and_outputs():
    torch.manual_seed(0)
    model = HookedChild().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    model.inner.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    model.outer.register_forward_hook(lambda m, args, kwargs, out: out + kwargs.get("bias", 1.0), with_kwargs=True)
    assert torch.equal(model(x), SchemaInterpreter().call(schema, x=x))


class ImportsInForward(nn.Module):
    def forward(self, x):
        import math
        from torch.nn import functional as F2

        return F2.gelu(x) * math.sqrt(2.0)


def test_import_inside_forward_binds_the_module():
    schema = assert_schema_matches_eager(ImportsInForward(), {"x": torch.randn(3)})
    assert not schema.skipped and schema.skip_reason is None


class IteratesOwnParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        total = sum(p.sum() for p in self.parameters())
        dtype = next(self.parameters()).dtype
        return self.fc(x).to(dtype) + total


def test_nn_module_methods_in_forward_run_live_and_keep_the_block_parsed():
    schema = assert_schema_matches_eager(IteratesOwnParameters(), {"x": torch.randn(2, 3)})
    assert schema.skip_reason is None and not schema.methods


class GeneratorHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def chunks(self, x):
        yield from (piece * 2 for piece in x.chunk(3, dim=0))  # `yield from`: not lowered

    def forward(self, x):
        return self.fc(torch.cat(list(self.chunks(x))))


def test_method_that_cannot_be_lowered_runs_live_without_skipping_its_block():
    schema = assert_schema_matches_eager(GeneratorHelper(), {"x": torch.randn(6, 3)})
    assert schema.skip_reason is None
    assert schema.methods["chunks"].skip_reason is not None
    assert "chunks()" in schema.skipped


class OffsetEmbedding(nn.Embedding):
    def forward(self, positions):
        return super().forward(positions + 1)


class UsesOffsetEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.positions = OffsetEmbedding(10, 4)

    def forward(self, ids):
        return self.positions(ids).sum(-1)


def test_super_forward_of_a_torch_module_subclass_runs_as_a_method_schema():
    schema = assert_schema_matches_eager(UsesOffsetEmbedding(), {"ids": torch.tensor([[1, 2, 3]])})
    child = schema.sub_blocks["positions"]
    assert child.skip_reason is None and "Embedding.forward" in child.methods


class TakesCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, cache: list):
        cache.append(self.fc(x))
        return torch.cat(cache).sum(0)


def test_mutable_inputs_given_to_parse_are_not_changed_by_resolution():
    cache = [torch.ones(1, 4)]
    NNParser.parse_model(model=TakesCache(), inputs_tensors_values={"x": torch.randn(1, 4), "cache": cache})
    assert len(cache) == 1


class CallerSensitive(nn.Module):
    """Reads the Python stack: the one thing an interpreter cannot reproduce."""

    def forward(self, x):
        import sys

        caller = sys._getframe(1).f_code.co_filename
        return x * 3 if "nnschemaparser" in caller else x * 2


class HoldsCallerSensitive(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.odd = CallerSensitive()

    def forward(self, x):
        return self.odd(self.fc(x)).sum(-1)


def test_child_whose_schema_differs_from_eager_is_found_and_skipped_at_parse_time():
    schema = assert_schema_matches_eager(HoldsCallerSensitive(), {"x": torch.randn(2, 3)})
    assert schema.sub_blocks["odd"].skip_reason is not None
    assert "different from eager" in schema.skipped["odd"]
    assert schema.skip_reason is None and schema.sub_blocks["fc"].skip_reason is None


class TorchEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x, mask):
        return self.head(self.layer(x, src_key_padding_mask=mask))


def test_verification_does_not_skip_modules_whose_fast_path_changes_under_hooks():
    # nn.TransformerEncoderLayer takes its fused fast path only without hooks; verifying with
    # recording hooks on one side only used to skip it and every block above it.
    mask = torch.tensor([[False, False, True], [False, False, False]])
    model = TorchEncoderLayer().eval()
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(2, 3, 8), "mask": mask})
    assert schema.skipped == {} and schema.skip_reason is None
    with torch.no_grad():
        x = torch.randn(2, 3, 8)
        assert torch.equal(model(x, mask), SchemaInterpreter().call(schema, x=x, mask=mask))
