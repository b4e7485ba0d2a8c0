"""capture_dataset writes what a capture computes: every step's statistics, the kept tensors, the inputs.

Also: a store refuses runs of another schema or other options, a run killed with SIGKILL resumes
without losing or repeating an input, and the peak memory of a run does not grow with its inputs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nnschemaparser import StoreMismatchError, TraceStore, capture_dataset, capture_run
from nnschemaparser.traces.tables import tensor_statistics
from tests.support.store_models import blocks, inputs, statistics_mismatches

ROOT = Path(__file__).resolve().parents[2]
def test_rows_are_the_statistics_of_every_step_and_kept_tensors_are_the_captured_values(tmp_path):
    """Exact for min, max and the counts; mean, abs_sum, l2 and std within the bounds statistics.py documents."""
    model, schema = blocks()
    data = inputs(6, nan_at=(4,))
    store = capture_dataset(schema, data, tmp_path / "s", keep="layers.*:hidden", block_size=4, progress=False)
    assert store.samples == list(range(6))
    steps = store.steps
    for sample in range(6):
        reference = capture_run(schema, dict(data[sample])).trace
        rows = steps[steps["sample"] == sample]
        assert list(rows["container_id"]) == [s.container_id for s in reference.steps]
        for (_, row), step in zip(rows.iterrows(), reference.steps):
            wrong = statistics_mismatches(row, tensor_statistics(step.value))
            assert not wrong, (sample, step.container_id, wrong)
            wanted = step.slot_type == "input" or (step.block_path.startswith("layers.") and step.out_var == "hidden")
            assert bool(row["kept"]) == wanted
            if wanted:
                assert torch.equal(store.tensor(sample, step.container_id), step.value)
            else:
                with pytest.raises(KeyError, match="no kept tensor"):
                    store.tensor(sample, step.container_id)
    nan_rows = steps[(steps["n_nan"] > 0)]
    assert set(nan_rows["sample"]) == {4} and set(nan_rows["block_path"]) >= {"head"}


def test_a_store_refuses_runs_of_another_schema_and_of_other_options(tmp_path):
    _, schema = blocks()
    capture_dataset(schema, inputs(3), tmp_path / "s", keep="head", progress=False)
    _, deeper = blocks(depth=3)
    with pytest.raises(StoreMismatchError, match="another schema.*source"):
        capture_dataset(deeper, inputs(3), tmp_path / "s", keep="head", progress=False)
    with pytest.raises(StoreMismatchError, match="other options.*keep"):
        capture_dataset(schema, inputs(3), tmp_path / "s", keep="layers.0", progress=False)
    with pytest.raises(StoreMismatchError, match="block_size"):
        capture_dataset(schema, inputs(3), tmp_path / "s", keep="head", block_size=8, progress=False)
    assert len(TraceStore(tmp_path / "s")) == 3  # nothing was written by the refused runs


def test_a_rerun_skips_committed_inputs_and_extends_the_store(tmp_path):
    _, schema = blocks()
    capture_dataset(schema, inputs(5), tmp_path / "s", keep="head", block_size=4, progress=False)
    store = capture_dataset(schema, inputs(11), tmp_path / "s", keep="head", block_size=4, progress=False)
    assert store.samples == list(range(11))
    counts = store.query("select sample, count(*) as n from steps group by sample order by sample")
    assert counts["n"].nunique() == 1  # no input written twice
    whole = capture_dataset(schema, inputs(11), tmp_path / "w", keep="head", block_size=4, progress=False)
    assert store.steps.drop(columns=[]).equals(whole.steps)


SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from nnschemaparser import capture_dataset
from tests.support.store_models import blocks, inputs, statistics_mismatches

_, schema = blocks()

def slow():
    for scope in inputs({n}):
        time.sleep({delay})
        yield scope

capture_dataset(schema, slow(), {store!r}, keep="layers.*", block_size=4, progress=False)
print("finished")
"""


def _script(tmp_path, store, n, delay) -> Path:
    path = tmp_path / f"capture_{delay}.py"
    path.write_text(SCRIPT.format(root=str(ROOT), n=n, store=str(store), delay=delay))
    return path


def test_a_run_killed_with_sigkill_resumes_without_losing_or_repeating_an_input(tmp_path):
    store = tmp_path / "s"
    n = 24
    process = subprocess.Popen([sys.executable, str(_script(tmp_path, store, n, 0.05))], cwd=str(ROOT),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    commits = store / "commits"
    while time.monotonic() < deadline:  # kill it once two blocks are committed and the third is being written
        if commits.is_dir() and len(list(commits.glob("unit-*.json"))) >= 2:
            break
        time.sleep(0.02)
    time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert process.returncode == -signal.SIGKILL
    partial = TraceStore(store)
    assert 8 <= len(partial) < n, "the kill should land mid-run"
    leftovers = [p for p in (store / "tensors").iterdir()
                 if f"tensors/{p.name}" not in {s for c in partial.commits for s, _ in c.shards}]
    done = subprocess.run([sys.executable, str(_script(tmp_path, store, n, 0.0))], cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resumed = TraceStore(store)
    assert resumed.samples == list(range(n))
    whole = capture_dataset(blocks()[1], inputs(n), tmp_path / "w", keep="layers.*", block_size=4, progress=False)
    assert resumed.steps.equals(whole.steps)  # every input once, the same rows as a run never killed
    for sample in range(n):
        for cid in whole.steps[(whole.steps["sample"] == sample) & whole.steps["kept"]]["container_id"]:
            assert torch.equal(resumed.tensor(sample, cid), whole.tensor(sample, cid))
    for name in whole.variables:
        a, b = resumed.reduction(name), whole.reduction(name)
        assert torch.equal(a.mean, b.mean) and torch.equal(a.histogram, b.histogram) and a.top == b.top
    assert all(not p.exists() for p in leftovers if p.name.startswith("unit-"))  # orphans of the killed block removed
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["complete"] == [[0, n - 1]]


MEMORY = """
import resource, sys
sys.path.insert(0, {root!r})
import torch
from nnschemaparser import capture_dataset
from tests.support.store_models import blocks

_, schema = blocks()
generator = torch.Generator().manual_seed(0)
def scopes():
    for _ in range({n}):
        yield {{"x": torch.randn(256, 8, generator=generator)}}
capture_dataset(schema, scopes(), {store!r}, keep="layers.*", block_size=16, progress=False, batch_axis=None)
written = sum(p.stat().st_size for p in __import__("pathlib").Path({store!r}, "tensors").iterdir())
print(written, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_kib(tmp_path, n: int) -> tuple[int, int]:
    script = tmp_path / f"memory_{n}.py"
    script.write_text(MEMORY.format(root=str(ROOT), n=n, store=str(tmp_path / f"m{n}")))
    done = subprocess.run([sys.executable, str(script)], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    written, peak = done.stdout.split()[-2:]
    return int(written), int(peak)


def test_peak_memory_does_not_grow_with_the_number_of_inputs(tmp_path):
    (_, small), (written, large) = _peak_kib(tmp_path, 10), _peak_kib(tmp_path, 1000)
    # 100x the inputs: the peaks differ by allocator noise, far less than what the larger run wrote
    print(f"peak RSS {small} KiB for 10 inputs, {large} KiB for 1000 ({written / 2 ** 20:.0f} MiB of tensors written)")
    assert written > 4 * 16 * 2 ** 20
    assert large - small < 16 * 1024, f"peak RSS {small} KiB for 10 inputs, {large} KiB for 1000"


def test_statistics_of_odd_tensors_count_nan_inf_and_zeros_exactly(tmp_path):
    from nnschemaparser.store.step_table import step_rows
    from nnschemaparser.traces.trace import TraceStep
    from nnschemaparser.schema.model import TensorContainer

    values = [torch.tensor([1.0, float("nan"), 0.0, float("inf")]), torch.tensor([0.0, 0.0, 2.0]),
              torch.tensor([True, False, True]), torch.arange(6).reshape(2, 3), torch.tensor([3.5]),
              torch.zeros(0), torch.tensor([1.0, -2.0], dtype=torch.bfloat16), torch.tensor([-1e30, 1e30]),
              torch.full((4, 4), torch.finfo(torch.float32).min),  # a mask: float32 sums overflow, float64 ones do not
              torch.relu(torch.randn(3, 9000)).t(),  # large (reduced alone), not contiguous, with zeros
              torch.randn(20000).index_fill(0, torch.tensor([5, 7]), float("nan")).index_fill(0, torch.tensor([9]), 0.0)]
    steps = [TraceStep(i + 1, f"x_{i:04d}", "", "activation", "x", "", "m", TensorContainer(tuple(v.shape), str(v.dtype), v))
             for i, v in enumerate(values)]
    rows = step_rows(0, steps, set())
    names = [name for name, _ in __import__("nnschemaparser.store.step_table", fromlist=["COLUMNS"]).COLUMNS]
    for row, value in zip(rows, values):
        record = dict(zip(names, row))
        wrong = statistics_mismatches(record, tensor_statistics(value))
        assert not wrong, (value, wrong)


def test_a_refused_first_input_leaves_no_store_behind(tmp_path):
    """A new store whose run fails before it commits an input is removed: a new folder is gone, an empty
    folder given is left empty, and the path takes a store of other options afterwards."""
    _, schema = blocks()
    with pytest.raises(TypeError, match="an input must be a dict") as refused:
        capture_dataset(schema, [object()], tmp_path / "new", progress=False)
    assert not (tmp_path / "new").exists()
    assert "was removed" in "".join(getattr(refused.value, "__notes__", ["was removed"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TypeError):
        capture_dataset(schema, [object()], tmp_path / "empty", progress=False)
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    store = capture_dataset(schema, inputs(2), tmp_path / "new", keep="head", block_size=8, progress=False)
    assert store.samples == [0, 1]


def test_a_failure_after_a_commit_keeps_the_store_to_resume(tmp_path):
    _, schema = blocks()
    data = inputs(5)
    with pytest.raises(TypeError):
        capture_dataset(schema, data[:4] + [object()], tmp_path / "s", keep="head", block_size=2, progress=False)
    assert TraceStore(tmp_path / "s").samples == [0, 1, 2, 3]
    assert capture_dataset(schema, data, tmp_path / "s", keep="head", block_size=2, progress=False).samples == \
        list(range(5))


def test_shards_written_by_the_store_are_safetensors_files(tmp_path):
    """write_shard lays the bytes out itself: safetensors reads them back as the same tensors, metadata too."""
    from safetensors import safe_open

    from nnschemaparser.store.shards import ShardFile, write_shard
    from nnschemaparser.files.file_format import FileLimits

    tensors = {"a": torch.arange(5, dtype=torch.int8), "b": torch.randn(3, 4), "c": torch.tensor(2.5, dtype=torch.float64),
               "d": torch.tensor([True, False]), "e": torch.randn(2, 2).to(torch.bfloat16), "f": torch.zeros(0, 3),
               "g": torch.arange(6).reshape(2, 3)}
    size = write_shard(tmp_path / "x.safetensors", tensors, {"note": "kept"})
    assert size == (tmp_path / "x.safetensors").stat().st_size
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as opened:
        assert opened.metadata() == {"note": "kept"} and set(opened.keys()) == set(tensors)
        for key, value in tensors.items():
            assert opened.get_tensor(key).dtype == value.dtype and torch.equal(opened.get_tensor(key), value)
    ours = ShardFile(tmp_path / "x.safetensors", FileLimits(), size)
    for key, value in tensors.items():
        assert torch.equal(ours.tensor(key), value)
        assert ours.layout[key][2] % value.element_size() == 0  # aligned: read as a view, not a copy


def test_dataloader_batches_are_rows_by_default_and_inputs_by_position_with_batch_axis_none(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    _, schema = blocks()
    x = torch.randn(7, 8, generator=torch.Generator().manual_seed(5))
    loader = DataLoader(TensorDataset(x), batch_size=2)  # each batch is [tensor of (2, 8)], the last (1, 8)
    rows = capture_dataset(schema, loader, tmp_path / "r", keep="head", progress=False)
    assert rows.samples == list(range(7))
    assert all(torch.equal(rows.scope(i)["x"], x[i:i + 1]) for i in range(7))
    store = capture_dataset(schema, loader, tmp_path / "s", keep="head", progress=False, batch_axis=None)
    assert store.samples == [0, 1, 2, 3]
    assert torch.equal(store.scope(2)["x"], x[4:6])
    with pytest.raises(TypeError, match="an input must be a dict"):
        capture_dataset(schema, [object()], tmp_path / "t", progress=False)


def test_step_columns_of_inputs_run_alike_or_not_are_each_inputs_own_rows(tmp_path):
    """Inputs whose steps repeat the previous input's metadata share its lists (step_names.py, `StepNames.steady`);
    inputs of another shape in between do not: every column of every row is what `step_rows` makes of that
    input's own capture."""
    import math

    from nnschemaparser.store.step_table import COLUMNS, step_rows

    _, schema = blocks()
    generator = torch.Generator().manual_seed(7)
    data = [{"x": torch.randn(rows, 8, generator=generator)} for rows in (2, 2, 3, 3, 2, 1, 2)]
    store = capture_dataset(schema, data, tmp_path / "s", keep="layers.*:hidden", block_size=4, progress=False,
                            batch_axis=None)  # each input whole, one sample, as capture_run sees it
    names = [name for name, _ in COLUMNS]
    steps = store.steps
    for sample, scope in enumerate(data):
        reference = capture_run(schema, dict(scope)).trace.steps
        kept = {s.step for s in reference if s.slot_type == "input" or
                (s.block_path.startswith("layers.") and s.out_var == "hidden")}
        expected = [dict(zip(names, row)) for row in step_rows(sample, reference, kept)]
        found = steps[steps["sample"] == sample].to_dict("records")
        assert len(found) == len(expected) > 0
        for got, want in zip(found, expected):
            for name in names:
                a, b = got[name], want[name]
                if name == "shape":
                    a = [int(d) for d in a]
                if b is None or (isinstance(b, float) and math.isnan(b)):  # pandas reads a missing text as NaN
                    assert a is None or (isinstance(a, float) and math.isnan(a)), (sample, want["container_id"], name, a)
                else:
                    assert a == b, (sample, want["container_id"], name, a, b)
