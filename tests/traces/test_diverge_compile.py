"""compiled_local_errors: a torch.compile divergence localized to the source statement, by compiling
regions of the schema's generated code with the model's own backend."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import GELUActivation
from transformers.pytorch_utils import Conv1D

from nnschemaparser import NNParser
from nnschemaparser.traces.compile_bound import measure
from nnschemaparser.traces.diverge_compile import ROW_KEYS, compiled_local_errors
from tests.support.compile_faults import (Attention, Cancelling, CountingBackend, Dropping, GeluMLP, GeluNet,
                                          NaiveSoftmax, ReassociatedAdd, ScaledMatmul, TanhGelu, expected_line,
                                          tiny_gpt2, tiny_llama)


def localize(model, inputs, backend, **compile_kwargs):
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    timings: dict = {}
    rows = compiled_local_errors(schema, model, torch.compile(model, backend=backend, **compile_kwargs), inputs,
                                 timings=timings)
    return rows, timings


def first_flagged(rows):
    return next((row for row in rows if row["flagged"]), None)


def place(row):
    return row["file"], row["line"]


def gelu_net():
    torch.manual_seed(0)
    return GeluNet().eval(), {"x": torch.randn(4, 8) * 3}


def attention(sharpness=1.0, dtype=torch.float32):
    torch.manual_seed(0)
    return Attention(sharpness=sharpness).eval().to(dtype), {"x": torch.randn(2, 5, 8).to(dtype)}


def test_user_backend_swapping_gelu_for_its_tanh_form_is_flagged_at_the_gelu_line():
    backend = TanhGelu()
    rows, timings = localize(*gelu_net(), backend)
    assert all(set(row) == set(ROW_KEYS) for row in rows)
    culprit = first_flagged(rows)
    assert place(culprit) == expected_line(GeluMLP.forward, "a = F.gelu(h)")
    assert culprit["block_path"] == "mlp" and culprit["out_var"] == "a" and culprit["region"] == "statement"
    assert culprit["local_error"] > culprit["bound"] > 0
    # the statement after it adds nothing of its own but carries the error in
    after = next(row for row in rows if row["block_path"] == "mlp" and row["out_var"] == "y")
    assert not after["flagged"] and after["carried_error"] > 10 * after["bound"]
    # the blocks around it are out of bounds too, listed after it (the order values are bound in)
    flagged = [row for row in rows if row["flagged"]]
    assert flagged[0] is culprit and [row["region"] for row in flagged[1:]] == ["block mlp", "block GeluNet"]
    model_row = rows[-1]
    assert model_row["block_path"] == "" and model_row["carried_error"] > model_row["bound"]
    assert timings["regions"] >= 4 and timings["compile_s"] > 0


def test_scaled_attention_scores_are_flagged_at_the_scores_matmul():
    backend = ScaledMatmul(width=5)  # the (5, 5) scores, not a projection
    rows, _ = localize(*attention(), backend)
    assert place(first_flagged(rows)) == expected_line(Attention.forward, "scores = q @ k.transpose(-1, -2)")


def test_softmax_without_max_subtraction_is_flagged_where_it_overflows():
    rows, _ = localize(*attention(sharpness=400.0), NaiveSoftmax())
    culprit = first_flagged(rows)
    assert place(culprit) == expected_line(Attention.forward, "weights = F.softmax(scores, dim=-1)")
    assert culprit["local_error"] == math.inf


def test_reassociated_add_that_loses_the_small_term_is_flagged():
    torch.manual_seed(0)
    rows, _ = localize(Cancelling().eval(), {"x": torch.randn(3, 8)}, ReassociatedAdd())
    assert place(first_flagged(rows)) == expected_line(Cancelling.forward, "total = (big + (-big)) + small")


def test_gpt2_user_backend_gelu_swap_is_flagged_at_the_activation_line():
    model, inputs = tiny_gpt2(layers=1, activation="gelu")
    rows, _ = localize(model, inputs, TanhGelu())
    culprit = first_flagged(rows)
    assert place(culprit) == expected_line(GELUActivation.forward, "return self.act(input)")
    assert culprit["block_path"] == "h.0.mlp.act"


def test_gpt2_scaled_conv1d_matmul_is_flagged_at_the_addmm_line():
    # the config's defaults: sdpa, and a cache object each layer appends to (replays get copies)
    model, inputs = tiny_gpt2(layers=1, defaults=True)
    rows, _ = localize(model, inputs, ScaledMatmul(width=96))  # c_attn: 3 x 32 wide
    culprit = first_flagged(rows)
    assert place(culprit) == expected_line(Conv1D.forward, "x = torch.addmm(")
    assert culprit["block_path"] == "h.0.attn.c_attn"


def test_llama_scaled_mlp_projection_is_flagged_at_the_linear_line():
    model, inputs = tiny_llama(layers=1)
    rows, _ = localize(model, inputs, ScaledMatmul(width=64))  # gate_proj: intermediate_size 64
    culprit = first_flagged(rows)
    assert place(culprit) == expected_line(torch.nn.Linear.forward, "return F.linear(")
    assert culprit["block_path"] == "layers.0.mlp.gate_proj"
    assert not any(row["flagged"] for row in rows if "self_attn" in row["region"])


def test_gpt2_aot_eager_flags_nothing():
    model, inputs = tiny_gpt2(layers=1)
    rows, _ = localize(model, inputs, "aot_eager")
    assert rows and not any(row["flagged"] for row in rows)
    assert rows[-1]["region"] == "block GPT2Model" and rows[-1]["local_error"] <= rows[-1]["bound"]


def test_bf16_attention_aot_eager_flags_nothing():
    rows, _ = localize(*attention(dtype=torch.bfloat16), "aot_eager")
    assert rows and not any(row["flagged"] for row in rows)


@pytest.mark.slow  # inductor compiles C++ kernels: about a minute on a busy CPU the first time
def test_inductor_on_cpu_flags_nothing():
    torch.manual_seed(0)
    rows, timings = localize(GeluMLP().eval(), {"x": torch.randn(4, 8)}, "inductor")
    assert rows and not any(row["flagged"] for row in rows)
    assert timings["graphs"] >= 1


def test_the_backend_object_given_is_the_one_called():
    model, inputs = gelu_net()
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():  # model_b compiled beforehand, as the regions run: every later call is a region's
        compiled(**inputs)
    before = backend.calls
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    timings: dict = {}
    rows = compiled_local_errors(schema, model, compiled, inputs, timings=timings)
    assert not any(row["flagged"] for row in rows)
    assert backend.calls - before == timings["graphs"] >= 1


def test_a_region_the_compiler_refuses_falls_back_to_the_enclosing_block():
    model, inputs = gelu_net()
    original = GeluMLP.forward

    def forward(self, x):  # a graph break in the block: fullgraph=True refuses its statement ranges
        h = self.fc1(x)
        torch._dynamo.graph_break()
        a = F.gelu(h)
        y = self.fc2(a)
        return y + x

    GeluMLP.forward = forward
    try:
        rows, _ = localize(model, inputs, TanhGelu())
    finally:
        GeluMLP.forward = original
    culprit = first_flagged(rows)
    assert culprit["region"].startswith("block mlp") and "graph" in culprit["region"]
    inside = [row for row in rows if "the enclosing region stands" in row["region"]]
    assert inside and all(row["block_path"] == "mlp" and not row["flagged"] for row in inside)


def test_bad_arguments_say_what_to_pass():
    model, inputs = gelu_net()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with pytest.raises(TypeError, match="not a torch.compile wrapper"):
        compiled_local_errors(schema, model, model, inputs)
    other, _ = gelu_net()
    with torch.no_grad():
        other.inp.weight.add_(1.0)
    with pytest.raises(ValueError, match="compares the compiler alone"):
        compiled_local_errors(schema, model, torch.compile(other, backend="eager"), inputs)
    with pytest.raises(ValueError, match="not a parse of model_a"):
        compiled_local_errors(schema, other, torch.compile(other, backend="eager"), inputs)
    training = Dropping().train()
    schema = NNParser.parse_model(model=training, inputs_tensors_values=inputs)
    with pytest.raises(ValueError, match=r"call model_a.eval\(\)"):
        compiled_local_errors(schema, training, torch.compile(training, backend="eager"), inputs)


def test_bound_lets_rounding_pass_and_blames_a_different_op():
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    exact = x.double().sum(-1)
    reordered = x.flip(-1).sum(-1)  # the same sum, added in another order
    assert not measure(reordered, x.sum(-1), exact).flagged
    h = torch.randn(100) * 3
    assert measure(F.gelu(h, approximate="tanh"), F.gelu(h), F.gelu(h.double())).flagged
    overflowed = torch.tensor([1.0, float("inf")])
    assert measure(overflowed, torch.tensor([1.0, 2.0]), None).error == math.inf
    assert measure(torch.tensor([1, 2]), torch.tensor([1, 2]), None).error == 0


def test_module_is_private_and_documented():
    import nnschemaparser

    assert not hasattr(nnschemaparser, "compiled_local_errors")
    assert "bound" in inspect.getdoc(compiled_local_errors)


def test_diverge_of_a_compiled_model_b_names_the_line_its_backend_computes_differently():
    """`diverge` hands a `torch.compile` wrapper on side b to `compiled_local_errors`: the report's table
    has the localized rows and `report.first` is the planted line, with the backend given reused."""
    import copy

    from nnschemaparser import diverge

    model, inputs = gelu_net()
    backend = TanhGelu()
    report = diverge(model, torch.compile(copy.deepcopy(model), backend=backend), inputs)
    assert report.first is not None
    assert (report.first.file, report.first.line) == expected_line(GeluMLP.forward, "a = F.gelu(h)")
    assert report.first.block_path == "mlp" and report.first.out_var == "a"
    assert backend.calls > 0
    assert {"local_error", "carried_error", "bound", "flagged", "status", "region"} <= set(report.table.columns)
