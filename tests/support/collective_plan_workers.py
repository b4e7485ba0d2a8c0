"""Workers for tests/distributed/test_collective_pauses_and_plans.py: a collective run that pauses
before sub-block calls, and planned edits (`edits=`) of logical values, on 2 gloo ranks.

Each worker returns what its rank saw as JSON-ready data. The model is the stepping tests' `Rooted`
(two child linears, so two calls to pause before); FSDP2 shards it for the planned sharded edit.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from nnschemaparser import CallPause, NNParser, SchemaInterpreter
from nnschemaparser.distributed import collective_step_run
from nnschemaparser.schema.errors import EditError
from tests.support.collective_workers import Rooted


def _inputs(rank: int) -> torch.Tensor:
    return torch.rand(3, 4, generator=torch.Generator().manual_seed(20 + rank)) + 0.5


def _position(item) -> list:
    if isinstance(item, CallPause):
        return ["call", item.callee_path, item.after_step]
    return ["step", item.block_path, item.out_var, item.step_index]


def _relu_step(schema, x) -> int:
    """The step index binding `h = torch.relu(h)` in the root (the second binding of `h` there)."""
    bound = [step.step_index for step in SchemaInterpreter().step_run(schema, {"x": x})
             if step.out_var == "h" and step.frame_depth == 0]
    return bound[1]


def pauses(rank: int, world: int) -> dict:
    """step() through a run that pauses before calls, on both ranks, against a local run's sequence."""
    torch.manual_seed(0)
    model = Rooted()
    x = _inputs(rank)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    out: dict = {}
    with torch.no_grad():
        local = [_position(item) for item in SchemaInterpreter().step_run(schema, {"x": x}, pause_before_calls=True)]
        expected = model(x)
        seen = []
        with collective_step_run(schema, {"x": x}, name="pauses", pause_before_calls=True) as run:
            while True:
                item = run.step()
                if item is None:
                    break
                seen.append(_position(item))
                if isinstance(item, CallPause):
                    assert run.pause is item and run.stop is not None and run.stop["call"] == item.callee_path
                    try:
                        run.edit(torch.zeros(3, 8))
                        out["edit_at_pause"] = "applied"
                    except EditError as exc:
                        out["edit_at_pause"] = str(exc)
            out["step_output_equal"] = torch.equal(run.outputs[0], expected)
        out["sequence"], out["local_sequence"] = seen, local
        with collective_step_run(schema, {"x": x}, name="pauses-continue", pause_before_calls=True) as run:
            run.break_at(var="out")
            stopped = run.continue_()  # runs past the pauses before fc1 and fc2
            out["continue_stop"] = _position(stopped)
            out["continue_pause"] = run.pause is None
            outputs = run.finish()
            out["continue_output_equal"] = torch.equal(outputs[0], expected)
    dist.barrier()
    return out


def plans(rank: int, world: int) -> dict:
    """A planned sharded edit of an FSDP2 model's `h`, against the same edit made at the stop; a refused
    planned edit, a planned edit past the end, and bad plans refused before any step."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Rooted()
    single = copy.deepcopy(model)
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    x = _inputs(rank)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    logical = torch.linspace(-2.0, 2.0, world * 3 * 8).reshape(world * 3, 8)  # the whole batch's h
    piece = logical[rank * 3:(rank + 1) * 3]
    out: dict = {}
    with torch.no_grad():
        relu = _relu_step(schema, x)
        out["relu_step"] = relu
        plan = {relu: [{"values": logical, "placement": "shard:0"}]}
        with collective_step_run(schema, {"x": x}, name="plan", edits=plan) as run:
            run.break_at(step=relu)
            stopped = run.continue_()
            out["planned_value_is_piece"] = torch.equal(stopped.value, piece)
            planned = run.finish()
        with collective_step_run(schema, {"x": x}, name="plan-interactive") as run:
            run.break_at(step=relu)
            run.continue_()
            run.edit(logical, placement="shard:0")
            interactive = run.finish()
        out["planned_equals_interactive"] = torch.equal(planned[0], interactive[0])
        out["planned_output_equal"] = torch.equal(planned[0], single.fc2(piece) + torch.sqrt(x))
        with collective_step_run(schema, {"x": x}, name="plan-finish", edits=plan) as run:
            out["planned_finish_equal"] = torch.equal(run.finish()[0], planned[0])
        wrong = {relu: {"values": torch.zeros(world * 3, 5), "placement": "shard:0"}}
        with collective_step_run(schema, {"x": x}, name="plan-refused", edits=wrong) as run:
            try:
                run.finish()
                out["refused"] = "no error"
            except EditError as exc:
                out["refused"] = str(exc)
            out["refused_kept"] = torch.equal(run.current.value, torch.relu(single.fc1(x)))
            out["refused_output_equal"] = torch.equal(run.finish()[0], single.fc2(torch.relu(single.fc1(x)))
                                                      + torch.sqrt(x))
        late = {10_000: {"values": logical}}
        with collective_step_run(schema, {"x": x}, name="plan-late", edits=late) as run:
            try:
                run.finish()
                out["late"] = "no error"
            except EditError as exc:
                out["late"] = str(exc)
            out["late_outputs_kept"] = run.outputs is not None
    out["bad"] = []
    for bad in ({0: {"values": logical}}, {relu: {"value": logical}}, {relu: {"values": [1.0]}}, [relu],
                {relu: {"values": logical, "placement": "diagonal"}}):
        try:
            collective_step_run(schema, {"x": x}, name="plan-bad", edits=bad)
            out["bad"].append("accepted")
        except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
            out["bad"].append(f"{type(exc).__name__}: {exc}")
    dist.barrier()
    return out
