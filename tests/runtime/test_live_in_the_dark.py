"""Nothing runs in the dark: a module the forward reaches without it being a sub-module (a dict or
list attribute, a module-level instance or registry, `object.__setattr__`, a module built per
call) runs as the real module, and `coverage()`, `skipped` and a watched run's coverage say so,
naming its class, where the schema called it (block, file:line) and how it was held."""

from __future__ import annotations

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


class SetPastRegistration(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        object.__setattr__(self, "hidden", nn.ReLU())

    def forward(self, x):
        return self.hidden(self.fc(x))


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
    (SetPastRegistration, "ReLU", "held as the plain attribute self.hidden"),
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


def test_a_module_class_outside_the_tree_is_watched_and_so_is_what_its_forward_runs_counted_once():
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
    frame = schema.coverage()
    # Outer is the region; the Linear its forward calls is inside it, not a second row
    assert list(frame["module_type"]) == ["test_a_module_class_outside_the_tree_is_watched_and_so_is_what_its_"
                                          "forward_runs_counted_once.<locals>.Outer"]
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
