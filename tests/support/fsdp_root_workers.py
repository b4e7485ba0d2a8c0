"""Workers for tests/distributed/test_fsdp_root_parameters.py: an FSDP2 model whose root holds a
Linear of its own (not given its own `fully_shard`), run under its schema on each rank of a gloo
group and compared with the same model run eagerly on the same ranks.

Each worker builds two copies of the model from one seed and shards both the same way; the eager
copy runs `model(x)`, the parsed copy runs through the schema (a plain call, a capture, a step_run to
the end, a collective run, a logical capture). Outputs and each rank's gradient shards are compared
with torch.equal. A counting forward pre-hook and forward hook on the parsed root say how often the
user's hooks ran per call (eager: once each).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn


class OwnHead(nn.Module):
    """`body` gets its own `fully_shard`; `head` does not, so its weights are in the root's group."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.body(x)
        return self.head(h) * 2.0


def _models():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    eager = OwnHead()
    parsed = copy.deepcopy(eager)
    for model in (eager, parsed):
        fully_shard(model.body, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return eager, parsed


def _inputs(rank: int) -> torch.Tensor:
    return torch.randn(3, 6, generator=torch.Generator().manual_seed(50 + rank))


def _grads(model: nn.Module) -> dict:
    return {name: param.grad.to_local().clone() for name, param in model.named_parameters()}


def _same_grads(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _Counter:
    def __init__(self, model: nn.Module):
        self.pre = self.post = 0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, module, args):
        self.pre += 1

    def _post(self, module, args, output):
        self.post += 1

    def take(self) -> list:
        counts, self.pre, self.post = [self.pre, self.post], 0, 0
        return counts


def root_parameters(rank: int, world: int) -> dict:
    """Plain call with gradients, a capture, a step_run to the end, under the schema of a root with its own Linear."""
    from nnschemaparser import NNParser, SchemaInterpreter, capture_run

    eager, parsed = _models()
    x = _inputs(rank)
    schema = NNParser.parse_model(parsed, inputs_tensors_values={"x": x})
    out: dict = {"skipped": sorted(schema.skipped)}
    counter = _Counter(parsed)

    expected = eager(x)
    expected.sum().backward()
    eager_grads = _grads(eager)

    result = SchemaInterpreter().call(schema, x)
    result.sum().backward()
    out["call_output_equal"] = torch.equal(result, expected)
    out["call_grads_equal"] = _same_grads(_grads(parsed), eager_grads)
    out["call_hooks"] = counter.take()
    parsed.zero_grad()

    with torch.no_grad():
        expected_ng = eager(x)
    record = capture_run(schema, {"x": x}, capture_grads=True)
    record.outputs[0].sum().backward()
    out["capture_output_equal"] = torch.equal(record.outputs[0], expected)
    out["capture_grads_equal"] = _same_grads(_grads(parsed), eager_grads)
    head_steps = [s for s in record.trace.steps if s.block_path == "head"]
    out["capture_head_steps"] = len(head_steps)
    out["capture_head_equal"] = bool(head_steps) and torch.equal(head_steps[-1].value, expected / 2.0)
    out["capture_hooks"] = counter.take()
    parsed.zero_grad()

    interpreter = SchemaInterpreter()
    with torch.no_grad():
        steps = list(interpreter.step_run(schema, {"x": x}))
    out["steps"] = len(steps)
    out["step_output_equal"] = torch.equal(interpreter.step_outputs[0], expected_ng)
    out["step_hooks"] = counter.take()

    from nnschemaparser.parser import preserved_state
    with torch.no_grad(), preserved_state(parsed) as guard:
        parsed(x)
    out["guard_copied"] = guard.copied + guard.copied_up_front
    out["guard_after_output_equal"] = torch.equal(SchemaInterpreter().call(schema, x), expected_ng)
    dist.barrier()
    return out


def collective_and_logical(rank: int, world: int) -> dict:
    """The same root under a collective step run (to the end, and to a stop in `head`) and a logical capture."""
    from nnschemaparser import NNParser
    from nnschemaparser.distributed import capture_logical, collective_step_run

    eager, parsed = _models()
    x = _inputs(rank)
    schema = NNParser.parse_model(parsed, inputs_tensors_values={"x": x})
    counter = _Counter(parsed)
    out: dict = {}
    with torch.no_grad():
        expected = eager(x)
        with collective_step_run(schema, {"x": x}, name="root-finish") as run:
            outputs = run.finish()
        out["collective_output_equal"] = torch.equal(outputs[0], expected)
        out["collective_hooks"] = counter.take()
        with collective_step_run(schema, {"x": x}, name="root-stop") as run:
            run.break_at(block="head")
            stopped = run.continue_()
            out["stopped_in"] = stopped.block_path
            outputs = run.finish()
        out["stopped_output_equal"] = torch.equal(outputs[0], expected)
        counter.take()
    record = capture_logical(schema, {"x": x})
    out["logical_output_equal"] = torch.equal(record.outputs[0], expected)
    out["logical_hooks"] = counter.take()
    head = [s for s in record.trace.steps if s.block_path == "head"][-1]
    whole = record.trace.logical(head.container_id)
    torch.manual_seed(0)
    single = OwnHead()  # one process, unsharded, run on each rank's rows (a matmul's bits depend on
    with torch.no_grad():  # its batch size, so the whole batch at once is not the reference)
        want = torch.cat([single.head(single.body(_inputs(r))) for r in range(world)])
    out["logical_head_equal"] = torch.equal(whole, want)
    dist.barrier()
    return out
