"""`diverge`: two configurations compared by source statement (dtype, autocast, CPU settings, code
version, device), on tiny transformers GPT-2 and Llama and on the toy block of tests/support/diverge_models."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from nnschemaparser import DivergeReport, diverge
from nnschemaparser.traces.diverge import COLUMNS, DivergeError
from tests.support.diverge_models import gpt2, llama, same_weights, toy, toy_line, toy_module, variant_module

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration")


def _assert_clean(report: DivergeReport) -> None:
    assert report.first is None, report.summary()
    assert not report.table["flagged"].any()
    assert set(report.table["status"]) == {"matched"}, report.table["status"].value_counts()


@pytest.fixture(scope="module")
def tiny_llama():
    return llama()


@pytest.fixture(scope="module")
def tiny_gpt2():
    return gpt2()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_precision_copies_of_llama_flag_nothing(tiny_llama, dtype):
    model, inputs = tiny_llama
    report = diverge(model, copy.deepcopy(model).to(dtype), inputs)
    _assert_clean(report)
    table = report.table
    assert list(table.columns) == list(COLUMNS)
    # the copy carries an error (the casts) that its own statements never add past the bound
    assert (table["carried_error"] > 0).any()
    floating = table[table["bound"].notna()]  # integer rows (positions) are compared for equality only
    assert len(floating) > 0.8 * len(table)
    assert (floating["local_error"] <= floating["bound"]).all()
    assert (table["bound"] == 8 * torch.finfo(dtype).eps).any()


def test_fp16_overflow_in_llama_names_the_overflowing_line(tiny_llama):
    model, inputs = tiny_llama
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(3e5)  # fine in float32, past 65504 in float16
    report = diverge(model, copy.deepcopy(model).half(), inputs)
    first = report.first
    assert first is not None, report.summary()
    assert (first.block_path, first.out_var, first.line) == ("model.layers.1.mlp.up_proj", "return", 134)
    assert first.source == "return F.linear(input, self.weight, self.bias)"
    assert first.local_error == float("inf")
    assert Path(first.file).name == "linear.py"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt2_under_autocast_flags_nothing(tiny_gpt2, dtype):
    model, inputs = tiny_gpt2
    report = diverge(model, model, inputs, autocast_b=dtype)
    _assert_clean(report)
    assert (report.table["carried_error"] > 0).any()  # autocast did change values


def test_gpt2_fp16_copy_flags_nothing(tiny_gpt2):
    model, inputs = tiny_gpt2
    _assert_clean(diverge(model, copy.deepcopy(model).half(), inputs))


@pytest.mark.parametrize("settings", [{"threads": 1}, {"deterministic": True}, {"mkldnn": False},
                                      {"threads": 1, "deterministic": True, "mkldnn": False}])
def test_cpu_settings_flag_nothing_and_are_put_back(tiny_gpt2, settings):
    model, inputs = tiny_gpt2
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    report = diverge(model, model, inputs, settings_b=settings)
    _assert_clean(report)
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (threads, deterministic)


def test_llama_version_with_changed_eps_names_the_edited_line(tiny_llama):
    from transformers.models.llama import modeling_llama

    model, inputs = tiny_llama
    old = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    new = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon * 1e4)"
    variant, lines = variant_module(modeling_llama, {old: new})
    other = same_weights(model, variant, "LlamaForCausalLM")
    report = diverge(model, other, inputs)
    first = report.first
    assert first is not None, report.summary()
    assert (first.file, first.line, first.source) == (variant.__file__, lines[new], new)
    assert (first.block_path, first.out_var, first.status) == ("model.layers.0.input_layernorm", "hidden_states",
                                                               "edited")
    row = report.table[(report.table["line"] == lines[new])].iloc[0]
    assert row["source_a"] == old  # an edited row shows a's text beside b's


def test_gpt2_version_with_a_downcast_residual_names_the_edited_line(tiny_gpt2):
    from transformers.models.gpt2 import modeling_gpt2

    model, inputs = tiny_gpt2
    new = "hidden_states = residual + feed_forward_hidden_states.to(torch.bfloat16).float()"
    variant, lines = variant_module(modeling_gpt2, {"hidden_states = residual + feed_forward_hidden_states": new})
    report = diverge(model, same_weights(model, variant, "GPT2LMHeadModel"), inputs)
    first = report.first
    assert first is not None, report.summary()
    assert (first.file, first.line, first.block_path, first.status) == (variant.__file__, lines[new], "transformer.h.0",
                                                                         "edited")


def test_identical_gpt2_version_in_another_file_flags_nothing(tiny_gpt2):
    from transformers.models.gpt2 import modeling_gpt2

    model, inputs = tiny_gpt2
    variant, _ = variant_module(modeling_gpt2, {})
    _assert_clean(diverge(model, same_weights(model, variant, "GPT2LMHeadModel"), inputs))


def test_renamed_variable_is_paired_as_edited_and_not_flagged():
    base = toy_module()
    source = Path(base.__file__).read_text().replace("mixed", "attended")
    from tests.support.diverge_models import import_source

    renamed = import_source(source, "toy_renamed")
    a, inputs = toy(base, seed=5)
    b, _ = toy(renamed, seed=5, state=a.state_dict())
    report = diverge(a, b, inputs)
    assert report.first is None, report.summary()
    edited = report.table[report.table["status"] == "edited"]
    assert sorted(set(edited["out_var"])) == ["attended", "y"]
    assert set(report.table["status"]) == {"matched", "edited"}


def test_a_moved_line_is_reported_as_deleted_and_inserted_never_paired_with_another():
    from tests.support.diverge_models import import_source

    base = toy_module()
    source = Path(base.__file__).read_text()
    moved = import_source(source.replace("        q = self.q(h)\n        k = self.k(h)\n",
                                         "        k = self.k(h)\n        q = self.q(h)\n"), "toy_moved")
    a, inputs = toy(base, seed=9)
    report = diverge(a, toy(moved, seed=9, state=a.state_dict())[0], inputs)
    assert report.first is None, report.summary()
    table = report.table
    moved_rows = table[table["status"].isin(["inserted", "deleted"])]
    assert len(moved_rows) == 4  # one of q / k per block, once as a's (deleted) and once as b's (inserted)
    assert moved_rows.groupby("block_path")["out_var"].nunique().eq(1).all()
    for _, row in table[table["status"] == "matched"].iterrows():
        assert row["source"].split("=")[0].strip() == row["out_var"] or row["out_var"].startswith("return")


def test_settings_may_be_any_context_manager():
    base = toy_module()
    a, inputs = toy(base, seed=10)
    report = diverge(a, a, inputs, settings_b=lambda: torch.backends.mkldnn.flags(enabled=False))
    assert report.first is None and len(report.table) > 0
    with pytest.raises(TypeError, match="must return a context manager"):
        diverge(a, a, inputs, settings_b=lambda: 3)


def test_inserted_deleted_and_untaken_statements_are_reported():
    base = toy_module()
    source = Path(base.__file__).read_text()
    source = source.replace("        m = torch.relu(m)\n", "        m = torch.relu(m)\n        extra = m * 1.0\n")
    source = source.replace("        centred = y - total / y.shape[-1]\n",
                            "        centred = y - total / y.shape[-1]\n        if x.shape[0] > 99:\n"
                            "            centred = centred * 2\n")
    from tests.support.diverge_models import import_source

    edited = import_source(source, "toy_inserted")
    a, inputs = toy(base, seed=6)
    b, _ = toy(edited, seed=6, state=a.state_dict())
    report = diverge(a, b, inputs)
    table = report.table
    assert report.first is None, report.summary()
    assert set(table[table["status"] == "inserted"]["out_var"]) == {"extra"}
    # the branch b has but did not take binds nothing: it is no row; reversed sides, the a-only line is deleted
    back = diverge(b, a, toy(edited, seed=6, state=a.state_dict())[1])
    assert set(back.table[back.table["status"] == "deleted"]["out_var"]) == {"extra"}


def test_an_inserted_line_changing_a_value_is_named_and_a_harmless_one_is_not():
    from tests.support.diverge_models import import_source

    base = toy_module()
    source = Path(base.__file__).read_text()
    line = "        k = self.k(h)\n"
    lossy = import_source(source.replace(line, "        h = h.to(torch.bfloat16).to(x.dtype)\n" + line), "toy_lossy")
    harmless = import_source(source.replace(line, "        h = h.contiguous()\n" + line), "toy_harmless")
    a, inputs = toy(base, seed=8)
    report = diverge(a, toy(lossy, seed=8, state=a.state_dict())[0], inputs)
    first = report.first
    assert first is not None, report.summary()
    assert (first.file, first.line, first.status, first.out_var) == (lossy.__file__, toy_line(lossy, "h = h.to("),
                                                                     "inserted", "h")
    # the name was put back to a's value: nothing after the inserted line is flagged in that block
    assert list(report.table[report.table["flagged"]]["line"].unique()) == [first.line]
    clean = diverge(a, toy(harmless, seed=8, state=a.state_dict())[0], inputs)
    assert clean.first is None, clean.summary()
    assert (clean.table[clean.table["status"] == "inserted"]["local_error"] == 0).all()


def test_untaken_when_a_branch_runs_on_one_side_only():
    source = Path(toy_module().__file__).read_text().replace(
        "        m = torch.relu(m)\n", "        m = torch.relu(m)\n        if self.gain > 2:\n            m = m * 1.0\n")
    from tests.support.diverge_models import import_source

    module = import_source(source, "toy_branch")
    a, inputs = toy(module, seed=7)
    b, _ = toy(module, seed=7, gain=3.0, state=a.state_dict())
    b.blocks[0].gain = 3.0
    b.blocks[1].gain = 1.0
    report = diverge(a, b, inputs)
    untaken = report.table[report.table["status"] == "untaken"]
    assert list(untaken["block_path"]) == ["blocks.0"] and list(untaken["out_var"]) == ["m"]


def test_report_keeps_both_sides_and_reads_well(tiny_gpt2):
    model, inputs = tiny_gpt2
    report = diverge(model, model, inputs, autocast_b=torch.bfloat16)
    assert report.schema_a is not None and report.schema_b is not None
    assert report.side_b["autocast"] is torch.bfloat16 and report.side_a["autocast"] is None
    assert torch.is_tensor(report.side_b["inputs"]["input_ids"])
    assert "first: none" in report.summary() and "rows" in repr(report)
    with pytest.raises(DivergeError, match="Diverge view"):
        report.show()


def test_bad_arguments_are_refused_with_the_fix(tiny_gpt2):
    model, inputs = tiny_gpt2
    with pytest.raises(DivergeError, match="dict of input name"):
        diverge(model, model, [inputs["input_ids"]])
    with pytest.raises(DivergeError, match="nn.Module"):
        diverge(model, "model", inputs)
    with pytest.raises(ValueError, match="not known"):
        diverge(model, model, inputs, settings_b={"thread": 1})
    with pytest.raises(ValueError, match="autocast must be"):
        diverge(model, model, inputs, autocast_b=torch.float64)
    training = copy.deepcopy(model).train()
    with pytest.raises(DivergeError, match=r"training mode .*model_b.eval\(\)"):
        diverge(model, training, inputs)


def test_compiled_model_without_the_compile_module_is_a_clear_error(tiny_gpt2, monkeypatch):
    model, inputs = tiny_gpt2
    monkeypatch.setitem(sys.modules, "nnschemaparser.traces.diverge_compile", None)
    with pytest.raises(DivergeError, match="diverge_compile"):
        diverge(model, torch.compile(model, backend="eager"), inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CPU against CUDA needs a GPU")
def test_cpu_against_cuda_flags_nothing(tiny_llama):
    model, inputs = tiny_llama
    report = diverge(model, copy.deepcopy(model).cuda(), inputs)
    _assert_clean(report)
    assert report.side_b["inputs"]["input_ids"].is_cuda
