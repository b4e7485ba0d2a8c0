"""Every global, dotted global, class attribute and closure name a forward reads has CPython's
semantics at the moment of the read: a rebinding made while the forward runs (by a helper it calls,
by the forward itself, between two loop iterations, by a parent before it calls a child) is seen by
every later read, in plain runs, captures and stepped runs alike. Before, the generated code read
each name once when the function was entered, and a run that took another path than the parse's
gave a wrong result with nothing skipped (the repro `repro_rebound_during_forward.py` of issue 38).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run

MODE = 1
ACT = torch.relu
LIB = types.ModuleType("nnsp_test_names_lib")
LIB.FLAG = False
sys.modules[LIB.__name__] = LIB
import nnsp_test_names_lib  # noqa: E402  (the module object above, imported as model code imports a library)

_THIS = sys.modules[__name__]


def set_mode(value):
    _THIS.MODE = value


def use_gelu():
    _THIS.ACT = torch.nn.functional.gelu


def flip(value):
    LIB.FLAG = value


def define_late(value):
    _THIS.LATE = value


class RebindsOnABranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            set_mode(2)
        return x * MODE


class RebindsInALoop(nn.Module):
    def forward(self, x):
        out = x
        for _ in range(3):
            out = out * MODE
            if x.sum() > 0:
                set_mode(MODE + 2)
        return out


class ReadsADottedGlobal(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            flip(True)
        return x + 1 if nnsp_test_names_lib.FLAG else x - 1


class AssignsItsClassAttribute(nn.Module):
    FACTOR = 2.0

    def forward(self, x):
        if x.sum() > 0:
            AssignsItsClassAttribute.FACTOR = 4.0
        return x * AssignsItsClassAttribute.FACTOR


class SwapsAGlobalFunction(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            use_gelu()
        return ACT(x - 2)


class Rotary(nn.Module):
    """A class-level cache the forward rebuilds when the length or the dtype changes."""

    _cache = None

    def forward(self, x):
        n = x.shape[-1]
        cache = Rotary._cache
        if cache is None or cache.shape[-1] < n or cache.dtype != x.dtype:
            Rotary._cache = torch.arange(n, dtype=x.dtype).mul(0.1).cos()
        return x * Rotary._cache[:n]


class Child(nn.Module):
    def forward(self, x):
        return x * MODE


class ParentRebindsThenCallsChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Child()

    def forward(self, x):
        if x.sum() > 0:
            set_mode(3)
        return self.child(x)


class ReadsAGlobalDefinedLater(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            define_late(7.0)
            return x * LATE  # noqa: F821  (defined by define_late, after the parse)
        return x


class ReadsLateOnly(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * LATE  # noqa: F821
        return x


class CatchesANameError(nn.Module):
    def forward(self, x):
        try:
            scale = GONE  # noqa: F821  (deleted after the parse)
        except NameError:
            scale = -1.0
        return x * scale


def make_closure_model():
    factor = 1.0

    def rebind(value):
        nonlocal factor
        factor = value

    class ReadsACell(nn.Module):
        def forward(self, x):
            out = x * factor
            if x.sum() > 0:
                rebind(6.0)
            return out + factor

    return ReadsACell


def _parse(model, x):
    return NNParser.parse_model(model=model, inputs_tensors_values={"x": x})


def _plain(schema, x):
    return SchemaInterpreter().call(schema, x)


def _captured(schema, x):
    return capture_run(schema, {"x": x}).outputs[0]


def _stepped(schema, x):
    interpreter = SchemaInterpreter()
    steps = interpreter.step_run(schema, {"x": x})
    for _ in steps:
        pass
    return interpreter.step_outputs[0]


RUNS = {"run": _plain, "capture_run": _captured, "step_run": _stepped}


def _reset_module_state():
    _THIS.MODE = 1
    _THIS.ACT = torch.relu
    LIB.FLAG = False
    AssignsItsClassAttribute.FACTOR = 2.0
    _THIS.__dict__.pop("LATE", None)


@pytest.fixture(autouse=True)
def _module_state():
    _reset_module_state()
    yield
    _reset_module_state()


def _check(model, parse_input, x, run, reset=_reset_module_state):
    """Parse on `parse_input` (a path that rebinds nothing), then run on `x` (a path that rebinds):
    the schema's result equals eager's, bit for bit, and nothing was skipped."""
    reset()
    schema = _parse(model, parse_input)
    assert schema.skipped == {} and schema.skip_reason is None
    reset()
    expected = model(x)
    reset()
    got = RUNS[run](schema, x)
    assert got.dtype == expected.dtype and torch.equal(got, expected), (got, expected)
    return schema


@pytest.mark.parametrize("run", RUNS)
def test_a_global_rebound_by_a_helper_on_a_branch_the_parse_did_not_take_is_read_anew(run):
    _check(RebindsOnABranch(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_global_rebound_on_the_branch_the_parse_took_is_interpreted_not_skipped(run):
    _check(RebindsOnABranch(), torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_global_read_in_a_loop_sees_the_rebinding_between_iterations(run):
    _check(RebindsInALoop(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_dotted_global_rebound_mid_forward_is_followed(run):
    _check(ReadsADottedGlobal(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_class_attribute_the_forward_assigns_is_read_anew(run):
    _check(AssignsItsClassAttribute(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_global_function_swapped_mid_forward_is_called_as_swapped(run):
    _check(SwapsAGlobalFunction(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_parent_rebinding_is_seen_by_the_child_it_calls_next(run):
    _check(ParentRebindsThenCallsChild(), -torch.ones(2), torch.ones(2), run)


@pytest.mark.parametrize("run", RUNS)
def test_a_closure_cell_rebound_mid_forward_is_read_anew(run):
    cls = make_closure_model()
    cell = dict(zip(cls.forward.__code__.co_freevars, cls.forward.__closure__))["factor"]

    def reset():
        cell.cell_contents = 1.0

    _check(cls(), -torch.ones(2), torch.ones(2), run, reset)


@pytest.mark.parametrize("run", RUNS)
def test_a_class_level_cache_rebuilt_for_a_float64_input_gives_the_float64_result(run):
    """The realistic form: the user ran the model in float32 before parsing, so the cache is a
    float32 tensor; a float64 run rebuilds it inside the forward and multiplies by the new one. Read
    once at entry, the stale float32 cache gave a float64 result off by about 1e-8."""
    model = Rotary()

    def reset():
        Rotary._cache = None
        model(torch.ones(2, 4))

    reset()
    schema = _parse(model, torch.ones(2, 4))
    assert schema.skipped == {}
    x = torch.ones(2, 4, dtype=torch.float64)
    reset()
    expected = model(x)
    reset()
    got = RUNS[run](schema, x)
    assert got.dtype == torch.float64 and torch.equal(got, expected)


@pytest.mark.parametrize("run", RUNS)
def test_a_global_defined_after_the_parse_is_found_as_eager_finds_it(run):
    """The parse input never defines `LATE` (the lowering found no such name); a run whose helper
    defines it reads it, as eager does, instead of raising the NameError frozen at parse time."""
    model = ReadsAGlobalDefinedLater()
    schema = _parse(model, -torch.ones(2))
    _reset_module_state()
    expected = model(torch.ones(2))
    _reset_module_state()
    assert torch.equal(RUNS[run](schema, torch.ones(2)), expected)
    _reset_module_state()  # LATE undefined: the NameError eager raises, at the line that reads it
    model = ReadsLateOnly()
    schema = _parse(model, -torch.ones(2))
    with pytest.raises(NameError) as eager:
        model(torch.ones(2))
    with pytest.raises(NameError) as info:
        RUNS[run](schema, torch.ones(2))
    assert str(info.value) == str(eager.value) == "name 'LATE' is not defined"


@pytest.mark.parametrize("run", RUNS)
def test_a_global_deleted_after_the_parse_is_a_name_error_the_forwards_own_handler_catches(run):
    _THIS.GONE = 2.0
    try:
        model = CatchesANameError()
        schema = _parse(model, torch.ones(2))
        assert torch.equal(RUNS[run](schema, torch.ones(2)), torch.full((2,), 2.0))
    finally:
        del _THIS.GONE
    assert torch.equal(model(torch.ones(2)), -torch.ones(2))
    assert torch.equal(RUNS[run](schema, torch.ones(2)), -torch.ones(2))
