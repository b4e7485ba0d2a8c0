"""The share server's CPU work, off its event loop: request bodies decoded, checked, planned and
rendered in worker processes, each request under a time budget.

`WorkerPool(count, budget, max_body)` starts `count` worker processes (spawned: each imports the
package afresh, nothing inherited from the server's threads). `await pool.run(kind, body, token)`
hands one request body (bytes, at most `max_body`) to an idle worker and waits in a thread, so the
event loop keeps serving `/healthz` and pages while bodies are decoded. The worker does all of the
request's CPU work (`process`): the bounded strict JSON reader (files.file_format.parse_json), the
graph checks (validate_graph, MAX_SERVED_NODES), the plan (compute_plan), the card, and for a share
the page (shared_page) and the files to keep; it answers `(status, answer, files)` where `files`
are the bytes the store writes. A worker that has not answered within `budget` seconds (it does
nothing else, so this is its CPU time) is killed and replaced, and the request is answered 413
("the request body takes more than N s to process") once the new worker has imported, so the
worker's restart is that request's cost, not the next one's. `run_timed` (blocking) also answers
the worker seconds the request took, which the server charges to its client's rate limit. Workers
run at a lower priority (nice 10) than the server's event loop, from their start on. The server
gives the pool at most one request per worker, in the fair order of share_queue.FairQueue; called
directly with every worker busy, a request waits for one at most `budget` seconds, then gets 503.
A hostile body therefore costs at most one worker for `budget` seconds (and a restart) and never
the event loop.

Depends on files (file_format, bounded_json), inspection (neurarch_graph, plan, gpu_table),
schema.errors and the widget's shared_page.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from typing import Any, Optional

__all__ = ["WorkerPool", "process", "MAX_SERVED_NODES"]

MAX_SERVED_NODES = 50_000
_NICE = 10  # the workers' priority below the server's event loop


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _checked(graph: Any, where: str) -> dict[str, Any]:
    from ..inspection.neurarch_graph import GraphFileError, validate_graph

    try:
        graph = validate_graph(graph, where)
    except GraphFileError as exc:
        raise _Refused(400, str(exc)) from None
    if len(graph["nodes"]) > MAX_SERVED_NODES:
        raise _Refused(400, f"{where} has {len(graph['nodes'])} nodes, more than this server's limit of "
                            f"{MAX_SERVED_NODES}")
    return graph


def _decode(body: bytes, max_body: int) -> Any:
    from ..files.bounded_json import plain
    from ..files.file_format import FileLimitError, parse_json
    from ..schema.errors import SchemaFormatError
    from .shared_page import share_limits

    try:
        return plain(parse_json(body or b"null", share_limits(max_body), "the request body"))
    except FileLimitError as exc:
        raise _Refused(413, str(exc)) from None
    except SchemaFormatError as exc:
        raise _Refused(400, str(exc)) from None


def _render(graph: dict[str, Any], schema: Any, card: str, token: str, max_body: int) -> dict[str, bytes]:
    """The files of a share: its graph, its page and (with a schema) the schema document."""
    import json

    from ..files.file_format import dump_json
    from ..schema.errors import SchemaFormatError
    from .shared_page import check_shared_schema, graph_page, inspector_page, share_limits

    files = {".json": json.dumps(graph).encode()}
    if schema is None:
        files[".html"] = graph_page(graph, card, token).encode("utf-8")
        return files
    try:
        decoded = check_shared_schema(schema, share_limits(max_body))
    except SchemaFormatError as exc:
        raise _Refused(400, f"the shared schema is refused: {exc}") from None
    try:
        files[".html"] = inspector_page(decoded, str(graph.get("name") or "graph"), card).encode("utf-8")
    except Exception as exc:  # a decoded schema the page cannot show: refused, never a crash
        raise _Refused(400, f"the shared schema cannot be shown: {type(exc).__name__}: {exc}") from None
    files[".schema.json"] = dump_json(schema)
    return files


def process(kind: str, body: bytes, token: str, max_body: int) -> tuple[int, dict[str, Any], Optional[dict]]:
    """The whole CPU side of one POST (`kind` "plan" or "share"): (status, answer, files to store or None)."""
    from ..inspection.gpu_table import GPUTableError
    from ..inspection.plan import PlanError, compute_plan, format_plan_card, options_from_json

    try:
        data = _decode(body, max_body)
        if not isinstance(data, dict) or "graph" not in data:
            raise _Refused(400, "the body must be a JSON object with a 'graph'")
        graph = _checked(data["graph"], "graph")
        if kind == "share":
            card = format_plan_card(compute_plan(graph))
            return 200, {}, _render(graph, data.get("schema"), card, token, max_body)
        base = _checked(data["base"], "base") if data.get("base") is not None else None
        try:
            options = options_from_json(data.get("options"))
        except (PlanError, GPUTableError) as exc:
            raise _Refused(400, str(exc)) from None
        result = compute_plan(graph, options, base)
        source = data.get("source")
        if not isinstance(source, str):  # the file or module part of the target
            target = data.get("target") if isinstance(data.get("target"), str) else graph.get("target")
            source = target.rpartition(":")[0] if isinstance(target, str) and ":" in target else (
                target if isinstance(target, str) else "")
        answer = {"plan": result, "card": format_plan_card(result, source=source[:200])}
        files = _render(graph, data.get("schema"), answer["card"], token, max_body) if data.get("share") else None
        return 200, answer, files
    except _Refused as exc:
        return exc.status, {"error": str(exc)}, None


def _serve(conn) -> None:  # pragma: no cover - runs in the worker process
    from ..inspection import plan  # noqa: F401 - the imports first: the budget is the request's alone
    from . import shared_page  # noqa: F401

    conn.send("ready")
    while True:
        try:
            kind, body, token, max_body = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = process(kind, body, token, max_body)
        except Exception as exc:  # a bug of ours: the request gets a 500, the worker lives on
            reply = (500, {"error": f"internal error: {type(exc).__name__}: {exc}"}, None)
        conn.send(reply)


class _Worker:
    def __init__(self, context) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        try:  # below the event loop from its first instruction on (the package import included)
            os.setpriority(os.PRIO_PROCESS, self.process.pid, _NICE)
        except (AttributeError, OSError):
            pass
        child.close()
        self.warm = False

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Wait for the worker's imports (once); False when it did not start."""
        if not self.warm:
            self.warm = self.conn.poll(timeout) and self.conn.recv() == "ready"
        return self.warm

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class WorkerPool:
    """`count` worker processes; `run` gives one request to an idle one under `budget` seconds."""

    def __init__(self, count: int = 2, budget: float = 5.0, max_body: int = 8 * 1024 * 1024) -> None:
        self.budget, self.max_body = budget, max_body
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Worker] = [_Worker(self._context) for _ in range(count)]
        self._all = list(self._idle)
        self._ready = threading.Condition()
        self.killed = 0  # workers killed past the budget (the load test reads it)
        self._closed = False

    def _take(self) -> Optional[_Worker]:
        with self._ready:
            if not self._ready.wait_for(lambda: self._idle, timeout=self.budget):
                return None
            return self._idle.pop()

    def _give_back(self, worker: _Worker) -> None:
        with self._ready:
            self._idle.append(worker)
            self._ready.notify()

    def _replace(self, worker: _Worker) -> None:
        """Kill `worker` and give back a fresh one once it has imported (its start is charged to the
        request that cost the worker, not to the next one)."""
        worker.kill()
        with self._ready:
            if self._closed:  # the server is stopping: no new worker
                return
            fresh = _Worker(self._context)
            self._all = [w for w in self._all if w is not worker] + [fresh]
        try:
            fresh.wait_ready()
        except (EOFError, OSError):  # it died or the pool closed: the next request finds out and replaces it
            pass
        self._give_back(fresh)

    def run_timed(self, kind: str, body: bytes, token: str) -> tuple[tuple[int, dict[str, Any], Optional[dict]], float]:
        """One request on an idle worker (blocking): ((status, answer, files), the worker seconds it
        took: `budget` when it was stopped there)."""
        worker = self._take()
        if worker is None:
            return (503, {"error": "the server is busy; try again in a few seconds"}, None), 0.0
        try:
            if not worker.wait_ready():
                raise EOFError
            start = time.monotonic()
            worker.conn.send((kind, body, token, self.max_body))
            if worker.conn.poll(self.budget):
                reply = worker.conn.recv()
                seconds = time.monotonic() - start
                self._give_back(worker)
                return reply, seconds
        except (EOFError, OSError):
            pass
        self.killed += 1
        self._replace(worker)
        return (413, {"error": f"the request body takes more than {self.budget:g} s to process; send a smaller "
                               "graph"}, None), self.budget

    def _run(self, kind: str, body: bytes, token: str) -> tuple[int, dict[str, Any], Optional[dict]]:
        return self.run_timed(kind, body, token)[0]

    async def run(self, kind: str, body: bytes, token: str) -> tuple[int, dict[str, Any], Optional[dict]]:
        return await asyncio.to_thread(self._run, kind, body, token)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            worker.kill()
