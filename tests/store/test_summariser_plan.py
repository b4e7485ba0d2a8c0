"""The store's Summariser reuses the previous input's plan only while the values fall the same way, and a
reused plan gives the figures a fresh one gives, bit for bit."""

import math

import numpy as np
import pytest
import torch

from nnschemaparser.store import native
from nnschemaparser.store.statistics import SMALL, ColumnReads, Summariser, summarise

# each test runs with torch's reductions and with the C kernel (where this machine builds it)
ENGINES = ["torch", pytest.param(native.ENGINE, marks=pytest.mark.skipif(
    native.kernel() is None, reason=f"the statistics kernel is not built here: {native.problem()}"))]
# what only torch's stacked groups care about: the kernel reads a tensor's elements whatever its shape
_SHAPE_ONLY = {"a shape changes, same count"}


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(p == q or (isinstance(p, float) and isinstance(q, float) and math.isnan(p)
                                            and math.isnan(q)) for p, q in zip(x, y)) for x, y in zip(a, b))


def _values(seed: int) -> list:
    """An input's values as a capture holds them: repeats, views, small and large tensors, odd ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 16, generator=g)
    h = torch.randn(2, 8, 8, generator=g)
    weights = torch.softmax(torch.randn(3, 6, 6, generator=g), -1).masked_fill(torch.eye(6, dtype=torch.bool), 0.0)
    mask = torch.full((6, 6), torch.finfo(torch.float32).min)
    big = torch.randn(SMALL + 5, generator=g)
    holes = torch.randn(5, 5, generator=g)
    holes[1, 2], holes[3, 3] = float("nan"), float("inf")
    return [torch.randint(0, 9, (4,), generator=g), x, x.view(64), x, h, h.transpose(1, 2), weights, mask, big,
            big[: SMALL], holes, torch.zeros(0, 3), None, 3.5, torch.randn(3, generator=g).to(torch.bfloat16),
            torch.randn(4, 16, generator=g), x.double()]


def _check(history: list, values: list, engine: str, replan: bool = True) -> Summariser:
    summariser = Summariser(engine)
    for earlier in history:
        summariser(earlier)
    before = summariser.plan
    got = summariser(values).rows()
    assert _same(got, summarise(values, engine)), "a reused plan differs from a fresh one"
    if replan:
        assert summariser.plan is not before, "the values fell another way, but the old plan was kept"
    return summariser


@pytest.mark.parametrize("engine", ENGINES)
def test_inputs_run_alike_reuse_the_plan_and_give_fresh_figures(engine):
    summariser = Summariser(engine)
    assert summariser.engine == engine
    summariser(_values(0))
    plan = summariser.plan
    for seed in (1, 2, 3):
        values = _values(seed)
        assert _same(summariser(values).rows(), summarise(values, engine))
        assert summariser.plan is plan  # nothing changed in how the values fall: planned once
        assert plan._checked is None  # the plan holds no input's values between inputs, whatever the engine
    rows = summarise(_values(4), engine)
    assert rows[2] == rows[1] and rows[3] == rows[1]  # a view and a repeat share the first's figures
    assert rows[10][6:8] == [1, 1] and rows[6][8] > 0 and math.isfinite(rows[7][0])  # NaN, inf, zeros, mask
    assert rows[12][6] is None and rows[13][6] is None and rows[11][4] == 0.0


# one change each from an input's values as `_values` makes them
CHANGES = {
    "a repeat becomes another object": lambda v: v.__setitem__(3, v[1].clone()),
    "two objects become one": lambda v: v.__setitem__(15, v[1]),
    "a repeat becomes another value's repeat": lambda v: v.__setitem__(3, v[4]),
    "a view becomes a copy": lambda v: v.__setitem__(2, v[1].clone().view(64)),
    "a copy becomes a view of an earlier value": lambda v: v.__setitem__(15, v[1].view(4, 16)),
    "a dtype changes": lambda v: v.__setitem__(15, v[15].double()),
    "a shape changes, same count": lambda v: v.__setitem__(15, v[15].reshape(16, 4)),
    "a shape changes in a group": lambda v: v.__setitem__(4, torch.randn(2, 8, 9)),
    "a large tensor changes shape": lambda v: v.__setitem__(8, torch.randn(SMALL + 9)),
    "an empty tensor fills": lambda v: v.__setitem__(11, torch.ones(2, 3)),
    "a tensor becomes None": lambda v: v.__setitem__(4, None),
    "None becomes a tensor": lambda v: v.__setitem__(12, torch.ones(3)),
    "a tensor requires grad": lambda v: v.__setitem__(15, v[15].clone().requires_grad_()),
    "a tensor becomes sparse": lambda v: v.__setitem__(15, v[15].to_sparse()),
    "a tensor becomes meta": lambda v: v.__setitem__(15, v[15].to("meta")),
    "a tensor becomes a CSR matrix": lambda v: v.__setitem__(15, v[15].to_sparse_csr()),
    "a view becomes sparse": lambda v: v.__setitem__(5, v[5].contiguous().to_sparse()),
    "a tensor becomes mkldnn": lambda v: v.__setitem__(15, v[15].to_mkldnn()),
    "a tensor becomes a negated view": lambda v: v.__setitem__(15, torch._neg_view(v[15])),
    "a view becomes a negated view": lambda v: v.__setitem__(2, torch._neg_view(v[1]).view(64)),
    "a view loses its contiguity": lambda v: v.__setitem__(2, v[1].t()),
    "one value fewer": lambda v: v.pop(),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_value_that_falls_another_way_makes_a_new_plan(engine):
    base = _values(0)
    changes = CHANGES
    for what, change in changes.items():
        values = _values(5)
        change(values)
        summariser = _check([base, _values(1)], values, engine, replan=engine == "torch" or what not in _SHAPE_ONLY)
        assert summariser.plan.matches(values), what


@pytest.mark.parametrize("engine", ENGINES)
def test_figures_are_numpy_columns_with_counts_missing_only_where_nothing_was_summarised(engine):
    values = _values(0)
    figures = Summariser(engine)(values)
    assert figures.table.shape == (len(values), 9) and figures.table.dtype == np.float64
    assert figures.counted.tolist() == [v is not None and not isinstance(v, float) for v in values]
    assert figures.numels.tolist() == [v.numel() if isinstance(v, torch.Tensor) else -1 for v in values]
    if engine == "torch":  # torch's own norm, in float32
        assert figures.l2(1) == float(torch.linalg.vector_norm(values[1]))
    else:  # the kernel's float64 sum of squares
        assert math.isclose(figures.l2(1), float(torch.linalg.vector_norm(values[1].double())), rel_tol=1e-14)


@pytest.mark.skipif(native.kernel() is None, reason=f"the statistics kernel is not built here: {native.problem()}")
def test_the_kernel_reads_only_values_whose_layout_was_checked():
    """The C code reads memory by address: values the plan did not check just before are checked first, and
    values that fall another way give None (a new plan), never a read of float64 memory as float32."""
    summariser = Summariser(native.ENGINE)
    summariser(_values(0))
    plan = summariser.plan
    other = _values(1)
    other[15] = other[15].double()
    assert plan.kernel_figures(other, summariser.kernel) is None
    fine = _values(2)
    assert _same(plan.kernel_figures(fine, summariser.kernel).rows(), summarise(fine, native.ENGINE))
    assert plan._checked is None  # the values are not held after the figures


def _dtypes(values: list) -> list:
    return [v.dtype if isinstance(v, torch.Tensor) else None for v in values]


def _each_change_gets_a_new_plan(engine, reads, new_plan_expected):
    """Each change of CHANGES (but a grad flag: outside what `dtypes=` promises), told through `reads(values)`,
    gives a fresh plan's figures, and a new plan where `new_plan_expected(what)`; returns the base values."""
    base = _values(0)
    for what, change in CHANGES.items():
        if what == "a tensor requires grad":
            continue
        values = _values(5)
        change(values)
        summariser = Summariser(engine)
        summariser(base, dtypes=reads(base))
        before = summariser.plan
        assert _same(summariser(values, dtypes=reads(values)).rows(), summarise(values, engine)), what
        if new_plan_expected(what):
            assert summariser.plan is not before, what
    return base


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("engine", ENGINES)
def test_the_callers_dtypes_stand_in_for_the_plans_reads(engine):
    """`dtypes=` (a logged input's columns: none of its values requires grad) replaces the plan check's reads of
    the dtypes and grad flags: each change still makes a new plan, and the figures are a fresh plan's."""
    base = _each_change_gets_a_new_plan(engine, _dtypes, lambda what: engine == "torch" or what not in _SHAPE_ONLY)
    summariser = Summariser(engine)
    summariser(base, dtypes=_dtypes(base))
    plan, again = summariser.plan, _values(1)
    assert _same(summariser(again, dtypes=_dtypes(again)).rows(), summarise(again, engine))
    assert summariser.plan is plan
    changed = _dtypes(again)
    changed[1] = torch.float64  # what the caller says is what is compared
    assert not plan.matches(again, changed)


@pytest.mark.parametrize("engine", ENGINES)
def test_views_whose_strides_change_are_read_with_their_own_strides(engine):
    """A view that stays a view of the same shape with other strides (the kernel's sizes and strides of the last
    input are reused only while they repeat) gives its own figures."""
    g = torch.Generator().manual_seed(7)
    first = torch.randn(16, 4, generator=g)
    second = torch.randn(4, 32, generator=g)
    summariser = Summariser(engine)
    a = [first, first.t(), torch.randn(3, generator=g)]
    summariser(a)
    plan = summariser.plan
    b = [torch.randn(16, 4, generator=g), second[:, ::2], torch.randn(3, generator=g)]  # strides (32, 2), not (1, 4)
    assert not b[1].is_contiguous() and b[1].shape == a[1].shape and b[1].stride() != a[1].stride()
    got = summariser(b).rows()
    assert _same(got, summarise(b, engine)) and summariser.plan is plan
    if engine != "torch":  # the kernel's figures of a view are its contiguous copy's (torch's depend on the group)
        assert got[1] == summarise([b[1].contiguous()], engine)[0]
    c = [first * 2, (first * 2).t(), torch.randn(3, generator=g)]
    assert _same(summariser(c).rows(), summarise(c, engine)) and summariser.plan is plan


@pytest.mark.parametrize("engine", ENGINES)
def test_values_at_one_address_with_other_counts_keep_the_plan(engine):
    """Two contiguous values at one address with other element counts (a flat tensor and its prefix) are told
    apart by their counts: the plan holds, and a value that starts sharing another's whole key makes a new one."""
    g = torch.Generator().manual_seed(8)

    def values(seed):
        x = torch.randn(64, generator=torch.Generator().manual_seed(seed))
        return [x, x[:32], torch.randn(5, generator=g)]

    summariser = Summariser(engine)
    summariser(values(0))
    plan = summariser.plan
    for seed in (1, 2):
        v = values(seed)
        assert _same(summariser(v).rows(), summarise(v, engine)) and summariser.plan is plan
    x = torch.randn(64, generator=g)
    same = [x, x.view(8, 8).reshape(64)[:64], torch.randn(5, generator=g)]  # now one key: a view of the first
    assert _same(summariser(same).rows(), summarise(same, engine))
    if engine != "torch":
        assert summariser.plan is not plan



def _reads(values: list) -> ColumnReads:
    return ColumnReads(_dtypes(values), [tuple(v.shape) if isinstance(v, torch.Tensor) and not v.is_sparse_csr else ()
                                         for v in values])


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize("engine", ENGINES)
def test_the_callers_shapes_stand_in_for_the_element_counts(engine):
    """`dtypes=ColumnReads(dtypes, shapes)` (what the store's logged columns hand over): the shapes are compared
    instead of reading the element counts; each change still makes a new plan (a shape that changes with the
    same count too, the shapes being compared), with a fresh plan's figures, and the views are read with the
    caller's sizes."""
    base = _each_change_gets_a_new_plan(engine, _reads, lambda what: True)
    summariser = Summariser(engine)
    summariser(base, dtypes=_reads(base))
    plan = summariser.plan
    for seed in (1, 2):
        again = _values(seed)
        assert _same(summariser(again, dtypes=_reads(again)).rows(), summarise(again, engine))
        assert summariser.plan is plan
    again = _values(3)
    reads = _reads(again)
    assert plan.matches(again, reads, reads.shapes)
    reads.shapes[8] = (SMALL + 6,)  # what the caller says is what is compared: the large tensor's count moved
    assert not plan.matches(again, reads, reads.shapes)
    assert plan.matches(again, reads)  # without shapes, the counts are read
