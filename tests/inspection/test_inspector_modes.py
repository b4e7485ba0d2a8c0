"""ModelInspector's execution modes (eager, graph via torch.export), op filtering and the seed's summary."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from nnschemaparser import (GraphExportError, ModelInspector, ModuleContext, PALETTIZABLE_OP_TYPES,
                            QUANTIZABLE_OP_TYPES)
from nnschemaparser.inspection.summary import LEGEND
from tests.support.seed_inspector_model import DataDependent, Mixed, MyModel, TopK


class Quantizer:
    """A compressor-like class: what it can compress is its registry of op types."""

    compressible_op_types = QUANTIZABLE_OP_TYPES


FILE = os.path.relpath(inspect.getsourcefile(MyModel))
FORWARD = inspect.getsourcelines(MyModel.forward)[1]
LINE1, LINE2 = FORWARD + 1, FORWARD + 3  # x = self.linear1(x), x = self.linear2(x)


def inspector(mode: str, compressor=None) -> ModelInspector:
    torch.manual_seed(0)
    return ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),), execution_mode=mode,
                          compressor=compressor)


def tree(text: str) -> list[str]:
    """The summary's lines after the legend."""
    assert text.startswith(LEGEND + "\n\n")
    return text[len(LEGEND) + 2:].splitlines()


def test_graph_mode_reproduces_the_seed_tree_with_a_quantizer():
    text = inspector("graph", Quantizer).format_summary(colorize=False)
    assert tree(text) == [
        "(tests.support.seed_inspector_model.MyModel)",
        "    module inputs:  {0: [linear[0]]}",
        "    module outputs: {0: linear_1[0]}",
        "├── ■ linear1 (torch.nn.modules.linear.Linear)",
        "│       module inputs:  {0: [linear[0]]}",
        "│       module outputs: {0: linear[0]}",
        "│   └── ◆ linear [linear]",
        "│         op inputs:  {0: x[0]}",
        "│         op states:  weight, bias",
        "│         op outputs: {0: [relu]}",
        f"│         filepath:  {FILE}:{LINE1}",
        "├── ■ relu (torch.nn.modules.activation.ReLU)",
        "│       module inputs:  {0: [relu[0]]}",
        "│       module outputs: {0: relu[0]}",
        "└── ■ linear2 (torch.nn.modules.linear.Linear)",
        "        module inputs:  {0: [linear_1[0]]}",
        "        module outputs: {0: linear_1[0]}",
        "    └── ◆ linear_1 [linear]",
        "          op inputs:  {0: relu[0]}",
        "          op states:  weight, bias",
        "          op outputs: {0: [output]}",
        f"          filepath:  {FILE}:{LINE2}",
    ]


def test_eager_mode_reproduces_the_seed_tree_with_call_site_lines():
    text = inspector("eager", Quantizer).format_summary(colorize=False)
    assert tree(text) == [
        "(tests.support.seed_inspector_model.MyModel)",
        "    module inputs:  {0: [linear1.linear[0]]}",
        "    module outputs: {0: linear2.linear[0]}",
        "├── ■ linear1 (torch.nn.modules.linear.Linear)",
        "│       module inputs:  {0: [linear1.linear[0]]}",
        "│       module outputs: {0: linear1.linear[0]}",
        "│   └── ◆ linear1.linear [linear]",
        "│         op inputs:  {0: input_0}",
        "│         op states:  weight, bias",
        "│         op outputs: {0: [relu.relu]}",
        f"│         filepath:  {FILE}:{LINE1}",
        "├── ■ relu (torch.nn.modules.activation.ReLU)",
        "│       module inputs:  {0: [relu.relu[0]]}",
        "│       module outputs: {0: relu.relu[0]}",
        "└── ■ linear2 (torch.nn.modules.linear.Linear)",
        "        module inputs:  {0: [linear2.linear[0]]}",
        "        module outputs: {0: linear2.linear[0]}",
        "    └── ◆ linear2.linear [linear]",
        "          op inputs:  {0: relu.relu[0]}",
        "          op states:  weight, bias",
        "          op outputs: {0: [output_0]}",
        f"          filepath:  {FILE}:{LINE2}",
    ]


def test_graph_mode_names_ops_by_the_export_graph_with_module_stacks_and_stack_trace_lines():
    graph = inspector("graph")
    assert [(op.op_name, op.op_type) for op in graph.ops] == [("linear", "linear"), ("relu", "relu"),
                                                               ("linear_1", "linear")]
    linear_1 = graph.op("linear_1")
    assert linear_1.module_stack == (ModuleContext("", "tests.support.seed_inspector_model.MyModel"),
                                     ModuleContext("linear2", "torch.nn.modules.linear.Linear"))
    assert linear_1.location.filename == inspect.getsourcefile(torch.nn.Linear)  # the op's own line: F.linear
    assert "F.linear" in linear_1.location.code
    assert (linear_1.call_site.lineno, linear_1.call_site.code) == (LINE2, "x = self.linear2(x)")
    assert [op.op_name for op in graph.get_matched_ops_for_module_name("linear[12]")] == ["linear", "linear_1"]
    assert [op.op_name for op in graph.get_matched_ops_for_op_name(".*linear.*")] == ["linear", "linear_1"]


def test_graph_mode_state_inputs_are_interleaved_is_state_records():
    op = inspector("graph").op("linear")
    assert [(e.source, e.is_state) for e in op.inputs] == [("x", False), ("linear1.weight", True),
                                                           ("linear1.bias", True)]
    weight = op.inputs[1].producer
    assert weight.is_state and weight.op_type == "parameter" and weight.outputs == (("linear",),)
    assert op.inputs[0].producer.kind == "input" and not op.is_state


def test_eager_is_the_default_and_accepted_explicitly():
    torch.manual_seed(0)
    default = ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),))
    explicit = inspector("eager")
    assert default.execution_mode == "eager"
    assert [op.op_name for op in default.ops] == [op.op_name for op in explicit.ops] == [
        "linear1.linear", "relu.relu", "linear2.linear"]
    assert explicit.exported is None and explicit.schema is not None


def test_graph_mode_result_and_flops_equal_the_eager_run():
    torch.manual_seed(0)
    model, x = MyModel(), torch.randn(3, 10)
    graph = ModelInspector(model, example_inputs=(x,), execution_mode="graph")
    eager = ModelInspector(model, example_inputs=(x,))
    with torch.no_grad():
        assert torch.equal(graph.result, model(x))
    assert graph.total_flops == eager.total_flops == 2 * 3 * (10 * 20 + 20 * 5)
    assert graph.op("linear").flops == 2 * 3 * 10 * 20
    assert graph.schema is None and graph.exported is not None


def test_export_failure_names_the_failure_and_suggests_eager():
    with pytest.raises(GraphExportError, match=r"torch\.export could not export DataDependent .*execution_mode='eager'"):
        ModelInspector(DataDependent(), example_inputs=(torch.randn(2, 4),), execution_mode="graph")
    assert ModelInspector(DataDependent(), example_inputs=(torch.randn(2, 4),)).ops  # eager handles it


def test_unknown_execution_mode_is_refused():
    with pytest.raises(ValueError, match=r"execution_mode must be 'eager' or 'graph', got 'fx'"):
        ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),), execution_mode="fx")


def test_graph_mode_multi_output_op_gets_one_slot_per_output():
    graph = ModelInspector(TopK(), example_inputs=(torch.randn(3, 5),), execution_mode="graph")
    assert [op.op_type for op in graph.ops] == ["topk", "mul", "add"]
    topk = graph.ops[0]
    assert topk.outputs == (("mul",), ("add",))
    assert [r.dtype for r in topk.output_reprs] == ["torch.float32", "torch.int64"]
    assert graph.op("add").inputs[0].output_idx == 1 and graph.op("add").inputs[0].producer is topk
    assert graph.modules[""].outputs == {0: ("mul[0]",), 1: ("add[0]",)}


# --- op filtering -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_filter_drops_ops_but_keeps_modules_and_connectivity_through_them(mode):
    kept = inspector(mode, Quantizer)
    everything = inspector(mode)
    relu = [op for op in everything.ops if op.op_type == "relu"][0]
    assert [op.op_type for op in kept.ops] == ["linear", "linear"]
    assert kept.get_matched_ops_for_op_type("relu") == ()
    assert kept.modules["relu"].ops == () and kept.modules["relu"].inputs == everything.modules["relu"].inputs
    second = kept.ops[1]
    assert second.inputs[0].source == relu.op_name and second.inputs[0].producer.op_type == "relu"
    assert kept.ops[0].outputs == ((relu.op_name,),)
    assert len(kept.unfiltered_flow.ops) == 3


def test_filter_takes_a_plain_set_and_the_palettization_set_keeps_ops_with_weights():
    tokens = torch.tensor([[1, 2, 3]])
    quantized = ModelInspector(Mixed(), example_inputs=(tokens,), compressor=QUANTIZABLE_OP_TYPES)
    palettized = ModelInspector(Mixed(), example_inputs=(tokens,), compressor=PALETTIZABLE_OP_TYPES)
    chosen = ModelInspector(Mixed(), example_inputs=(tokens,), compressor={"relu"})
    assert [op.op_type for op in quantized.ops] == ["linear", "matmul"]
    assert [op.op_type for op in palettized.ops] == ["embedding", "linear"]
    assert all(op.states for op in palettized.ops)
    assert [op.op_type for op in chosen.ops] == ["relu"]
    graph = ModelInspector(Mixed(), example_inputs=(tokens,), execution_mode="graph", compressor=PALETTIZABLE_OP_TYPES)
    assert [op.op_type for op in graph.ops] == ["embedding", "linear"]


def test_a_compressor_without_a_registry_is_refused_with_the_accepted_forms():
    with pytest.raises(TypeError, match=r"compressor must be None, a set of op types .* object has none"):
        inspector("eager", object())
    with pytest.raises(TypeError, match=r"non-string op types"):
        inspector("eager", {"linear", 3})


def test_summary_starts_with_the_seed_legend():
    text = inspector("eager").format_summary(colorize=False)
    assert text.startswith("Legend:\n  ■ module_name (module_type)  ◆ op_name [op_type]\n\n"
                           "  op inputs:  {I: producer[N]}  —  I = op_input_spec index; N = output slot of the producing op\n")
    assert "untracked_N                  —  input tensor whose producer was not intercepted" in text


def test_graph_mode_module_tree_flattens_containers_as_eager_does():
    from tests.support.inspection_models import make_encoder

    model, inputs = make_encoder()
    graph = ModelInspector(model, example_kwargs=inputs, execution_mode="graph")
    eager = ModelInspector(model, example_kwargs=inputs)
    assert set(graph.modules) == set(eager.modules)
    assert graph.modules[""].children == eager.modules[""].children
    assert all(graph.modules[p].calls == eager.modules[p].calls for p in eager.modules)
    block = graph.modules["blocks.0"]
    assert block.inputs == {0: ("layer_norm[0]", "add[0]")}  # the residual reads the block's input too
    assert graph.op("embedding").inputs[1].source == "tokens" and graph.op("embedding").inputs[0].is_state


def test_graph_mode_warns_and_says_how_when_the_exported_graph_differs_from_eager():
    import warnings

    from nnschemaparser import GraphMismatchWarning
    from tests.support.seed_inspector_model import ExportDiffers

    x = torch.randn(2, 3)
    with pytest.warns(GraphMismatchWarning, match=r"does not compute what its eager forward computes \(output: values differ"):
        graph = ModelInspector(ExportDiffers(), example_inputs=(x,), execution_mode="graph")
    assert torch.equal(graph.result, x * 2)  # the graph's own result, said to differ
    assert graph.eager_mismatch is not None and "values differ" in str(graph.eager_mismatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inspector("graph").eager_mismatch is None


def test_graph_mode_refuses_listeners_of_the_schema_run():
    from nnschemaparser import TraceRecorder

    with pytest.raises(ValueError, match=r"listeners observe the schema run of execution_mode='eager'"):
        ModelInspector(MyModel(), example_inputs=(torch.randn(1, 10),), execution_mode="graph",
                       listeners=[TraceRecorder()])


def test_a_registry_may_be_a_mapping_or_a_method_returning_the_op_types():
    class Palettizer:
        registry = {"linear": object(), "embedding": object()}

    class Custom:
        def supported_op_types(self):
            return ["relu"]

    assert [op.op_type for op in inspector("eager", Palettizer).ops] == ["linear", "linear"]
    assert [op.op_type for op in inspector("graph", Custom()).ops] == ["relu"]
