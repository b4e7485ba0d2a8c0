"""The ranks of the collective stepping tests (tests/distributed/test_collective_*.py).

Each worker runs on every rank of a 2-process gloo group (tests/support/collective_group.py) and
returns what it saw as JSON-ready data; the tests assert on it. The models live here, in a file,
so that every spawned rank can parse their source.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.distributed import (CollectiveTimeoutError, RankFailedError, RanksDivergedError,
                                        collective_step_run)
from nnschemaparser.schema.errors import EditError


class Rooted(nn.Module):
    """A square root in the middle of the run: a rank with a negative input gets its NaN there."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.relu(h)
        root = torch.sqrt(x)
        out = self.fc2(h)
        return out + root


class Halving(nn.Module):
    """A loop of 100 rounds binding `h` each round: 100 places to pause at."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        for _ in range(100):
            h = h * 0.5 + 1.0
        return h


class Branching(nn.Module):
    """Data-dependent control flow: ranks with inputs of other signs take other branches."""

    def forward(self, x):
        h = x * 2.0
        if h.sum() > 0:
            h = h + 1.0
        else:
            h = h - 1.0
            h = h * 3.0
        return h


class Boom(nn.Module):
    """Fails inside the same instruction every rank runs (no branch): a torch op given a bad shape."""

    def __init__(self):
        super().__init__()
        self.shape = (-1,)

    def forward(self, x):
        flat = x.reshape(self.shape)
        return flat + 1.0


class Gathered(nn.Module):
    """A reshape that can fail on one rank, then an FSDP-sharded linear (its all-gather a collective)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.boom = Boom()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = self.boom(h)
        h = h.reshape(1, 8)
        return self.fc2(h)


class Failing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.boom = Boom()

    def forward(self, x):
        h = self.fc(x)
        h = torch.tanh(h)
        h = self.boom(h)
        return h.sum() * 2.0


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, with a NaN equal to a NaN in the same place (rank 1's outputs hold one)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0))


def _inputs(rank: int) -> torch.Tensor:
    torch.manual_seed(10 + rank)
    x = torch.rand(3, 4) + 0.5
    if rank == 1:
        x[1, 2] = -1.0  # sqrt gives a NaN on rank 1 only
    return x


def _parse(model: nn.Module, x: torch.Tensor):
    return NNParser.parse_model(model, inputs_tensors_values={"x": x})


def _step_dict(step) -> dict:
    return {"step": step.step_index, "block": step.block_path, "var": step.out_var} if step is not None else None


def stepping(rank: int, world: int) -> dict:
    """NaN on one rank, a predicate on one rank, 100 pause/resume cycles, replicated and sharded edits,
    refused edits, diverging ranks, a driver with a follower."""
    out: dict = {}
    torch.manual_seed(0)
    model = Rooted()
    x = _inputs(rank)
    schema = _parse(model, x)
    eager = model(x)

    # 1. NaN on rank 1 only: both ranks stop at the same step
    with collective_step_run(schema, {"x": x}, name="nan") as run:
        run.break_on_nonfinite()
        stopped = run.continue_()
        out["nan"] = {"at": _step_dict(stopped), "reasons": {str(k): v for k, v in run.stop["reasons"].items()}}
        outputs = run.finish()
        out["nan"]["outputs_equal_eager"] = _same(outputs[0], eager)
        out["nan"]["ended"] = run.ended and run.current is None

    # 2. a predicate set on rank 0 only stops rank 1 too
    with collective_step_run(schema, {"x": x}, name="predicate") as run:
        if rank == 0:
            run.break_when(lambda step: step.out_var == "out", label="out is bound")
        stopped = run.continue_()
        out["predicate"] = {"at": _step_dict(stopped), "reasons": {str(k): v for k, v in run.stop["reasons"].items()}}
        run.finish()

    # 3. a replicated edit (the same logical value on every rank) and a sharded one (rank r gets piece r)
    with collective_step_run(schema, {"x": x}, name="edits") as run:
        run.break_at(var="h")
        run.continue_()  # h = self.fc1(x)
        run.continue_()  # h = torch.relu(h)
        logical = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 8) - 5.0
        run.edit(logical)
        out["replicated"] = torch.equal(run.current.value, logical)
        outputs = run.finish()
        reference = model.fc2(logical) + torch.sqrt(x)
        out["replicated_output_equal"] = _same(outputs[0], reference)

    with collective_step_run(schema, {"x": x}, name="sharded") as run:
        run.break_at(var="root")
        run.continue_()
        logical = torch.arange(world * 3 * 4, dtype=torch.float32).reshape(world * 3, 4)
        run.edit(logical, placement="shard:0")
        mine = logical[rank * 3:(rank + 1) * 3]
        out["sharded"] = torch.equal(run.current.value, mine)
        outputs = run.finish()
        out["sharded_output_equal"] = _same(outputs[0], model.fc2(torch.relu(model.fc1(x))) + mine)

    # 4. an edit one rank refuses is applied on none; different logical values are refused
    with collective_step_run(schema, {"x": x}, name="refused") as run:
        run.break_at(var="root")
        before = run.continue_().value.clone()
        uneven = torch.zeros(5, 4)  # pieces of 3 and 2 rows: rank 1's has the wrong shape
        try:
            run.edit(uneven, placement="shard:0")
            out["refused"] = "no error"
        except EditError as exc:
            out["refused"] = str(exc)
        out["refused_kept"] = _same(run.current.value, before)
        try:
            run.edit(torch.full((3, 4), float(rank)))
            out["different"] = "no error"
        except EditError as exc:
            out["different"] = str(exc)
        out["different_kept"] = _same(run.current.value, before)
        run.finish()

    # 5. 100 pause/resume cycles, each stop at the same step on every rank
    torch.manual_seed(0)
    halving = Halving()
    hx = torch.rand(2, 4)
    hschema = _parse(halving, hx)
    stops = []
    started = time.perf_counter()
    with collective_step_run(hschema, {"x": hx}, name="cycles") as run:
        run.break_at(var="h")
        while run.continue_() is not None:
            stops.append(run.current.step_index)
        out["cycles_output_equal"] = torch.equal(run.outputs[0], halving(hx))
    out["cycles"] = {"stops": stops, "seconds": time.perf_counter() - started}
    # the same 100 cycles with a breakpoint on values (a predicate): every step agreed
    value_stops = []
    with collective_step_run(hschema, {"x": hx}, name="cycles-values") as run:
        run.break_when(lambda step: step.out_var == "h", label="h is bound")
        while run.continue_() is not None:
            value_stops.append(run.current.step_index)
    out["cycles_values"] = value_stops

    # 6. ranks that take other branches cannot stop together
    branching = Branching()
    bx = torch.ones(2, 2) * (1.0 if rank == 0 else -1.0)
    bschema = _parse(branching, bx)
    with collective_step_run(bschema, {"x": bx}, name="diverge") as run:
        try:
            run.finish()
            out["diverged"] = "no error"
        except RanksDivergedError as exc:
            out["diverged"] = str(exc)
        out["diverged_ended"] = run.ended

    # 6b. ranks giving different commands (rank 0 a Continue, rank 1 a finish) are told so
    with collective_step_run(schema, {"x": x}, name="commands") as run:
        try:
            if rank == 0:
                run.break_on_nonfinite()
                run.continue_()
            else:
                run.finish()
            out["commands"] = "no error"
        except RanksDivergedError as exc:
            out["commands"] = str(exc)
        run.close()

    # 7. rank 0 drives, rank 1 follows: the NaN stop and a sharded edit given on rank 0 only
    run = collective_step_run(schema, {"x": x}, name="driven", driver=0)
    if rank == 0:
        run.break_on_nonfinite()
        stopped = run.continue_()
        out["driven"] = {"at": _step_dict(stopped), "reasons": {str(k): v for k, v in run.stop["reasons"].items()}}
        logical = torch.arange(world * 3 * 4, dtype=torch.float32).reshape(world * 3, 4)
        run.edit(logical, placement="shard:0")
        out["driven"]["edited"] = torch.equal(run.current.value, logical[:3])
        outputs = run.finish()
    else:
        outputs = run.follow()
        first = run.hits[0] if run.hits else {}
        out["driven"] = {"at": {key: first.get(key) for key in ("step", "block", "var")},
                         "reasons": {str(k): v for k, v in first.get("reasons", {}).items()}, "edited": None}
    mine = torch.arange(world * 3 * 4, dtype=torch.float32).reshape(world * 3, 4)[rank * 3:(rank + 1) * 3]
    out["driven"]["output_equal"] = _same(outputs[0], model.fc2(torch.relu(model.fc1(x))) + mine)
    out["driven"]["hit_steps"] = [hit["step"] for hit in run.hits]
    dist.barrier()
    return out


def failing(rank: int, world: int) -> dict:
    """A rank whose model raises mid-run, a rank whose own code raises inside `with run:`, a rank
    that stops answering: each in its own process group, since a failed run leaves its group unusable."""
    out: dict = {}
    groups = [dist.new_group(list(range(world))) for _ in range(3)]
    torch.manual_seed(0)
    model = Failing()
    x = torch.rand(2, 4)
    schema = _parse(model, x)

    # 1. the model raises on rank 1 at its third step
    if rank == 1:
        model.boom.shape = (3, 5)  # 8 elements cannot be 15
    started = time.perf_counter()
    try:
        with collective_step_run(schema, {"x": x}, group=groups[0], name="raises", timeout=60) as run:
            run.finish()
        out["raises"] = {"error": "none"}
    except RankFailedError as exc:
        out["raises"] = {"error": "RankFailedError", "rank": exc.rank, "type": exc.exc_type, "text": str(exc)}
    except RuntimeError as exc:
        out["raises"] = {"error": "RuntimeError", "text": str(exc)}
    out["raises"]["seconds"] = time.perf_counter() - started
    model.boom.shape = (-1,)

    # 2. rank 0's own code raises between commands, inside `with run:`
    started = time.perf_counter()
    try:
        with collective_step_run(schema, {"x": x}, group=groups[1], name="user", timeout=60) as run:
            run.step()
            if rank == 0:
                raise ValueError("rank 0's notebook code failed")
            run.finish()
        out["user"] = {"error": "none"}
    except RankFailedError as exc:
        out["user"] = {"error": "RankFailedError", "rank": exc.rank, "type": exc.exc_type, "text": str(exc)}
    except ValueError as exc:
        out["user"] = {"error": "ValueError", "text": str(exc)}
    out["user"]["seconds"] = time.perf_counter() - started

    # 3. rank 1 stops answering without a word: rank 0 times out
    started = time.perf_counter()
    run = collective_step_run(schema, {"x": x}, group=groups[2], name="silent", timeout=3)
    if rank == 0:
        try:
            run.finish()
            out["silent"] = {"error": "none"}
        except CollectiveTimeoutError as exc:
            out["silent"] = {"error": "CollectiveTimeoutError", "text": str(exc)}
    else:
        time.sleep(6)
        try:  # late: rank 0 gave up and said so in the store
            run.step()
            run.step()
            out["silent"] = {"error": "none"}
        except RankFailedError as exc:
            out["silent"] = {"error": "RankFailedError", "rank": exc.rank, "type": exc.exc_type, "text": str(exc)}
    out["silent"]["seconds"] = time.perf_counter() - started

    # 4. inside the model's own collective: rank 1 fails before an FSDP all-gather that rank 0 then
    # waits in; the group's 5 s timeout ends that wait, and the error names rank 1
    import datetime

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    short = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=5))
    torch.manual_seed(0)
    sharded = Gathered()
    mesh = DeviceMesh.from_group(short, "cpu")
    fully_shard(sharded.fc1, mesh=mesh)
    fully_shard(sharded.fc2, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    gx = torch.rand(2, 4)
    gschema = _parse(sharded, gx)
    if rank == 1:
        sharded.boom.shape = (3, 5)
    started = time.perf_counter()
    try:
        with torch.no_grad(), collective_step_run(gschema, {"x": gx}, group=short, name="in-model", timeout=60) as run:
            run.finish()
        out["in_model"] = {"error": "none"}
    except RankFailedError as exc:
        out["in_model"] = {"error": "RankFailedError", "rank": exc.rank, "type": exc.exc_type, "text": str(exc),
                           "cause": type(exc.__cause__).__name__}
    except RuntimeError as exc:
        out["in_model"] = {"error": "RuntimeError", "text": str(exc)[:300]}
    out["in_model"]["seconds"] = time.perf_counter() - started
    dist.barrier()  # rank 0 holds the store: it stays until rank 1 is done with it
    return out


class Feed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.relu(h)
        out = self.fc2(h)
        return out


def tensor_parallel(rank: int, world: int) -> dict:
    """Column- then row-parallel linears on a 1-D mesh: an edit of the column-parallel activation,
    given whole, as a DTensor (its own placements) and as a plain local shard (placement=Shard(-1))."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    out: dict = {}
    logical = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 8) / 10.0 - 1.0
    piece = logical[:, rank * 4:(rank + 1) * 4]
    torch.manual_seed(0)
    x = torch.rand(3, 4)  # tensor parallel: the same input on every rank
    for kind, local_output in (("dtensor", False), ("local", True)):
        torch.manual_seed(0)
        model = Feed()
        single = copy.deepcopy(model)
        parallelize_module(model, mesh, {"fc1": ColwiseParallel(use_local_output=local_output),
                                         "fc2": RowwiseParallel()})
        schema = _parse(model, x)
        seen: dict = {"skipped": sorted(schema.skipped)}
        with collective_step_run(schema, {"x": x}, name=f"tp-{kind}") as run:
            run.break_at(var="h")
            run.continue_()
            step = run.continue_()  # h = torch.relu(h)
            seen["is_dtensor"] = isinstance(step.value, DTensor)
            if kind == "dtensor":
                seen["placements"] = [str(p) for p in step.value.placements]
                run.edit(logical)
                value = run.current.value
                seen["local_piece"] = torch.equal(value.to_local(), piece)
                seen["logical"] = torch.equal(value.full_tensor(), logical)
            else:
                run.edit(logical, placement=Shard(-1))
                seen["local_piece"] = torch.equal(run.current.value, piece)
            outputs = run.finish()
        result = outputs[0].full_tensor() if isinstance(outputs[0], DTensor) else outputs[0]
        with torch.no_grad():
            result = result.detach()
            reference = single.fc2(logical)
            # the row-parallel fc2 sums partial products over the ranks: another order of additions than
            # one process's matmul, so the output is compared with the difference it has, and bit for bit
            # with the same sum done in one process: each rank's partial product plus its half of the
            # bias (a Replicate bias joins a Partial sum as bias / world on each rank), added in rank order
            weight, half = single.fc2.weight, single.fc2.bias / world
            partials = [torch.nn.functional.linear(logical[:, r * 4:(r + 1) * 4], weight[:, r * 4:(r + 1) * 4]) + half
                        for r in range(world)]
            same_order = partials[0] + partials[1]
        seen["max_difference"] = float((result - reference).abs().max())
        seen["output_equal"] = torch.equal(result, reference)
        seen["output_equal_same_sum"] = torch.equal(result, same_order)
        seen["same_sum_difference"] = float((result - same_order).abs().max())
        out[kind] = seen
    dist.barrier()
    return out


def fsdp(rank: int, world: int) -> dict:
    """FSDP2 (`fully_shard` on both linears and the root): each rank its own batch, the weights
    all-gathered inside the steps. A sharded edit of the batch's activations, then a NaN on rank 1
    stopping both ranks, with the model's own all-gathers running between the agreements."""
    import copy

    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    torch.manual_seed(0)
    model = Rooted()
    single = copy.deepcopy(model)
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    x = _inputs(rank)
    schema = _parse(model, x)
    logical = torch.linspace(-2.0, 2.0, world * 3 * 8).reshape(world * 3, 8)  # the whole batch's h
    piece = logical[rank * 3:(rank + 1) * 3]
    out: dict = {"skipped": sorted(schema.skipped)}
    with torch.no_grad(), collective_step_run(schema, {"x": x}, name="fsdp") as run:
        run.break_at(var="h")
        run.continue_()
        run.continue_()  # h = torch.relu(h)
        run.edit(logical, placement=Shard(0))
        out["edited"] = torch.equal(run.current.value, piece)
        run.clear_breakpoints()
        run.break_on_nonfinite()
        stopped = run.continue_()
        out["nan"] = {"at": _step_dict(stopped), "reasons": {str(k): v for k, v in run.stop["reasons"].items()}}
        outputs = run.finish()
        # the all-gathered weights are the unsharded model's: the output is one process's, bit for bit
        out["output_equal"] = _same(outputs[0], single.fc2(piece) + torch.sqrt(x))
    dist.barrier()
    return out


def four_ranks(rank: int, world: int) -> dict:
    """4 ranks: a NaN on the last rank only stops all four; a sharded edit gives each its rows."""
    torch.manual_seed(0)
    model = Rooted()
    torch.manual_seed(10 + rank)
    x = torch.rand(3, 4) + 0.5
    if rank == world - 1:
        x[0, 0] = -1.0
    schema = _parse(model, x)
    logical = torch.arange(world * 3 * 4, dtype=torch.float32).reshape(world * 3, 4)
    mine = logical[rank * 3:(rank + 1) * 3]
    with collective_step_run(schema, {"x": x}, name="four") as run:
        run.break_on_nonfinite()
        stopped = run.continue_()
        out = {"at": _step_dict(stopped), "reasons": {str(k): v for k, v in run.stop["reasons"].items()}}
        run.edit(logical, placement="shard:0")
        out["edited"] = torch.equal(run.current.value, mine)
        outputs = run.finish()
        out["output_equal"] = _same(outputs[0], model.fc2(torch.relu(model.fc1(x))) + mine)
    dist.barrier()
    return out
