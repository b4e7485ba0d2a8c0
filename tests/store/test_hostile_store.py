"""Store files are hostile until proved otherwise: each corruption is refused with a typed error naming it."""

from __future__ import annotations

import json
import shutil

import pytest

from nnschemaparser import (FileLimitError, FileLimits, FormatVersionError, MalformedFileError, TraceStore,
                            capture_dataset)
from nnschemaparser.store.step_table import COLUMNS
from tests.support.store_models import blocks, inputs


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    _, schema = blocks()
    path = tmp_path_factory.mktemp("hostile") / "s"
    capture_dataset(schema, inputs(6), path, keep="layers.*", block_size=4, progress=False, batch_axis=None)
    return path


@pytest.fixture
def store(pristine, tmp_path):
    copy = tmp_path / "s"
    shutil.copytree(pristine, copy)
    return copy


def _commit(store):
    return sorted((store / "commits").glob("unit-*.json"))[0]


def _edit_commit(store, change):
    path = _commit(store)
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_the_pristine_store_opens(pristine):
    assert len(TraceStore(pristine)) == 6


def test_a_manifest_that_is_not_json_is_malformed(store):
    (store / "manifest.json").write_text("{not json")
    with pytest.raises(MalformedFileError, match="manifest.json"):
        TraceStore(store)


def test_a_manifest_of_another_version_is_refused(store):
    document = json.loads((store / "manifest.json").read_text())
    document["version"] = 99
    (store / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(FormatVersionError, match="version 99"):
        TraceStore(store)


def test_a_manifest_with_an_unknown_field_is_refused(store):
    document = json.loads((store / "manifest.json").read_text())
    document["execute"] = "rm -rf /"
    (store / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(MalformedFileError, match="unknown field 'execute'"):
        TraceStore(store)


def test_a_huge_manifest_is_refused_before_it_is_read(store):
    with pytest.raises(FileLimitError, match="over the limit"):
        TraceStore(store, limits=FileLimits(max_file_bytes=64))


def test_a_commit_naming_a_file_outside_the_store_is_refused(store):
    _edit_commit(store, lambda d: d.update(steps_file="../../etc/passwd"))
    with pytest.raises(MalformedFileError, match="inside its store"):
        TraceStore(store)


def test_a_commit_whose_file_changed_size_is_refused(store):
    shard = sorted((store / "tensors").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(MalformedFileError, match="changed or truncated"):
        TraceStore(store)


def test_a_sample_committed_twice_is_refused(store):
    first = _commit(store)
    document = json.loads(first.read_text())
    old, new = first.stem, "unit-000000-000000002"
    for name, _ in document["sizes"]:  # the same files again, under a second unit of block 0
        shutil.copy(store / name, store / name.replace(old, new))
    twin = json.loads(json.dumps(document).replace(old, new))
    twin["samples"] = [2, 3]
    (store / "commits" / f"{new}.json").write_text(json.dumps(twin))
    with pytest.raises(MalformedFileError, match="sample 2 is committed twice"):
        TraceStore(store)


def test_a_commit_whose_samples_leave_its_block_is_refused(store):
    _edit_commit(store, lambda d: d.update(samples=[0, 1, 2, 3, 9]))
    with pytest.raises(MalformedFileError, match="samples"):
        TraceStore(store)


def _rewrite_shard(store, header_change=None, data=None):
    shard = sorted((store / "tensors").iterdir())[0]
    raw = shard.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    body = raw[8 + size:]
    if header_change:
        header_change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    new = len(text).to_bytes(8, "little") + text + (body if data is None else data)
    shard.write_bytes(new)
    _edit_commit(store, lambda d: d.update(
        shards=[[n, len(new) if n == f"tensors/{shard.name}" else s] for n, s in d["shards"]],
        sizes=[[n, len(new) if n == f"tensors/{shard.name}" else s] for n, s in d["sizes"]]))


def test_a_shard_whose_tensor_claims_bytes_past_the_file_is_refused(store):
    def stretch(header):
        key = next(k for k in header if k != "__metadata__")
        header[key]["shape"] = [1 << 30]
    _rewrite_shard(store, stretch)
    with pytest.raises(MalformedFileError, match="needs .* bytes|past the"):
        TraceStore(store)


def test_a_shard_with_an_unknown_dtype_is_refused(store):
    def odd(header):
        key = next(k for k in header if k != "__metadata__")
        header[key]["dtype"] = "PYOBJECT"
    _rewrite_shard(store, odd)
    with pytest.raises(MalformedFileError, match="unknown dtype"):
        TraceStore(store)


def test_a_shard_tensor_of_no_elements_whose_strides_overflow_is_refused_before_a_read(store):
    """A zero-element tensor needs no bytes, so only its strides can be wrong: [0, 2**40, 2**40] passes a
    bytes check but torch cannot lay it out (its strides overflow 64 bits). The store refuses the shard as
    trace files refuse such a shape, rather than torch failing with a RuntimeError when it is read."""
    shard = sorted((store / "tensors").iterdir())[0]
    raw = shard.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    key = next(k for k in header if k != "__metadata__")
    begin, end = header[key]["data_offsets"]
    body = raw[8 + size:]
    for entry in header.values():
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o - (end - begin) for o in entry["data_offsets"]]
    header[key]["shape"] = [0, 2 ** 40, 2 ** 40]
    header[key]["data_offsets"] = [begin, begin]
    _rewrite_shard(store, lambda h: (h.clear(), h.update(header)), data=body[:begin] + body[end:])
    with pytest.raises(MalformedFileError, match="strides overflow"):
        TraceStore(store)
    opened = TraceStore(store, check_shards=False)
    with pytest.raises(MalformedFileError, match="strides overflow"):
        opened.tensor(0, key.split("/", 1)[1])


def test_a_store_opened_without_checking_shards_checks_each_one_before_its_first_tensor(store):
    """TraceStore(check_shards=False), as capture_dataset returns its store, defers the header checks to
    the first read of a commit's tensors: a corrupt shard is still refused before any of its data is used."""
    def odd(header):
        key = next(k for k in header if k != "__metadata__")
        header[key]["dtype"] = "PYOBJECT"
    _rewrite_shard(store, odd)
    opened = TraceStore(store, check_shards=False)
    assert len(opened) == 6 and len(opened.steps) > 0  # statistics need no shard
    with pytest.raises(MalformedFileError, match="unknown dtype"):
        opened.tensor(0, opened.steps["container_id"][0])
    with pytest.raises(MalformedFileError, match="unknown dtype"):
        opened.trace(1)


def test_a_shard_whose_header_claims_more_than_the_limit_is_refused(store):
    shard = sorted((store / "tensors").iterdir())[0]
    raw = bytearray(shard.read_bytes())
    raw[:8] = (1 << 40).to_bytes(8, "little")
    shard.write_bytes(bytes(raw))
    with pytest.raises(FileLimitError, match="header claims"):
        TraceStore(store)


def test_a_shard_tensor_of_another_sample_is_refused(store):
    def foreign(header):
        key = next(k for k in header if k != "__metadata__")
        header["5/" + key.split("/", 1)[1]] = header.pop(key)
    _rewrite_shard(store, foreign)
    with pytest.raises(MalformedFileError, match="not of a sample of"):
        TraceStore(store)


def test_a_statistics_file_that_is_not_parquet_is_refused(store):
    path = sorted((store / "steps").iterdir())[0]
    path.write_bytes(b"\0" * path.stat().st_size)
    with pytest.raises(MalformedFileError, match="not a readable Parquet file"):
        TraceStore(store)


def test_a_statistics_file_with_other_columns_is_refused(store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = sorted((store / "steps").iterdir())[0]
    pq.write_table(pa.table({"sample": [0], "payload": ["x"]}), path)
    _edit_commit(store, lambda d: d.update(sizes=[[n, path.stat().st_size if n == f"steps/{path.name}" else s]
                                                  for n, s in d["sizes"]]))
    with pytest.raises(MalformedFileError, match="columns are not a store's statistics"):
        TraceStore(store)


def test_a_statistics_file_with_a_row_count_other_than_its_commit_is_refused(store):
    _edit_commit(store, lambda d: d.update(rows=d["rows"] + 1))
    with pytest.raises(MalformedFileError, match="rows, its commit says"):
        TraceStore(store)


def test_the_statistics_columns_are_the_documented_ones():
    assert [name for name, _ in COLUMNS][:3] == ["sample", "step", "container_id"]


def test_a_statistics_file_corrupted_past_its_footer_is_refused_by_the_query(store):
    path = sorted((store / "steps").iterdir())[0]
    raw = bytearray(path.read_bytes())
    raw[4:len(raw) // 2] = b"\xff" * (len(raw) // 2 - 4)  # the pages, not the footer the store checks on open
    path.write_bytes(bytes(raw))
    opened = TraceStore(store)
    with pytest.raises(MalformedFileError, match="statistics file"):
        opened.query("select sum(l2) from steps")
    with pytest.raises(MalformedFileError, match="statistics file"):
        opened.steps


@pytest.fixture(scope="module")
def pristine_rows(tmp_path_factory):
    """A store of rows: batches of 3 rows, 2 inputs a unit, so its commits give `sample_ranges`."""
    import torch

    _, schema = blocks()
    generator = torch.Generator().manual_seed(3)
    data = [{"x": torch.randn(3, 8, generator=generator)} for _ in range(4)]
    path = tmp_path_factory.mktemp("hostile_rows") / "s"
    capture_dataset(schema, data, path, keep="layers.*", block_size=2, progress=False)
    return path


@pytest.fixture
def rows_store(pristine_rows, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(pristine_rows, copy)
    return copy


def test_a_store_of_rows_commits_sample_ranges_and_reads_back(rows_store):
    commit = json.loads(sorted((rows_store / "commits").iterdir())[1].read_text())
    assert commit["sample_ranges"] == [[6, 11]] and "samples" not in commit
    assert TraceStore(rows_store).samples == list(range(12))


@pytest.mark.parametrize("ranges, match", [
    ([[0, 3], [2, 5]], "increasing"),  # overlapping
    ([[5, 0]], "increasing"),  # backwards
    ([[0, 10 ** 12]], "more than the commit's rows"),  # a range that would expand to a bomb
    ([[0, 5], "x"], "expected \\[first, last\\]"),
])
def test_a_commit_of_rows_with_bad_sample_ranges_is_refused_before_it_is_expanded(rows_store, ranges, match):
    _edit_commit(rows_store, lambda d: d.update(sample_ranges=ranges))
    with pytest.raises(MalformedFileError, match=match):
        TraceStore(rows_store)


def test_a_commit_of_rows_whose_ids_go_back_below_an_earlier_block_is_refused(rows_store):
    path = sorted((rows_store / "commits").iterdir())[0]
    document = json.loads(path.read_text())
    document["sample_ranges"] = [[0, 7]]  # block 0 reaching into block 1's ids, from 6
    path.write_text(json.dumps(document))
    with pytest.raises(MalformedFileError, match="increase block by block"):
        TraceStore(rows_store)


def test_a_commit_giving_samples_both_ways_or_the_wrong_way_is_refused(rows_store, store):
    _edit_commit(rows_store, lambda d: d.update(samples=[0, 1, 2]))
    with pytest.raises(MalformedFileError, match="one of them"):
        TraceStore(rows_store)
    _edit_commit(store, lambda d: (d.pop("samples"), d.update(sample_ranges=[[0, 3]])))
    with pytest.raises(MalformedFileError, match="store of inputs gives its samples as samples"):
        TraceStore(store)
