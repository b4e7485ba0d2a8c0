"""The ranks of the pipeline tests (tests/distributed/test_pipeline_*.py): two stages of one model.

The model is a stack of residual blocks; stage 0 holds the first half of its layers, stage 1 the
rest, each in a `Part` module with the model's own forward over its layers (a manual split: the
tracer-based `pipeline()` runs FX code, not a forward a schema can run). Each rank parses its part,
wraps it in `SchemaStage` under `PipelineStage`, and runs `ScheduleGPipe` on a batch of 4 in 2
micro-batches, with stage 0 editing one variable. What each rank saw comes back as JSON.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter
from nnschemaparser.distributed import PlacedEdit, SchemaStage
from nnschemaparser.distributed.pipeline import PlaceEditor
from nnschemaparser.traces.recorder import ActivationRecorder

BATCH, WIDTH, LAYERS, MICROBATCHES = 4, 8, 4, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.fc(x)
        h = torch.tanh(h)
        return h + x


class Part(nn.Module):
    """Some layers of the model, run by the model's own loop (the whole model is a Part of all of them)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def model_and_batch():
    torch.manual_seed(0)
    model = Part([Block() for _ in range(LAYERS)])
    return model, torch.randn(BATCH, WIDTH)


def edit_values() -> torch.Tensor:
    """The whole-batch value of `h` = tanh(...) in layer 1 (stage 0's second layer) after the edit."""
    return torch.linspace(-1.0, 1.0, BATCH * WIDTH).reshape(BATCH, WIDTH)


def _steps(trace, offset: int = 0) -> list[tuple[str, str, torch.Tensor]]:
    """(block path in the whole model, variable, value) of a trace's layer steps, in order."""
    found = []
    for step in trace.steps:
        if step.block_path.startswith("layers.") and step.value is not None:
            index, _, rest = step.block_path[len("layers."):].partition(".")
            path = f"layers.{int(index) + offset}" + (f".{rest}" if rest else "")
            found.append((path, step.out_var, step.value))
    return found


def pipeline(rank: int, world: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model, batch = model_and_batch()
    per_stage = LAYERS // world
    part = Part(list(model.layers[rank * per_stage:(rank + 1) * per_stage]))
    schema = NNParser.parse_model(part, inputs_tensors_values={"x": batch[:BATCH // MICROBATCHES]})
    edits = [PlacedEdit("layers.1", "h", edit_values(), occurrence=2)] if rank == 0 else []
    stage_module = SchemaStage(part, schema, rank, name=f"layers {rank * per_stage}..{(rank + 1) * per_stage - 1}",
                               capture=True, edits=edits, microbatches=MICROBATCHES)
    # static metadata (the shapes of one micro-batch in and out): the schedule then calls the stage
    # once per micro-batch, and never for a metadata inference run of its own
    piece = torch.empty(BATCH // MICROBATCHES, WIDTH)
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"), input_args=piece, output_args=piece)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES)
    with torch.no_grad():
        output = schedule.eval(batch) if rank == 0 else schedule.eval()

    # the same edit in one process: the whole model's schema on the whole batch
    whole = NNParser.parse_model(model, inputs_tensors_values={"x": batch})
    recorder = ActivationRecorder()
    editor = PlaceEditor([PlacedEdit("layers.1", "h", edit_values(), occurrence=2)], notify=[recorder])
    with torch.no_grad():
        reference = SchemaInterpreter(listeners=[recorder, editor]).call(whole, batch)
        unedited = model(batch)
    expected = [(path, var, value) for path, var, value in _steps(recorder.trace)
                if int(path.split(".")[1]) // per_stage == rank]

    captures = stage_module.captures
    mine = [_steps(capture.trace, rank * per_stage) for capture in captures]
    same_places = all([(p, v) for p, v, _ in steps] == [(p, v) for p, v, _ in expected] for steps in mine)
    joined_equal = same_places and all(
        torch.equal(torch.cat([steps[i][2] for steps in mine]), expected[i][2]) for i in range(len(expected)))
    edited_marked = [step.edited for capture in captures for step in capture.trace.steps
                     if step.block_path == "layers.1" and step.out_var == "h"]
    result = {"captures": [{"stage": c.stage, "name": c.name, "microbatch": c.microbatch, "call": c.call,
                            "steps": len(c.trace.steps)} for c in captures],
              "same_places": same_places, "captured_values_equal": joined_equal,
              "edited_marks": edited_marked, "places": len(expected)}
    if rank == world - 1:
        result["output_equal_one_process"] = torch.equal(output, reference)
        result["edit_changed_output"] = not torch.equal(output, unedited)
    dist.barrier()
    return result
