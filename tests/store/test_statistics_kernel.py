"""The store's one-pass statistics kernel (store/native.py, _statistics.c): its figures follow the order its
source documents, bit for bit; they agree with torch's reductions to rounding; it is built once into its
cache; without a compiler the store falls back to torch and says so; each commit records its engine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nnschemaparser import MalformedFileError, TraceStore, capture_dataset
from nnschemaparser.store import native
from nnschemaparser.store.manifest import STATISTICS_ENGINES
from nnschemaparser.store.statistics import Summariser, summarise
from tests.support.store_models import blocks, inputs

ROOT = Path(__file__).resolve().parents[2]
needs_kernel = pytest.mark.skipif(native.kernel() is None,
                                  reason=f"the statistics kernel is not built here: {native.problem()}")
LANES = 32


def _reference(values: list[float]) -> list[float]:
    """The kernel's figures as its source defines them, in Python floats (float64): element i to lane i % 32,
    each lane adding in element order, the lanes added in lane order; min, max and least magnitude skip NaN."""
    lanes = [[0.0, 0.0, 0.0] for _ in range(LANES)]
    low = high = least = None
    nans = infs = zeros = 0
    for i, v in enumerate(values):
        lane = lanes[i % LANES]
        m = abs(v)
        lane[0] += v
        lane[1] += m
        lane[2] += v * v
        if v != v:
            nans += 1
            continue
        infs += m == math.inf
        zeros += v == 0
        low = v if low is None or v < low else low
        high = v if high is None or v > high else high
        least = m if least is None or m < least else least
    total = magnitude = squares = 0.0
    for lane in lanes:
        total += lane[0]
        magnitude += lane[1]
        squares += lane[2]
    none = math.inf
    return [total, none if low is None else low, -none if high is None else high, magnitude,
            none if least is None else least, squares, float(nans), float(infs), float(zeros)]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_figures_follow_the_documented_lane_order_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    tensors = []
    for n in (1, 5, 31, 32, 33, 64, 95, 1000, 3001):
        # magnitudes from 1e-9 to 1e9: float64 sums of these round, so another order gives other figures
        tensors.append((torch.randn(n, generator=g, dtype=torch.float64)
                        * 10 ** torch.randint(-9, 10, (n,), generator=g)).to(dtype))
    special = (torch.randn(70, generator=g, dtype=torch.float64) * 1e6).to(dtype)
    special[3], special[40] = 0.0, -0.0
    tensors += [special, special.clone(), special.clone(), torch.full((40,), float("nan"), dtype=dtype)]
    tensors[-3][7] = float("nan")
    tensors[-2][11], tensors[-2][12] = float("inf"), -float("inf")
    got = native.kernel().figures(tensors, dtype)
    for tensor, row in zip(tensors, got.tolist()):
        expected = _reference(tensor.tolist())
        same = [a == b or (a != a and b != b) for a, b in zip(row, expected)]
        assert all(same), (tensor.numel(), row, expected)
    # the figures depend on the order: the same 3,001 elements summed in sequence round otherwise
    plain = 0.0
    for v in tensors[8].tolist():
        plain += v
    assert plain != got[8, 0]


@needs_kernel
def test_views_are_summarised_as_their_contiguous_copies():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 16, 24, generator=g)
    values = [x, x.transpose(1, 2), x[:, ::2], torch.randn(300, 400, generator=g).t(), x.permute(2, 0, 1)]
    copies = [v.contiguous() for v in values]
    summariser = Summariser(native.ENGINE)
    for _ in range(2):  # a fresh plan, then the plan reused
        assert summariser(values).rows() == summariser(copies).rows() == Summariser(native.ENGINE)(copies).rows()


@needs_kernel
def test_the_kernel_reads_views_as_their_contiguous_copies():
    """A view is gathered in the C code (sizes and strides in elements), not copied by torch first: its
    figures are those of its contiguous copy, bit for bit, whatever its strides (gaps, repeats, a
    transposed inner dimension, a dimension of size 1 or 0, many dimensions)."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 5, 40, generator=g)
    views = [x.transpose(0, 2), x[:, ::2, 3:], x[:, :1].expand(6, 7, 40), x.chunk(2, dim=-1)[1],
             x.permute(1, 2, 0)[1:, :, ::3], x[:, :, :0].transpose(1, 2), x.unsqueeze(1).transpose(0, 3),
             torch.randn(2, 1, 3, 1, 2, 1, 3, generator=g).transpose(2, 6), x.view(6, 5, 2, 2, 10)[:, :, :, 1].mT]
    assert not any(v.is_contiguous() for v in views if v.numel())
    for dtype in (torch.float32, torch.float64):
        typed = [v.to(dtype) if dtype != v.dtype else v for v in views]
        got = native.kernel().figures(typed, dtype)
        copied = native.kernel().figures([v.contiguous() for v in typed], dtype)
        assert got.tobytes() == copied.tobytes()


@needs_kernel
def test_the_kernel_refuses_what_it_cannot_read():
    kernel = native.kernel()
    with pytest.raises(ValueError, match="float32"):
        kernel.figures([torch.randn(4, dtype=torch.float64)], torch.float32)
    with pytest.raises(ValueError, match="strided CPU"):
        kernel.figures([torch.randn(4, 4).to_sparse()], torch.float32)
    with pytest.raises(ValueError, match="strided CPU"):
        kernel.figures([torch.randn(4, device="meta")], torch.float32)


def _values() -> list:
    g = torch.Generator().manual_seed(0)
    holes = torch.randn(300, generator=g)
    holes[4], holes[9], holes[10] = float("nan"), float("inf"), 0.0
    mask = torch.full((8, 8), torch.finfo(torch.float32).min)
    return [torch.randn(3, 50, generator=g), torch.relu(torch.randn(20000, generator=g)), holes, mask,
            torch.randint(-5, 5, (7, 7), generator=g), torch.rand(9, generator=g) > 0.5,
            torch.randn(100, generator=g).half(), torch.randn(6, dtype=torch.complex64, generator=g),
            torch.randn(40, generator=g, dtype=torch.float64) * 1e10, torch.tensor(2.5), torch.zeros(0),
            torch.full((5,), float("inf")), None, 7]


@needs_kernel
def test_kernel_and_torch_figures_agree_to_rounding():
    values = _values()
    kernel, torch_rows = summarise(values, native.ENGINE), summarise(values, "torch")
    for value, a, b in zip(values, kernel, torch_rows):
        for k, (x, y) in enumerate(zip(a, b)):
            if x is None or y is None or x != x or y != y or k in (2, 3, 6, 7, 8):
                # min, max and the counts are exact in both; NaN and None where both have them
                assert x == y or (x != x and y != y), (value, k, x, y)
            elif k == 0:  # a mean near zero: within a millionth of the mean magnitude
                assert math.isclose(x, y, rel_tol=2e-5, abs_tol=1e-6 * a[4] / value.numel()), (value, k, x, y)
            else:
                assert math.isclose(x, y, rel_tol=2e-5), (value, k, x, y)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300,
                          cwd=ROOT)


_REPORT = ("from nnschemaparser.store import native; from nnschemaparser.store.statistics import Summariser; "
           "k = native.kernel(); print(Summariser().engine); print(k.path if k else native.problem())")


@needs_kernel
def test_the_kernel_is_built_once_into_its_cache_and_reused(tmp_path):
    first = _python(_REPORT, NNSCHEMAPARSER_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    engine, library = first.stdout.split()
    assert engine == native.ENGINE and Path(library).parent == tmp_path / "native"
    built = Path(library).stat().st_mtime_ns
    again = _python(_REPORT, NNSCHEMAPARSER_CACHE=str(tmp_path))
    assert again.stdout.split() == [engine, library] and Path(library).stat().st_mtime_ns == built
    assert [p.name for p in (tmp_path / "native").iterdir()] == [Path(library).name]  # no temporary left


def test_without_a_compiler_the_statistics_use_torch_and_say_why(tmp_path):
    done = _python(_REPORT, NNSCHEMAPARSER_CACHE=str(tmp_path), CC=str(tmp_path / "no-such-cc"))
    assert done.returncode == 0, done.stderr
    engine, why = done.stdout.split("\n", 1)
    assert engine == "torch" and "no C compiler" in why
    off = _python(_REPORT, NNSCHEMAPARSER_NATIVE="0")
    assert off.stdout.split("\n", 1) == ["torch", "NNSCHEMAPARSER_NATIVE is off\n"]


def test_asking_for_the_kernel_where_it_is_off_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("NNSCHEMAPARSER_NATIVE", "0")
    with pytest.raises(RuntimeError, match="engine='torch'"):
        Summariser(native.ENGINE)
    with pytest.raises(ValueError, match="expected"):
        Summariser("fast")
    assert Summariser().engine == "torch"


@needs_kernel
def test_a_store_records_each_commits_engine_and_refuses_an_unknown_one(tmp_path, monkeypatch):
    assert native.ENGINE in STATISTICS_ENGINES
    _, schema = blocks()
    path = tmp_path / "s"
    capture_dataset(schema, inputs(4), path, block_size=2, progress=False)
    monkeypatch.setenv("NNSCHEMAPARSER_NATIVE", "0")
    capture_dataset(schema, inputs(6), path, block_size=2, progress=False)  # resumes: inputs 4 and 5
    store = TraceStore(path)
    assert store.statistics_engines == {native.ENGINE: 4, "torch": 2}
    steps = store.steps
    assert len(steps[steps["sample"] == 0]) == len(steps[steps["sample"] == 5]) > 0
    commit = sorted((path / "commits").glob("unit-*.json"))[0]
    document = json.loads(commit.read_text())
    assert document["statistics"] == native.ENGINE
    document["statistics"] = "guesswork"
    commit.write_text(json.dumps(document))
    with pytest.raises(MalformedFileError, match="'guesswork' is not an engine"):
        TraceStore(path)
    del document["statistics"]  # a commit written before engines were recorded: torch's reductions
    commit.write_text(json.dumps(document))
    assert TraceStore(path).statistics_engines == {"torch": 4, native.ENGINE: 2}
