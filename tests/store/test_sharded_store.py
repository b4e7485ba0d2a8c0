"""A store written under torchrun (2 processes on 127.0.0.1, gloo) from a tensor-parallel model
(transformers' `tp_plan="auto"`) by `capture_sharded_dataset` equals the store one process writes
from the unsharded model: the same samples and variables, every value `torch.equal` except those
computed from a sum over shards (a row-parallel output and what follows), whose difference is
reported per value; from FSDP2, every value `torch.equal`. capture_dataset itself refuses a sharded
model it would split over ranks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nnschemaparser import NNParser, TraceStore, capture_dataset
from tests.support.logical_hf_tp import save_llama
from tests.support.sharded_store import KEEP, batches

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="this torch build has no gloo backend for torch.distributed")


def _torchrun(folder: Path, store: Path, out: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                                 "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 str(ROOT / "tests/support/torchrun_sharded_store.py"), str(folder), str(store), str(out)],
                                cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and every worker it started, by its group
        launcher.communicate()
        raise AssertionError("the torchrun launch did not finish within 300 s")
    assert launcher.returncode == 0, output[-4000:]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import AutoModel

    tmp = tmp_path_factory.mktemp("sharded_store")
    save_llama(str(tmp / "llama"))
    _torchrun(tmp / "llama", tmp / "tp", tmp / "out")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker runs
    try:
        model = AutoModel.from_pretrained(str(tmp / "llama")).eval()
        data = batches()
        schema = NNParser.parse_model(model, inputs_tensors_values=data[0])
        one = capture_dataset(schema, data, tmp / "one", keep=KEEP, block_size=2, progress=False)
    finally:
        torch.set_num_threads(threads)
    reduced = json.loads((tmp / "out.reduced.json").read_text())
    counts = [(tmp / f"out.rank{r}").read_text() for r in (0, 1)]
    return TraceStore(tmp / "tp"), one, reduced, counts


def test_a_tp_model_under_torchrun_writes_the_store_of_one_process(stores):
    sharded, one, reduced, counts = stores
    assert counts == ["6", "6"]  # every rank returns the store: 3 inputs of 2 rows
    assert {c.rank for c in sharded.commits} == {0}  # rank 0 wrote every block
    assert sharded.samples == one.samples == list(range(6))
    assert sharded.variables == one.variables and len(sharded.variables) >= 5
    steps = sharded.steps
    kept = steps[steps["kept"] & (steps["sample"] == 0)]
    placed = dict(zip(kept["name"], kept["container_id"]))
    exact, summed = [], {}
    for name in sharded.variables:
        if name not in placed:
            continue  # the root's inputs: kept whole on every rank
        a, b = sharded.stack(name), one.stack(name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if reduced[placed[name]]:
            summed[name] = float((a.double() - b.double()).abs().max())  # the terms' order: said, not hidden
        else:
            assert torch.equal(a, b), name
            exact.append(name)
    assert "layers.0.self_attn:query_states" in exact  # before any sum over shards: bit for bit
    assert "layers.0:output" in summed and "norm:output" in summed  # after the first row-parallel sum
    print("differences of the values made by a sum over shards:", summed)


def test_capture_dataset_refuses_a_sharded_model_it_would_split_over_ranks(stores):
    """Under torchrun capture_dataset gives each rank other inputs; a sharded model's ranks must all
    run the same ones: it says so and names capture_sharded_dataset (the script tried it on each rank)."""
    counts = stores[3]
    assert counts  # the launch ran
    refusal = stores[0].path.parent / "out.refused"
    text = refusal.read_text()
    assert text.startswith("ValueError") and "capture_sharded_dataset" in text and "is sharded" in text, text


def test_an_fsdp2_model_under_torchrun_writes_the_store_of_one_process_bit_for_bit(stores):
    """FSDP2 gathers each layer's weights before it runs: no sum over shards, every value exact."""
    one = stores[1]
    fsdp = TraceStore(stores[0].path.parent / "tp.fsdp")
    assert {c.rank for c in fsdp.commits} == {0}
    assert fsdp.samples == one.samples and fsdp.variables == one.variables
    for name in one.variables:
        assert torch.equal(fsdp.stack(name), one.stack(name)), name
