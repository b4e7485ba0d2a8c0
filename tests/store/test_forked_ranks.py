"""capture_dataset(world=N) never hangs: its forked ranks start safely from a process that has run
multi-threaded torch ops at the default thread count, and a rank that stops answering (stopped, not
killed) is named within the liveness bound while every rank is stopped.

Before, a rank forked after the parent's OpenMP pool existed waited forever in MKL's sgemm for threads
fork did not copy (`repro_world2_fork_hang.py` of issue 38), and a stopped rank left the others
waiting for the group's 30-minute timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nnschemaparser import StoreIncompleteError, TraceStore, capture_dataset
from tests.support.store_models import STOP_FLAG, blocks, inputs

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch build has no gloo backend for torch.distributed")

ROOT = Path(__file__).resolve().parents[2]

# The parent sets torch's default thread count (no OMP_NUM_THREADS), runs a threaded matrix product and a
# threaded reduction, parses a model wide enough that its ranks' products would start parallel
# regions, and writes a store with two forked ranks, each of which notes the thread count torch has
# in it (one: a fork copies no OpenMP thread, so a rank must never start a team); then one process at
# one thread writes the same inputs, and the two stores must hold the same bits. (Before the fix this
# script hung in the ranks' first matrix product, and each rank noted two threads.)
_SCRIPT = textwrap.dedent("""
    import glob, os, sys, torch
    from torch import nn
    from nnschemaparser import NNParser, capture_dataset

    threads = torch.get_num_threads()  # the default: no OMP_NUM_THREADS in this process's environment
    torch.set_num_threads(threads)  # as notebooks (and the zoo) do: torch then also turns MKL's dynamic
                                    # threads off, so MKL's products in a forked child ask for every thread
    a = torch.randn(768, 768)
    (a @ a).sum().item(), a.sum(dim=0).norm().item()  # the OpenMP pool exists from here on

    def note_threads(x):  # the thread count torch has in the process running this forward, a file each
        with open(f"{sys.argv[1]}/threads-{os.getpid()}", "w") as out:
            out.write(str(torch.get_num_threads()))
        return x

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(384, 384), nn.Linear(384, 16)

        def forward(self, x):
            hidden = self.fc1(note_threads(x))
            activated = hidden.relu()
            return self.fc2(activated)

    torch.manual_seed(0)
    model = Wide().eval()
    data = [{"x": torch.randn(96, 384, generator=torch.Generator().manual_seed(i))} for i in range(6)]
    schema = NNParser.parse_model(model=model, inputs_tensors_values=data[0])
    two = capture_dataset(schema, data, sys.argv[1] + "/two", keep="*:activated", world=2, block_size=2,
                          progress=False)
    ranks = {path: open(path).read() for path in glob.glob(sys.argv[1] + "/threads-*")
             if not path.endswith(f"-{os.getpid()}")}
    assert len(ranks) == 2 and set(ranks.values()) == {"1"}, ranks  # each forked rank: one thread
    torch.set_num_threads(1)
    one = capture_dataset(schema, data, sys.argv[1] + "/one", keep="*:activated", block_size=2, progress=False)
    assert {c.rank for c in two.commits} == {0, 1}
    assert one.steps.equals(two.steps)
    kept = sorted(one._where)
    assert kept == sorted(two._where) and kept
    for key in kept:
        sample, cid = key.split("/", 1)
        assert torch.equal(one.tensor(int(sample), cid), two.tensor(int(sample), cid)), key
    print("threads", threads, "kept", len(kept))
""")


def test_world_2_finishes_after_the_parent_ran_threaded_ops_at_the_default_thread_count(tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: torch's default is one thread, and no OpenMP pool is made")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    # its own session, so that a hang is ended with every rank it forked (stopped by their group's id)
    process = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(tmp_path)], env=env, cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"capture_dataset(world=2) did not finish in 240 s after a threaded op: {stderr[-2000:]}")
    assert process.returncode == 0, stderr[-4000:]
    threads = int(stdout.split()[1])
    assert threads > 1  # the parent really ran with a pool of several threads


def _children() -> list[tuple[int, str]]:
    """(pid, state) of this process's living children, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append((int(entry.name), fields[0]))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from Linux's /proc")
def test_a_stopped_rank_is_named_within_the_liveness_bound_and_every_rank_is_stopped(tmp_path, monkeypatch):
    flag = tmp_path / "stop"
    flag.write_text("")
    monkeypatch.setenv(STOP_FLAG, str(flag))
    _, schema = blocks()
    data = inputs(22, stop_at=(13,))  # sample 13: block 3 of size 4, rank 1 of 2
    before = {pid for pid, _ in _children()}
    started = time.monotonic()
    with pytest.raises(StoreIncompleteError) as info:
        capture_dataset(schema, data, tmp_path / "s", keep="layers.*", block_size=4, world=2, progress=False,
                        liveness=3)
    elapsed = time.monotonic() - started
    text = str(info.value)
    assert "rank 1 of 2" in text and "sent no heartbeat" in text and "stopped by a signal" in text, text
    assert "Run capture_dataset again" in text
    assert elapsed < 60, elapsed  # named within the bound, not after the group's 30-minute timeout
    assert not [c for c in _children() if c[0] not in before]  # no rank left behind, stopped or not

    flag.unlink()  # the rerun writes what is missing and gives the whole store
    store = capture_dataset(schema, data, tmp_path / "s", keep="layers.*", block_size=4, world=2, progress=False)
    assert store.samples == list(range(22))
    assert isinstance(TraceStore(tmp_path / "s"), TraceStore)


def test_liveness_must_be_a_positive_number_of_seconds_or_none(tmp_path):
    _, schema = blocks()
    for bad in (0, -1, True, "60"):
        with pytest.raises(ValueError, match="liveness must be a positive number of seconds or None"):
            capture_dataset(schema, inputs(2), tmp_path / "s", world=2, liveness=bad, progress=False)
    assert not (tmp_path / "s").exists()
