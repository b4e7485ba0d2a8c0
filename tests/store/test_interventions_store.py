"""capture_dataset(..., interventions=...): every input's run gets the interventions (the stored values
are the changed ones, as capture_run with the same interventions records them), the manifest records
their selectors, and resuming the store with other interventions or none is refused."""

from __future__ import annotations

import json

import pytest
import torch

from nnschemaparser import StoreMismatchError, TraceStore, capture_dataset, capture_run
from tests.support.store_models import blocks, inputs


def _double(value, site):
    return value * 2.0


def test_each_input_is_captured_with_the_interventions_and_the_manifest_names_them(tmp_path):
    model, schema = blocks()
    data = inputs(5)
    changes = {"layers.0:hidden": _double}
    store = capture_dataset(schema, data, tmp_path / "s", keep="layers.*:hidden, head:logits", block_size=2,
                            progress=False, interventions=changes)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["options"]["interventions"] == "layers.0:hidden"
    for sample in range(5):
        changed = capture_run(schema, dict(data[sample]), interventions=changes).trace
        plain = capture_run(schema, dict(data[sample])).trace
        for name in ("layers.0:hidden", "layers.1:hidden", "head:logits"):
            path, var = name.split(":")
            (ours,) = [s for s in changed if (s.block_path, s.out_var) == (path, var)]
            (before,) = [s for s in plain if (s.block_path, s.out_var) == (path, var)]
            stored = store.tensor(sample, ours.container_id)
            assert torch.equal(stored, ours.value) and not torch.equal(stored, before.value)
        (hidden,) = [s for s in plain if (s.block_path, s.out_var) == ("layers.0", "hidden")]
        assert torch.equal(store.tensor(sample, hidden.container_id), hidden.value * 2.0)


def test_a_store_captured_with_interventions_is_resumed_with_the_same_ones_only(tmp_path):
    model, schema = blocks()
    data = inputs(4)
    changes = {"layers.0:hidden index=[:, 0]": lambda value, site: value + 1.0}
    capture_dataset(schema, data[:2], tmp_path / "s", keep="head", block_size=2, progress=False, interventions=changes)
    with pytest.raises(StoreMismatchError, match=r"interventions: 'layers.0:hidden index=\[:, 0\]' there, None here"):
        capture_dataset(schema, data, tmp_path / "s", keep="head", block_size=2, progress=False)
    with pytest.raises(StoreMismatchError, match="interventions: .* there, 'layers.1:hidden' here"):
        capture_dataset(schema, data, tmp_path / "s", keep="head", block_size=2, progress=False,
                        interventions={"layers.1:hidden": _double})
    store = capture_dataset(schema, data, tmp_path / "s", keep="head", block_size=2, progress=False,
                            interventions=changes)
    assert store.samples == [0, 1, 2, 3]
    plain = capture_dataset(schema, data[:2], tmp_path / "p", keep="head", block_size=2, progress=False)
    with pytest.raises(StoreMismatchError, match="interventions: None there"):
        capture_dataset(schema, data, tmp_path / "p", keep="head", block_size=2, progress=False, interventions=changes)
    assert len(TraceStore(tmp_path / "p")) == len(plain) == 2


def test_a_manifest_whose_interventions_field_is_not_text_is_refused(tmp_path):
    from nnschemaparser.files.file_format import MalformedFileError

    model, schema = blocks()
    capture_dataset(schema, inputs(2), tmp_path / "s", keep="head", progress=False,
                    interventions={"layers.0:hidden": _double})
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["options"]["interventions"] = 5
    path.write_text(json.dumps(manifest))
    with pytest.raises(MalformedFileError, match="interventions"):
        TraceStore(tmp_path / "s")


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch build has no gloo backend for torch.distributed")
def test_forked_ranks_capture_with_the_same_interventions_as_one_process(tmp_path):
    model, schema = blocks()
    data = inputs(4)
    changes = {"layers.0:hidden": _double}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the forked ranks run
    try:
        one = capture_dataset(schema, data, tmp_path / "one", keep="layers.*:hidden", block_size=1, progress=False,
                              interventions=changes)
    finally:
        torch.set_num_threads(threads)
    two = capture_dataset(schema, data, tmp_path / "two", keep="layers.*:hidden", block_size=1, progress=False,
                          interventions=changes, world=2)
    steps = one.steps
    kept = steps[steps["kept"]]
    assert len(kept) > 0
    for row in kept.itertuples():
        assert torch.equal(one.tensor(row.sample, row.container_id), two.tensor(row.sample, row.container_id))
    (hidden,) = [s for s in capture_run(schema, dict(data[3])).trace if (s.block_path, s.out_var) == ("layers.0", "hidden")]
    assert torch.equal(two.tensor(3, hidden.container_id), hidden.value * 2.0)
