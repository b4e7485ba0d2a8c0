"""The README's store queries, run exactly as written (read from README.md) on a GPT-2 store built from its
config (random weights, offline), and their answers checked against forward hooks on the same layers; and
the steps' names: `h.3:output` for a layer's output, the caller's ordinal kept as an alias."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from nnschemaparser import capture_dataset
from nnschemaparser.store.reader import TraceStore
from tests.support.exactness import hooked_outputs
from tests.support.store_models import tiny_gpt2, token_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")
README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_block() -> str:
    text = README.read_text()
    found = re.search(r"<!-- store-queries -->\n```python\n(.*?)```", text, re.S)
    assert found, "README.md lost its store-queries block"
    return found.group(1)


def _hooked_layer_outputs(model, scopes):
    """Per input, what a forward hook on each layer sees, by layer index."""
    return [dict(enumerate(hooked_outputs(model.h, lambda scope=scope: model(**dict(scope))))) for scope in scopes]


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    model, schema = tiny_gpt2(4)
    inputs = token_inputs(6)
    folder = tmp_path_factory.mktemp("readme")
    names = {"capture_dataset": capture_dataset, "gpt2_schema": schema, "gpt2_inputs": inputs}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(compile(_readme_block(), "README.md (store-queries)", "exec"), names)
    finally:
        os.chdir(cwd)
    names["folder"] = folder
    return model, inputs, names


def test_the_readme_store_queries_run_as_written_and_answer_what_hooks_see(gpt2_run):
    model, inputs, found = gpt2_run
    hooked = _hooked_layer_outputs(model, inputs)
    layer3 = found["layer3"]
    assert list(layer3["sample"]) == list(range(6))
    assert set(layer3["block_path"]) == {"GPT2Model"} and set(layer3["op_name"]) == {"h.3"}
    store = found["store"]
    for sample, cid, l2 in zip(layer3["sample"], layer3["container_id"], layer3["l2"]):
        assert torch.equal(store.tensor(int(sample), cid), hooked[sample][3])
        assert l2 == pytest.approx(hooked[sample][3].double().norm().item(), rel=1e-5)
    top = found["top"]
    assert list(top["sample"]) == sorted(range(6), key=lambda s: -hooked[s][3].double().norm().item())[:5]
    layers = found["layers"]
    assert list(layers["name"]) == ["h.0:output", "h.1:output", "h.2:output", "h.3:output"]
    assert list(layers["bad"]) == [0, 0, 0, 0]
    assert torch.equal(found["hidden"], hooked[int(top["sample"][0])][3])


def test_kept_values_have_layer_names_and_the_callers_ordinal_stays_an_alias(gpt2_run):
    _, _, found = gpt2_run
    store = TraceStore(found["folder"] / found["store"].path)  # a fresh reader of the store on disk
    assert [v for v in store.variables if re.fullmatch(r"h\.\d+:output", v)] == [f"h.{i}:output" for i in range(4)]
    assert "h.2.attn:attn_output" in store.variables
    assert not any(v.startswith("GPT2Model:") or "$t" in v for v in store.variables)
    by_name, by_alias = store.reduction("h.3:output"), store.reduction("GPT2Model:hidden_states#4")
    assert torch.equal(by_name.mean, by_alias.mean) and torch.equal(by_name.channel_var, by_alias.channel_var)
    steps = store.steps
    assert list(steps["name"]) == list(store.query("select name from steps order by sample, step")["name"])
    with pytest.raises(KeyError, match="h.3:output"):
        store.reduction("h.3:outptu")


def test_the_readme_rows_block_runs_as_written_and_answers_what_hooks_see(tmp_path):
    """Each text a sample, padding left out of its statistics and tokens; the stacked rows are what a forward
    hook on layer 3 sees for those rows of the batched run."""
    text = README.read_text()
    found = re.search(r"<!-- store-rows -->\n```python\n(.*?)```", text, re.S)
    assert found, "README.md lost its store-rows block"
    model, schema = tiny_gpt2(4)
    names = {"capture_dataset": capture_dataset, "gpt2_schema": schema, "torch": torch}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(found.group(1), "README.md (store-rows)", "exec"), names)
    finally:
        os.chdir(cwd)
    texts, rows = names["texts"], names["rows"]
    lengths = [len(t) for t in texts]
    assert rows.samples == list(range(6)) and list(names["per_text"]["numel"]) == [n * 32 for n in lengths]
    hooked = []
    for start in (0, 3):
        batch = names["pad"](texts[start:start + 3])
        out = hooked_outputs([model.h[3]], lambda batch=batch: model(**batch))[0]
        hooked += [out[r:r + 1] for r in range(3)]
    assert torch.equal(names["layer3"], torch.cat(hooked[2:5]))
    assert torch.equal(names["first_token"], torch.cat(hooked)[:, 0])
    batches = names["batches"]
    assert sum(len(b) for b in batches) == sum(lengths) == 37 and batches[0].shape == (16, 32)
    every = torch.cat([h[0, :n] for h, n in zip(hooked, lengths)])
    assert sorted(map(tuple, torch.cat(batches).tolist())) == sorted(map(tuple, every.tolist()))
