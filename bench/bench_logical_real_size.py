"""Real size, sharded (issue 25, points 2 and 4): the 1.04B Llama of bench_real_size.py with FSDP2
over 2 gloo processes on 127.0.0.1, and rank 0's widget.

    HF_HUB_OFFLINE=1 python bench/bench_logical_real_size.py [--tokens 32] [--steps 20] [--tiny]

Each rank builds the same model (seed 0, float32, random weights), shards every decoder layer and
the root with `fully_shard` on a 1-D "dp" mesh, and parses it on its own batch of 1 x `--tokens`
tokens (different ids per rank: FSDP2's inputs are batch shards). Measured on rank 0:

1. the initial state of an `InspectorWidget` on the sharded schema, as Jupyter serializes it (the
   budget of tests/widget/test_initial_state.py: 100 KB), and again after `show_logical` (the
   logical view is not synced state: it must not grow);
2. `capture_logical` (a logical run of every step, each value's placement, the ranks' consolidation):
   wall time and rank 0's CPU time;
3. `show_logical(trace)` (gathers every step's whole value and its statistics; a collective);
4. the browser's `logical` request on rank 0: handled and serialized (ms) and its reply's size;
5. a collective Step round trip with rank 0 as the driver (`collective_step_run(..., driver=0)`,
   rank 1 follows): median and p95 over `--steps` steps from the start.

The processes are killed by pid if the group does not finish within `--timeout` seconds; the
memory of both ranks is returned when they exit. `--tiny` runs the same on a 2-layer Llama of
width 64 (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_real_size import CONFIG_1B  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, tie_word_embeddings=True)
GIB = 2 ** 30


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rank(rank: int, world: int, port: int, tokens: int, steps: int, tiny: bool, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from nnschemaparser import NNParser
    from nnschemaparser.distributed import capture_logical, collective_step_run
    from nnschemaparser.widget import InspectorWidget
    from nnschemaparser.widget.messages import handle_message

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    config = TINY if tiny else CONFIG_1B
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ids = torch.randint(0, config["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(10 + rank))
    result: dict = {"rank": rank, "params": sum(p.numel() for p in model.parameters()), "full_bytes": full_bytes}
    with torch.no_grad():
        started = time.perf_counter()
        schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
        result["parse_s"] = time.perf_counter() - started
        widget = InspectorWidget(schema, scope={"input_ids": ids})
        result["initial_bytes"] = len(json.dumps(widget.get_state(), ensure_ascii=False))
        dist.barrier()
        started, cpu = time.perf_counter(), time.process_time()
        record = capture_logical(schema, {"input_ids": ids}, mesh=mesh)
        result["capture_s"], result["capture_cpu_s"] = time.perf_counter() - started, time.process_time() - cpu
        result["values"] = len(record.trace.steps)
        result["badges"] = sorted({record.trace.placements[s.step].badge() for s in record.trace.steps})
        started = time.perf_counter()
        view = widget.show_logical(record.trace)
        result["show_s"] = time.perf_counter() - started
        result["unknown"] = sum(1 for row in view["rows"] if row["note"])
        why: dict = {}
        for row in view["rows"]:
            if row["note"]:
                why[row["source"]] = why.get(row["source"], 0) + 1
        result["unknown_why"] = sorted(why.items(), key=lambda item: -item[1])[:3]
        result["first_unknown"] = next(([row["var"], row["block"]] for row in view["rows"] if row["note"]), None)
        result["after_bytes"] = len(json.dumps(widget.get_state(), ensure_ascii=False))
        if rank == 0:
            times = []
            for index in range(5):
                started = time.perf_counter()
                reply = handle_message(widget.state, {"type": "logical", "id": index})
                text = json.dumps(reply, ensure_ascii=False)
                times.append(time.perf_counter() - started)
            result["logical_reply_ms"] = statistics.median(times) * 1e3
            result["logical_reply_bytes"] = len(text)
            result["logical_reply_ok"] = bool(reply.get("ok"))
        del record, view
        widget.close()
        run = collective_step_run(schema, {"input_ids": ids}, driver=0, timeout=600)
        if rank == 0:
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                run.step()
                times.append(time.perf_counter() - started)
            run.close()
            result["step_median_ms"] = statistics.median(times) * 1e3
            result["step_p95_ms"] = sorted(times)[int(0.95 * (len(times) - 1))] * 1e3
            result["steps"] = steps
        else:
            run.follow()
    result["peak_rss"] = _peak_rss()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's destructors can abort a normal exit (tests/support/distributed_logical.py)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="tokens per rank")
    parser.add_argument("--steps", type=int, default=20, help="collective Step round trips timed on rank 0")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer Llama of width 64 (smoke test)")
    parser.add_argument("--timeout", type=float, default=1500.0)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        _rank(args.rank, 2, args.port, args.tokens, args.steps, args.tiny, args.out)
        return 0
    import tempfile

    out = tempfile.mkdtemp(prefix="nnsp-logical-bench-")
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, __file__, "--tokens", str(args.tokens), "--steps", str(args.steps), "--port", str(port),
               "--out", out] + (["--tiny"] if args.tiny else [])
    ranks = [subprocess.Popen(command + ["--rank", str(r)], env=env) for r in range(2)]
    deadline = time.monotonic() + args.timeout
    try:
        for proc in ranks:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in ranks:
            proc.kill()
        print(f"the group did not finish within {args.timeout:.0f} s: both ranks killed", file=sys.stderr)
        return 1
    files = [Path(out, f"rank{r}.json") for r in range(2)]
    if not all(f.exists() for f in files):
        print(f"a rank failed (exit codes {[p.returncode for p in ranks]})", file=sys.stderr)
        return 1
    zero, one = (json.loads(f.read_text()) for f in files)
    size = "tiny Llama" if args.tiny else "1B Llama"
    print(f"{size} ({zero['params'] / 1e9:.3f}B parameters, {zero['full_bytes'] / GIB:.2f} GiB float32), FSDP2 over "
          f"2 gloo processes, {args.tokens} tokens per rank; parse {zero['parse_s']:.2f} s on rank 0")
    print(f"  rank 0 widget initial state {zero['initial_bytes'] / 1e3:.1f} KB (after show_logical "
          f"{zero['after_bytes'] / 1e3:.1f} KB)  target <= 100 KB: {'ok' if zero['after_bytes'] <= 100_000 else 'OVER'}")
    print(f"  capture_logical: {zero['capture_s']:.2f} s wall ({zero['capture_cpu_s']:.2f} s CPU on rank 0), "
          f"{zero['values']} values, badges {zero['badges']}, {zero['unknown']} without a whole value")
    if zero["unknown"]:
        print(f"    first: {zero['first_unknown']}; why (count): {zero['unknown_why']}")
    print(f"  show_logical (gather every value + statistics): {zero['show_s']:.2f} s; the browser's logical request "
          f"on rank 0: {zero['logical_reply_ms']:.1f} ms, reply {zero['logical_reply_bytes'] / 1e6:.2f} MB "
          f"({'ok' if zero['logical_reply_ok'] else 'REFUSED'})")
    print(f"  collective Step round trip, rank 0 driving, rank 1 following: median {zero['step_median_ms']:.1f} ms, "
          f"p95 {zero['step_p95_ms']:.1f} ms over {zero['steps']} steps  target < 100 ms: "
          f"{'ok' if zero['step_median_ms'] < 100 else 'OVER'}")
    print(f"  peak resident memory: rank 0 {zero['peak_rss'] / GIB:.2f} GiB, rank 1 {one['peak_rss'] / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
