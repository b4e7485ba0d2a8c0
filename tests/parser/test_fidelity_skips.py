"""Issue 14, items 7-11: what used to crash parse or skip a child now parses, runs and stays exact.

TorchScript children run live and are listed in `skipped` with the reason; a local function bound
with `__get__`, a tuple subclass whose `__iter__` raises, an uninitialised lazy module and an import
on a branch that never runs all parse without a skip, and each run equals eager bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.fidelity_models import (
    BindsLocalFunction,
    HoldsCompiled,
    HoldsLazy,
    HoldsOpaqueChild,
    HoldsScripted,
    HoldsTraced,
    ImportsLate,
    NormedBlock,
    ReturnsOpaque,
    run_every_way,
)
from nnschemaparser import NNParser, SchemaInterpreter, dump_schema
from nnschemaparser.lowering import intrinsics
from nnschemaparser.parser.equality import first_mismatch
from nnschemaparser.runtime.program import Observer, Program

REPO = Path(__file__).resolve().parents[2]


# --- 7 / 10: TorchScript children ---------------------------------------------------------------


@pytest.mark.parametrize("model_class, key, how", [(HoldsScripted, "scripted", "scripted"),
                                                   (HoldsTraced, "traced", "traced")])
def test_torchscript_child_runs_live_and_is_listed_as_skipped_with_the_reason(model_class, key, how):
    torch.manual_seed(0)
    schema, steps = run_every_way(model_class(), {"x": torch.randn(2, 4)})
    assert schema.skip_reason is None and set(schema.skipped) == {key}
    assert "TorchScript" in schema.skipped[key] and how in schema.skipped[key]
    assert schema.sub_blocks[key].sub_blocks == {}, "the compiled code's own sub-modules get no blocks"
    assert not schema.sub_blocks["pre"].skip_reason
    assert {s.block_path for s in steps} >= {"pre", "HoldsScripted" if key == "scripted" else "HoldsTraced"}


class ResidualStage(nn.Module):
    """A resnet basic block: what `torch.jit.script(resnet18())` is made of."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(out)) + x).relu()


def test_scripted_resnet_inside_a_model_is_skipped_not_a_crash():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.jit.script(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), ResidualStage(8),
                                                           ResidualStage(8), nn.AdaptiveAvgPool2d(1), nn.Flatten()))
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.backbone(x))

    torch.manual_seed(0)
    for train in (False, True):
        schema, _ = run_every_way(Wrapper().train(train), {"x": torch.randn(2, 3, 8, 8)})
        assert list(schema.skipped) == ["backbone"] and "TorchScript" in schema.skipped["backbone"]


def test_scripted_root_runs_live_with_the_reason():
    torch.manual_seed(0)
    model = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input": torch.randn(2, 4)})
    assert "TorchScript" in schema.skip_reason
    x = torch.randn(2, 4)
    assert torch.equal(SchemaInterpreter().call(schema, x), model(x))


def test_compiled_child_runs_live_and_is_listed_as_skipped_with_the_reason():
    torch.manual_seed(0)
    model = HoldsCompiled(lambda m: torch.compile(m, backend="eager"))
    schema, _ = run_every_way(model, {"x": torch.randn(2, 4)})
    assert list(schema.skipped) == ["compiled"] and "torch.compile" in schema.skipped["compiled"]
    assert "_orig_mod" in schema.skipped["compiled"]


# --- 8: functions bound with __get__, results whose __iter__ raises ---------------------------------


def test_local_function_bound_with_get_runs_as_a_bound_method():
    torch.manual_seed(0)
    schema, steps = run_every_way(BindsLocalFunction(), {"x": torch.randn(2, 4)})
    assert schema.skip_reason is None and schema.skipped == {}
    assert sum(1 for s in steps if s.block_path == "fc") == 4, "both calls of the bound function ran the schema"


def test_interpreted_function_binds_like_a_python_function():
    torch.manual_seed(0)
    model = BindsLocalFunction()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    seen = {}

    class Probe(Observer):
        def enter_function(self, fn, frame):
            seen["fn"] = fn

    observer = Probe()
    Program(schema, observer).run_root({"x": x})
    fn = seen["fn"]
    assert fn.__get__(None, type(model)) is fn, "read from the class, a function is itself"
    bound = fn.__get__(model)
    assert bound.__self__ is model and bound.__func__ is fn
    assert torch.equal(bound(x), model.fc(x) + 1.0)


def test_result_whose_iter_raises_compares_by_its_items():
    a, b = torch.ones(2), torch.ones(2)
    from tests.support.fidelity_models import Opaque

    assert first_mismatch(Opaque((a, b)), Opaque((a.clone(), b.clone()))) is None
    mismatch = first_mismatch(Opaque((a, b)), Opaque((a, b + 1)))
    assert mismatch is not None and mismatch.path == "output[1]" and "values differ" in mismatch.reason


@pytest.mark.parametrize("model_class", [ReturnsOpaque, HoldsOpaqueChild])
def test_tuple_subclass_whose_iter_raises_parses_without_a_misleading_skip(model_class):
    torch.manual_seed(0)
    model = model_class()
    x = torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None and schema.skipped == {}
    mismatch = first_mismatch(model(x), SchemaInterpreter().call(schema, x))
    assert mismatch is None, mismatch


# --- 9: lazy modules -------------------------------------------------------------------------------


def _uninitialised(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if isinstance(p, nn.parameter.UninitializedParameter)]


def test_parse_of_an_uninitialised_lazy_module_leaves_it_uninitialised():
    torch.manual_seed(0)
    model = HoldsLazy()
    hooks_before = (dict(model.lazy._forward_pre_hooks), dict(model.lazy._load_state_dict_pre_hooks),
                    dict(model.lazy._forward_pre_hooks_with_kwargs))
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": torch.randn(2, 5)})
    assert schema.skip_reason is None and schema.skipped == {}
    assert type(model.lazy) is nn.LazyLinear and model.lazy.in_features == 0
    assert _uninitialised(model) == ["lazy.weight", "lazy.bias"]
    assert (dict(model.lazy._forward_pre_hooks), dict(model.lazy._load_state_dict_pre_hooks),
            dict(model.lazy._forward_pre_hooks_with_kwargs)) == hooks_before
    assert model.lazy._initialize_hook.id in model.lazy._forward_pre_hooks
    assert schema.sub_blocks["lazy"].weights["weight"].dtype == "UninitializedParameter"
    assert schema.sub_blocks["lazy"].outputs[0].shape == (2, 3), "the resolution run saw the initialised module"


def test_lazy_module_initialises_through_the_schema_as_eager_would():
    torch.manual_seed(0)
    model = HoldsLazy()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": torch.randn(2, 5)})
    twin = HoldsLazy()
    twin.load_state_dict(model.state_dict())  # the same uninitialised module
    x = torch.randn(2, 5)
    torch.manual_seed(3)
    expected = twin(x)
    torch.manual_seed(3)
    actual = SchemaInterpreter().call(schema, x)
    assert torch.equal(expected, actual)
    assert type(model.lazy) is nn.Linear and torch.equal(model.lazy.weight, twin.lazy.weight)


LAZY_MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class HoldsLazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lazy = nn.LazyLinear(3)

        def forward(self, x):
            return self.lazy(x).relu()
''')


def test_cli_card_of_a_model_with_a_lazy_module(tmp_path):
    path = tmp_path / "lazy_models.py"
    path.write_text(LAZY_MODELS)
    done = subprocess.run([sys.executable, "-m", "nnschemaparser", f"{path}:HoldsLazy", "--input", "2,5"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "output equals eager bit for bit" in done.stdout


# --- 11: imports run when executed ----------------------------------------------------------------


def test_import_on_a_branch_that_never_runs_does_not_skip_the_child():
    torch.manual_seed(0)
    schema, steps = run_every_way(NormedBlock(), {"x": torch.randn(2, 4)})
    assert schema.skipped == {} and schema.sub_blocks["norm"].skip_reason is None
    assert any(s.block_path == "norm" for s in steps)
    assert "torch_npu_is_not_installed = import(torch_npu_is_not_installed)" in dump_schema(schema)


@pytest.mark.parametrize("which, error, message", [
    (1, ModuleNotFoundError, "No module named 'torch_npu_is_not_installed'"),
    (2, ModuleNotFoundError, "No module named 'torch_npu_is_not_installed'"),
    (3, ModuleNotFoundError, "No module named 'torch_npu_is_not_installed'"),
    (4, ImportError, "cannot import name 'name_torch_does_not_have' from 'torch'"),
    # fidelity_models is a module of the package tests.support
    (5, ImportError, "cannot import name 'sibling_that_does_not_exist' from 'tests.support'"),
])
def test_import_that_fails_raises_when_its_branch_runs_as_eager_does(which, error, message):
    model = ImportsLate()
    x = torch.randn(2)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None
    with pytest.raises(error) as eager:
        model(x, which)
    with pytest.raises(error) as interpreted:
        SchemaInterpreter().call(schema, x, which)
    assert type(interpreted.value) is type(eager.value)
    assert message in str(eager.value) and str(interpreted.value) == str(eager.value)
    assert torch.equal(SchemaInterpreter().call(schema, x, 0), model(x, 0))


def test_deferred_import_binds_what_python_binds():
    DeferredImport = intrinsics.DeferredImport
    assert DeferredImport("os.path", "")() is __import__("os")
    assert DeferredImport("os.path", "", leaf=True)() is __import__("os.path").path
    assert DeferredImport("nnschemaparser.lowering", "", attr="intrinsics")() is intrinsics
    assert DeferredImport("", "nnschemaparser.lowering", 1, "intrinsics")() is intrinsics
    assert DeferredImport("os", "") is DeferredImport("os", ""), "equal statements share one object"
    with pytest.raises(TypeError, match="needs a DeferredImport"):
        intrinsics.run_import(len)


def test_deferred_import_is_not_on_the_file_allowlist():
    from nnschemaparser.files.allowlist import callable_name

    assert callable_name(intrinsics.run_import) is None and callable_name(intrinsics.DeferredImport) is None
    assert callable_name(intrinsics.assign) == "nnschemaparser.intrinsics.assign"


def test_schema_with_a_deferred_import_runs_only_with_its_model_after_load(tmp_path):
    from nnschemaparser import SchemaRunError, load_schema, save_schema

    torch.manual_seed(0)
    model, x = NormedBlock(), torch.randn(2, 4)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    save_schema(schema, tmp_path / "normed.json")
    bound = load_schema(tmp_path / "normed.json", model=model)
    assert torch.equal(SchemaInterpreter().call(bound, x), model(x))
    model.norm.on_npu = True
    with pytest.raises(ModuleNotFoundError, match="torch_npu_is_not_installed"):
        SchemaInterpreter().call(bound, x)
    loose = load_schema(tmp_path / "normed.json")
    assert "import(torch_npu_is_not_installed)" in dump_schema(loose)
    with pytest.raises(SchemaRunError):
        SchemaInterpreter().call(loose, x)
    from nnschemaparser import ControlInstruction, OpInstruction, UnresolvedReference

    def ops(body):
        for instr in body:
            if isinstance(instr, ControlInstruction):
                yield from ops(instr.body + instr.else_body)
            elif isinstance(instr, OpInstruction):
                yield instr

    deferred = [i for i in ops(loose.sub_blocks["norm"].body) if i.display_name == "import"]
    assert len(deferred) == 1 and isinstance(deferred[0].target, UnresolvedReference)
    assert isinstance(deferred[0].args[0].value, UnresolvedReference), "a file alone never names what to import"


# --- the sweep's "skipped children" column ----------------------------------------------------------


def test_sweep_counts_skipped_children_by_cause():
    from nnschemaparser.validation.sweep import markdown_table, run_case

    namespace: dict = {"nn": nn}
    exec("class NoSource(nn.Module):\n    def forward(self, x):\n        return x * 2\n", namespace)

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            # parameter-free: the sweep's eager twin is a deepcopy, and a deep-copied ScriptModule's
            # parameters are not leaves (torch gives them no .grad), which the sweep would flag
            self.scripted = torch.jit.script(nn.Tanh())
            self.opaque = namespace["NoSource"]()  # no source to read: a limit of the project
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.opaque(self.scripted(x)))

    row = run_case("mixed", "local", Mixed, lambda m: {"x": torch.randn(2, 4)})
    assert row.status == "exact", row.detail
    assert (row.skipped_children, row.skipped_by_design) == (1, 1)
    assert "| 2 | 1 (+1 by design) |" in markdown_table([row])
    clean = run_case("clean", "local", NormedBlock, lambda m: {"x": torch.randn(2, 4)})
    assert (clean.skipped_children, clean.skipped_by_design) == (0, 0)


def test_schema_of_a_lazy_model_saves_and_loads_with_the_uninitialised_model(tmp_path):
    from nnschemaparser import load_schema, save_schema

    torch.manual_seed(0)
    model = HoldsLazy()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": torch.randn(2, 5)})
    save_schema(schema, tmp_path / "lazy.json")
    loaded = load_schema(tmp_path / "lazy.json", model=model)
    assert _uninitialised(model) == ["lazy.weight", "lazy.bias"]
    twin = HoldsLazy()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 5)
    torch.manual_seed(1)
    expected = twin(x)
    torch.manual_seed(1)
    assert torch.equal(SchemaInterpreter().call(loaded, x), expected)
