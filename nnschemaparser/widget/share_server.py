"""`nnschemaparser serve`: a small self-hostable plan and share deployment (Starlette on uvicorn).

    nnschemaparser serve [--host 127.0.0.1] [--port 8000] [--store DIR] [--rate-limit 30] [--window 60]
                         [--max-body 8388608] [--public-url https://plans.example.org]

Routes:

- `POST /api/v1/plan`: body `{"graph", "base"?, "target"?, "source"?, "options"?, "share"?,
  "schema"?}` (what `plan_client.request_plan` sends). The graph (and base) are validated as
  `.neurarch.json` graphs, the plan is computed by `inspection.plan.compute_plan` (the same code as
  the CLI's local `--plan`) and the answer is `{"card", "plan"}`, plus `{"shareUrl", "id"}` when
  `share` is true. Nothing of a plain plan request is kept (a `schema` is read only when sharing).
- `POST /api/v1/share`: body `{"graph", "schema"?}`; stores it and answers `{"shareUrl", "id"}`.
- `GET /p/<id>`: the page of a share. With a schema (what `nnschemaparser ... --share` uploads:
  shared_page.share_document), the inspector's static page of that schema (its block tree, shapes,
  sources; static_html.py) under the plan card; for a graph-only share, the card, the layers by scope
  and the nodes, with no script. Both are one self-contained page sent with a Content-Security-Policy
  that fetches nothing (the inspector's one script is allowed by its hash). The page is rendered
  once, when the share is stored, so a GET only reads a file.
  `GET /api/v1/graphs/<id>`: the stored graph as JSON; `GET /api/v1/schemas/<id>`: the stored
  schema document (404 for a graph-only share), which `load_schema` reads.
- `GET /healthz`: `{"ok": true}`.

An uploaded schema is hostile data: the request body is read with the schema files' strict bounded
JSON reader (`files.file_format.parse_json`: nesting, string, number and decoded-size bounds) and
the schema is decoded by the schema file loader without a model (shared_page.check_shared_schema:
every record typed and checked, nothing imported, evaluated or called, never run); a body it
refuses is 400 (413 past a size bound), naming the problem.

Shares are stored as files in `--store` (default: a new temporary folder) under ids made by
`secrets.token_urlsafe(18)` (144 random bits): the URL cannot be guessed, and anyone who has it can
open it. Limits: a request body over `--max-body` bytes is refused with 413, a graph over
`MAX_SERVED_NODES` nodes with 400; each client IP may make `--rate-limit` POST requests per
`--window` seconds (429 past that), unless it sends `Authorization: Bearer <key>` with a key from
`NEURARCH_SERVER_KEYS` (comma-separated) or `--keys-file` (one a line); an unknown key is 401.
Errors answer `{"error": "..."}`.

The server lives in the widget stage because it serves pages (it may import `inspection` for the
graph checks and the plan); the root `__main__` dispatches `nnschemaparser serve` here.
Depends on inspection (neurarch_graph, plan, gpu_table), files (file_format), the widget's shared_page
and static_html, starlette and uvicorn (the `serve` extra).
"""

from __future__ import annotations

import argparse
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

from ..files.bounded_json import plain
from ..files.file_format import FileLimitError, dump_json, parse_json
from ..inspection.gpu_table import GPUTableError
from ..inspection.neurarch_graph import GraphFileError, validate_graph
from ..inspection.plan import PlanError, compute_plan, format_plan_card, options_from_json
from ..schema.errors import SchemaFormatError
from .shared_page import check_shared_schema, graph_page, inspector_page, share_limits
from .static_html import content_security_policy

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
    """Shares as files in one folder, under ids from `secrets.token_urlsafe`: `<id>.json` (the graph),
    `<id>.html` (its page) and, when a schema was shared, `<id>.schema.json` (its document)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(18)

    def put(self, token: str, graph: dict[str, Any], page: Optional[str] = None,
            schema: Optional[dict[str, Any]] = None) -> bool:
        """Store a share under `token` (False when the token is taken: draw another). Its schema and page
        are written before the graph, whose file makes the id visible; no file is ever overwritten."""
        try:
            if schema is not None:
                with open(self.folder / f"{token}.schema.json", "xb") as handle:
                    handle.write(dump_json(schema))
            if page is not None:
                with open(self.folder / f"{token}.html", "x", encoding="utf-8") as handle:
                    handle.write(page)
            with open(self.folder / f"{token}.json", "x") as handle:
                json.dump(graph, handle)
            return True
        except FileExistsError:  # pragma: no cover - 144 random bits
            return False

    def _path(self, token: str, suffix: str) -> Optional[Path]:
        if not _ID.match(token) or not (self.folder / f"{token}.json").is_file():
            return None
        path = self.folder / f"{token}{suffix}"
        return path if path.is_file() else None

    def get(self, token: str) -> Optional[dict[str, Any]]:
        path = self._path(token, ".json")
        return None if path is None else json.loads(path.read_text())

    def page(self, token: str) -> Optional[str]:
        """The stored page (None for a share stored by an older server, or no such share)."""
        path = self._path(token, ".html")
        return None if path is None else path.read_text(encoding="utf-8")

    def schema(self, token: str) -> Optional[bytes]:
        path = self._path(token, ".schema.json")
        return None if path is None else path.read_bytes()


_GRAPH_PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; " \
                     "frame-ancestors 'none'"


def _page_headers(page: str) -> dict[str, str]:
    try:
        policy = content_security_policy(page)  # the inspector page: its one script by hash
    except ValueError:
        policy = _GRAPH_PAGE_POLICY  # the graph page has no script
    return {"Content-Security-Policy": policy, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def create_app(store: Optional[Path] = None, *, rate_limit: int = 30, window: float = 60.0,
               api_keys: Sequence[str] = (), max_body: int = DEFAULT_MAX_BODY, public_url: Optional[str] = None):
    """The Starlette application (see the module docstring); `store` defaults to a new temporary folder."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    graphs = GraphStore(Path(store) if store is not None else Path(tempfile.mkdtemp(prefix="nnsp-shares-")))
    limiter = RateLimiter(rate_limit, window)
    keys = {k for k in api_keys if k}
    limits = share_limits(max_body)

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
            # the bounded reader's compact document, as the plain dicts and lists the handlers read
            return plain(parse_json(b"".join(chunks) or b"null", limits, "the request body"))
        except FileLimitError as exc:
            raise _Refused(413, str(exc)) from None
        except SchemaFormatError as exc:
            raise _Refused(400, str(exc)) from None

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

    def render(graph: dict[str, Any], schema: Any, card: str, token: str) -> tuple[str, Optional[dict[str, Any]]]:
        """The share's page (the inspector's for a schema, else the graph page) and the schema to keep."""
        title = str(graph.get("name") or "graph")
        if schema is None:
            return graph_page(graph, card, token), None
        try:
            decoded = check_shared_schema(schema, limits)
        except SchemaFormatError as exc:
            raise _Refused(400, f"the shared schema is refused: {exc}") from None
        try:
            return inspector_page(decoded, title, card), schema
        except Exception as exc:  # a decoded schema the page cannot show: refused, never a crash
            raise _Refused(400, f"the shared schema cannot be shown: {type(exc).__name__}: {exc}") from None

    async def store(graph: dict[str, Any], schema: Any, card: str) -> str:
        while True:
            token = graphs.new_token()
            page, kept = await run_in_threadpool(render, graph, schema, card, token)
            if await run_in_threadpool(graphs.put, token, graph, page, kept):
                return token

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
                token = await store(graph, body.get("schema"), answer["card"])
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
            graph = checked(body["graph"], "graph")
            card = format_plan_card(await run_in_threadpool(compute_plan, graph))
            token = await store(graph, body.get("schema"), card)
            return JSONResponse({"id": token, "shareUrl": share_url(request, token)})
        except _Refused as exc:
            return refuse(exc.status, str(exc))

    def stored(request: Request) -> Optional[dict[str, Any]]:
        return graphs.get(request.path_params["token"])

    async def graph_json(request: Request):
        graph = await run_in_threadpool(stored, request)
        return JSONResponse(graph) if graph is not None else refuse(404, "no shared graph has this id")

    def stored_page(token: str) -> Optional[str]:
        page = graphs.page(token)
        if page is not None:
            return page
        graph = graphs.get(token)  # a share stored before pages were kept: rendered now
        return None if graph is None else graph_page(graph, format_plan_card(compute_plan(graph)), token)

    async def share_page(request: Request):
        page = await run_in_threadpool(stored_page, request.path_params["token"])
        if page is None:
            return HTMLResponse("<!doctype html><p>No shared graph has this id.</p>", status_code=404,
                                headers=_page_headers(""))
        return HTMLResponse(page, headers=_page_headers(page))

    async def schema_json(request: Request):
        data = await run_in_threadpool(graphs.schema, request.path_params["token"])
        if data is None:
            return refuse(404, "no shared schema has this id (a graph-only share has none)")
        return Response(data, media_type="application/json")

    async def health(request: Request):
        return JSONResponse({"ok": True})

    return Starlette(routes=[
        Route("/api/v1/plan", plan, methods=["POST"]),
        Route("/api/v1/share", share, methods=["POST"]),
        Route("/api/v1/graphs/{token}", graph_json, methods=["GET"]),
        Route("/api/v1/schemas/{token}", schema_json, methods=["GET"]),
        Route("/p/{token}", share_page, methods=["GET"]),
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
