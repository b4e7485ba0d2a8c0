"""The neurarch-trace seed's contract for the command: what `--plan` and `--share` send (no source, no
weights unless `--share-source`), the trace run with autograd enabled, exit statuses 0 / 1 / 2 as the
seed defines them, the model's own `sys.exit` as a failure, bounded reads of `--base` and `--gpu-table`,
and the `neurarch-trace` / `python -m neurarch_trace` entry points with the seed's commands verbatim.

What leaves the machine is read at the other end of a real HTTP connection: a small plan endpoint on
127.0.0.1 that records each request body and answers as a deployment does."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
import tomllib
from pathlib import Path

import pytest
import torch

from nnschemaparser.__main__ import main as command
from nnschemaparser.inspection.cli import USAGE_STATUS, main, make_inputs, parse_input_spec
from nnschemaparser.inspection.target import load_target

ROOT = Path(__file__).resolve().parents[2]
WEIGHT = 0.1234567  # every weight of Private is this value: its digits must never be sent

MODELS = textwrap.dedent('''
    import sys
    import types
    import torch
    from torch import nn

    # what fc1's runs saw, kept outside this module: the parse puts back what its runs write to the
    # model's own module globals (parser/python_state.py), and the command's runs are parse runs
    LOG = sys.modules.setdefault("private_models_log", types.ModuleType("private_models_log"))
    LOG.__dict__.setdefault("SEEN", [])


    class Private(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)
            with torch.no_grad():
                for p in self.parameters():
                    p.fill_(%r)
            self.fc1.register_forward_hook(lambda m, i, o: LOG.SEEN.append(torch.is_grad_enabled()))

        def forward(self, x):
            confidential_hidden_state = self.fc1(x)  # COMMENT_THAT_MUST_STAY_HOME
            return self.fc2(confidential_hidden_state.relu())


    class Exits(nn.Module):
        def forward(self, x):
            sys.exit(3)


    class Fails(nn.Module):
        def forward(self, x):
            raise RuntimeError("MESSAGE_THAT_MUST_STAY_HOME at /home/someone/secret.py")
''' % WEIGHT)


class PlanEndpoint:
    """A plan deployment on 127.0.0.1 that keeps every request body it receives."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                endpoint.bodies.append({"raw": raw.decode(), **body})
                answer = {"card": "the card\n", "plan": {"blockers": []}}
                if body.get("share"):
                    answer.update(id="x" * 24, shareUrl=f"http://127.0.0.1/p/{'x' * 24}")
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def endpoint():
    running = PlanEndpoint()
    yield running
    running.close()


@pytest.fixture()
def models(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURARCH_API", raising=False)
    monkeypatch.delenv("NEURARCH_API_KEY", raising=False)
    path = tmp_path / "private_models.py"
    path.write_text(MODELS)
    return path


def run(capsys, *argv: str, entry=main) -> tuple[int, str, str]:
    code = entry(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _secrets_absent(raw: str) -> None:
    for text in ("confidential_hidden_state", "COMMENT_THAT_MUST_STAY_HOME", "MESSAGE_THAT_MUST_STAY_HOME",
                 "/home/someone", "def forward", str(WEIGHT), "123456"):
        assert text not in raw, f"{text!r} left the machine"


# --- privacy: what --plan and --share send -------------------------------------------------------


@pytest.mark.parametrize("flags", [["--plan"], ["--share"], ["--share", "--share-graph-only"]])
def test_plan_and_share_send_the_graph_without_source_or_weights(models, endpoint, capsys, flags):
    code, out, err = run(capsys, f"{models}:Private", "--input", "2,16", *flags, "--api", endpoint.url,
                         entry=command)  # the console script's entry point, which can encode a schema
    assert code == 0, err
    (body,) = endpoint.bodies
    assert set(body) == {"raw", "graph", "base", "target", "source", "options", "share"}  # no "schema"
    _secrets_absent(body["raw"])
    assert [n["type"] for n in body["graph"]["nodes"]] == ["input", "linear", "linear", "output"]
    assert body["graph"]["nodes"][1]["params"] == {"inFeatures": 16, "outFeatures": 32, "bias": True}
    assert "no weights" in err and ("public URL" in err) == ("--share" in flags)


def test_share_source_sends_the_schema_with_the_forwards_source(models, endpoint, capsys):
    code, _, err = run(capsys, f"{models}:Private", "--input", "2,16", "--share", "--share-source",
                       "--api", endpoint.url, entry=command)
    assert code == 0, err
    (body,) = endpoint.bodies
    assert "confidential_hidden_state" in json.dumps(body["schema"])  # what --share-source is documented to reveal
    assert str(WEIGHT) not in body["raw"]  # still no weights


def test_a_failed_forward_is_sent_as_its_type_without_its_message(models, endpoint, capsys):
    code, out, err = run(capsys, f"{models}:Fails", "--input", "2,16", "--plan", "--api", endpoint.url)
    assert code == 0 and out == "the card\n"
    (body,) = endpoint.bodies
    assert body["graph"]["blockers"] == ["the forward does not run: ParseError"]
    _secrets_absent(body["raw"])
    on_disk = json.loads((models.parent / "Fails.neurarch.json").read_text())
    assert "MESSAGE_THAT_MUST_STAY_HOME" in on_disk["blockers"][0]  # the local file keeps the message


def test_share_source_needs_share_and_refuses_share_graph_only(models, capsys):
    code, out, err = run(capsys, f"{models}:Private", "--input", "2,16", "--share-source")
    assert (code, out) == (1, "") and err.count("\n") == 1 and "add --share" in err
    code, _, err = run(capsys, f"{models}:Private", "--input", "2,16", "--share", "--share-source",
                       "--share-graph-only", "--api", "http://127.0.0.1:9")
    assert code == 1 and err.count("\n") == 1 and "give one of them" in err


# --- the trace: eval(), CPU, autograd enabled, exact ---------------------------------------------


def test_the_trace_runs_with_autograd_enabled_and_equals_eager_bit_for_bit(models, capsys):
    sys.modules.pop("private_models_log", None)
    code, out, err = run(capsys, f"{models}:Private", "--input", "3,16", "--card")
    assert code == 0, err
    assert "output equals eager bit for bit" in out
    seen = sys.modules["private_models_log"].SEEN
    assert seen and all(seen), seen  # every run of fc1 the command made saw autograd on
    from nnschemaparser.inspection.inspector import ModelInspector

    model = load_target(f"{models}:Private").model.eval()
    (x,) = make_inputs([parse_input_spec("3,16")], torch.float32, 1000)
    traced = ModelInspector(model, (x,), autograd=True).result
    assert traced.grad_fn is not None  # the recorded run built the autograd graph
    assert torch.equal(traced, model(x)) and torch.equal(traced, ModelInspector(model, (x,)).result)


# --- exit statuses -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["{m}:Private"],  # no --input
    ["{m}:Private", "--input", "2,x"],
    ["{m}:Private", "--input", "2,16", "--no-such-flag"],
    ["{m}:Private", "--input", "2,16", "--plan", "-o", "-"],
    ["{m}:Private", "--input", "2,16", "--share"],  # no deployment named
])
def test_bad_usage_is_one_stderr_line_and_never_exit_status_2(models, capsys, argv):
    code, out, err = run(capsys, *[a.format(m=models) for a in argv])
    assert code == USAGE_STATUS == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("nnschemaparser: error: ") and "--help" in err


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "--share-source" in out


def test_a_forward_calling_sys_exit_is_a_failure_line_with_status_1(models, capsys):
    code, out, err = run(capsys, f"{models}:Exits", "--input", "2,16", "-o", "g.json")
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == ("nnschemaparser: error: ModelExit: the model's code called sys.exit(3); "
                                            "a model must raise, not exit")


def test_a_module_calling_sys_exit_on_import_is_a_failure_line_with_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quits.py").write_text("import sys\nsys.exit('bye')\n")
    code, _, err = run(capsys, "quits.py:Net", "--input", "2")
    assert code == 1 and err.strip().splitlines()[-1].endswith("called sys.exit('bye'); a model must raise, not exit")


@pytest.mark.parametrize("flag", ["--base", "--gpu-table"])
def test_base_and_gpu_table_are_read_bounded(models, capsys, flag):
    code, out, err = run(capsys, f"{models}:Private", "--input", "2,16", "--plan", flag, "/dev/zero")
    assert code == 1 and out == ""
    assert "/dev/zero is larger than" in err.strip().splitlines()[-1]


# --- neurarch-trace ------------------------------------------------------------------------------

RESNET = textwrap.dedent('''
    from torch import nn


    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 7, stride=8, padding=3)
            self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4, 10)

        def forward(self, x):
            x = self.stem(x)
            x = x + self.block(x)
            return self.fc(self.pool(x).flatten(1))


    def build_model():
        return ResNet18()
''')


def test_the_console_script_and_the_module_are_declared_and_packaged():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["neurarch-trace"] == "neurarch_trace:main"
    assert "neurarch_trace" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert (ROOT / "neurarch_trace" / "__main__.py").is_file()


def test_python_dash_m_neurarch_trace_runs_the_seeds_commands_verbatim(tmp_path, endpoint):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "resnet.py").write_text(RESNET)
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "model.py").write_text(RESNET)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEURARCH_API": endpoint.url}
    env.pop("NEURARCH_API_KEY", None)

    def trace(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "neurarch_trace", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    done = trace("models/resnet.py:ResNet18", "--input", "1,3,224,224", "--plan", "--share")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"the card\nShare: http://127.0.0.1/p/{'x' * 24}\n"  # stdout: the card and Share only
    assert "neurarch-trace: wrote ResNet18.neurarch.json" in done.stderr
    graph = json.loads((tmp_path / "ResNet18.neurarch.json").read_text())
    assert graph["nodes"][1]["inputShape"] == [3, 224, 224]  # the batch is stripped, as the seed's convention says
    assert "schema" not in endpoint.bodies[-1]

    done = trace("models/resnet.py:ResNet18", "--input", "1,3,224,224", "-o", "resnet18.neurarch.json")
    assert done.returncode == 0 and (tmp_path / "resnet18.neurarch.json").is_file(), done.stderr
    done = trace("my_pkg.model:build_model", "--input", "1,3,224,224", "--name", "Mine", "--depth", "1", "-o", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "Mine"
    done = trace("models/resnet.py:ResNet18", "--input", "1,3,224,224", "--base", "resnet18.neurarch.json",
                 "--fail-on-block")
    assert done.returncode == 0, done.stderr
    assert endpoint.bodies[-1]["base"]["name"] == "ResNet18"
    done = trace("models/resnet.py:ResNet18")  # bad usage: one line, status 1
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith("neurarch-trace: error: ")
