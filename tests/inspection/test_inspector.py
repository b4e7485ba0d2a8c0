"""Behaviour of ModelInspector: op names, queries, connectivity, module boundaries and the summary."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnschemaparser.inspection.inspector import ModuleContext
from nnschemaparser.inspection.inspector import ModelInspector
from tests.support.exactness import assert_same_structure
from tests.support.fixture_models import FIXTURES
from tests.support.inspection_models import WithSkippedChild, make_encoder


class MyModel(nn.Module):
    """The two-Linear model of the inspector spec."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(10, 20)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(20, 5)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu(x)
        x = self.linear2(x)
        return x


class QuickStartMLP(nn.Module):
    """The quick start's MLP: fc1, a bound-method relu in the root, fc2."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        hidden = self.fc1(x)
        activated = hidden.relu()
        return self.fc2(activated)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h = h - x
        y = h + x
        return y + self.fc(y)


class SetItem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        y[:, 0] = 0.0
        return y.relu()


class TopK(nn.Module):
    def forward(self, scores):
        values, indices = torch.topk(scores, 2, dim=-1)
        return values * 2, indices + 1


def scaled(fn, x):
    """A plain helper the schema calls as one op; the module it is given runs as its schema inside it."""
    return fn(x) * 2


class OpaqueHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        y = scaled(self.inner, x)
        return torch.sigmoid(y)


class TrainModeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(F.relu(self.bn(self.fc(x))))


def two_linear() -> ModelInspector:
    torch.manual_seed(0)
    return ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),))


def names(ops) -> list[str]:
    return [op.op_name for op in ops]


# --- names and queries --------------------------------------------------------------------------


def test_op_names_are_module_qualified_as_in_the_spec_example():
    inspector = two_linear()
    assert names(inspector.ops) == ["linear1.linear", "relu.relu", "linear2.linear"]
    assert [op.op_type for op in inspector.ops] == ["linear", "relu", "linear"]


def test_op_type_query_matches_the_exact_type_only():
    inspector = two_linear()
    assert names(inspector.get_matched_ops_for_op_type("linear")) == ["linear1.linear", "linear2.linear"]
    assert inspector.get_matched_ops_for_op_type("line") == ()
    assert names(inspector.get_matched_ops_for_op_type("relu")) == ["relu.relu"]


def test_op_name_query_is_a_full_match_regex():
    inspector = two_linear()
    assert names(inspector.get_matched_ops_for_op_name("linear2\\.linear")) == ["linear2.linear"]
    assert names(inspector.get_matched_ops_for_op_name(".*linear.*")) == ["linear1.linear", "linear2.linear"]
    assert inspector.get_matched_ops_for_op_name("linear") == ()  # a prefix is not a full match


def test_module_name_query_selects_the_ops_of_matching_modules():
    inspector = two_linear()
    assert names(inspector.get_matched_ops_for_module_name("linear1")) == ["linear1.linear"]
    assert names(inspector.get_matched_ops_for_module_name("linear[12]")) == ["linear1.linear", "linear2.linear"]
    mlp = ModelInspector(QuickStartMLP(), example_inputs=(torch.randn(2, 16),))
    assert names(mlp.get_matched_ops_for_module_name("fc[12]")) == ["fc1.linear", "fc2.linear"]
    assert names(mlp.get_matched_ops_for_op_type("linear")) == ["fc1.linear", "fc2.linear"]


def test_module_name_query_includes_ops_of_nested_modules():
    model, inputs = make_encoder()
    inspector = ModelInspector(model, example_kwargs=inputs)
    matched = names(inspector.get_matched_ops_for_module_name("blocks\\.0"))
    assert "blocks.0.attn.qkv.linear" in matched and "blocks.0.add" in matched
    assert all(name.startswith("blocks.0.") for name in matched)
    assert len(matched) == len([op for op in inspector.ops if op.op_name.startswith("blocks.0.")])


def test_module_type_query_matches_fully_qualified_types():
    inspector = two_linear()
    linear = inspector.get_matched_ops_for_module_type("torch\\.nn\\.modules\\.linear\\.Linear")
    assert names(linear) == ["linear1.linear", "linear2.linear"]
    assert names(inspector.get_matched_ops_for_module_type(".*ReLU")) == ["relu.relu"]
    assert inspector.get_matched_ops_for_module_type("Linear") == ()


def test_invalid_regex_names_the_pattern_and_the_fix():
    inspector = two_linear()
    with pytest.raises(ValueError, match=r"'linear\[' is not a valid regular expression.*re\.escape"):
        inspector.get_matched_ops_for_op_name("linear[")


def test_module_stack_runs_from_the_root_to_the_innermost_module():
    inspector = two_linear()
    op = inspector.op("linear1.linear")
    assert op.module_stack == (ModuleContext("", f"{__name__}.MyModel"),
                               ModuleContext("linear1", "torch.nn.modules.linear.Linear"))
    assert op.module_name == "linear1"


# --- connectivity -------------------------------------------------------------------------------


def test_inputs_name_their_producer_slot_and_states_in_argument_order():
    inspector = two_linear()
    op = inspector.op("linear2.linear")
    assert [edge.source for edge in op.inputs] == ["relu.relu", "linear2.weight", "linear2.bias"]
    assert op.inputs[0].producer is inspector.op("relu.relu")
    assert op.inputs[0].output_idx == 0 and not op.inputs[0].is_state
    assert [edge.is_state for edge in op.inputs] == [False, True, True]
    weight = op.inputs[1].producer
    assert weight.is_state and weight.kind == "state" and weight.op_type == "parameter"
    assert weight.op_name == "linear2.weight" and weight.outputs == (("linear2.linear",),)
    assert weight.module_name == "linear2" and weight not in inspector.ops
    assert not any(o.is_state for o in inspector.ops)
    assert op.states == ("linear2.weight", "linear2.bias")
    assert inspector.op("linear1.linear").inputs[0].source == "input_0"


def test_outputs_list_the_consumers_of_each_slot():
    inspector = two_linear()
    assert inspector.op("linear1.linear").outputs == (("relu.relu",),)
    assert inspector.op("linear2.linear").outputs == (("output_0",),)


def test_bound_method_receiver_is_the_input_of_the_method_op():
    inspector = ModelInspector(QuickStartMLP(), example_inputs=(torch.randn(2, 16),))
    relu = inspector.op("relu")
    assert relu.module_name == "" and relu.var_name == "activated"
    assert [edge.source for edge in relu.inputs] == ["fc1.linear"]


def test_rebinding_a_name_keeps_the_argument_order():
    inspector = ModelInspector(Residual(), example_inputs=(torch.randn(3, 8),))
    sub = inspector.op("sub")  # h = h - x: h is rebound by the op that reads it
    assert [edge.source for edge in sub.inputs] == ["fc.linear", "input_0"]


def test_repeated_op_types_in_one_module_get_numbered_suffixes():
    inspector = ModelInspector(Residual(), example_inputs=(torch.randn(3, 8),))
    assert names(inspector.ops) == ["fc.linear", "sub", "add", "fc.linear_1", "add_1"]
    assert inspector.modules["fc"].calls == 2
    assert [edge.source for edge in inspector.op("add_1").inputs] == ["add", "fc.linear_1"]


def test_in_place_write_makes_the_writer_the_new_producer():
    inspector = ModelInspector(SetItem(), example_inputs=(torch.randn(2, 4),))
    assert names(inspector.ops) == ["fc.linear", "setitem", "relu"]
    setitem = inspector.op("setitem")
    assert "fc.linear" in [edge.source for edge in setitem.inputs]
    assert [edge.source for edge in inspector.op("relu").inputs] == ["setitem"]


def test_each_output_slot_has_its_own_consumers():
    inspector = ModelInspector(TopK(), example_inputs=(torch.randn(3, 5),))
    topk = inspector.op("topk")
    assert topk.outputs == (("mul",), ("add",))
    assert [r.dtype for r in topk.output_reprs] == ["torch.float32", "torch.int64"]
    assert inspector.op("add").inputs[0].output_idx == 1


def test_skipped_child_is_one_module_op_reading_its_weights():
    inspector = ModelInspector(WithSkippedChild(), example_inputs=(torch.randn(3, 4),))
    assert inspector.schema.skipped.keys() == {"block"}
    op = inspector.op("block.NoSource")
    assert op.kind == "module" and op.op_type == "NoSource"
    assert op.states == ("block.proj.weight", "block.proj.bias")
    assert op.inputs[0].source == "input_0"
    assert op.eager_modules == ("block", "block.proj")
    assert [edge.source for edge in inspector.op("add").inputs] == ["block.NoSource", "input_0"]
    assert inspector.modules["block"].skipped
    assert inspector.modules["block"].outputs == {0: ("block.NoSource[0]",)}


def test_skipped_root_runs_as_one_op_of_the_root():
    from tests.support.inspection_models import NoSource

    inspector = ModelInspector(NoSource(), example_inputs=(torch.randn(3, 4),))
    assert inspector.schema.is_skipped
    (op,) = inspector.ops
    assert (op.op_name, op.kind, op.module_name) == ("NoSource", "module", "")
    assert op.states == ("proj.weight", "proj.bias") and op.outputs == (("output_0",),)
    assert op.flops == inspector.total_flops == 2 * 3 * 4 * 4
    assert inspector.modules["proj"].run_by == ("NoSource",)


def test_module_a_helper_calls_is_interpreted_and_not_counted_as_an_eager_call():
    """`scaled(self.inner, x)` runs as one op, and the module it calls runs as its schema (the
    parser lends it the schema as its forward): its op is there, counted once, run by no op."""
    inspector = ModelInspector(OpaqueHelper(), example_inputs=(torch.randn(2, 4),))
    assert names(inspector.ops) == ["inner.linear", "scaled", "sigmoid"]
    assert inspector.op("inner.linear").states == ("inner.weight", "inner.bias")
    assert inspector.op("scaled").eager_modules == ()
    assert [edge.source for edge in inspector.op("scaled").inputs] == ["inner.linear"]
    assert inspector.modules["inner"].calls == 1
    assert inspector.modules["inner"].run_by == ()
    assert "run inside:" not in inspector.format_summary(colorize=False, details=True)


def test_skipped_child_and_its_children_count_their_eager_calls():
    inspector = ModelInspector(WithSkippedChild(), example_inputs=(torch.randn(3, 4),))
    assert inspector.modules["block"].calls == 1 and inspector.modules["block"].run_by == ()
    assert inspector.modules["block.proj"].calls == 1
    assert inspector.modules["block.proj"].run_by == ("block.NoSource",)


def test_module_boundaries_name_the_ops_at_the_edges():
    inspector = two_linear()
    assert inspector.modules["linear1"].inputs == {0: ("linear1.linear[0]",)}
    assert inspector.modules["linear1"].outputs == {0: ("linear1.linear[0]",)}
    assert inspector.modules[""].inputs == {0: ("linear1.linear[0]",)}
    assert inspector.modules[""].outputs == {0: ("linear2.linear[0]",)}


def test_module_never_entered_is_listed_with_zero_calls():
    inspector = ModelInspector(Residual(), example_inputs=(torch.randn(3, 8),))
    assert inspector.modules["unused"].calls == 0
    assert inspector.modules["unused"].ops == ()
    assert "■ unused" in inspector.format_summary(colorize=False)


# --- the summary --------------------------------------------------------------------------------


def test_plain_summary_reproduces_the_spec_tree_without_ansi_codes():
    inspector = two_linear()
    text = inspector.format_summary(colorize=False)
    assert "\x1b" not in text
    for line in [
        f"({__name__}.MyModel)",
        "    module inputs:  {0: [linear1.linear[0]]}",
        "    module outputs: {0: linear2.linear[0]}",
        "├── ■ linear1 (torch.nn.modules.linear.Linear)",
        "│       module inputs:  {0: [linear1.linear[0]]}",
        "│   └── ◆ linear1.linear [linear]",
        "│         op inputs:  {0: input_0}",
        "│         op states:  weight, bias",
        "│         op outputs: {0: [relu.relu]}",
        "├── ■ relu (torch.nn.modules.activation.ReLU)",
        "│         op inputs:  {0: linear1.linear[0]}",
        "└── ■ linear2 (torch.nn.modules.linear.Linear)",
        "          op outputs: {0: [output_0]}",
    ]:
        assert line in text.splitlines(), line


def test_detailed_summary_shows_variable_shape_call_site_code_and_the_ops_own_line():
    inspector = ModelInspector(QuickStartMLP(), example_inputs=(torch.randn(2, 16),))
    text = inspector.format_summary(colorize=False, details=True)
    lineno = inspect.getsourcelines(QuickStartMLP.forward)[1] + 2
    assert "variable:   activated -> torch.float32[2, 32]" in text
    assert f"filepath:  {os.path.relpath(__file__)}:{lineno}" in text
    assert "code:       activated = hidden.relu()" in text
    assert "code:       hidden = self.fc1(x)" in text  # the call site of fc1's linear, in the model
    linear_file = inspect.getsourcefile(nn.Linear)
    assert f"op source:  {linear_file}:" in text and "return F.linear(input, self.weight, self.bias)" in text
    plain = inspector.format_summary(colorize=False)
    assert "variable:" not in plain and "op source:" not in plain and "code:" not in plain


def test_colorized_summary_uses_ansi_codes():
    text = two_linear().format_summary()
    assert "\x1b[" in text
    assert "linear1.linear" in text


# --- runs, state and bad input ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_inspection_run_returns_what_eager_returns(name):
    model, inputs = FIXTURES[name]()
    model.eval()
    inspector = ModelInspector(model, example_kwargs=inputs)
    with torch.no_grad():
        expected = model(**{k: v.detach().clone() for k, v in inputs.items()})
    assert_same_structure(expected, inspector.result)
    assert inspector.ops, "every fixture computes something"


def test_inspection_leaves_parameters_buffers_and_modes_unchanged():
    torch.manual_seed(0)
    model = TrainModeNet().train()
    model.drop.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    ModelInspector(model, example_inputs=(torch.randn(4, 6),))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [m.training for m in model.modules()] == modes


def test_rejects_a_class_with_a_hint_to_construct_it():
    with pytest.raises(TypeError, match=r"construct it first"):
        ModelInspector(MyModel, example_inputs=(torch.randn(1, 10),))


def test_rejects_a_bare_tensor_as_example_inputs():
    with pytest.raises(TypeError, match=r"example_inputs must be a tuple"):
        ModelInspector(MyModel(), example_inputs=torch.randn(1, 10))


def test_too_many_positional_inputs_names_the_forward_parameters():
    with pytest.raises(TypeError, match=r"takes 1 positional inputs \(x\) but example_inputs has 2"):
        ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10), torch.randn(1, 10)))


def test_unknown_op_name_lists_known_ones():
    with pytest.raises(KeyError, match=r"linear1\.linear"):
        two_linear().op("nope")


def test_train_mode_batchnorm_keeps_its_running_statistics_as_states():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)).train()
    inspector = ModelInspector(model, example_inputs=(torch.randn(4, 6),))
    bn = inspector.op("1.batch_norm")
    assert {"1.running_mean", "1.running_var", "1.weight", "1.bias"} <= set(bn.states)
    assert len(bn.outputs) == 1
