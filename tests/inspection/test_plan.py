"""The local plan card: memory, GPU fit, epoch time and cost, lints, the verifier, --base diffs and exit codes."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import pytest
import torch

from nnschemaparser.inspection.cli import main
from nnschemaparser.inspection.gpu_table import GPUTableError, load_table, table_from_json
from nnschemaparser.inspection.graph_diff import diff_graphs
from nnschemaparser.inspection.plan import PlanError, PlanOptions, compute_plan, format_plan_card, memory_estimate

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x).relu())


    class Wider(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 64)
            self.fc2 = nn.Linear(64, 4)
            self.extra = nn.Linear(4, 4)

        def forward(self, x):
            return self.extra(self.fc2(self.fc1(x).relu()))


    class WithDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.drop = nn.Dropout(0.5)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.drop(self.fc1(x)))


    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))


    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(x.reshape(3, 7))
''')


@pytest.fixture()
def models(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "plan_models.py"
    path.write_text(MODELS)
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def graph(models: Path, name: str, *extra: str, shape: str = "2,16") -> dict:
    out = models.parent / f"{name}-{len(extra)}.neurarch.json"
    code = main([f"{models}:{name}", "--input", shape, "-o", str(out), *extra])
    assert code == 0
    return json.loads(out.read_text())


# --- memory, fit, cost -------------------------------------------------------------------------


def test_memory_adds_weights_gradients_optimizer_state_and_the_measured_activations(models):
    g = graph(models, "TwoLayer")
    params = 16 * 32 + 32 + 32 * 4 + 4
    measured = (2 * 32 + 2 * 32 + 2 * 4) * 4  # the run's op outputs at batch 2, float32
    assert g["totals"]["activationBytes"] == measured
    fp32 = memory_estimate(g, PlanOptions(batch_size=8, precision="fp32"))
    assert fp32 == {"weights": params * 4, "gradients": params * 4, "optimizer": params * 8,
                    "activations": measured * 4, "peak": params * 16 + measured * 4}
    fp16 = memory_estimate(g, PlanOptions(batch_size=8, precision="fp16", optimizer="sgd"))
    # half-width weights and gradients, a fp32 master copy, one fp32 momentum, half-width activations
    assert fp16 == {"weights": params * 2 + params * 4, "gradients": params * 2, "optimizer": params * 4,
                    "activations": measured * 2, "peak": params * 12 + measured * 2}
    inference = memory_estimate(g, PlanOptions(batch_size=2, precision="bf16", mode="inference"))
    assert inference == {"weights": params * 2, "gradients": 0, "optimizer": 0,
                         "activations": 2 * (2 * 32 * 4) // 2, "peak": params * 2 + 2 * 32 * 4}


def test_gpu_fit_is_the_cheapest_gpu_whose_memory_holds_the_peak(models, tmp_path):
    g = graph(models, "TwoLayer")
    peak = memory_estimate(g, PlanOptions(batch_size=4))["peak"]
    table = table_from_json({"only": True, "headroom": 0, "gpus": {
        "Tiny": {"memory_gb": (peak - 1) / 1e9, "tflops": {"fp16": 1}, "price_per_hour": 0.01},
        "Exact": {"memory_gb": peak / 1e9, "tflops": {"fp16": 1}, "price_per_hour": 5},
        "Roomy": {"memory_gb": 1, "tflops": {"fp16": 1}, "price_per_hour": 9}}})
    plan = compute_plan(g, PlanOptions(batch_size=4, table=table))
    assert plan["fit"]["gpu"] == "Exact" and plan["fit"]["peakBytes"] == peak
    assert {x["name"]: x["fits"]["fp16"] for x in plan["gpus"]} == {"Tiny": False, "Exact": True, "Roomy": True}
    # the largest batch that still fits on the chosen GPU is at least the planned one
    assert plan["fit"]["maxBatchSize"] == 4
    assert "| GPU fit         Exact " in format_plan_card(plan)
    assert "at batch 4 fp16" in format_plan_card(plan)


def test_a_gpu_without_the_precision_does_not_fit(models):
    g = graph(models, "TwoLayer")
    table = table_from_json({"only": True, "gpus": {"T4": {}}})
    assert compute_plan(g, PlanOptions(precision="bf16", table=table))["fit"] is None
    assert compute_plan(g, PlanOptions(precision="fp16", table=table))["fit"]["gpu"] == "T4"


def test_epoch_time_and_cost_follow_the_flop_rate_and_price_table_given_as_a_file(models, tmp_path, capsys):
    table_file = tmp_path / "gpus.json"
    table_file.write_text(json.dumps({"only": True, "utilization": 0.5, "gpus": {
        "Slow": {"memory_gb": 16, "tflops": {"fp32": 1e-9, "fp16": 1e-9, "bf16": None}, "price_per_hour": 3.6}}}))
    code, out, _ = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan", "--gpu-table", str(table_file),
                       "--epoch-samples", "1000", "--plan-json", "plan.json")
    assert code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    g = json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())
    per_sample = g["totals"]["flops"] / 2 * 3  # forward and backward
    seconds = 1000 * per_sample / (1e-9 * 1e12 * 0.5)
    assert seconds / 3600 * 3.6 > 1  # big enough for the card to show its cents
    assert plan["epoch"]["gpu"] == "Slow" and plan["epoch"]["seconds"] == pytest.approx(seconds, rel=1e-12)
    assert plan["epoch"]["cost"] == pytest.approx(seconds / 3600 * 3.6, rel=1e-12)
    assert f"~${seconds / 3600 * 3.6:,.2f} per epoch of 1K samples on a Slow ({seconds / 3600:.1f} h)" in \
        " ".join(out.split())


@pytest.mark.parametrize("data, message", [
    ({"gpus": {"T4": {"memory_gb": -1}}}, r"gpus\['T4'\]\.memory_gb must be a positive number"),
    ({"gpus": {"New": {"price_per_hour": 1}}}, r"gpus\['New'\] is a new GPU: give its memory_gb and tflops"),
    ({"gpus": {"T4": {"tflops": {"fp8": 3}}}}, r"tflops must map some of fp32, fp16, bf16"),
    ({"utilization": 2}, r"utilization is a fraction of the peak, at most 1"),
    ({"prices": {}}, r"unknown keys \['prices'\]"),
])
def test_a_bad_gpu_table_names_the_entry_and_the_field(data, message):
    with pytest.raises(GPUTableError, match=message):
        table_from_json(data)


def test_a_bad_gpu_table_file_is_a_one_line_failure(models, tmp_path, capsys):
    bad = tmp_path / "gpus.json"
    bad.write_text("{not json")
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan", "--gpu-table", str(bad))
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1].startswith(f"nnschemaparser: error: GPUTableError: {bad} is not JSON")
    with pytest.raises(GPUTableError, match="cannot read"):
        load_table(tmp_path / "missing.json")


def test_plan_options_are_checked():
    with pytest.raises(PlanError, match="precision must be one of fp32, fp16, bf16"):
        PlanOptions(precision="fp8")
    with pytest.raises(PlanError, match="batch size must be a whole number"):
        PlanOptions(batch_size=0)


# --- lints and the verifier --------------------------------------------------------------------


def test_no_dropout_before_the_classifier_is_a_warning(models):
    assert "no dropout before the classifier" in compute_plan(graph(models, "TwoLayer"))["warnings"]
    assert "no dropout before the classifier" not in compute_plan(graph(models, "WithDropout"))["warnings"]


def test_unused_parameters_and_batch_norm_at_batch_one_are_warnings(models):
    g = graph(models, "Wider")
    g["unusedParams"] = ["spare.weight"]
    assert "1 parameter tensor never used in the forward (spare.weight)" in compute_plan(g)["warnings"]
    normed = graph(models, "Normed", shape="2,3,6,6")
    warnings = compute_plan(normed, PlanOptions(batch_size=1))["warnings"]
    assert "batchNorm cannot train at batch size 1 (no batch statistics)" in warnings
    assert not any("batchNorm" in w for w in compute_plan(normed, PlanOptions(batch_size=2))["warnings"])


def test_the_verifier_reports_a_layer_whose_input_breaks_its_shape_contract(models):
    g = graph(models, "TwoLayer")
    assert compute_plan(g)["runs"] and compute_plan(g)["blockers"] == []
    edited = copy.deepcopy(g)
    next(n for n in edited["nodes"] if n["id"] == "fc2")["params"]["inFeatures"] = 99
    plan = compute_plan(edited)
    assert not plan["runs"]
    assert plan["blockers"] == ["fc2: linear expects inFeatures 99, its input is [32]"]
    cut = copy.deepcopy(g)
    cut["edges"] = [e for e in cut["edges"] if e["target"] != "output"]
    assert compute_plan(cut)["blockers"] == ["the output is not reached from any input"]


# --- --base -------------------------------------------------------------------------------------


def test_diff_names_added_removed_and_changed_nodes_with_parameter_totals(models):
    base, head = graph(models, "TwoLayer"), graph(models, "Wider")
    diff = diff_graphs(base, head)
    assert diff["nodes"]["added"] == ["extra"] and diff["nodes"]["removed"] == []
    changed = {c["id"]: c for c in diff["nodes"]["changed"]}
    assert set(changed) == {"fc1", "fc2"}
    assert changed["fc1"]["params"] == {"outFeatures": [32, 64]}
    assert changed["fc2"]["params"] == {"inFeatures": [32, 64]}
    assert changed["fc1"]["paramCount"] == [16 * 32 + 32, 16 * 64 + 64]
    assert diff["params"] == {"added": 4 * 4 + 4, "removed": 0,
                              "changed": (16 * 64 + 64 + 64 * 4 + 4) - (16 * 32 + 32 + 32 * 4 + 4)}
    assert diff["totals"]["params"] == {"base": base["totals"]["params"], "head": head["totals"]["params"],
                                        "delta": head["totals"]["params"] - base["totals"]["params"]}
    reverse = diff_graphs(head, base)
    assert reverse["nodes"]["removed"] == ["extra"] and reverse["params"]["removed"] == 20


def test_base_puts_the_diff_in_the_card_and_in_the_plan_json(models, tmp_path, capsys):
    graph(models, "TwoLayer")
    base = tmp_path / "TwoLayer-0.neurarch.json"
    code, out, err = run(capsys, f"{models}:Wider", "--input", "2,16", "--base", str(base), "--plan-json", "p.json")
    assert code == 0
    assert out.startswith("+---") and "| Diff" in out
    assert "vs TwoLayer: 1 added, 0 removed, 2 changed" in " ".join(out.split())
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["diff"]["nodes"]["added"] == ["extra"]
    assert (tmp_path / "Wider.neurarch.json").exists() and "wrote Wider.neurarch.json" in err


def test_a_base_that_is_not_a_neurarch_graph_is_refused_before_the_model_runs(models, tmp_path, capsys):
    nnsp = tmp_path / "rich.json"
    assert main([f"{models}:TwoLayer", "--input", "2,16", "--format", "nnsp", "-o", str(nnsp)]) == 0
    capsys.readouterr()
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--base", str(nnsp))
    assert code == 1 and out == ""
    assert "expected 'neurarch/1' (an nnsp graph: write it with --format neurarch)" in err
    assert "loading" not in err


# --- exit codes ---------------------------------------------------------------------------------


def test_a_forward_that_fails_is_a_blocker_on_the_card_and_exit_0(models, tmp_path, capsys):
    code, out, err = run(capsys, f"{models}:Broken", "--input", "2,16", "--plan")
    assert code == 0
    assert "| Runs            no, see the blockers below" in out
    assert "Blockers        the forward does not run" in out
    g = json.loads((tmp_path / "Broken.neurarch.json").read_text())
    assert g["runs"] is False and g["totals"]["params"] == 16 * 4 + 4 and g["nodes"] == []
    assert "the forward does not run" in err


def test_fail_on_block_exits_2_when_the_card_reports_a_blocker(models, capsys):
    code, out, _ = run(capsys, f"{models}:Broken", "--input", "2,16", "--fail-on-block")
    assert code == 2 and "Blockers        the forward does not run" in out


def test_fail_on_block_exits_0_once_the_card_printed_for_a_model_that_runs(models, capsys):
    code, out, _ = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--fail-on-block")
    assert code == 0 and "Blockers        none" in out


@pytest.mark.parametrize("extra, message", [
    (["--plan", "-o", "-"], "-o - writes the graph to stdout"),
    (["--share"], "--share stores the graph on a deployment: give --api URL or set NEURARCH_API"),
    (["--plan", "--batch-size", "0"], "--batch-size must be 1 or more"),
    (["--plan", "--precision", "fp8"], "invalid choice: 'fp8'"),
])
def test_bad_usage_is_one_line_and_exit_status_1_never_the_blockers_2(models, capsys, monkeypatch, extra, message):
    monkeypatch.delenv("NEURARCH_API", raising=False)
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", *extra)
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and message in err


def test_stdout_carries_only_the_card(models, capsys):
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("+---") and lines[-1].startswith("+---")
    assert all(line.startswith(("+", "|")) for line in lines)
    assert "TwoLayer" in lines[1]
    size = next(line for line in lines if "params" in line)
    assert "2 layers, 676 params" in size and "FLOPs at 16 " in size and "wrote" in err
