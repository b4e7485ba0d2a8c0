"""Nothing runs in the dark: a module the forward reaches without it being a sub-module (a dict or
list attribute, a module-level instance or registry, a module built per call) runs as the real
module, and `coverage()`, `skipped` and a watched run's coverage say so, naming its class, where
the schema called it (block, file:line) and how it was held. A module held as a plain attribute,
set past registration (`object.__setattr__`), has a block and runs interpreted:
`tests/parser/test_held_modules.py`."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run

REGISTRY = {"silu": nn.SiLU()}  # a module-level registry of module instances
SHARED_NORM = nn.LayerNorm(4)  # a module-level module instance


class _Glow(nn.Module):
    """A class that appears in no parsed tree: only reached through a dict attribute."""

    def forward(self, x):
        return x * torch.sigmoid(x)


class HeldInDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.table = {"act": _Glow()}

    def forward(self, x):
        return self.table["act"](self.fc(x))


class HeldInList(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fns = [nn.Tanh()]

    def forward(self, x):
        return self.fns[0](self.fc(x))


class FromRegistry(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = "silu"

    def forward(self, x):
        return REGISTRY[self.act](self.fc(x))


class FromGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return SHARED_NORM(self.fc(x))


class BuiltPerCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return nn.Hardswish()(self.fc(x))


CASES = [
    (HeldInDict, "_Glow", "held in the dict attribute self.table['act']"),
    (HeldInList, "Tanh", "held in the list attribute self.fns[0]"),
    (FromRegistry, "SiLU", f"held in the module-level dict {__name__}.REGISTRY['silu']"),
    (FromGlobal, "LayerNorm", f"the module-level global {__name__}.SHARED_NORM"),
    (BuiltPerCall, "Hardswish", "made at run time"),
]


@pytest.mark.parametrize("cls, class_name, how", CASES, ids=[case[0].__name__ for case in CASES])
def test_a_module_that_is_no_sub_module_is_reported_with_its_class_place_and_how_it_was_held(cls, class_name, how):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    frame = schema.coverage()
    assert len(frame) == 1, frame.to_string()
    row = frame.iloc[0]
    assert row["module"] is None and row["module_type"] == class_name and row["kind"] == "module"
    assert row["callee"] == f"{class_name}.forward" and row["calls"] == 1 and row["phase"] == "forward"
    line = cls.forward.__code__.co_firstlineno + 1
    assert row["block"] == cls.__name__ and row["location"].endswith(f"{__file__}:{line}")
    assert "not a sub-module" in row["reason"] and how in row["reason"]
    assert f"reached from {cls.__name__} at {__file__}:{line}" in row["reason"]
    assert schema.skipped == {f"<{class_name} from {cls.__name__}>": row["reason"]}
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))
    watched = capture_run(schema, {"x": x}, coverage=True)
    assert torch.equal(watched.outputs[0], model(x))
    assert list(watched.coverage()["module_type"]) == [class_name]


def test_a_module_class_outside_the_tree_is_watched_and_so_are_the_modules_its_forward_calls():
    class Outer(nn.Module):  # no sub-module either: built per call, calls a module of its own
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x).relu()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            torch.manual_seed(1)
            return Outer()(self.fc(x))

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    rows = {row["module_type"].rsplit(".", 1)[-1]: row for row in schema.coverage().to_dict("records")}
    assert set(rows) == {"Outer", "Linear"}  # each class that ran live is named, none a sub-module
    assert rows["Outer"]["via"] == "" and rows["Linear"]["via"].endswith("Outer.forward")
    assert all(row["module"] is None and row["calls"] == 1 for row in rows.values())
    assert len(schema.skipped) == 2
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))


_namespace: dict = {}
exec("def forward(self, x):\n    return x * 3\n", _namespace)  # a forward with no source to lower


class CallsNoForward(nn.Module):
    """kornia's containers, in short: skipped, and its `__call__` does the work without `forward`."""

    forward = _namespace["forward"]

    def __call__(self, x):
        return x * 3


class HoldsSkipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.container = CallsNoForward()
        self.scripted = torch.jit.script(nn.Linear(4, 4))

    def forward(self, x, flag: bool = False):
        x = self.container(self.fc(x))
        if flag:  # not taken on the parse run
            x = self.scripted(x)
        return x


def test_every_region_skipped_lists_is_in_coverage_called_or_not():
    torch.manual_seed(0)
    model = HoldsSkipped().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert set(schema.skipped) == {"container", "scripted"}
    frame = schema.coverage()
    assert set(frame["module"]) == set(schema.skipped)  # the two agree
    rows = {row["module"]: row for row in frame.to_dict("records")}
    assert rows["container"]["calls"] == 1 and rows["container"]["reason"].startswith("skipped: ")
    assert rows["container"]["location"].endswith(f":{HoldsSkipped.forward.__code__.co_firstlineno + 1}")
    assert rows["scripted"]["calls"] == 0 and "no call of it was seen at parse time" in rows["scripted"]["reason"]
    watched = capture_run(schema, {"x": x, "flag": True}, coverage=True)
    assert torch.equal(watched.outputs[0], model(x, True))
    assert {row["module"]: row["calls"] for row in watched.coverage().to_dict("records")} == \
        {"container": 1, "scripted": 1}


# --- what runs during backward ----------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Recomputed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.block = _Block()
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, x, use_reentrant=self.reentrant).sum()


def _grads(model):
    return {name: param.grad.clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize("reentrant", [True, False])
def test_what_a_checkpoint_recomputes_in_backward_is_reported_as_phase_backward(reentrant):
    torch.manual_seed(0)
    model = Recomputed(reentrant)
    x = torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert all(param.grad is None for param in model.parameters())  # the parse's backward left no trace
    frame = schema.coverage()
    assert len(frame) == 1, frame.to_string()
    row = frame.iloc[0]
    assert row["phase"] == "backward" and row["module"] == "block" and row["module_type"] == "_Block"
    assert row["calls"] == 1 and "torch.utils.checkpoint" in row["via"]
    assert row["reason"].startswith("ran during backward: torch.utils.checkpoint")
    assert schema.skipped == {"block (backward)": row["reason"]}
    # the gradients stay eager's
    ref = model(x.clone().requires_grad_())
    ref.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    out = SchemaInterpreter().run(block=schema, scope={"x": x.clone().requires_grad_()})[0]
    out.backward()
    assert torch.equal(out, ref) and all(torch.equal(expected[k], v) for k, v in _grads(model).items())


def test_a_watched_run_reports_what_a_later_backward_pass_runs_and_adds_up_passes():
    torch.manual_seed(0)
    model = Recomputed(False)
    x = torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    record = capture_run(schema, {"x": x.clone().requires_grad_()}, coverage=True)
    assert record.coverage().empty  # the forward ran interpreted
    record.outputs[0].backward(retain_graph=True)
    frame = record.coverage()
    assert list(frame["module"]) == ["block"] and list(frame["phase"]) == ["backward"] and list(frame["calls"]) == [1]
    record.outputs[0].backward()
    assert list(record.coverage()["calls"]) == [2]
    plain = capture_run(schema, {"x": x.clone().requires_grad_()})  # unwatched: nothing armed
    plain.outputs[0].backward()
    assert sys.gettrace() is None


def test_a_parse_that_cannot_watch_backward_says_so_in_coverage():
    from tests.support.live_call_models import apply_twice

    class RefusesGrad(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            if torch.is_grad_enabled():
                raise RuntimeError("this forward runs under no_grad only")
            return apply_twice(self.fc, x)  # a helper: the parse would watch a backward pass

    torch.manual_seed(0)
    model = RefusesGrad().eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    frame = schema.coverage()
    row = frame[frame["kind"] == "unwatched"].iloc[0]
    assert row["phase"] == "backward" and "could not watch a backward pass" in row["reason"]
    assert "this forward runs under no_grad only" in row["reason"] and "capture_run(..., coverage=True)" in row["reason"]
    assert schema.skipped == {}  # a note, not a region that ran live


def test_torchdiffeq_modules_built_inside_odeint_and_its_adjoint_are_reported():
    torchdiffeq = pytest.importorskip("torchdiffeq")

    class ODEFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, t, y):
            return torch.tanh(self.lin(y))

    class Adjoint(nn.Module):
        def __init__(self):
            super().__init__()
            self.func = ODEFunc()

        def forward(self, x):
            times = torch.tensor([0.0, 1.0])
            return torchdiffeq.odeint_adjoint(self.func, x, times, method="rk4", options=dict(step_size=0.5))[-1].sum()

    torch.manual_seed(0)
    model = Adjoint()
    x = torch.randn(3, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    frame = schema.coverage()
    forward = frame[frame["phase"] == "forward"]
    assert list(forward["module_type"]) == ["_PerturbFunc"] and forward["module"].isna().all()
    assert "odeint_adjoint" in forward.iloc[0]["reason"] and forward.iloc[0]["block"] == "Adjoint"
    backward = frame[frame["phase"] == "backward"]
    assert {"_PerturbFunc", "_ReverseFunc", "_TupleFunc", "ODEFunc"} <= {t.rsplit(".", 1)[-1] for t in
                                                                         backward["module_type"]}
    assert "func" in set(backward["module"])  # the ODE function itself, run again by the adjoint solve
    assert "<_PerturbFunc from Adjoint>" in schema.skipped and "func (backward)" in schema.skipped
    ref = model(x.clone().requires_grad_())
    ref.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    out = SchemaInterpreter().run(block=schema, scope={"x": x.clone().requires_grad_()})[0]
    out.backward()
    assert torch.equal(out, ref) and all(torch.equal(expected[k], v) for k, v in _grads(model).items())


# --- decorators: one wrapper code, many uses ----------------------------------------------------------


def test_a_dispatching_decorator_is_seen_on_each_instance_that_shares_its_wrapper_code():
    from tests.support.live_call_models import Dispatched

    class TwoOfThem(nn.Module):
        def __init__(self):
            super().__init__()
            self.plain = Dispatched("plain")  # runs its schema
            self.fast = Dispatched("fast")  # the decorator dispatches elsewhere: live

        def forward(self, x):
            return self.fast(self.plain(x))

    torch.manual_seed(0)
    model = TwoOfThem().eval()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    frame = schema.coverage()
    dispatch = frame[frame["kind"] == "dispatch"]
    assert list(dispatch["module"]) == ["fast"] and list(dispatch["calls"]) == [1]
    assert "the decorator of Dispatched.forward" in dispatch.iloc[0]["reason"]
    assert "fast" in schema.skipped and "plain" not in schema.skipped
    assert torch.equal(SchemaInterpreter().run(block=schema, scope={"x": x})[0], model(x))



# A decorator returning a value it keeps (vit-pytorch's `singleton`): tests/runtime/test_kept_value_decorators.py
