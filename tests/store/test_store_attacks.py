"""A store under attack (issue 38, point 5): a Parquet bomb, another checkpoint resuming a store, links planted in
the folder, two writers at once, a full disk. Each hostile store is built here, small."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from nnschemaparser import (FileLimitError, MalformedFileError, StoreBusyError, StoreIncompleteError, StoreLinkError,
                            StoreMismatchError, TraceStore, capture_dataset)
from nnschemaparser.store import shards as shards_module
from nnschemaparser.store import manifest as manifest_module
from tests.support.store_models import Blocks, blocks, inputs
from nnschemaparser import NNParser


def _write(path, n=4, schema=None, **options):
    if schema is None:
        _, schema = blocks()
    options.setdefault("keep", "layers.*")
    options.setdefault("block_size", 4)
    return capture_dataset(schema, inputs(n), path, progress=False, **options)


def _commit_of(path, steps_file):
    name = os.path.basename(steps_file)[:-len(".parquet")]
    return path / "commits" / f"{name}.json"


def _replace_statistics(path, table, **write_options):
    """Write `table` as the first unit's statistics file and make its commit agree (rows, size)."""
    import pyarrow.parquet as pq

    steps = sorted((path / "steps").iterdir())[0]
    pq.write_table(table, steps, **write_options)
    commit = _commit_of(path, steps)
    document = json.loads(commit.read_text())
    document["rows"] = table.num_rows
    document["sizes"] = [[n, steps.stat().st_size if n == f"steps/{steps.name}" else s] for n, s in document["sizes"]]
    commit.write_text(json.dumps(document))
    return steps


# -- 1. Parquet bombs -------------------------------------------------------------------------------------------------

def test_a_statistics_file_whose_dictionary_expands_past_the_bound_is_refused_before_it_is_expanded(tmp_path):
    """One 256 KiB description in the dictionary, repeated on every row: a few KiB on disk (its footer declares
    about 0.3 MB), tens of MB once each row gets its copy. The open check passes (nothing declared is over), and
    every read (steps, trace, query) refuses the file, naming it, the column and the bound, before a row is
    expanded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "s"
    _write(path, 4)
    steps = sorted((path / "steps").iterdir())[0]
    table = pq.read_table(steps)
    rows = table.num_rows
    index = table.schema.get_field_index("description")
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["A" * (256 * 1024)]))
    table = table.set_column(index, pa.field("description", bomb.type), bomb)
    steps = _replace_statistics(path, table, compression="lz4", use_dictionary=True, store_schema=False)
    assert steps.stat().st_size < 64 * 1024 and rows * 256 * 1024 > 64 * 64 * 1024  # small file, past the bound

    store = TraceStore(path)  # the footer declares nothing past the bound
    for read in (lambda: store.steps, lambda: store.trace(0), lambda: store.query("select count(*) from steps")):
        with pytest.raises(FileLimitError, match=rf"{steps.name}.*'description'.*bound") as info:
            read()
        assert "decompression bomb" in str(info.value)


def test_a_statistics_file_of_many_constant_rows_is_refused_when_the_store_is_opened(tmp_path):
    """200,000 constant rows, every column dictionary-encoded: a small file whose rows alone decode to tens of MB.
    The row count is what decoding gives, so the store refuses the file when it opens, reading nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "s"
    _write(path, 4)
    steps = sorted((path / "steps").iterdir())[0]
    row = pq.read_table(steps).slice(0, 1)
    table = pa.concat_tables([row] * 1000)
    table = pa.concat_tables([table] * 200).combine_chunks()
    _replace_statistics(path, table, compression="lz4", use_dictionary=True)
    with pytest.raises(FileLimitError, match=rf"{steps.name}: 200000 rows decode to at least .* bound"):
        TraceStore(path)


def test_a_real_store_reads_within_the_bound_as_before(tmp_path):
    """The counted read gives the table pyarrow gives: same columns, types and rows (and the `name`
    column worked out on reading, which the files do not hold)."""
    import pyarrow.parquet as pq

    store = _write(tmp_path / "s", 6, block_size=4)
    expected = pq.read_table(store.parquet_files()).to_pandas().sort_values(["sample", "step"]).reset_index(drop=True)
    assert "name" not in expected.columns
    assert store.steps.drop(columns="name").equals(expected)
    assert len(store.trace(5)) == len(expected[expected["sample"] == 5])
    assert int(store.query("select count(*) as n from steps")["n"][0]) == len(expected)


# -- 2. Other weights -------------------------------------------------------------------------------------------------

def _schema_of(model, width=8):
    return NNParser.parse_model(model=model, inputs_tensors_values={"x": torch.randn(2, width)})


def test_resuming_a_store_with_other_weights_of_the_same_model_is_refused_naming_the_first_differing_tensor(tmp_path):
    path = tmp_path / "s"
    model, schema = blocks()
    _write(path, 4, schema)
    before = {p.name: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    other = Blocks().eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.layers[1].fc.bias[3] += 1.0  # one value of one tensor: another checkpoint, the same everything else
    with pytest.raises(StoreMismatchError, match=r"weights differ: the first differing tensor is layers\.1\.fc\.bias"):
        capture_dataset(_schema_of(other), inputs(8), path, keep="layers.*", block_size=4, progress=False)
    assert {p.name: p.read_bytes() for p in path.rglob("*") if p.is_file() and p.name != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}  # nothing written
    resumed = capture_dataset(schema, inputs(8), path, keep="layers.*", block_size=4, progress=False)
    assert resumed.samples == list(range(8))  # the same weights resume it


def test_resuming_a_store_with_another_hidden_size_is_refused_naming_the_parameter_and_both_shapes(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    torch.manual_seed(0)
    wide = Blocks(width=16).eval()  # the same source, so the same schema identity: only the weights tell
    scopes = [{"x": torch.randn(2, 16)} for _ in range(8)]
    with pytest.raises(StoreMismatchError, match=r"layers\.0\.fc\.weight has shape \[8, 8\] in the store, "
                                                 r"\[16, 16\] in this model"):
        capture_dataset(_schema_of(wide, 16), scopes, path, keep="layers.*", block_size=4, progress=False)
    assert TraceStore(path).samples == [0, 1, 2, 3]


def test_a_store_written_before_weights_were_recorded_resumes_with_a_warning_and_records_none(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    manifest = json.loads((path / "manifest.json").read_text())
    assert [item[0] for item in manifest["weights"]][:2] == ["layers.0.fc.weight", "layers.0.fc.bias"]
    del manifest["weights"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="before stores recorded the model's weights"):
        store = _write(path, 8)
    assert store.samples == list(range(8))
    assert "weights" not in json.loads((path / "manifest.json").read_text())  # it vouches for nothing it did not see


# -- 3. Links -------------------------------------------------------------------------------------------------------

def test_a_link_planted_at_the_manifest_s_temporary_name_is_refused_and_the_file_it_points_at_is_untouched(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=$HOME/bin:$PATH\n")
    link = path / f".manifest.json.{os.getpid()}.tmp"
    os.symlink(victim, link)
    with pytest.raises(StoreLinkError, match=rf"{link.name} is a symbolic link \(to {victim}\).*remove the link"):
        _write(path, 8)
    assert victim.read_text() == "export PATH=$HOME/bin:$PATH\n"
    assert not (path / "manifest.json").is_symlink()
    link.unlink()
    assert _write(path, 8).samples == list(range(8))  # the fix the error names


def test_a_file_is_never_written_through_a_link_planted_after_the_check(tmp_path):
    """The scan before a write is not the only guard: each file is created with O_EXCL | O_NOFOLLOW."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "tensors").mkdir()
    link = tmp_path / "tensors" / "unit-000000-000000000-000.safetensors"
    os.symlink(victim, link)
    with pytest.raises(StoreLinkError, match="symbolic link"):
        shards_module.write_shard(link, {"a": torch.ones(3)})
    with pytest.raises(StoreLinkError, match="symbolic link"):
        manifest_module.sync_write(link, b"{}")
    assert victim.read_text() == "keep me"


def test_a_tensors_folder_linked_outside_the_store_is_refused_when_the_store_is_opened(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    outside = tmp_path / "elsewhere"
    shutil.move(path / "tensors", outside)
    os.symlink(outside, path / "tensors")
    with pytest.raises(StoreLinkError, match=r"tensors is a symbolic link"):
        TraceStore(path)
    with pytest.raises(StoreLinkError, match=r"tensors is a symbolic link"):
        _write(path, 8)


# -- 4. Two writers -------------------------------------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from nnschemaparser.store.guard import StoreLock
    with StoreLock(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(120)
""")


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_blocks_nobody(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusyError, match=rf"being written by another capture_dataset \(pid {holder.pid} on "
                                                 r"host .*, since .*\).*Wait for it to finish"):
            _write(path, 8)
        assert TraceStore(path).samples == [0, 1, 2, 3]  # the refused writer touched nothing
    finally:
        holder.kill()  # killed while it holds the lock: the kernel drops it
        holder.wait()
    assert _write(path, 8).samples == list(range(8))


# -- 5. A full disk -------------------------------------------------------------------------------------------------

def _full_disk(monkeypatch, after_writes):
    """Shard writes fail with ENOSPC after `after_writes` succeed (half the bytes of the failing one reach the
    file first, as on a disk that fills up mid-write); returns a switch that frees the space."""
    real = shards_module._write_all
    state = {"writes": 0, "full": True}

    def write_all(fd, view):
        state["writes"] += 1
        if state["full"] and state["writes"] > after_writes:
            os.write(fd, bytes(view[:len(view) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, view)

    monkeypatch.setattr(shards_module, "_write_all", write_all)
    monkeypatch.setenv("NNSCHEMAPARSER_DIRECT_WRITES", "0")
    return lambda: state.update(full=False)


def test_a_full_disk_mid_store_names_what_was_kept_removes_the_failed_block_and_a_rerun_completes_it(tmp_path,
                                                                                                    monkeypatch):
    path = tmp_path / "s"
    free = _full_disk(monkeypatch, after_writes=2)  # block 0: its tensor shard and reductions; block 1's shard fails
    with pytest.raises(StoreIncompleteError, match=rf"{path}: writing tensors/unit-000001-000000002-000.safetensors "
                                                   r"failed: the disk is full .* keeps the 2 inputs committed "
                                                   r"\(sample ids 0\.\.1\); the files of block 1 written so far were "
                                                   r"removed\. Free space .* run capture_dataset again"):
        _write(path, 6, block_size=2)
    left = sorted(p.name for p in path.rglob("unit-*"))
    assert left and all(name.startswith("unit-000000-") for name in left), left  # block 1's partial shard is gone
    assert TraceStore(path).samples == [0, 1]
    free()
    store = _write(path, 6, block_size=2)
    assert store.samples == list(range(6))
    reference = _write(tmp_path / "ref", 6, block_size=2)
    assert store.steps.equals(reference.steps)


def test_a_new_store_whose_first_block_meets_a_full_disk_is_removed_and_a_retry_creates_it(tmp_path, monkeypatch):
    path = tmp_path / "s"
    free = _full_disk(monkeypatch, after_writes=0)
    with pytest.raises(StoreIncompleteError, match=r"keeps the 0 inputs committed") as info:
        _write(path, 4)
    assert "the new store" in " ".join(getattr(info.value, "__notes__", [])) and not path.exists()
    free()
    assert _write(path, 4).samples == [0, 1, 2, 3]


def test_a_new_store_whose_manifest_cannot_be_written_is_removed_and_a_retry_creates_it(tmp_path, monkeypatch):
    path = tmp_path / "s"
    real = manifest_module.sync_write

    def no_space(target, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(manifest_module, "sync_write", no_space)
    with pytest.raises(StoreIncompleteError, match=r"the new store could not be created .*no input was written"):
        _write(path, 4)
    assert not path.exists()  # not a half-made folder that every later call refuses
    monkeypatch.setattr(manifest_module, "sync_write", real)
    assert _write(path, 4).samples == [0, 1, 2, 3]


# -- small escapes of a hostile store ---------------------------------------------------------------------------------

def test_a_reduction_whose_counts_are_zero_is_refused_as_malformed_not_a_division_by_zero(tmp_path):
    path = tmp_path / "s"
    _write(path, 8)
    for file in sorted((path / "reductions").iterdir()):
        raw = file.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + size])
        items = json.loads(header["__metadata__"]["reductions"])
        for item in items:
            item.update(element_n=0, channel_n=0, count=0)
        header["__metadata__"]["reductions"] = json.dumps(items)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        new = len(text).to_bytes(8, "little") + text + raw[8 + size:]
        file.write_bytes(new)
        commit = path / "commits" / f"{file.stem}.json"
        document = json.loads(commit.read_text())
        document["sizes"] = [[n, len(new) if n == f"reductions/{file.name}" else s] for n, s in document["sizes"]]
        commit.write_text(json.dumps(document))
    store = TraceStore(path)
    with pytest.raises(MalformedFileError, match=r"element_n: 0 is outside 1\.\."):
        store.variables  # the reductions are read and merged here


def test_a_shard_key_of_thousands_of_digits_is_refused_as_malformed(tmp_path):
    path = tmp_path / "s"
    _write(path, 4)
    shard = sorted((path / "tensors").iterdir())[0]
    raw = shard.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    key = next(k for k in header if k != "__metadata__")
    header["9" * 5000 + "/input_0001"] = header.pop(key)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    new = len(text).to_bytes(8, "little") + text + raw[8 + size:]
    shard.write_bytes(new)
    commit = sorted((path / "commits").iterdir())[0]
    document = json.loads(commit.read_text())
    for field in ("shards", "sizes"):
        document[field] = [[n, len(new) if n == f"tensors/{shard.name}" else s] for n, s in document[field]]
    commit.write_text(json.dumps(document))
    with pytest.raises(MalformedFileError, match="is not of a sample of unit-000000-000000000"):
        TraceStore(path)
