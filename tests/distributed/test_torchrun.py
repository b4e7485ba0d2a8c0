"""The recipe of docs/DISTRIBUTED.md under a real torchrun launch (2 processes on 127.0.0.1): the
launcher and its workers run in their own process group, killed as a group when it runs late."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_torchrun_launch_gathers_the_logical_model(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "table.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                                 "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 str(ROOT / "tests/support/torchrun_logical.py"), str(out)],
                                cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and every worker it started
        launcher.communicate()
        raise AssertionError("the torchrun launch did not finish within 240 s")
    assert launcher.returncode == 0, output[-4000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 35
    assert all(row["exact"] for row in rows if not row["reduced"])
    assert {row["placement"] for row in rows} == {"R", "S(1)@tp", "S(2)@tp", "P(sum)@tp"}
