"""diverge's per-row error in C (traces/_diverge_errors.c, issue 39 point 5) gives the very float the
torch path of `diverge_bounds.relative_error` gives, the sign of a zero included, on random rows of
every kind the common case takes and on real GPT-2 and Llama bfloat16 reports; everything else is
handed back to the torch path."""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nnschemaparser import diverge
from nnschemaparser.traces import diverge_native
from nnschemaparser.traces.diverge_bounds import Scratch, local_error, relative_error
from tests.support.diverge_models import gpt2, llama

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")
needs_kernel = pytest.mark.skipif(not diverge_native.available(),
                                  reason=f"the diverge errors kernel is not built here: {diverge_native.problem()}")
ROOT = Path(__file__).resolve().parents[2]


def _torch_path(monkeypatch, fn, *args, **kwargs) -> float:
    monkeypatch.setenv("NNSCHEMAPARSER_NATIVE", "0")
    try:
        return fn(*args, **kwargs)
    finally:
        monkeypatch.delenv("NNSCHEMAPARSER_NATIVE")


def _same_float(a: float, b: float) -> bool:
    return (a != a and b != b) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))


def _rows(seed: int):
    """Random (x, ref) pairs: scales from subnormal to near float32's largest, zeros of both signs,
    values equal to the reference, x in float32, bfloat16 and float16."""
    g = torch.Generator().manual_seed(seed)
    for i in range(240):
        n = int(torch.randint(1, 700, (1,), generator=g))
        scale = 10.0 ** float(torch.randint(-44, 38, (1,), generator=g))
        ref = torch.randn(n, generator=g) * scale
        x = ref + torch.randn(n, generator=g) * ref.abs().max() * 10.0 ** float(torch.randint(-8, 0, (1,), generator=g))
        if i % 4 == 1:
            x[::3] = ref[::3]
        if i % 5 == 2:
            ref[::4], x[::7] = 0.0, -0.0
            ref[1::9] = -0.0
        if i % 6 == 3:
            x = ref.clone()  # every quotient +0: the torch path answers -0.0
        if i % 6 == 4:
            ref = ref.abs()
            x = ref.clone()
            x[ref == 0] = -0.0
            ref[0] = 0.0
            x[0] = -0.0
        if i % 12 == 5:
            ref = torch.randn(n, generator=g) * 1e-40  # subnormal
            x = ref + torch.randn(n, generator=g) * 1e-42
        yield x.to((torch.float32, torch.bfloat16, torch.float16)[i % 3]), ref.view(1, n)


@needs_kernel
def test_random_rows_give_the_torch_paths_float_bit_for_bit(monkeypatch):
    taken = 0
    for x, ref in _rows(0):
        x = x.view(ref.shape)
        for clamp in (None, x.dtype):
            for scratch in (None, Scratch()):
                expected = _torch_path(monkeypatch, relative_error, x, ref, clamp, scratch=scratch)
                got = relative_error(x, ref, clamp, scratch=scratch)
                assert _same_float(got, expected), (x.dtype, clamp, got, expected)
        taken += diverge_native.error(x, ref, 1.7e38) is not None
        if x.dtype != torch.float32:
            expected = _torch_path(monkeypatch, local_error, x, ref)
            assert _same_float(local_error(x, ref), expected)
    assert taken > 200  # the kernel answered most of them (the rest: an inf from an fp16 overflow, mixed zeros)


@needs_kernel
def test_zero_answers_keep_the_torch_paths_sign():
    ref = torch.tensor([1.0, -2.0, 0.0, 3.0])
    plus = diverge_native.error(ref.clone(), ref, math.inf)  # every quotient +0: max(-min, max) is -0.0
    assert plus == 0.0 and math.copysign(1.0, plus) == -1.0
    x = ref.clone()
    x[2] = -0.0  # -0 - +0 is -0: zeros of both signs, whose answer is aminmax's choice: the torch path's
    assert diverge_native.error(x, ref, math.inf) is None
    assert diverge_native.error(torch.tensor([-0.0, -0.0]), torch.tensor([0.0, 0.0]), math.inf) is None  # 0 / 0


@needs_kernel
def test_what_the_common_case_does_not_cover_goes_back_to_the_torch_path(monkeypatch):
    ref, x = torch.randn(6, 5), torch.randn(6, 5)
    assert diverge_native.error(x, ref, math.inf) is not None
    for bad_ref, bad_x, limit in [
            (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]), math.inf),  # NaN in ref
            (torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 2.0]), math.inf),  # inf in ref
            (torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")]), math.inf),  # NaN in x
            (torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("-inf")]), math.inf),  # inf in x
            (torch.tensor([1.0, 3e38]), torch.tensor([1.0, -3e38]), math.inf),  # the difference overflows
            (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), 2.0),  # biggest not below the limit
            (torch.zeros(3), torch.zeros(3), math.inf),  # 0 / 0
            (ref.t(), x.t(), math.inf),  # views
            (ref.double(), x.double(), math.inf),  # float64
            (ref, x.double(), math.inf),
            (ref, x.to(torch.int32), math.inf)]:
        assert diverge_native.error(bad_x, bad_ref, limit) is None
        expected = _torch_path(monkeypatch, relative_error, bad_x, bad_ref)
        assert _same_float(relative_error(bad_x, bad_ref), expected)
    assert diverge_native.error(x.ravel()[:3], ref, math.inf) is None  # shapes differ
    assert diverge_native.error(x[:, 1:], ref.t().contiguous().t()[:, 1:], math.inf) is None  # ref's rows strided


@needs_kernel
def test_views_whose_last_dimension_is_contiguous_give_the_torch_paths_float(monkeypatch):
    g = torch.Generator().manual_seed(1)
    base_ref = torch.randn(3, 6, 5, 8, generator=g) * 100
    base_x = (base_ref + torch.randn(3, 6, 5, 8, generator=g)).to(torch.bfloat16)
    views = [lambda t: t.transpose(0, 2), lambda t: t[:, 1:4], lambda t: t[..., 2:7], lambda t: t.split(3, dim=1)[1],
             lambda t: t[..., 3:4], lambda t: t[:1].expand(4, 6, 5, 8), lambda t: t.permute(1, 0, 2, 3)[::2],
             lambda t: t.reshape(18, 5, 8).transpose(0, 1)]
    for view in views:
        ref = view(base_ref)
        assert not ref.is_contiguous()
        for dtype in (torch.bfloat16, torch.float32, torch.float16):
            value = view(base_x.to(dtype))
            got = diverge_native.error(value, ref, math.inf)
            expected = _torch_path(monkeypatch, relative_error, value, ref)
            assert got is not None and _same_float(got, expected), (value.dtype, got, expected)
            assert _same_float(relative_error(value, ref), expected)
    same = base_ref.transpose(1, 2)
    got = diverge_native.error(same.clone(), same, math.inf)  # x contiguous, ref a view: other strides
    assert got == 0.0 and math.copysign(1.0, got) == -1.0


def _counted(monkeypatch):
    calls = {"answered": 0}
    plain = diverge_native.error

    def counted(x, ref, limit):
        got = plain(x, ref, limit)
        calls["answered"] += got is not None
        return got

    monkeypatch.setattr(diverge_native, "error", counted)
    return calls


@needs_kernel
@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_bfloat16_report_is_the_same_with_and_without_the_kernel(monkeypatch, build):
    model, inputs = build(seq=16)
    other = copy.deepcopy(model).to(torch.bfloat16)
    calls = _counted(monkeypatch)
    fast = diverge(model, other, inputs).table
    assert calls["answered"] > 20  # the kernel did answer rows
    slow = _torch_path(monkeypatch, diverge, model, other, inputs).table
    assert list(fast["out_var"]) == list(slow["out_var"]) and list(fast["flagged"]) == list(slow["flagged"])
    for column in ("local_error", "carried_error", "bound"):
        a = torch.tensor(fast[column].to_numpy(dtype=float), dtype=torch.float64)
        b = torch.tensor(slow[column].to_numpy(dtype=float), dtype=torch.float64)
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()]), column
        assert torch.equal(a[~a.isnan()].signbit(), b[~b.isnan()].signbit()), column


def test_without_a_compiler_diverge_uses_torch_and_says_why(tmp_path):
    code = ("import torch; from nnschemaparser.traces import diverge_native as n; "
            "from nnschemaparser.traces.diverge_bounds import relative_error; "
            "print(n.available(), relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))); print(n.problem())")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NNSCHEMAPARSER_CACHE": str(tmp_path), "CC": str(tmp_path / "no-cc")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    first, why = done.stdout.splitlines()
    assert first == f"False {torch.tensor(0.5 / 5.0).item()}" and "no C compiler" in why
