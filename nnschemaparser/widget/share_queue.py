"""The share server's admission of POST bodies: each body read under a deadline and caps, then its
CPU work queued fairly per client for the worker processes (share_worker.WorkerPool).

Both run on the server's event loop (no locks: every change happens between two awaits), and a
client is its address (`request.client.host`, after `--trusted-proxy`).

`Uploads(total, per_client, deadline, max_body)`: `await uploads.read(request, client)` reads one
request body. At most `total` bodies are being read at once, and at most `per_client` from one
address; past either cap the request is answered 503 at once (with `Retry-After`), without
reading its body. The whole body must arrive within `deadline` seconds of the start of its read,
else 408 and what was read is dropped. More than `max_body` bytes (declared or sent) is 413. So a
client that sends its headers and then trickles or stops its body holds at most `per_client`
buffers for at most `deadline` seconds, and all such clients together at most `total` buffers.

`FairQueue(pool, ...)`: `await queue.run(client, kind, body, token)` runs one request's CPU work on a
worker and answers `((status, answer, files), seconds)`, the seconds being the worker time the
request took (`budget` when it was stopped there). Fairness here means the workers are shared
between addresses, not between requests:

- a request waits in its address's own queue; a free worker goes to the waiting request of the
  address with the fewest requests on a worker, and among equals to the address whose turn it is
  (round-robin: an address served goes to the end of the turn);
- one address has at most `client_workers` requests on workers at once (default: half the workers,
  at least one), so with two or more workers an address that floods leaves the others a free
  worker, and a newcomer waits for no one's request but other newcomers';
- an address may have at most `client_queue` requests waiting and all addresses together
  `max_queue` (past either: 503 at once, with `Retry-After`), so a flood holds a bounded number of
  bodies in memory;
- a request that waited `wait` seconds without a worker is answered 503 with `Retry-After`.

The server also charges the rate limit by worker time (share_server: a request counts once per
second of worker time it took, rounded up), so a flood of bodies that each burn the whole CPU
budget gets fewer requests through its rate limit as well.

Depends on the widget's share_worker (the pool it feeds) and the standard library only.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

__all__ = ["Refusal", "Uploads", "FairQueue"]


class Refusal(Exception):
    """A request answered with `status` at once (503 busy, 408 too slow, 413 too large); `headers` go
    with the answer (`Retry-After`, `Connection: close` when the body was not read to its end)."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, dict(headers or {})


def _busy(message: str, retry_after: int, *, unread: bool = False) -> Refusal:
    headers = {"Retry-After": str(retry_after)}
    if unread:  # the rest of the body is never read: the connection cannot carry another request
        headers["Connection"] = "close"
    return Refusal(503, message, headers)


class Uploads:
    """Request bodies being read: at most `total` at once, `per_client` per address, each whole body
    within `deadline` seconds and at most `max_body` bytes."""

    def __init__(self, total: int = 16, per_client: int = 2, deadline: float = 60.0,
                 max_body: int = 8 * 1024 * 1024, retry_after: int = 5) -> None:
        self.total, self.per_client, self.deadline, self.max_body = total, per_client, deadline, max_body
        self.retry_after = retry_after
        self._reading: dict[str, int] = {}
        self.count = 0  # bodies being read now (tests and benches read it)

    async def read(self, request: Any, client: str) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise Refusal(413, f"the request body is {declared} bytes, more than the limit of {self.max_body}",
                          {"Connection": "close"})
        if self.count >= self.total:
            raise _busy(f"the server is receiving {self.count} request bodies already; try again in "
                        f"{self.retry_after} s", self.retry_after, unread=True)
        mine = self._reading.get(client, 0)
        if mine >= self.per_client:
            raise _busy(f"this address is sending {mine} request bodies already (at most {self.per_client} at "
                        f"once); send the next one when one is answered", self.retry_after, unread=True)
        self.count += 1
        self._reading[client] = mine + 1
        chunks: list[bytes] = []

        async def receive() -> None:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body:
                    raise Refusal(413, f"the request body is more than the limit of {self.max_body} bytes",
                                  {"Connection": "close"})
                chunks.append(chunk)

        try:
            await asyncio.wait_for(receive(), self.deadline)
        except asyncio.TimeoutError:
            size = sum(len(chunk) for chunk in chunks)
            chunks.clear()
            of = f" of {declared}" if declared is not None and declared.isdigit() else ""
            raise Refusal(408, f"the request body did not arrive within {self.deadline:g} s ({size}{of} bytes "
                               "received); send it faster or in a smaller request", {"Connection": "close"}) from None
        finally:
            self.count -= 1
            left = self._reading[client] - 1
            if left:
                self._reading[client] = left
            else:
                del self._reading[client]
        return b"".join(chunks)


class _Job:
    __slots__ = ("client", "kind", "body", "token", "future", "started")

    def __init__(self, client: str, kind: str, body: bytes, token: str, future: asyncio.Future) -> None:
        self.client, self.kind, self.body, self.token, self.future = client, kind, body, token, future
        self.started = False


class FairQueue:
    """Requests queued per address and given to the pool's workers in turn (see the module docstring)."""

    def __init__(self, pool: Any, *, workers: int, budget: float, client_workers: Optional[int] = None,
                 wait: float = 15.0, client_queue: int = 4, max_queue: int = 32) -> None:
        self.pool, self.workers, self.wait = pool, workers, wait
        self.client_workers = client_workers if client_workers is not None else max(1, workers // 2)
        self.client_queue, self.max_queue = client_queue, max_queue
        self.retry_after = max(1, math.ceil(budget))
        self._free = workers
        self._running: dict[str, int] = {}
        self._waiting: "OrderedDict[str, deque[_Job]]" = OrderedDict()  # the order is the turn
        self._tasks: set[asyncio.Task] = set()
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="share-queue")
        self.queued = 0  # requests waiting for a worker now (tests and benches read it)

    def running(self, client: str) -> int:
        return self._running.get(client, 0)

    async def run(self, client: str, kind: str, body: bytes, token: str) -> tuple[tuple[int, dict, Optional[dict]],
                                                                                   float]:
        """Run one request on a worker in its turn: ((status, answer, files), worker seconds); Refusal
        503 when the queue is full or no worker was free for it within `wait` seconds."""
        if self.queued >= self.max_queue:
            raise _busy(f"{self.queued} requests are waiting for a worker; try again in {self.retry_after} s",
                        self.retry_after)
        mine = self._waiting.get(client)
        if mine is not None and len(mine) >= self.client_queue:
            raise _busy(f"this address has {len(mine)} requests waiting for a worker already (at most "
                        f"{self.client_queue}); send the next one when one is answered", self.retry_after)
        job = _Job(client, kind, body, token, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(client, deque()).append(job)
        self.queued += 1
        self._dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), self.wait)
        except asyncio.TimeoutError:
            if job.started:  # it got its worker as the wait ended: its answer comes within the budget
                return await job.future
            self._forget(job)
            raise _busy(f"no worker was free for this request within {self.wait:g} s (the server is busy); try "
                        f"again in {self.retry_after} s", self.retry_after) from None
        except asyncio.CancelledError:
            if not job.started:
                self._forget(job)
            raise

    def _forget(self, job: _Job) -> None:
        jobs = self._waiting.get(job.client)
        if jobs is not None and job in jobs:
            jobs.remove(job)
            self.queued -= 1
            if not jobs:
                del self._waiting[job.client]

    def _next_client(self) -> Optional[str]:
        """The address whose request gets the next worker: fewest on workers, then its turn."""
        best, fewest = None, None
        for client in self._waiting:
            running = self._running.get(client, 0)
            if running < self.client_workers and (fewest is None or running < fewest):
                best, fewest = client, running
        return best

    def _dispatch(self) -> None:
        while self._free > 0 and self._waiting:
            client = self._next_client()
            if client is None:
                return
            jobs = self._waiting.pop(client)
            job = jobs.popleft()
            if jobs:
                self._waiting[client] = jobs  # the end of the turn
            self.queued -= 1
            self._free -= 1
            self._running[client] = self._running.get(client, 0) + 1
            job.started = True
            task = asyncio.ensure_future(self._work(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self, job: _Job) -> None:
        try:
            body, job.body = job.body, b""
            result = await asyncio.get_running_loop().run_in_executor(
                self._threads, self.pool.run_timed, job.kind, body, job.token)
            if not job.future.done():
                job.future.set_result(result)
        except BaseException as exc:  # noqa: BLE001 - handed to the request that waits for it
            if not job.future.done():
                job.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._free += 1
            left = self._running[job.client] - 1
            if left:
                self._running[job.client] = left
            else:
                del self._running[job.client]
            self._dispatch()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
