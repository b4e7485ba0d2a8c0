"""`nnschemaparser serve` started for real on 127.0.0.1, and the CLI's --plan --api / --share against it.

`main` here is `inspection.cli.main` called without a schema encoder, which shares the graph only
(as an older client does); `command` is the console script's entry point (`nnschemaparser.__main__`),
whose `--share` uploads the schema too and whose share opens in the inspector's static page.
The browser checks of that page are in tests/browser/test_shared_page_e2e.py."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from nnschemaparser.__main__ import main as command  # noqa: E402
from nnschemaparser.inspection.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-0123456789"

MODELS = textwrap.dedent('''
    from torch import nn


    class TwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x).relu())


    class Broken(nn.Module):
        def forward(self, x):
            return x.reshape(3, 7)
''')


class Server:
    def __init__(self, folder: Path, *args: str) -> None:
        self.store = folder / "store"
        self.log = folder / "server.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "NEURARCH_SERVER_KEYS": KEY}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nnschemaparser", "serve", "--port", "0", "--store", str(self.store), *args],
                stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=folder)
        deadline = time.monotonic() + 180
        self.url = None
        while time.monotonic() < deadline and self.process.poll() is None:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.log.read_text())
            if found:
                self.url = found.group(1)
                break
            time.sleep(0.2)
        if self.url is None:
            self.stop()
            raise RuntimeError(f"the server did not start: {self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, 9)
                self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("server"), "--rate-limit", "1000", "--max-body", "100000")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("strict"), "--rate-limit", "2", "--window", "3600")
    yield running
    running.stop()


@pytest.fixture()
def models(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEURARCH_API", raising=False)
    monkeypatch.delenv("NEURARCH_API_KEY", raising=False)
    path = tmp_path / "served_models.py"
    path.write_text(MODELS)
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def get(url: str) -> tuple[int, bytes, object]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


@pytest.mark.parametrize("target", ["file", "hf:bert"])
def test_the_deployment_prints_the_same_card_as_the_local_plan(server, models, capsys, target):
    argv = [f"{models}:TwoLayer", "--input", "2,16"] if target == "file" else [target]
    if target.startswith("hf:"):
        pytest.importorskip("transformers")
    code, local, _ = run(capsys, *argv, "--plan")
    assert code == 0
    code, remote, err = run(capsys, *argv, "--plan", "--api", server.url)
    assert code == 0
    assert remote == local and "| Runs            yes" in remote
    assert f"sending the graph (layer types, shapes and hyperparameters; no weights) to {server.url}" in err
    assert not any(server.store.glob("*.json"))  # a plan request keeps nothing addressable


def test_share_prints_the_url_last_and_the_url_serves_the_page_and_the_graph(server, models, tmp_path, capsys):
    code, out, _ = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--api", server.url)
    assert code == 0
    last = out.rstrip("\n").splitlines()[-1]
    match = re.fullmatch(re.escape(server.url) + r"/p/([A-Za-z0-9_-]{24,})", last.removeprefix("Share: "))
    assert last.startswith("Share: ") and match, last
    token = match.group(1)
    status, page, headers = get(f"{server.url}/p/{token}")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    text = page.decode()
    assert "<h1>TwoLayer</h1>" in text and "<code>fc1</code> <b>linear</b>" in text and "<script" not in text
    status, body, _ = get(f"{server.url}/api/v1/graphs/{token}")
    assert status == 200 and json.loads(body) == json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())
    code, again, _ = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--api", server.url)
    assert again.splitlines()[-1] != last  # every share gets its own unguessable id


@pytest.mark.parametrize("token", ["nope", "A" * 30, "..%2F..%2Fetc%2Fpasswd"])
def test_an_unknown_share_id_is_404(server, token):
    assert get(f"{server.url}/p/{token}")[0] == 404
    assert get(f"{server.url}/api/v1/graphs/{token}")[0] == 404


def test_a_body_over_the_size_limit_is_413_and_a_bad_graph_is_400(server):
    status, answer, _ = post(f"{server.url}/api/v1/plan", b" " * 200_000)
    assert status == 413 and "more than the limit of 100000" in answer["error"]
    status, answer, _ = post(f"{server.url}/api/v1/plan", json.dumps({"graph": {"format": "x"}}).encode())
    assert status == 400 and answer["error"] == "graph has format 'x', expected 'neurarch/1'"
    status, answer, _ = post(f"{server.url}/api/v1/plan", b"{oops")
    assert status == 400 and answer["error"] == ("the request body: not valid JSON at line 1 column 2: Expecting "
                                                 "property name enclosed in double quotes")


def test_the_rate_limit_is_one_line_and_exit_1_and_a_bearer_key_lifts_it(strict_server, models, tmp_path, capsys,
                                                                         monkeypatch):
    url = f"{strict_server.url}/api/v1/plan"
    statuses = [post(url, b"{}")[0] for _ in range(3)]  # bounded: the limit is 2 per window
    assert statuses == [400, 400, 429]
    monkeypatch.setenv("NEURARCH_API", strict_server.url)
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan")
    assert code == 1 and out == ""
    error_lines = [line for line in err.splitlines() if "error" in line]
    assert len(error_lines) == 1 and "rate limited (HTTP 429)" in error_lines[0]
    assert (tmp_path / "TwoLayer.neurarch.json").exists()
    monkeypatch.setenv("NEURARCH_API_KEY", KEY)
    code, out, _ = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan")
    assert code == 0 and out.startswith("+---")
    monkeypatch.setenv("NEURARCH_API_KEY", "wrong")
    code, _, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan")
    assert code == 1 and "refused the request (HTTP 401): unknown API key" in err


def test_a_network_failure_is_one_line_and_exit_1_with_the_graph_on_disk(models, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--plan", "--api", f"http://127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1].startswith(
        f"nnschemaparser: error: PlanAPIError: http://127.0.0.1:{port}/api/v1/plan: network failure")
    assert json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())["name"] == "TwoLayer"


class _Failing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"error": "the planner crashed"}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_error_is_one_line_and_exit_1(models, tmp_path, capsys):
    failing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=failing.serve_forever, daemon=True)
    thread.start()
    try:
        api = f"http://127.0.0.1:{failing.server_address[1]}"
        code, out, err = run(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--api", api)
    finally:
        failing.shutdown()
        failing.server_close()
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == (f"nnschemaparser: error: PlanAPIError: {api}/api/v1/plan: server error "
                                            "(HTTP 500): the planner crashed")
    assert (tmp_path / "TwoLayer.neurarch.json").exists()


@pytest.mark.parametrize("field, value, message", [
    ("outputShape", "3x8", "outputShape must be a list of whole numbers or null"),
    ("paramCount", -4, "paramCount a count"),
    ("scope", 7, "scope must be a string"),
])
def test_a_graph_with_malformed_node_fields_is_400_not_a_crash(server, models, tmp_path, capsys, field, value,
                                                               message):
    assert main([f"{models}:TwoLayer", "--input", "2,16"]) == 0
    graph = json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())
    graph["nodes"][1][field] = value
    status, answer, _ = post(f"{server.url}/api/v1/plan", json.dumps({"graph": graph}).encode())
    assert status == 400 and message in answer["error"] and "'fc1'" in answer["error"]


def test_the_deployment_reports_a_forward_that_fails_as_a_blocker_and_fail_on_block_exits_2(server, models, capsys):
    code, out, err = run(capsys, f"{models}:Broken", "--input", "2,16", "--fail-on-block", "--api", server.url)
    assert code == 2
    assert "| Runs            no, see the blockers below" in out
    assert "Blockers        the forward does not run" in out
    code, out, _ = run(capsys, f"{models}:Broken", "--input", "2,16", "--plan", "--api", server.url)
    assert code == 0 and "the forward does not run" in out


# ------------------------------------------------------------ shares with a schema: the inspector's page


def run_command(capsys, *argv: str) -> tuple[int, str, str]:
    code = command(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def share_token(server, out: str) -> str:
    last = out.rstrip("\n").splitlines()[-1]
    match = re.fullmatch(re.escape(server.url) + r"/p/([A-Za-z0-9_-]{24,})", last.removeprefix("Share: "))
    assert last.startswith("Share: ") and match, last
    return match.group(1)


def page_payload(text: str) -> dict:
    """The JSON payload of an inspector static page (its `nnsp-data` element)."""
    found = re.search(r'<script type="application/json" id="nnsp-data">(.*?)</script>', text, re.S)
    assert found, "no nnsp-data element: not the inspector's static page"
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_share_from_the_command_uploads_the_schema_and_the_page_is_the_inspector_with_the_models_blocks(
        server, models, tmp_path, capsys):
    from nnschemaparser import load_schema
    from nnschemaparser.files.schema_file import schema_from_json
    from nnschemaparser.widget.static_html import content_security_policy

    code, out, err = run_command(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--share-source",
                                 "--api", server.url)
    assert code == 0 and "with its schema (the forward's source)" in err
    token = share_token(server, out)
    status, page, headers = get(f"{server.url}/p/{token}")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    text = page.decode()
    # the inspector's static page: the built bundle, one module script, allowed by its hash only
    assert '<div id="nnsp-static"></div>' in text and text.count('<script type="module">') == 1
    policy = headers["Content-Security-Policy"]
    assert policy == content_security_policy(text)
    assert policy.startswith("default-src 'none'; script-src 'sha256-") and "unsafe-inline'; base" in policy
    assert "script-src 'unsafe-inline'" not in policy and "connect-src" not in policy
    # the model's blocks, as the tree shows them, and the card the command printed, above the page
    rows = page_payload(text)["traits"]["tree"]["rows"]
    # a row: [index, parent, kind, text, shape, ..., extra]; kind "B" is a block
    blocks = {(row[3], row[-1].get("path")) for row in rows if row[2] == "B"}
    assert blocks == {("TwoLayer", ""), ("fc1 · Linear", "fc1"), ("fc2 · Linear", "fc2")}, blocks
    assert any(row[3].endswith("CALL fc1(x)") and row[4] == "float32[2, 32]" for row in rows)
    card = out.rstrip("\n").rsplit("\n", 1)[0]  # everything before the Share line
    import html as html_module
    assert html_module.escape(card.splitlines()[1]) in text and "| Runs            yes" in text
    # the stored schema: decodable without a model, the same blocks as the model's own schema
    status, body, _ = get(f"{server.url}/api/v1/schemas/{token}")
    assert status == 200
    shared = schema_from_json(json.loads(body))
    assert sorted(b.path for b in shared.iter_blocks()) == ["", "fc1", "fc2"]
    assert shared.module is None and shared.sub_blocks["fc1"].module_type == "torch.nn.modules.linear.Linear"
    # no absolute path of the uploader's machine: files are named relative to the current directory
    assert [entry["path"] for entry in json.loads(body)["files"]] == ["served_models.py",
                                                                       "torch/nn/modules/linear.py"]
    (tmp_path / "shared.schema.json").write_bytes(body)
    assert load_schema(tmp_path / "shared.schema.json").name == "TwoLayer"


def test_share_graph_only_and_an_old_clients_graph_get_the_graph_page(server, models, tmp_path, capsys):
    code, out, err = run_command(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--share-graph-only",
                                 "--api", server.url)
    assert code == 0 and "to share it at a public URL\n" in err
    token = share_token(server, out)
    graph = json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())
    status, answer, _ = post(f"{server.url}/api/v1/share", json.dumps({"graph": graph}).encode())  # an old client
    assert status == 200
    legacy = "L" * 24  # a share an older server stored: its graph file only, the page rendered when asked
    (server.store / f"{legacy}.json").write_text(json.dumps(graph))
    for shared in (token, answer["id"], legacy):
        status, page, headers = get(f"{server.url}/p/{shared}")
        text = page.decode()
        assert status == 200 and "<h1>TwoLayer</h1>" in text and "<code>fc1</code> <b>linear</b>" in text
        assert "<script" not in text and "Shared as a graph only" in text
        assert headers["Content-Security-Policy"].startswith("default-src 'none'; style-src 'unsafe-inline'")
        assert get(f"{server.url}/api/v1/schemas/{shared}")[0] == 404


def test_share_graph_only_without_share_is_bad_usage(models, capsys):
    code, _, err = run_command(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share-graph-only")
    assert code == 1 and "--share-graph-only only changes what --share uploads: add --share" in err


def _schema_document(models) -> dict:
    import importlib.util

    from nnschemaparser import NNParser
    from nnschemaparser.widget.shared_page import share_document

    spec = importlib.util.spec_from_file_location("served_models", models)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    schema = NNParser.parse_model(model=module.TwoLayer().eval(), inputs_tensors_shapes={"x": (2, 16)})
    return share_document(schema)


def _hostile(document: dict, kind: str) -> dict:
    document = json.loads(json.dumps(document))
    op = next(i for i in document["root"]["sub_blocks"]["fc1"]["signature"]["body"] if i["type"] == "op")
    if kind == "callable":
        op["target"] = {"kind": "callable", "name": "os.system"}
    elif kind == "field":
        op["exec"] = "import os"
    elif kind == "format":
        document["format"] = "pickle"
    return document


@pytest.mark.parametrize("kind, status, message", [
    ("callable", 400, "the shared schema is refused: schema: "),
    ("field", 400, "the shared schema is refused: schema: "),
    ("format", 400, "this is not a nnschemaparser-schema file"),
])
def test_a_hostile_schema_is_refused_and_nothing_is_stored(server, models, tmp_path, kind, status, message):
    assert main([f"{models}:TwoLayer", "--input", "2,16"]) == 0
    graph = json.loads((tmp_path / "TwoLayer.neurarch.json").read_text())
    before = sorted(p.name for p in server.store.glob("*"))
    schema = _hostile(_schema_document(models), kind)
    for url, body in ((f"{server.url}/api/v1/share", {"graph": graph, "schema": schema}),
                      (f"{server.url}/api/v1/plan", {"graph": graph, "schema": schema, "share": True})):
        code, answer, _ = post(url, json.dumps(body).encode())
        assert code == status and message in answer["error"], answer
    assert sorted(p.name for p in server.store.glob("*")) == before


def test_a_request_body_is_read_with_the_bounded_strict_reader(server):
    keys = b",".join(b'"k%d":0' % i for i in range(10_000))  # one new string per 8 bytes: past 4x (under --max-body)
    bomb = b'{"graph": {' + keys + b"}}"
    status, answer, _ = post(f"{server.url}/api/v1/share", bomb)
    assert status == 413 and "dense with tiny values, containers or unique keys" in answer["error"]
    nested = b'{"graph": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    status, answer, _ = post(f"{server.url}/api/v1/share", nested)
    assert status == 413 and "JSON nesting deeper than 128 levels" in answer["error"]
    deep = b'{"graph": ' + b"[" + b" " * 40 * 1000 + b"[" * 999 + b"]" * 1000 + b"}"  # padded: not a bomb
    status, answer, _ = post(f"{server.url}/api/v1/share", deep)
    assert status == 413 and "JSON nesting deeper than 128 levels" in answer["error"]
    status, answer, _ = post(f"{server.url}/api/v1/share", b'{"graph": 1, "graph": 2}')
    assert status == 400 and "duplicate key 'graph'" in answer["error"]
    status, answer, _ = post(f"{server.url}/api/v1/share", b'{"graph": NaN}')
    assert status == 400 and "the JSON token NaN is not allowed" in answer["error"]
    assert get(f"{server.url}/healthz")[0] == 200  # still serving


def test_a_share_too_large_for_the_deployment_is_one_line_naming_share_source(models, tmp_path_factory, capsys):
    small = Server(tmp_path_factory.mktemp("small"), "--max-body", "4000")  # the graph fits, not its schema
    try:
        code, out, err = run_command(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share", "--share-source",
                                     "--api", small.url)
        assert code == 1 and out == ""
        assert err.strip().splitlines()[-1].startswith(
            f"nnschemaparser: error: PlanAPIError: {small.url}/api/v1/plan: refused the request as too large (HTTP "
            "413; without --share-source the graph is sent without its schema): the request body is ")
        code, out, _ = run_command(capsys, f"{models}:TwoLayer", "--input", "2,16", "--share",
                                   "--api", small.url)
        assert code == 0 and out.splitlines()[-1].startswith(f"Share: {small.url}/p/")
    finally:
        small.stop()
