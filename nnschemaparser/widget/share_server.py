"""`nnschemaparser serve`: a small self-hostable plan and share deployment (Starlette on uvicorn).

    nnschemaparser serve [--host 127.0.0.1] [--port 8000] [--store DIR] [--rate-limit 30] [--window 60]
                         [--max-body 8388608] [--public-url https://plans.example.org] [--allow-origin URL]
                         [--trusted-proxy ADDRS] [--workers 2] [--cpu-budget 5] [--store-quota BYTES]
                         [--client-quota BYTES] [--expire-days 30] [--body-timeout 60] [--max-uploads 16]
                         [--client-uploads 2] [--queue-wait 15] [--client-queue 4] [--max-queue 32]
                         [--client-workers N]

Routes:

- `POST /api/v1/plan`: body `{"graph", "base"?, "target"?, "source"?, "options"?, "share"?,
  "schema"?}` (what `plan_client.request_plan` sends). The graph (and base) are validated as
  `.neurarch.json` graphs, the plan is computed by `inspection.plan.compute_plan` (the same code as
  the CLI's local `--plan`) and the answer is `{"card", "plan"}`, plus `{"shareUrl", "id"}` when
  `share` is true. Nothing of a plain plan request is kept (a `schema` is read only when sharing).
- `POST /api/v1/share`: body `{"graph", "schema"?}`; stores it and answers `{"shareUrl", "id"}`.
- `GET /p/<id>`: the page of a share. With a schema (what `nnschemaparser ... --share --share-source`
  uploads: shared_page.share_document), the inspector's static page of that schema (its block tree,
  shapes, sources; static_html.py) under the plan card; for a graph-only share, the card, the layers
  by scope and the nodes, with no script. Both are one self-contained page sent with a
  Content-Security-Policy that fetches nothing (the inspector's one script is allowed by its hash).
  The page is rendered once, when the share is stored, so a GET only reads a file.
  `GET /api/v1/graphs/<id>`: the stored graph as JSON; `GET /api/v1/schemas/<id>`: the stored
  schema document (404 for a graph-only share), which `load_schema` reads.
- `GET /healthz`: `{"ok": true}`.

Every request body is hostile. The event loop only reads it (share_queue.Uploads: at most
`--max-body` bytes, else 413; the whole body within `--body-timeout` seconds, else 408 and what was
read is dropped; at most `--max-uploads` bodies read at once and `--client-uploads` per address,
else 503 at once with Retry-After); the decoding (`files.file_format.parse_json`, the strict
bounded reader), the graph checks, the plan, the schema check (shared_page.check_shared_schema:
decoded without a model, nothing imported, evaluated, called or run) and the page are done in
worker processes (share_worker.WorkerPool), each request under `--cpu-budget` seconds (past it:
413, the worker killed and replaced), so a body that takes seconds of CPU never delays `/healthz`
or a page. The requests wait for a worker in a fair queue per address (share_queue.FairQueue): a
free worker goes to the address with the fewest requests on workers, in turn; one address has at
most `--client-workers` on workers at once (default half of `--workers`, at least one), at most
`--client-queue` waiting, all addresses at most `--max-queue` waiting (past these: 503 at once), and
a request that waits `--queue-wait` seconds without a worker is 503; every 503 carries Retry-After.
A body refused is 400 (413 past a size bound), naming the problem.

POSTs must be `Content-Type: application/json` (415 otherwise) and, when they carry an `Origin`,
come from the public URL's origin or one named by `--allow-origin` (403 otherwise: a cross-site
form cannot create shares). Each client address may make `--rate-limit` POST requests per
`--window` seconds (429 past that; RateLimiter forgets idle clients and keeps at most 100,000),
a request counting once per second of worker time it took, rounded up (one stopped at
`--cpu-budget 5` counts 5), unless it sends `Authorization: Bearer <key>` with a key from
`NEURARCH_SERVER_KEYS` (comma-separated) or `--keys-file` (one a line); an unknown key is 401. The address is the socket's:
forwarded headers are believed only from `--trusted-proxy` addresses (uvicorn's proxy headers are
off otherwise). Share URLs start with `--public-url` (default: the address the server listens on),
never the request's Host header. Every response is sent with `X-Content-Type-Options: nosniff`.
Errors answer `{"error": "..."}`.

Shares are stored as files in `--store` (default: a new temporary folder) under ids made by
`secrets.token_urlsafe(18)` (144 random bits): the URL cannot be guessed, and anyone who has it can
open it. GraphStore keeps at most `--store-quota` bytes in all and `--client-quota` bytes per
address per day (507 past either), and a share is gone `--expire-days` after it was stored (404;
its files deleted by the next sweep). A graph over `MAX_SERVED_NODES` nodes is 400.

The server lives in the widget stage because it serves pages (it may import `inspection` for the
graph checks and the plan); the root `__main__` dispatches `nnschemaparser serve` here.
Depends on inspection (plan), files (file_format), the widget's share_worker, share_queue, shared_page
and static_html, starlette and uvicorn (the `serve` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

from ..files.file_format import dump_json
from ..inspection.plan import compute_plan, format_plan_card
from .share_queue import FairQueue, Refusal, Uploads
from .share_worker import MAX_SERVED_NODES, WorkerPool
from .shared_page import graph_page
from .static_html import content_security_policy

__all__ = ["create_app", "main", "RateLimiter", "GraphStore", "QuotaError", "MAX_SERVED_NODES", "DEFAULT_MAX_BODY"]

DEFAULT_MAX_BODY = 8 * 1024 * 1024
_ID = re.compile(r"^[A-Za-z0-9_-]{20,64}$")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RateLimiter:
    """At most `limit` hits per `window` seconds for each key (a client address), sliding window.

    Bounded: a client idle for a whole window is forgotten (the least recently seen are checked
    first, so each call does O(1) work on average), and past `max_clients` the least recently seen
    client is forgotten as well."""

    def __init__(self, limit: int, window: float, max_clients: int = 100_000) -> None:
        self.limit, self.window, self.max_clients = limit, window, max_clients
        self._hits: "OrderedDict[str, deque]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._hits)

    def allow(self, key: str, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._hits:  # forget the clients idle for a whole window, oldest first
                oldest = next(iter(self._hits.values()))
                if oldest and oldest[-1] > now - self.window:
                    break
                self._hits.popitem(last=False)
            hits = self._hits.pop(key, None) or deque()
            self._hits[key] = hits  # the most recently seen last
            while hits and hits[0] <= now - self.window:
                hits.popleft()
            if len(hits) >= self.limit:
                return False
            hits.append(now)
            while len(self._hits) > self.max_clients:
                self._hits.popitem(last=False)
            return True

    def charge(self, key: str, extra: int, now: Optional[float] = None) -> None:
        """Count `extra` more hits for `key` now (a request that took seconds of worker time), at most
        up to the limit."""
        now = time.monotonic() if now is None else now
        with self._lock:
            hits = self._hits.get(key)
            if hits is None or extra < 1:
                return
            for _ in range(min(extra, self.limit - len(hits))):
                hits.append(now)


class QuotaError(Exception):
    """A share the store's quotas refuse (the message says which)."""


class GraphStore:
    """Shares as files in one folder, under ids from `secrets.token_urlsafe`: `<id>.json` (the graph),
    `<id>.html` (its page) and, when a schema was shared, `<id>.schema.json` (its document).

    Bounded: at most `max_bytes` in all, at most `client_bytes` written per client per `client_window`
    seconds, and a share older than `expire_after` seconds is gone (404, its files deleted by the next
    sweep, which runs at most once a minute on a write)."""

    def __init__(self, folder: Path, *, max_bytes: int = 1 << 30, client_bytes: int = 32 << 20,
                 client_window: float = 86_400.0, expire_after: float = 30 * 86_400.0) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.client_bytes, self.expire_after = max_bytes, client_bytes, expire_after
        self._client_use: "OrderedDict[str, deque]" = OrderedDict()  # client -> (time, bytes) written
        self.client_window = client_window
        self._lock = threading.Lock()
        self._last_sweep = 0.0
        self.total = 0
        self.sweep(force=True)

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(18)

    def sweep(self, force: bool = False) -> None:
        """Delete expired shares and recount the bytes kept."""
        now = time.time()
        if not force and now - self._last_sweep < 60:
            return
        self._last_sweep = now
        total = 0
        for path in self.folder.iterdir():
            try:
                stat = path.stat()
                if now - stat.st_mtime > self.expire_after:
                    path.unlink()
                else:
                    total += stat.st_size
            except OSError:
                pass
        with self._lock:
            self.total = total

    def _charge(self, client: str, size: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self.total + size > self.max_bytes:
                raise QuotaError(f"the store is full ({self.total} of {self.max_bytes} bytes); try again later")
            uses = self._client_use
            while uses:  # forget the clients that wrote nothing for a whole window, oldest first
                oldest = next(iter(uses.values()))
                if oldest and oldest[-1][0] > now - self.client_window:
                    break
                uses.popitem(last=False)
            use = uses.pop(client, None) or deque()
            uses[client] = use
            while use and use[0][0] <= now - self.client_window:
                use.popleft()
            used = sum(n for _, n in use)
            if used + size > self.client_bytes:
                raise QuotaError(f"this address has stored {used} bytes in the last {self.client_window:g} s; "
                                 f"the quota is {self.client_bytes}")
            use.append((now, size))
            while len(uses) > 100_000:
                uses.popitem(last=False)
            self.total += size

    def put(self, token: str, graph: Any = None, page: Optional[str] = None, schema: Optional[dict[str, Any]] = None,
            *, files: Optional[dict[str, bytes]] = None, client: str = "") -> bool:
        """Store a share under `token` (False when the token is taken: draw another): `files` by suffix
        (`.json`, `.html`, `.schema.json`), or the graph, page and schema. The graph's file, which makes
        the id visible, is written last; no file is ever overwritten. QuotaError past a quota."""
        if files is None:
            files = {".json": json.dumps(graph).encode()}
            if page is not None:
                files[".html"] = page.encode("utf-8")
            if schema is not None:
                files[".schema.json"] = dump_json(schema)
        self.sweep()
        self._charge(client, sum(len(data) for data in files.values()))
        try:
            for suffix in sorted(files, key=lambda s: s == ".json"):
                with open(self.folder / f"{token}{suffix}", "xb") as handle:
                    handle.write(files[suffix])
            return True
        except FileExistsError:  # pragma: no cover - 144 random bits
            return False

    def _path(self, token: str, suffix: str) -> Optional[Path]:
        if not _ID.match(token):
            return None
        graph = self.folder / f"{token}.json"
        try:
            if time.time() - graph.stat().st_mtime > self.expire_after:
                return None
        except OSError:
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


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _nosniff(app):
    """ASGI middleware: `X-Content-Type-Options: nosniff` on every response."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-content-type-options"]
                message = {**message, "headers": headers + [(b"x-content-type-options", b"nosniff")]}
            await send(message)

        return await app(scope, receive, send_with_header)

    return wrapped


def create_app(store: Optional[Path] = None, *, rate_limit: int = 30, window: float = 60.0,
               api_keys: Sequence[str] = (), max_body: int = DEFAULT_MAX_BODY,
               public_url: str = "http://127.0.0.1:8000",
               allowed_origins: Sequence[str] = (), workers: int = 2, cpu_budget: float = 5.0,
               max_store_bytes: int = 1 << 30, client_store_bytes: int = 32 << 20,
               expire_days: float = 30.0, max_clients: int = 100_000, body_timeout: float = 60.0,
               max_uploads: int = 16, client_uploads: int = 2, queue_wait: float = 15.0, client_queue: int = 4,
               max_queue: int = 32, client_workers: Optional[int] = None):
    """The ASGI application (see the module docstring); `store` defaults to a new temporary folder.
    Share URLs start with `public_url` (never the request's Host header)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    if not public_url.startswith(("http://", "https://")):
        raise ValueError(f"public_url must start with http:// or https://, got {public_url!r}")
    graphs = GraphStore(Path(store) if store is not None else Path(tempfile.mkdtemp(prefix="nnsp-shares-")),
                        max_bytes=max_store_bytes, client_bytes=client_store_bytes,
                        expire_after=expire_days * 86_400.0)
    limiter = RateLimiter(rate_limit, window, max_clients)
    keys = {k for k in api_keys if k}
    origins = {_origin_of(public_url)} | {_origin_of(o) for o in allowed_origins}
    pool = WorkerPool(workers, cpu_budget, max_body)
    queue = FairQueue(pool, workers=workers, budget=cpu_budget, client_workers=client_workers, wait=queue_wait,
                      client_queue=client_queue, max_queue=max_queue)
    uploads = Uploads(max_uploads, client_uploads, body_timeout, max_body, retry_after=queue.retry_after)
    root = public_url.rstrip("/")

    def refuse(status: int, message: str, headers: Optional[dict[str, str]] = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def admit(request: Request) -> bool:
        """Check the request's headers and rate limit; True when a known key lifts the limit."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _Refused(415, "the request body must be JSON, sent with Content-Type: application/json")
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() not in origins:
            raise _Refused(403, f"requests from the origin {origin[:100]!r} are refused; this server accepts "
                                "POSTs from the command line and its own pages")
        auth = request.headers.get("authorization", "")
        if auth:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise _Refused(401, "the Authorization header must be 'Bearer <key>'")
            if not any(secrets.compare_digest(token.strip(), k) for k in keys):
                raise _Refused(401, "unknown API key")
            return True  # a known key lifts the per-IP limit
        if not limiter.allow(client_of(request)):
            raise _Refused(429, f"rate limit: at most {rate_limit} requests per {window:g} s from one address "
                                "(a request counts once per second of worker time it takes); send an API key to "
                                "lift it")
        return False

    async def post(request: Request, kind: str):
        try:
            keyed = admit(request)
            client = client_of(request)
            body = await uploads.read(request, client)
            token = graphs.new_token()
            (status, answer, files), seconds = await queue.run(client, kind, body, token)
            del body
            if not keyed:  # the worker time beyond the first second counts against the rate limit
                limiter.charge(client, max(1, math.ceil(seconds)) - 1)
            if status != 200:
                return refuse(status, answer.get("error", "refused"))
            if files is not None:
                try:
                    while not await run_in_threadpool(graphs.put, token, files=files, client=client_of(request)):
                        token = graphs.new_token()  # pragma: no cover - 144 random bits
                except QuotaError as exc:
                    raise _Refused(507, str(exc)) from None
                answer.update(id=token, shareUrl=f"{root}/p/{token}")
            return JSONResponse(answer)
        except _Refused as exc:
            return refuse(exc.status, str(exc))
        except Refusal as exc:
            return refuse(exc.status, str(exc), exc.headers)

    async def plan(request: Request):
        return await post(request, "plan")

    async def share(request: Request):
        return await post(request, "share")

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

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            queue.close()
            pool.close()

    app = Starlette(routes=[
        Route("/api/v1/plan", plan, methods=["POST"]),
        Route("/api/v1/share", share, methods=["POST"]),
        Route("/api/v1/graphs/{token}", graph_json, methods=["GET"]),
        Route("/api/v1/schemas/{token}", schema_json, methods=["GET"]),
        Route("/p/{token}", share_page, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ], lifespan=lifespan)
    wrapped = _nosniff(app)
    wrapped.pool, wrapped.limiter, wrapped.store = pool, limiter, graphs  # for tests and benches
    wrapped.queue, wrapped.uploads = queue, uploads
    return wrapped


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
    parser.add_argument("--public-url", default=None,
                        help="the URL share links start with (default: http://HOST:PORT this server listens on; "
                             "never the request's Host header)")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                        help="a web origin whose pages may POST here (repeatable; the public URL's always may)")
    parser.add_argument("--trusted-proxy", default=None, metavar="ADDRESSES",
                        help="addresses of reverse proxies whose X-Forwarded-For is believed (comma-separated; "
                             "default: none, every client is its socket address)")
    parser.add_argument("--workers", type=int, default=2, help="processes that decode and plan bodies (default 2)")
    parser.add_argument("--cpu-budget", type=float, default=5.0, metavar="SECONDS",
                        help="the most time one request body may take to process (default 5)")
    parser.add_argument("--store-quota", type=int, default=1 << 30, metavar="BYTES",
                        help="the most bytes the store keeps in all (default 1 GiB)")
    parser.add_argument("--client-quota", type=int, default=32 << 20, metavar="BYTES",
                        help="the most bytes one address may store per day (default 32 MiB)")
    parser.add_argument("--expire-days", type=float, default=30.0, metavar="DAYS",
                        help="shares are deleted this many days after they were stored (default 30)")
    serving = parser.add_argument_group("fair service", "how request bodies are received and queued for the "
                                                         "workers (docs/CLI.md)")
    serving.add_argument("--body-timeout", type=float, default=60.0, metavar="SECONDS",
                         help="the whole request body must arrive within this (else 408; default 60)")
    serving.add_argument("--max-uploads", type=int, default=16, metavar="N",
                         help="request bodies received at once, all clients (past it: 503; default 16)")
    serving.add_argument("--client-uploads", type=int, default=2, metavar="N",
                         help="request bodies received at once from one address (past it: 503; default 2)")
    serving.add_argument("--queue-wait", type=float, default=15.0, metavar="SECONDS",
                         help="the longest a request waits for a worker (then 503; default 15)")
    serving.add_argument("--client-queue", type=int, default=4, metavar="N",
                         help="requests one address may have waiting for a worker (past it: 503; default 4)")
    serving.add_argument("--max-queue", type=int, default=32, metavar="N",
                         help="requests waiting for a worker, all clients (past it: 503; default 32)")
    serving.add_argument("--client-workers", type=int, default=None, metavar="N",
                         help="workers one address may use at once (default: half of --workers, at least 1)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the server until it is stopped (SIGINT/SIGTERM); returns the exit status."""
    parser = _argument_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    counts = (args.rate_limit, args.max_body, args.workers, args.store_quota, args.client_quota, args.max_uploads,
              args.client_uploads, args.client_queue, args.max_queue, 1 if args.client_workers is None else
              args.client_workers)
    if min(counts) < 1 or min(args.window, args.cpu_budget, args.expire_days, args.body_timeout,
                              args.queue_wait) <= 0 or not 0 <= args.port <= 65535:
        parser.print_usage(sys.stderr)
        print("nnschemaparser serve: error: --rate-limit, --window, --max-body, --workers, --cpu-budget, the quotas, "
              "--expire-days, --body-timeout, the upload and queue bounds and --client-workers must be positive, "
              "--port 0-65535", file=sys.stderr)
        return 2
    if args.public_url is not None and not args.public_url.startswith(("http://", "https://")):
        print("nnschemaparser serve: error: --public-url must start with http:// or https://", file=sys.stderr)
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
    here = f"http://[{args.host}]:{port}" if family == socket.AF_INET6 else f"http://{args.host}:{port}"
    app = create_app(Path(args.store) if args.store else None, rate_limit=args.rate_limit, window=args.window,
                     api_keys=keys, max_body=args.max_body, public_url=args.public_url or here,
                     allowed_origins=args.allow_origin, workers=args.workers, cpu_budget=args.cpu_budget,
                     max_store_bytes=args.store_quota, client_store_bytes=args.client_quota,
                     expire_days=args.expire_days, body_timeout=args.body_timeout, max_uploads=args.max_uploads,
                     client_uploads=args.client_uploads, queue_wait=args.queue_wait, client_queue=args.client_queue,
                     max_queue=args.max_queue, client_workers=args.client_workers)
    print(f"nnschemaparser serve: listening on {here}", file=sys.stderr, flush=True)
    proxies = [a.strip() for a in (args.trusted_proxy or "").split(",") if a.strip()]
    # X-Forwarded-For is believed only from the proxies named (uvicorn trusts 127.0.0.1 by default)
    # on SIGTERM the requests in progress get a bounded time to finish (a stalled upload is not waited for)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=5,
                                           timeout_graceful_shutdown=max(5, math.ceil(args.cpu_budget) + 2),
                                           proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None))
    server.run(sockets=[sock])
    return 0
