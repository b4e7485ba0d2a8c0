"""`nnschemaparser serve`: a small self-hostable plan and share deployment (Starlette on uvicorn).

    nnschemaparser serve [--host 127.0.0.1] [--port 8000] [--store DIR] [--rate-limit 30] [--window 60]
                         [--max-body 8388608] [--public-url https://plans.example.org]

Routes:

- `POST /api/v1/plan`: body `{"graph", "base"?, "target"?, "source"?, "options"?, "share"?}` (what
  `plan_client.request_plan` sends). The graph (and base) are validated as `.neurarch.json`
  graphs, the plan is computed by `inspection.plan.compute_plan` (the same code as the CLI's local
  `--plan`) and the answer is `{"card", "plan"}`, plus `{"shareUrl", "id"}` when `share` is true.
  Nothing of a plain plan request is kept.
- `POST /api/v1/share`: body `{"graph"}`; stores it and answers `{"shareUrl", "id"}`.
- `GET /p/<id>`: the page of a shared graph (its plan card, its layers by scope, its nodes), one
  self-contained HTML page with no script. `GET /api/v1/graphs/<id>`: the stored graph as JSON.
- `GET /healthz`: `{"ok": true}`.

Shared graphs are stored as files in `--store` (default: a new temporary folder) under ids made by
`secrets.token_urlsafe(18)` (144 random bits): the URL cannot be guessed, and anyone who has it can
open it. Limits: a request body over `--max-body` bytes is refused with 413, a graph over
`MAX_SERVED_NODES` nodes with 400; each client IP may make `--rate-limit` POST requests per
`--window` seconds (429 past that), unless it sends `Authorization: Bearer <key>` with a key from
`NEURARCH_SERVER_KEYS` (comma-separated) or `--keys-file` (one a line); an unknown key is 401.
Errors answer `{"error": "..."}`.

The server lives in the widget stage because it serves pages (it may import `inspection` for the
graph checks and the plan); the root `__main__` dispatches `nnschemaparser serve` here.
Depends on inspection (neurarch_graph, plan, gpu_table), starlette and uvicorn (the `serve` extra).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Optional, Sequence

from ..inspection.gpu_table import GPUTableError
from ..inspection.neurarch_graph import GraphFileError, validate_graph
from ..inspection.plan import PlanError, compute_plan, format_plan_card, options_from_json

__all__ = ["create_app", "main", "RateLimiter", "GraphStore", "MAX_SERVED_NODES", "DEFAULT_MAX_BODY"]

MAX_SERVED_NODES = 50_000
DEFAULT_MAX_BODY = 8 * 1024 * 1024
_ID = re.compile(r"^[A-Za-z0-9_-]{20,64}$")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RateLimiter:
    """At most `limit` hits per `window` seconds for each key (a client IP), sliding window."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self._hits: dict[str, deque] = {}
        self._lock = threading.Lock()

    def allow(self, key: str, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            hits = self._hits.setdefault(key, deque())
            while hits and hits[0] <= now - self.window:
                hits.popleft()
            if len(hits) >= self.limit:
                return False
            hits.append(now)
            if len(self._hits) > 100_000:  # forget idle clients rather than grow without bound
                for stale in [k for k, v in self._hits.items() if not v]:
                    del self._hits[stale]
            return True


class GraphStore:
    """Shared graphs as `<id>.json` files in one folder; ids from `secrets.token_urlsafe`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def put(self, graph: dict[str, Any]) -> str:
        while True:
            token = secrets.token_urlsafe(18)
            path = self.folder / f"{token}.json"
            try:
                with open(path, "x") as handle:  # never overwrite another share
                    json.dump(graph, handle)
                return token
            except FileExistsError:  # pragma: no cover - 144 random bits
                continue

    def get(self, token: str) -> Optional[dict[str, Any]]:
        if not _ID.match(token):
            return None
        path = self.folder / f"{token}.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text())


def _graph_page(graph: dict[str, Any], card: str) -> str:
    """The page of a shared graph: the card, the layers grouped by scope, the node table."""
    esc = html.escape
    nodes = graph.get("nodes", [])
    by_scope: dict[str, list[dict]] = {}
    for node in nodes:
        by_scope.setdefault(str(node.get("scope", "")), []).append(node)
    tree = []
    for scope in sorted(by_scope):
        items = "".join(f"<li><code>{esc(str(n.get('id')))}</code> <b>{esc(str(n.get('type')))}</b> "
                        f"{esc(json.dumps(n.get('outputShape')))}</li>" for n in by_scope[scope])
        tree.append(f"<details open><summary>{esc(scope or '(root)')} <small>{len(by_scope[scope])} nodes"
                    f"</small></summary><ul>{items}</ul></details>")
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in (
            n.get("id"), n.get("type"), n.get("scope"), json.dumps(n.get("inputShape")),
            json.dumps(n.get("outputShape")), n.get("paramCount"), json.dumps(n.get("params"))[:300])) + "</tr>"
        for n in nodes)
    title = esc(str(graph.get("name") or "graph"))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title} · nnschemaparser</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}pre{background:#f6f6f6;"
            "padding:1em}table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ddd;padding:2px 6px;"
            "text-align:left}code{font-size:95%}</style></head><body>"
            f"<h1>{title}</h1><pre>{esc(card)}</pre><h2>Layers by scope</h2>{''.join(tree)}"
            f"<h2>Nodes</h2><table><tr><th>id</th><th>type</th><th>scope</th><th>input</th><th>output</th>"
            f"<th>params</th><th>hyperparameters</th></tr>{rows}</table>"
            f"<p><a href='../api/v1/graphs/{esc(str(graph.get('_id', '')))}'>the graph as JSON</a></p></body></html>")


def create_app(store: Optional[Path] = None, *, rate_limit: int = 30, window: float = 60.0,
               api_keys: Sequence[str] = (), max_body: int = DEFAULT_MAX_BODY, public_url: Optional[str] = None):
    """The Starlette application (see the module docstring); `store` defaults to a new temporary folder."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    graphs = GraphStore(Path(store) if store is not None else Path(tempfile.mkdtemp(prefix="nnsp-shares-")))
    limiter = RateLimiter(rate_limit, window)
    keys = {k for k in api_keys if k}

    def refuse(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def admit(request: Request) -> None:
        auth = request.headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _Refused(401, "the Authorization header must be 'Bearer <key>'")
            if not any(secrets.compare_digest(token.strip(), k) for k in keys):
                raise _Refused(401, "unknown API key")
            return  # a known key lifts the per-IP limit
        client = request.client.host if request.client else "unknown"
        if not limiter.allow(client):
            raise _Refused(429, f"rate limit: at most {rate_limit} requests per {window:g} s from one address; "
                                "send an API key to lift it")

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            raise _Refused(413, f"the request body is {declared} bytes, more than the limit of {max_body}")
        size, chunks = 0, []
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise _Refused(413, f"the request body is more than the limit of {max_body} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks) or b"null")
        except ValueError:
            raise _Refused(400, "the request body is not JSON") from None

    def checked(graph: Any, where: str) -> dict[str, Any]:
        try:
            graph = validate_graph(graph, where)
        except GraphFileError as exc:
            raise _Refused(400, str(exc)) from None
        if len(graph["nodes"]) > MAX_SERVED_NODES:
            raise _Refused(400, f"{where} has {len(graph['nodes'])} nodes, more than this server's limit of "
                                f"{MAX_SERVED_NODES}")
        return graph

    def share_url(request: Request, token: str) -> str:
        root = (public_url or str(request.base_url)).rstrip("/")
        return f"{root}/p/{token}"

    async def plan(request: Request):
        try:
            admit(request)
            body = await read_json(request)
            if not isinstance(body, dict) or "graph" not in body:
                raise _Refused(400, "the body must be a JSON object with a 'graph'")
            graph = checked(body["graph"], "graph")
            base = checked(body["base"], "base") if body.get("base") is not None else None
            try:
                options = options_from_json(body.get("options"))
            except (PlanError, GPUTableError) as exc:
                raise _Refused(400, str(exc)) from None
            result = await run_in_threadpool(compute_plan, graph, options, base)
            source = body.get("source")
            if not isinstance(source, str):  # the file or module part of the target
                target = body.get("target") if isinstance(body.get("target"), str) else graph.get("target")
                source = target.rpartition(":")[0] if target and ":" in target else (target or "")
            source = source[:200]
            answer = {"plan": result, "card": format_plan_card(result, source=source)}
            if body.get("share"):
                token = await run_in_threadpool(graphs.put, graph)
                answer.update(id=token, shareUrl=share_url(request, token))
            return JSONResponse(answer)
        except _Refused as exc:
            return refuse(exc.status, str(exc))

    async def share(request: Request):
        try:
            admit(request)
            body = await read_json(request)
            if not isinstance(body, dict) or "graph" not in body:
                raise _Refused(400, "the body must be a JSON object with a 'graph'")
            token = await run_in_threadpool(graphs.put, checked(body["graph"], "graph"))
            return JSONResponse({"id": token, "shareUrl": share_url(request, token)})
        except _Refused as exc:
            return refuse(exc.status, str(exc))

    def stored(request: Request) -> Optional[dict[str, Any]]:
        return graphs.get(request.path_params["token"])

    async def graph_json(request: Request):
        graph = await run_in_threadpool(stored, request)
        return JSONResponse(graph) if graph is not None else refuse(404, "no shared graph has this id")

    async def graph_page(request: Request):
        graph = await run_in_threadpool(stored, request)
        if graph is None:
            return HTMLResponse("<!doctype html><p>No shared graph has this id.</p>", status_code=404)
        card = format_plan_card(compute_plan(graph))
        page = _graph_page({**graph, "_id": request.path_params["token"]}, card)
        return HTMLResponse(page, headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
                                           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    async def health(request: Request):
        return JSONResponse({"ok": True})

    return Starlette(routes=[
        Route("/api/v1/plan", plan, methods=["POST"]),
        Route("/api/v1/share", share, methods=["POST"]),
        Route("/api/v1/graphs/{token}", graph_json, methods=["GET"]),
        Route("/p/{token}", graph_page, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ])


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnschemaparser serve",
                                     description="Serve POST /api/v1/plan and shared graphs (see docs/CLI.md).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument("--store", default=None, help="folder of shared graphs (default: a new temporary folder)")
    parser.add_argument("--rate-limit", type=int, default=30, metavar="N",
                        help="POST requests per window per client IP without a key (default 30)")
    parser.add_argument("--window", type=float, default=60.0, metavar="SECONDS", help="rate window (default 60)")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES",
                        help=f"largest request body (default {DEFAULT_MAX_BODY})")
    parser.add_argument("--keys-file", default=None,
                        help="file of API keys, one a line (also: NEURARCH_SERVER_KEYS, comma-separated)")
    parser.add_argument("--public-url", default=None, help="the URL share links start with (default: as requested)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the server until it is stopped (SIGINT/SIGTERM); returns the exit status."""
    parser = _argument_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.rate_limit < 1 or args.window <= 0 or args.max_body < 1 or not 0 <= args.port <= 65535:
        parser.print_usage(sys.stderr)
        print("nnschemaparser serve: error: --rate-limit, --window and --max-body must be positive, --port 0-65535",
              file=sys.stderr)
        return 2
    try:
        import uvicorn
    except ImportError:
        print("nnschemaparser serve: error: the server needs starlette and uvicorn: "
              "pip install 'nnschemaparser[serve]'", file=sys.stderr)
        return 1
    keys = [k.strip() for k in os.environ.get("NEURARCH_SERVER_KEYS", "").split(",") if k.strip()]
    if args.keys_file:
        try:
            keys += [line.strip() for line in Path(args.keys_file).read_text().splitlines() if line.strip()]
        except OSError as exc:
            print(f"nnschemaparser serve: error: cannot read {args.keys_file}: {exc.strerror}", file=sys.stderr)
            return 1
    app = create_app(Path(args.store) if args.store else None, rate_limit=args.rate_limit, window=args.window,
                     api_keys=keys, max_body=args.max_body, public_url=args.public_url)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"nnschemaparser serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    sock.listen(128)
    port = sock.getsockname()[1]
    print(f"nnschemaparser serve: listening on http://{args.host}:{port}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=5))
    server.run(sockets=[sock])
    return 0
