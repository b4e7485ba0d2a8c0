"""How shard files reach the disk: O_DIRECT through a reused staging buffer where the file system takes it,
the page cache otherwise, and the same bytes either way."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from nnschemaparser import TraceStore, capture_dataset
from nnschemaparser.files.file_format import FileLimits
from nnschemaparser.store import shards
from nnschemaparser.store.shards import ShardFile, write_bytes, write_shard

from .test_writer import blocks, inputs


def _takes_direct(folder: Path) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    (folder / ".probe").unlink()
    return True


def _odd_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Tensors of many dtypes whose byte sizes are not multiples of 8 or of a block, some empty, one 0-d."""
    pick = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(40):
        n = pick.choice([0, 1, 3, 7, 100, 1023, 4097, 5000])
        dtype = pick.choice([torch.float32, torch.float64, torch.int8, torch.bfloat16, torch.bool, torch.int64])
        out[f"t{i}"] = (torch.randn(n, generator=generator) * 10).to(dtype)
    out["scalar"] = torch.tensor(3.25)
    return out


@pytest.mark.parametrize("stage", [4096, 3 * 4096, 2 ** 20])
def test_direct_and_buffered_writes_give_the_same_bytes_across_staging_buffers(tmp_path, monkeypatch, stage):
    """The staging buffer fills and is written several times, the last one padded and cut back: the file is
    byte for byte the buffered one, and reads back as the tensors."""
    monkeypatch.setattr(shards, "_STAGE", stage)
    tensors = _odd_tensors(stage)
    monkeypatch.setenv("NNSCHEMAPARSER_DIRECT_WRITES", "1")
    size = write_shard(tmp_path / "direct.safetensors", tensors, {"note": "x"})
    monkeypatch.setenv("NNSCHEMAPARSER_DIRECT_WRITES", "0")
    assert write_shard(tmp_path / "buffered.safetensors", tensors, {"note": "x"}) == size
    direct, buffered = (tmp_path / "direct.safetensors").read_bytes(), (tmp_path / "buffered.safetensors").read_bytes()
    assert len(direct) == size and direct == buffered
    opened = ShardFile(tmp_path / "direct.safetensors", FileLimits(), size)
    for key, value in tensors.items():
        assert torch.equal(opened.tensor(key), value)


def test_pieces_are_written_in_order_whatever_their_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "_STAGE", 2 * 4096)
    pick = random.Random(3)
    pieces = [bytes(pick.randrange(256) for _ in range(pick.choice([0, 1, 4095, 4096, 4097, 9000, 20000])))
              for _ in range(30)]
    write_bytes(tmp_path / "f", pieces)
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_a_file_system_that_takes_o_direct_gets_direct_writes_and_the_switch_turns_them_off(tmp_path, monkeypatch):
    if not _takes_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system does not open files with O_DIRECT")
    monkeypatch.delenv("NNSCHEMAPARSER_DIRECT_WRITES", raising=False)
    assert write_bytes(tmp_path / "a", [b"x" * 10000]) == "direct"
    monkeypatch.setenv("NNSCHEMAPARSER_DIRECT_WRITES", "0")
    assert write_bytes(tmp_path / "b", [b"x" * 10000]) == "buffered"
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_file_system_that_refuses_o_direct_gets_buffered_writes_of_the_same_bytes(tmp_path, monkeypatch, where):
    """tmpfs before Linux 6.6 and some network file systems answer O_DIRECT with EINVAL, on open or on the
    first write: the file is written again through the page cache, from the start. (This machine's file
    systems all take O_DIRECT, so the refusal is made here: the open or the staged write raises EINVAL.)"""
    import errno

    monkeypatch.delenv("NNSCHEMAPARSER_DIRECT_WRITES", raising=False)
    tensors = _odd_tensors(1)
    size = write_shard(tmp_path / "reference.safetensors", tensors)
    if where == "open":
        real_open = os.open

        def refusing_open(path, flags, *args):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)
        monkeypatch.setattr(shards.os, "open", refusing_open)
    else:
        real_write = shards._write_through_stage

        def refusing_write(fd, pieces, direct):
            if direct:
                os.write(fd, b"partial")  # what a refused direct write may leave before the error
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_write(fd, pieces, direct)
        monkeypatch.setattr(shards, "_write_through_stage", refusing_write)
    assert write_bytes(tmp_path / "small", [b"y" * 5000]) == "buffered"
    assert (tmp_path / "small").read_bytes() == b"y" * 5000
    assert write_shard(tmp_path / "refused.safetensors", tensors) == size
    assert (tmp_path / "refused.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_an_error_other_than_a_refusal_is_raised(tmp_path, monkeypatch):
    import errno

    def full(fd, pieces, direct):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shards, "_write_through_stage", full)
    with pytest.raises(OSError, match="No space"):
        write_shard(tmp_path / "x.safetensors", {"a": torch.zeros(3)})


def test_processes_forked_after_a_write_do_not_share_the_staging_buffer(tmp_path):
    """The staging buffer is made before the fork (capture_dataset(world=N) forks after writing): each process
    must fill its own copy, or two ranks writing at once write each other's bytes."""
    write_shard(tmp_path / "warm.safetensors", {"w": torch.zeros(10)})  # this process's buffer exists now
    tensors = {"a": torch.full((3 * 2 ** 20,), 1.0)}
    theirs = {"b": torch.full((3 * 2 ** 20,), 2.0)}
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's result is its exit status
        ok = True
        try:
            for i in range(20):
                write_shard(tmp_path / f"child{i}.safetensors", theirs)
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    for i in range(20):
        write_shard(tmp_path / f"parent{i}.safetensors", tensors)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for i in range(20):
        assert torch.equal(ShardFile(tmp_path / f"parent{i}.safetensors", FileLimits()).tensor("a"), tensors["a"])
        assert torch.equal(ShardFile(tmp_path / f"child{i}.safetensors", FileLimits()).tensor("b"), theirs["b"])


def test_a_store_written_with_and_without_direct_writes_has_the_same_files(tmp_path, monkeypatch):
    _, schema = blocks()
    data = inputs(6)
    for mode in ("1", "0"):
        monkeypatch.setenv("NNSCHEMAPARSER_DIRECT_WRITES", mode)
        capture_dataset(schema, data, tmp_path / mode, keep="*", block_size=4, shard_bytes=4096, progress=False)
    names = sorted(p.relative_to(tmp_path / "1") for p in (tmp_path / "1").rglob("*.safetensors"))
    assert len(names) >= 4
    assert names == sorted(p.relative_to(tmp_path / "0") for p in (tmp_path / "0").rglob("*.safetensors"))
    for name in names:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "0" / name).read_bytes()
    a, b = TraceStore(tmp_path / "1"), TraceStore(tmp_path / "0")
    assert torch.equal(a.tensor(5, "input_0001"), b.tensor(5, "input_0001"))
