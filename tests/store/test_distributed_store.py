"""capture_dataset(world=N) on real gloo groups on 127.0.0.1: 1, 2 and 4 processes write the same store.

Same rows, same tensors, bit-equal reductions whatever the number of processes; a rank that dies
is reported with StoreIncompleteError, and a rerun writes only the missing inputs.
"""

from __future__ import annotations

import pytest
import torch

from nnschemaparser import StoreIncompleteError, TraceStore, capture_dataset
from tests.support.store_models import DEATH_FLAG, blocks, inputs

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch build has no gloo backend for torch.distributed")

N = 22  # 6 blocks of 4, the last one short: ranks get unequal shares


def _write(path, world, data=None):
    _, schema = blocks()
    return capture_dataset(schema, data if data is not None else inputs(N, nan_at=(5,)), path, keep="layers.*, head",
                           block_size=4, world=world, progress=False)


def _bits(u: torch.Tensor, v: torch.Tensor) -> bool:
    """Bit for bit (NaN payloads included), which torch.equal is not for NaN."""
    return u.dtype == v.dtype and u.shape == v.shape and torch.equal(u.reshape(-1).contiguous().view(torch.uint8),
                                                                      v.reshape(-1).contiguous().view(torch.uint8))


def _assert_same(a: TraceStore, b: TraceStore) -> None:
    assert a.samples == b.samples == list(range(N))
    assert a.steps.equals(b.steps)
    keys_a, keys_b = sorted(a._where), sorted(b._where)
    assert keys_a == keys_b
    for key in keys_a:
        sample, cid = key.split("/", 1)
        assert _bits(a.tensor(int(sample), cid), b.tensor(int(sample), cid)), key
    assert a.variables == b.variables
    for name in a.variables:
        x, y = a.reduction(name), b.reduction(name)
        assert x.count == y.count and repr(x.top) == repr(y.top) and x.note == y.note  # NaN norms compare by text
        for field in ("mean", "var", "channel_mean", "channel_var", "histogram"):
            u, v = getattr(x, field), getattr(y, field)
            assert (u is None and v is None) or _bits(u, v), (name, field)


def test_one_two_and_four_processes_write_the_same_store(tmp_path):
    one = _write(tmp_path / "w1", 1)
    two = _write(tmp_path / "w2", 2)
    four = _write(tmp_path / "w4", 4)
    assert {c.rank for c in two.commits} == {0, 1} and {c.rank for c in four.commits} == {0, 1, 2, 3}
    _assert_same(one, two)
    _assert_same(one, four)


def test_a_rank_that_dies_is_reported_and_a_rerun_writes_only_the_missing_inputs(tmp_path, monkeypatch):
    flag = tmp_path / "die"
    flag.write_text("")
    monkeypatch.setenv(DEATH_FLAG, str(flag))
    data = inputs(N, nan_at=(5,), die_at=(13,))  # sample 13: block 3, rank 1 of 2
    with pytest.raises(StoreIncompleteError, match=r"rank 1 of 2 died with exit code 3.*Run capture_dataset again"):
        _write(tmp_path / "s", 2, data)
    partial = TraceStore(tmp_path / "s")
    assert 13 not in partial.samples and len(partial) < N
    before = {c.name for c in partial.commits}
    flag.unlink()
    resumed = _write(tmp_path / "s", 2, data)
    assert resumed.samples == list(range(N))
    assert before <= {c.name for c in resumed.commits}  # what was committed stays; only the rest was written
    reference = _write(tmp_path / "w1", 1, data)
    _assert_same(resumed, reference)


TORCHRUN = """
import os, sys
sys.path.insert(0, {root!r})
from nnschemaparser import capture_dataset
from tests.support.store_models import blocks, inputs

_, schema = blocks()
store = capture_dataset(schema, inputs({n}, nan_at=(5,)), {store!r}, keep="layers.*, head", block_size=4,
                        progress=False)
open({store!r} + ".rank" + os.environ["RANK"], "w").write(str(len(store)))  # not stdout: torchrun interleaves it
os._exit(0)  # as the project's gloo workers do: no gloo thread destructors at exit
"""


def test_the_same_script_under_torchrun_writes_the_same_store(tmp_path):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "capture.py"
    script.write_text(TORCHRUN.format(root=str(root), n=N, store=str(tmp_path / "t")))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)],
                          cwd=str(root), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [(tmp_path / f"t.rank{rank}").read_text() for rank in (0, 1)] == [str(N), str(N)]  # each rank saw all
    launched = TraceStore(tmp_path / "t")
    assert {c.rank for c in launched.commits} == {0, 1}
    _assert_same(launched, _write(tmp_path / "w1", 1))


def test_rows_of_batches_of_several_sizes_are_numbered_alike_by_one_and_two_processes(tmp_path):
    """Each rank counts the rows of every input, its own or not, so the running sample ids agree."""
    _, schema = blocks()
    generator = torch.Generator().manual_seed(2)
    sizes = [3, 1, 2, 4, 3, 2, 1, 4, 2, 3, 2]
    data = [{"x": torch.randn(n, 8, generator=generator)} for n in sizes]
    one = capture_dataset(schema, data, tmp_path / "r1", keep="layers.*", block_size=2, progress=False)
    two = capture_dataset(schema, data, tmp_path / "r2", keep="layers.*", block_size=2, world=2, progress=False)
    assert {c.rank for c in two.commits} == {0, 1}
    assert one.samples == two.samples == list(range(sum(sizes)))
    assert one.steps.equals(two.steps)
    assert sorted(one._where) == sorted(two._where)
    for key in one._where:
        sample, cid = key.split("/", 1)
        assert _bits(one.tensor(int(sample), cid), two.tensor(int(sample), cid)), key
    for name in one.variables:
        x, y = one.reduction(name), two.reduction(name)
        assert x.top == y.top and _bits(x.channel_mean, y.channel_mean) and _bits(x.histogram, y.histogram)
    first = sum(sizes[:4])  # input 4 (block 2) starts after the 10 rows of inputs 0..3
    assert torch.equal(two.scope(first)["x"], data[4]["x"][:1])
