"""`nnschemaparser serve` under issue 38's attacks (point 5), each against a real server process on
127.0.0.1 with clients bound to other loopback addresses (127.0.0.2, ...), which the server keys
clients by: one client flooding within its rate limit leaves the others their share of the workers
(share_queue.FairQueue), a request that waits too long is 503 with Retry-After, worker time counts
against the rate limit, and stalled uploads get 408 at the body deadline and 503 past the upload
caps (share_queue.Uploads). Small options (--cpu-budget 1, short deadlines) keep each test to
seconds; every loop is bounded and every server is stopped."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tests.widget.test_share_server import Server  # noqa: E402
from tests.widget.test_share_server_service import GRAPH, HOSTILE  # noqa: E402

SMALL = json.dumps({"graph": GRAPH}).encode()


def post_from(url: str, source: str, body: bytes, path: str = "/api/v1/plan",
              timeout: float = 60) -> tuple[int, dict, dict, float]:
    """POST `body` from the loopback address `source`: (status, headers, answer, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout, source_address=(source, 0))
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        raw = answer.read()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, json.loads(raw), \
            time.monotonic() - start
    finally:
        connection.close()


def warm(url: str) -> None:
    """Both workers have imported and answered once (two addresses: each gets a worker)."""
    answers: list[int] = []
    threads = [threading.Thread(target=lambda s=s: answers.append(post_from(url, s, SMALL)[0]))
               for s in ("127.0.0.2", "127.0.0.3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert answers == [200, 200]


def test_a_client_flooding_within_its_rate_limit_leaves_other_clients_their_share_of_workers(tmp_path):
    server = Server(tmp_path, "--workers", "2", "--cpu-budget", "1", "--rate-limit", "1000")
    try:
        warm(server.url)
        stop = threading.Event()
        flood: list[int] = []

        def flooder() -> None:  # 127.0.0.1: bodies that each take a worker its whole budget, back to back
            for _ in range(30):
                if stop.is_set():
                    return
                try:
                    status = post_from(server.url, "127.0.0.1", HOSTILE)[0]
                except (ConnectionResetError, BrokenPipeError):  # a third upload at once: 503 while it sends
                    status = 0
                flood.append(status)
                if status != 413:
                    time.sleep(0.1)

        flooders = [threading.Thread(target=flooder) for _ in range(3)]
        for thread in flooders:
            thread.start()
        time.sleep(1.5)  # both workers are taken by the flood
        others: dict[str, list[tuple[int, float]]] = {}

        def other(source: str) -> None:
            for _ in range(3):
                status, _, _, seconds = post_from(server.url, source, SMALL)
                others.setdefault(source, []).append((status, seconds))
                time.sleep(0.3)

        clients = [threading.Thread(target=other, args=(f"127.0.0.{n}",)) for n in range(2, 6)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(120)
        stop.set()
        for thread in flooders:
            thread.join(120)
        answers = [answer for source in sorted(others) for answer in others[source]]
        print(f"flood {sorted(flood)}; others {answers}")
        assert 413 in flood  # the flood did take workers for their whole budget
        assert [status for status, _ in answers] == [200] * 12, answers
        # nobody waited for one of the flood's requests (each holds a worker 1 s, plus its restart)
        assert max(seconds for _, seconds in answers) < 1.0, answers
    finally:
        server.stop()


def test_a_request_that_waits_past_the_queue_wait_is_503_with_retry_after(tmp_path):
    server = Server(tmp_path, "--workers", "1", "--cpu-budget", "2", "--queue-wait", "0.5", "--rate-limit", "1000")
    try:
        warm_status = post_from(server.url, "127.0.0.2", SMALL)[0]
        assert warm_status == 200
        hostile: list[int] = []
        thread = threading.Thread(target=lambda: hostile.append(post_from(server.url, "127.0.0.1", HOSTILE)[0]))
        thread.start()
        time.sleep(0.8)  # the only worker decodes the hostile body
        status, headers, answer, seconds = post_from(server.url, "127.0.0.2", SMALL)
        thread.join(120)
        assert status == 503 and headers["retry-after"] == "2", (status, headers, answer)
        assert "no worker was free for this request within 0.5 s" in answer["error"]
        assert 0.4 < seconds < 1.5
        assert hostile == [413]
        assert post_from(server.url, "127.0.0.2", SMALL)[0] == 200  # the worker was replaced and serves again
    finally:
        server.stop()


def test_a_request_stopped_at_its_cpu_budget_counts_that_many_seconds_against_the_rate_limit(tmp_path):
    server = Server(tmp_path, "--workers", "1", "--cpu-budget", "2", "--rate-limit", "3", "--window", "3600")
    try:
        status, _, answer, _ = post_from(server.url, "127.0.0.2", HOSTILE)
        assert status == 413 and "takes more than 2 s to process" in answer["error"]  # counts 2
        assert post_from(server.url, "127.0.0.2", SMALL)[0] == 200  # the third
        status, _, answer, _ = post_from(server.url, "127.0.0.2", SMALL)
        assert status == 429 and "once per second of worker time" in answer["error"]
        assert post_from(server.url, "127.0.0.3", SMALL)[0] == 200  # another address has its own limit
    finally:
        server.stop()


def stalled_upload(url: str, source: str, declared: int = 1_000_000, sent: int = 100_000) -> socket.socket:
    """A POST whose headers say `declared` body bytes, of which `sent` are sent, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    sock.sendall(b"POST /api/v1/share HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {declared}\r\n\r\n".encode() + b" " * sent)
    return sock


def answer_of(sock: socket.socket, timeout: float) -> tuple[int, dict, dict, bool]:
    """Read one response from a raw socket: (status, headers, answer, whether the server closed)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    try:
        closed = sock.recv(1) == b""
    except socket.timeout:
        closed = False
    except ConnectionResetError:
        closed = True
    return int(lines[0].split()[1]), headers, json.loads(body), closed


def test_stalled_uploads_get_408_at_the_body_deadline_and_past_the_upload_caps_503_at_once(tmp_path):
    server = Server(tmp_path, "--body-timeout", "2", "--client-uploads", "2", "--max-uploads", "3",
                    "--rate-limit", "1000")
    sockets: list[socket.socket] = []
    try:
        assert post_from(server.url, "127.0.0.2", SMALL)[0] == 200
        start = time.monotonic()
        held = [stalled_upload(server.url, "127.0.0.1"), stalled_upload(server.url, "127.0.0.1")]
        sockets += held
        time.sleep(0.3)  # both are being read
        # a third from the same address: 503 at once, its body never read
        third = stalled_upload(server.url, "127.0.0.1", sent=0)
        sockets.append(third)
        status, headers, answer, closed = answer_of(third, timeout=5)
        assert status == 503 and headers["retry-after"] and closed, (status, headers, answer)
        assert "this address is sending 2 request bodies already" in answer["error"]
        held.append(stalled_upload(server.url, "127.0.0.2"))  # the third body being read, all addresses
        sockets.append(held[-1])
        time.sleep(0.3)
        fourth = stalled_upload(server.url, "127.0.0.3", sent=0)
        sockets.append(fourth)
        status, headers, answer, closed = answer_of(fourth, timeout=5)
        assert status == 503 and headers["retry-after"] and closed, (status, headers, answer)
        assert "receiving 3 request bodies already" in answer["error"]
        assert time.monotonic() - start < 1.8  # both answered before any deadline
        for sock in held:  # past the deadline: 408, the connection closed (and the buffer dropped)
            status, headers, answer, closed = answer_of(sock, timeout=10)
            assert status == 408 and closed, (status, headers, answer)
            assert "did not arrive within 2 s (100000 of 1000000 bytes received)" in answer["error"]
        assert time.monotonic() - start < 6
        # the slots are free again: each address uploads at once
        for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            assert post_from(server.url, source, SMALL, "/api/v1/share")[0] == 200
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
