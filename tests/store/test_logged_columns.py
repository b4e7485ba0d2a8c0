"""The store's logged path (traces/logged_columns.py, store/step_names.py) gives what the records path gives: the
step fields of capture_run's trace, list for list, and so the same per-step statistics bit for bit, in stores
written both ways (GPT-2 and Llama built from their configs, random weights, offline; rows as samples too)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, capture_dataset, capture_run
from nnschemaparser.store.statistics import Summariser
from nnschemaparser.store.step_names import StepNames, step_fields
from nnschemaparser.traces.logged_columns import LoggedColumns
from nnschemaparser.traces.tensor_walk import tensors_in
from tests.support.store_models import tiny_gpt2, token_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _llama():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    config._attn_implementation = "eager"
    model = LlamaModel(config).eval()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    return model, NNParser.parse_model(model=model, inputs_tensors_values={"input_ids": ids, "use_cache": False})


class InPlace(nn.Module):
    """A value changed in place by an op the schema does not flag (inplace passed positionally): dropped."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        g = h * 2
        torch.nn.functional.relu(g, True)
        return g + h


class Chooser(nn.Module):
    """A callee fetched at run time that differs from input to input, in the same blocks: the step's description
    differs, nothing else."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        act = torch.relu if bool(x.sum() > 0) else torch.tanh
        return act(self.fc(x))


class ModuleChooser(nn.Module):
    """A module fetched at run time that differs from input to input (compared by identity): the step's
    description differs, nothing else."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        layer = self.a if bool(x.sum() > 0) else self.b
        return torch.relu(layer(x))


def _module_chooser():
    torch.manual_seed(0)
    model = ModuleChooser().eval()
    return model, NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.ones(2, 8)})


def _chooser():
    torch.manual_seed(0)
    model = Chooser().eval()
    return model, NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.ones(2, 8)})


def _in_place():
    torch.manual_seed(0)
    model = InPlace().eval()
    return model, NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(2, 8)})


MODELS = {"gpt2": (tiny_gpt2, lambda: token_inputs(3)),
          "llama": (_llama, lambda: [dict(s, use_cache=False) for s in token_inputs(3)]),
          "in_place": (_in_place, lambda: [{"x": torch.randn(2, 8, generator=torch.Generator().manual_seed(i))}
                                           for i in range(3)]),
          "chooser": (_chooser, lambda: [{"x": torch.ones(2, 8)}, {"x": -torch.ones(2, 8)}, {"x": torch.ones(2, 8)}]),
          "module_chooser": (_module_chooser, lambda: [{"x": torch.ones(2, 8)}, {"x": -torch.ones(2, 8)},
                                                       {"x": torch.ones(2, 8)}])}


def _bits(table: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(table).view(np.int64)


@pytest.mark.parametrize("name", list(MODELS))
def test_logged_columns_equal_the_trace_records_and_their_statistics(name):
    build, scopes = MODELS[name]
    _, schema = build()
    names = StepNames(None, schema)
    metas = []
    for scope in scopes():
        with torch.no_grad():
            outputs, fields = names.fields(schema, dict(scope))
            record = capture_run(schema, dict(scope))
        expected = step_fields(record.trace)
        metas.append(names.logged.meta)
        got, want = [t for _, t in tensors_in(outputs)], [t for _, t in tensors_in(record.outputs)]
        assert len(got) == len(want) and got and all(torch.equal(a, b) for a, b in zip(got, want))
        for k in (0, 1, 2, 3, 4, 5, 7, 8, 10):  # numbers .. block paths, depths, omitted, dtypes
            assert list(fields[k]) == list(expected[k]), k
        assert [tuple(s) for s in fields[9]] == [tuple(s) for s in expected[9]]
        values, others = fields[6], expected[6]
        assert len(values) == len(others)
        for a, b in zip(values, others):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b) and a.dtype == b.dtype and a.requires_grad == b.requires_grad
        ours, theirs = Summariser()(values), Summariser()(others)
        assert np.array_equal(_bits(ours.table), _bits(theirs.table))
        assert np.array_equal(ours.counted, theirs.counted) and np.array_equal(ours.numels, theirs.numels)
    if name in ("chooser", "module_chooser"):  # another callee, another description: the metadata is worked out again
        assert metas[1] is not metas[0] and metas[2] is not metas[1]
        assert len({tuple(m.columns[1]) for m in metas}) == 2
    else:
        assert metas[0] is not None and metas[1] is metas[0] and metas[2] is metas[0]  # the later runs reused it
    if name == "in_place":
        assert any(o is not None for o in fields[8])  # the dropped value, omitted as capture_run omits it


def _store(schema, inputs, path, logged: bool, monkeypatch, **options):
    with monkeypatch.context() as patch:
        if not logged:
            patch.setattr(LoggedColumns, "capture", lambda self, scope: None)
        return capture_dataset(schema, inputs, path, progress=False, **options)


def _assert_same_rows(a, b):
    left, right = a.steps, b.steps
    assert list(left.columns) == list(right.columns) and len(left) == len(right) and len(left)
    for column in left.columns:
        x, y = left[column], right[column]
        if x.dtype == np.float64:
            assert np.array_equal(_bits(x.to_numpy()), _bits(y.to_numpy())), column
        else:
            pd.testing.assert_series_equal(x, y, check_exact=True)


def test_gpt2_store_rows_as_samples_equal_the_records_path(tmp_path, monkeypatch):
    _, schema = tiny_gpt2()
    generator = torch.Generator().manual_seed(3)
    inputs = []
    for length in (8, 5, 8):
        ids = torch.randint(1, 128, (2, 8), generator=generator)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, length:] = 0
        inputs.append({"input_ids": ids, "attention_mask": mask})
    options = dict(keep="h.*.attn:attn_output", mask="attention_mask")
    fast = _store(schema, inputs, tmp_path / "logged", True, monkeypatch, **options)
    slow = _store(schema, inputs, tmp_path / "records", False, monkeypatch, **options)
    _assert_same_rows(fast, slow)
    assert sorted(fast.steps["sample"].unique()) == list(range(6))


def test_llama_store_equals_the_records_path(tmp_path, monkeypatch):
    _, schema = _llama()
    inputs = [dict(s, use_cache=False) for s in token_inputs(4)]
    fast = _store(schema, inputs, tmp_path / "logged", True, monkeypatch, keep="layers.1", batch_axis=None)
    slow = _store(schema, inputs, tmp_path / "records", False, monkeypatch, keep="layers.1", batch_axis=None)
    _assert_same_rows(fast, slow)
    assert fast.steps["kept"].any()


def test_llama_statistics_with_the_columns_dtypes_equal_a_fresh_summary():
    """The plan check takes the logged columns' dtypes and shapes instead of reading the dtypes and element counts
    (store/step_names.py): the figures of every input equal a fresh summariser's, bit for bit."""
    _, schema = _llama()
    names = StepNames(None, schema)
    for scope in [dict(s, use_cache=False) for s in token_inputs(3)]:
        _, fields = names.fields(schema, dict(scope))
        assert names.dtypes == fields[10] and names.dtypes.shapes is fields[9]
        values = fields[6]
        ours, fresh = names.summarise(values, dtypes=names.dtypes), Summariser()(values)
        assert np.array_equal(_bits(ours.table), _bits(fresh.table))
        assert np.array_equal(ours.numels, fresh.numels) and np.array_equal(ours.counted, fresh.counted)
    plan = names.summarise.plan
    assert plan is not None and plan.matches(values, names.dtypes)
    assert not plan.matches(values, [None] * len(values))  # the dtypes given are the ones compared
    assert plan.matches(values, names.dtypes, names.dtypes.shapes)
    moved = list(names.dtypes.shapes)
    moved[plan.native[-1]] = tuple(moved[plan.native[-1]]) + (1,)
    assert not plan.matches(values, names.dtypes, moved)  # and so are the shapes given

