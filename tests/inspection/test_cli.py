"""Behaviour of the `nnschemaparser` command: targets, outputs, stdout/stderr discipline, exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nnschemaparser.inspection.cli import main, make_inputs, parse_input_spec
from nnschemaparser.inspection.target import TargetError, load_target

ROOT = Path(__file__).resolve().parents[2]

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            hidden = self.fc1(x)
            return self.fc2(hidden.relu())


    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.head = nn.Linear(8, 3)

        def forward(self, ids, scale):
            return self.head(self.embed(ids)) * scale


    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("this model cannot run\\nsecond line")


    class NeedsArgs(nn.Module):
        def __init__(self, width):
            super().__init__()


    def build():
        torch.manual_seed(1)
        return TwoLayer()


    def not_a_model():
        return 42


    instance = TwoLayer()
''')


@pytest.fixture(autouse=True)
def in_tmp_dir(tmp_path: Path, monkeypatch):
    """The graph file is always written (default: <Name>.neurarch.json here): keep it out of the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture()
def models_file(tmp_path: Path) -> Path:
    path = tmp_path / "cli_models.py"
    path.write_text(MODELS)
    return path


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def eager_counts(model: torch.nn.Module, *inputs: torch.Tensor) -> tuple[int, int]:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(*inputs)
    return sum(p.numel() for p in model.parameters()), counter.get_total_flops()


# --- targets and outputs ------------------------------------------------------------------------


def test_graph_totals_equal_torch_counts_and_stdout_stays_empty(models_file, tmp_path, capsys):
    out = tmp_path / "graph.json"
    code, stdout, stderr = run_main(capsys, f"{models_file}:TwoLayer", "--input", "2,16", "-o", str(out),
                                    "--format", "nnsp")
    assert code == 0 and stdout == ""
    assert f"wrote {out}" in stderr
    graph = json.loads(out.read_text())
    model = load_target(f"{models_file}:TwoLayer").model.eval()
    (x,) = make_inputs([parse_input_spec("2,16")], torch.float32, 1000)
    params, flops = eager_counts(model, x)
    assert graph["totals"]["params"] == params
    assert graph["totals"]["flops"] == flops > 0
    assert [n["id"] for n in graph["nodes"]] == ["input_0", "fc1.linear", "relu", "fc2.linear", "output"]
    assert graph["target"] == f"{models_file}:TwoLayer" and graph["inputs"] == ["2,16"]


def test_card_is_printed_when_nothing_else_is_asked(models_file, capsys):
    code, stdout, _ = run_main(capsys, f"{models_file}:TwoLayer", "--input", "2,16")
    assert code == 0
    assert stdout.startswith("+---") and stdout.rstrip().endswith("+")
    assert "TwoLayer" in stdout and "676 params" in stdout
    assert "output equals eager bit for bit" in stdout
    assert "Blockers     none" in stdout


def test_summary_prints_the_op_tree_without_colour_when_asked(models_file, capsys):
    code, stdout, _ = run_main(capsys, f"{models_file}:TwoLayer", "--input", "2,16", "--summary", "--color", "never")
    assert code == 0
    assert "◆ fc1.linear [linear]" in stdout and "◆ relu [relu]" in stdout
    assert "\x1b" not in stdout
    assert "+---" not in stdout  # the card only when asked or when nothing else is


def test_dump_and_trace_are_written(models_file, tmp_path, capsys):
    dump, trace = tmp_path / "schema.txt", tmp_path / "trace.txt"
    code, stdout, _ = run_main(capsys, f"{models_file}:TwoLayer", "--input", "2,16", "--dump", str(dump),
                               "--trace", str(trace))
    assert code == 0 and stdout == ""
    assert "=== BLOCK TwoLayer ===" in dump.read_text()
    assert "ENTER BLOCK TwoLayer" in trace.read_text()


def test_output_dash_writes_the_graph_to_stdout(models_file, capsys):
    code, stdout, _ = run_main(capsys, f"{models_file}:TwoLayer", "--input", "2,16", "-o", "-", "--depth", "0",
                               "--format", "nnsp")
    assert code == 0
    graph = json.loads(stdout)
    assert graph["depth"] == 0 and [n["kind"] for n in graph["nodes"]] == ["input", "module", "output"]


@pytest.mark.parametrize("name", ["build", "instance", "TwoLayer"])
def test_target_may_be_a_factory_an_instance_or_a_class(models_file, capsys, name):
    code, stdout, _ = run_main(capsys, f"{models_file}:{name}", "--input", "2,16", "-o", "-")
    assert code == 0
    assert json.loads(stdout)["totals"]["params"] == 16 * 32 + 32 + 32 * 4 + 4


def test_module_target_is_imported_by_name(capsys):
    code, stdout, _ = run_main(capsys, "nnschemaparser.examples.mlp:MLP", "--input", "2,784", "-o", "-",
                               "--format", "nnsp")
    assert code == 0
    assert json.loads(stdout)["model_type"] == "nnschemaparser.examples.mlp.MLP"


def test_integer_inputs_take_a_dtype_suffix_and_stay_inside_the_embedding(models_file, capsys):
    code, stdout, _ = run_main(capsys, f"{models_file}:Tokens", "--input", "2,5:long", "--input", "1", "-o", "-",
                               "--format", "nnsp")
    assert code == 0
    graph = json.loads(stdout)
    assert [(n["name"], n["dtype"]) for n in graph["nodes"] if n["kind"] == "input"] == [
        ("ids", "torch.int64"), ("scale", "torch.float32")]


def test_make_inputs_draws_integers_below_the_token_range():
    (ids,) = make_inputs([parse_input_spec("4,100:long")], torch.float32, token_range=7)
    assert ids.dtype == torch.int64 and 0 <= int(ids.min()) and int(ids.max()) < 7


# --- usage and failures -------------------------------------------------------------------------


def test_missing_input_is_bad_usage(models_file, capsys):
    code, stdout, stderr = run_main(capsys, f"{models_file}:TwoLayer")
    assert code == 1 and stdout == ""  # bad usage is a failure; 2 is --fail-on-block's
    assert len(stderr.splitlines()) == 1 and "--input" in stderr


@pytest.mark.parametrize("spec", ["2,x", "", "2,16:complex7", "-1,4"])
def test_malformed_input_is_bad_usage(models_file, capsys, spec):
    code, _, stderr = run_main(capsys, f"{models_file}:TwoLayer", "--input", spec)
    assert code == 1
    assert len(stderr.splitlines()) == 1 and "--input" in stderr


@pytest.mark.parametrize("target, message", [
    ("missing_file.py:Model", "no such file: missing_file.py"),
    ("{file}:Nope", "has no attribute 'Nope'"),
    ("{file}:not_a_model", "not_a_model() returned int, not an nn.Module"),
    ("{file}:NeedsArgs", "NeedsArgs() cannot be built without arguments"),
    ("{file}:Broken", "this model cannot run"),
    ("no_such_package_xyz.models:Net", "no module named 'no_such_package_xyz.models'"),
])
def test_failure_is_one_line_on_stderr_with_exit_status_1(models_file, capsys, target, message):
    code, stdout, stderr = run_main(capsys, target.format(file=models_file), "--input", "2,16", "-o", "-")
    assert code == 1 and stdout == ""
    error_lines = [line for line in stderr.splitlines() if "error" in line]
    assert len(error_lines) == 1 and message in error_lines[0]
    assert "Traceback" not in stderr


def test_card_of_a_model_that_does_not_run_says_so_and_exit_status_is_1(models_file, capsys):
    code, stdout, stderr = run_main(capsys, f"{models_file}:Broken", "--input", "2,16", "--card")
    assert code == 1
    assert "| Runs         no: ParseError: Broken raises RuntimeError" in stdout
    assert "0 params, at 2,16" in stdout
    assert len([line for line in stderr.splitlines() if "error" in line]) == 1


def test_verbose_failure_shows_the_traceback(models_file, capsys):
    code, _, stderr = run_main(capsys, f"{models_file}:Broken", "--input", "2,16", "--verbose")
    assert code == 1
    assert "Traceback" in stderr and stderr.rstrip().splitlines()[-1].startswith("nnschemaparser: error:")


def test_target_without_a_name_is_refused():
    with pytest.raises(TargetError, match=r"path/to/file\.py:Name, package\.module:Name or hf:<model_type>"):
        load_target("just_a_word")


def test_unknown_hf_model_type_is_refused():
    pytest.importorskip("transformers")
    with pytest.raises(TargetError, match=r"no model type 'not-a-model'"):
        load_target("hf:not-a-model")


# --- as a process -------------------------------------------------------------------------------


def run_process(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=600)


def test_python_dash_m_on_a_file_target(models_file, tmp_path):
    result = run_process(sys.executable, "-m", "nnschemaparser", f"{models_file.name}:TwoLayer", "--input", "3,16",
                         "-o", "g.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    graph = json.loads((tmp_path / "g.json").read_text())
    model = load_target(f"{models_file}:TwoLayer").model.eval()
    (x,) = make_inputs([parse_input_spec("3,16")], torch.float32, 1000)
    assert (graph["totals"]["params"], graph["totals"]["flops"]) == eager_counts(model, x)


def test_console_script_reports_failure_with_status_1(tmp_path):
    script = Path(sys.executable).with_name("nnschemaparser")
    if not script.exists():
        pytest.skip("the console script is not installed in this environment (pip install -e .)")
    result = run_process(str(script), "gone.py:Model", "--input", "1", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == "nnschemaparser: error: TargetError: no such file: gone.py"


ESCAPES = textwrap.dedent('''
    from torch import nn


    class Boom(BaseException):
        pass


    class Raising(nn.Module):
        def __init__(self, error):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.error = error

        def forward(self, x):
            raise self.error


    def generator_exit():
        return Raising(GeneratorExit("closed"))


    def own_base_exception():
        return Raising(Boom("x"))


    def keyboard_interrupt():
        return Raising(KeyboardInterrupt())
''')


def run_command_process(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m nnschemaparser` on this checkout's package (not whichever one is installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "nnschemaparser", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.parametrize("factory, raised", [("generator_exit", "GeneratorExit: closed"),
                                             ("own_base_exception", "Boom: x")])
def test_a_models_generator_exit_or_own_base_exception_is_one_line_naming_it_and_where_with_status_1(
        tmp_path, factory, raised):
    (tmp_path / "escapes.py").write_text(ESCAPES)
    result = run_command_process(tmp_path, f"escapes.py:{factory}", "--input", "2,16", "-o", "g.json")
    assert result.returncode == 1 and result.stdout == ""
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert error_lines == [result.stderr.strip().splitlines()[-1]]
    line = error_lines[0]
    assert line.startswith(f"nnschemaparser: error: ModelAbort: the model's code raised {raised}, a BaseException "
                           "that is not an Exception (")  # what failed
    assert f"{tmp_path / 'escapes.py'}:16" in line and "forward" in line  # where: the forward's raise
    assert line.endswith(") (--verbose shows the traceback)")


def test_a_keyboard_interrupt_is_one_line_and_exit_status_130(tmp_path):
    (tmp_path / "escapes.py").write_text(ESCAPES)
    result = run_command_process(tmp_path, "escapes.py:keyboard_interrupt", "--input", "2,16", "-o", "g.json")
    assert result.returncode == 130 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "nnschemaparser: interrupted"


def test_hf_bert_runs_end_to_end_as_a_process(tmp_path):
    pytest.importorskip("transformers")
    result = run_process(sys.executable, "-m", "nnschemaparser", "hf:bert", "-o", "bert.json", "--card",
                         "--format", "nnsp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "BertModel" in result.stdout and "output equals eager bit for bit" in result.stdout
    graph = json.loads((tmp_path / "bert.json").read_text())
    target = load_target("hf:bert")
    model = target.model.eval()
    (ids,) = make_inputs([parse_input_spec("1,16:long")], torch.float32, target.token_range)
    assert (graph["totals"]["params"], graph["totals"]["flops"]) == eager_counts(model, ids)
    assert any(n["op"] == "linear" and n["block_path"].endswith("attention.self.query") for n in graph["nodes"])


def test_the_console_script_entry_point_dispatches_serve_and_the_command(capsys):
    import tomllib

    from nnschemaparser.__main__ import main as entry

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nnschemaparser"] == "nnschemaparser.__main__:main"
    assert entry(["serve", "--port", "70000"]) == 2  # the server's own usage check
    assert "nnschemaparser serve: error: " in capsys.readouterr().err
    assert entry(["gone.py:Model", "--input", "1"]) == 1  # anything else is the inspection command
    assert capsys.readouterr().err.strip().splitlines()[-1] == "nnschemaparser: error: TargetError: no such file: gone.py"
