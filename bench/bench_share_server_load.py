"""`nnschemaparser serve` under hostile load: /healthz latency and the server's memory while senders post
bodies of small numbers that take seconds of CPU to decode (the longer version of the load test in
tests/widget/test_share_server_service.py).

    PYTHONPATH=. .venv/bin/python bench/bench_share_server_load.py [--seconds 120] [--senders 4]
        [--workers 2] [--cpu-budget 2]

Starts a real server on 127.0.0.1 (port 0), runs `--senders` threads that post 8 MB bodies of small
numbers in a loop (each from its own loopback address, 127.0.0.10 on: the server queues per address,
so senders sharing one address would mostly be turned away at once) and one prober that GETs /healthz every 50 ms, then prints the probes' p50, p99
and max, the hostile answers by status, and the server process's RSS sampled every 10 s.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = b'{"graph": [' + b",".join([b"0"] * 4_000_000) + b"]}"


def _request(port: int, method: str, path: str, body: bytes | None = None, source: str = "127.0.0.1") -> int | str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def _rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpu-budget", type=float, default=2.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="nnsp-load-"))
    log = open(folder / "server.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    server = subprocess.Popen([sys.executable, "-m", "nnschemaparser", "serve", "--port", "0", "--store",
                               str(folder / "store"), "--rate-limit", "1000000", "--workers", str(args.workers),
                               "--cpu-budget", str(args.cpu_budget)], stderr=log, stdout=subprocess.DEVNULL, env=env)
    try:
        port = None
        for _ in range(600):
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", (folder / "server.log").read_text())
            if found:
                port = int(found.group(1))
                break
            time.sleep(0.1)
        assert port is not None, (folder / "server.log").read_text()
        stop = threading.Event()
        answers: collections.Counter = collections.Counter()

        def hostile(source: str) -> None:
            while not stop.is_set():
                try:
                    answers[_request(port, "POST", "/api/v1/plan", HOSTILE, source)] += 1
                except (ConnectionResetError, BrokenPipeError):  # refused at once while it was sending
                    answers["reset"] += 1
                    time.sleep(0.1)

        senders = [threading.Thread(target=hostile, args=(f"127.0.0.{10 + n}",), daemon=True)
                   for n in range(args.senders)]
        for sender in senders:
            sender.start()
        latencies, rss = [], []
        start = time.monotonic()
        next_sample = start
        while time.monotonic() - start < args.seconds:
            t0 = time.perf_counter()
            assert _request(port, "GET", "/healthz") == 200
            latencies.append(time.perf_counter() - t0)
            if time.monotonic() >= next_sample:
                rss.append(round(_rss_mib(server.pid), 1))
                next_sample += 10
            time.sleep(0.05)
        stop.set()
        for sender in senders:
            sender.join(timeout=120)
        latencies.sort()
        pick = lambda q: latencies[int(q * (len(latencies) - 1))] * 1e3  # noqa: E731
        print(f"{len(latencies)} /healthz probes over {args.seconds:g} s with {args.senders} hostile senders, "
              f"{args.workers} workers, budget {args.cpu_budget:g} s")
        print(f"healthz ms: p50 {pick(0.5):.1f}  p99 {pick(0.99):.1f}  max {latencies[-1] * 1e3:.1f}")
        print(f"hostile answers: {dict(answers)}")
        print(f"server RSS MiB every 10 s: {rss}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    raise SystemExit(main())
