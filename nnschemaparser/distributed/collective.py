"""Stepping, breakpoints and edits across the ranks of a `torch.distributed` group.

Every rank runs the same schema (SPMD: DDP, FSDP2, tensor parallel), each under its own
`SchemaInterpreter.step_run`. `collective_step_run(schema, scope)` wraps that generator in a
`CollectiveRun` whose commands (`step`, `continue_`, `finish`, `edit`) every rank carries out
together:

- **one stop for all.** After each step every rank contributes, in one `all_reduce(MAX)` of a small
  integer tensor, whether one of its breakpoints hit, whether its run ended, and its step index and
  an instruction fingerprint (each also negated, so one MAX gives the minimum too). So a NaN on one
  rank stops every rank at that same step, and ranks that reach different instructions (data-
  dependent control flow) raise `RanksDivergedError` instead of going on out of step. A breakpoint
  needs to be set on one rank only to stop them all; the reasons of the ranks that hit are shared
  through the group's store (`run.stop`).
- **edits of the logical value.** `run.edit(values)` takes the whole (logical) tensor: a DTensor
  variable gets its own shard of it (`distribute_tensor(..., src_data_rank=None)`: a local slice, no
  communication); a plain tensor is replicated (`placement=None`, the same value on every rank) or
  sharded (`placement=Shard(d)` or `"shard:d"`: rank r gets `torch.chunk`'s piece r along d, as a
  DTensor shard). The ranks then agree: an edit one rank refuses (a shape, a dtype) is undone on
  every rank and raises `EditError` naming the rank and its reason; ranks given different logical
  values raise too.
- **no hang when a rank raises.** Waiting for the other ranks polls the collective and a failure key
  in the group's store (a `TCPStore`: the side channel). A rank whose run raises (its model, a
  predicate, or the user's code inside `with run:`) writes its rank, exception type and message
  there before re-raising, and the ranks waiting for it raise `RankFailedError` naming them. A wait
  with no answer and no failure ends with `CollectiveTimeoutError` after `timeout` seconds. Inside
  the model's own collectives (an FSDP all-gather) only the process group's timeout can end the
  wait; the error raised then also names the failed rank when it has written its key.
- **pauses before calls.** With `pause_before_calls=True`, `step()` also stops every rank before each
  sub-block call (a `CallPause`, in `run.pause`; the ranks agree on it as on a step); `continue_()`
  and `finish()` run past pauses, as they are not steps. Nothing is edited at a pause.
- **planned edits.** `edits={step: [{"values": whole, "placement": ...}, ...]}` (the same on every
  rank) applies `run.edit`'s edit when each rank reaches that step, before breakpoints look at it:
  the logical value, each rank its part, agreed by all ranks (a refusal undoes it everywhere).
- **one driver.** With `driver=0`, only rank 0 gives commands (a notebook, the widget): each is
  published in the store, and the other ranks call `run.follow()`, which carries them out until
  rank 0's run ends or is closed. Predicate breakpoints are code, so every rank sets those itself.

Depends on the runtime's `step_run` and `StepInfo`, and `collective_parts` (breakpoints, per-rank parts).
"""

from __future__ import annotations

import io
import json
import time
import zlib
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..runtime.interpreter import CallPause, SchemaInterpreter, StepInfo
from .collective_parts import (EDIT_KEYS, CollectiveBreakpoint, is_dtensor, local_part, placement_of, planned_edits,
                               step_fingerprint, value_fingerprint)
from ..schema.errors import EditError, NNSchemaError, SchemaRunError

__all__ = ["collective_step_run", "CollectiveRun", "CollectiveBreakpoint", "CollectiveError", "RankFailedError",
           "RanksDivergedError", "CollectiveTimeoutError", "local_part"]  # the last two from collective_parts


class CollectiveError(NNSchemaError):
    """A collective stepped run cannot go on together on every rank."""


class RankFailedError(CollectiveError):
    """Another rank of the collective run raised; `rank`, `exc_type` and `exc_message` say which and what."""

    def __init__(self, rank: int, exc_type: str, exc_message: str, where: str = ""):
        self.rank, self.exc_type, self.exc_message = rank, exc_type, exc_message
        super().__init__(f"rank {rank} raised {exc_type}: {exc_message}{where}; the collective run stops on every "
                         "rank (destroy the process group, fix the cause on that rank and start again)")


class RanksDivergedError(CollectiveError):
    """The ranks reached different steps (data-dependent control flow), so they cannot stop together."""


class CollectiveTimeoutError(CollectiveError):
    """No answer from the other ranks within the run's timeout, and none of them reported a failure."""


_STEP, _MODE, _EDIT = 1, 2, 3  # the phases of an agreement
_ON_VALUES = ("nonfinite", "when")  # breakpoints on values, which differ per rank (the others are on places)
_STEPPED = "stepped"  # the stop reason of step(): every rank was told to take one step
_SEQUENCES: dict[str, int] = {}  # runs per store prefix: every rank creates its runs in the same order


_COMMANDS = {"step": (), "continue_": (), "finish": (), "close": (), "clear_breakpoints": (),
             "break_on_nonfinite": (), "break_at": ("step", "line", "file", "block", "var"),
             "edit": EDIT_KEYS}


class CollectiveRun:
    """One rank's side of a collective stepped run (see the module docstring); made by `collective_step_run`."""

    def __init__(self, schema: Any, scope: dict, *, group: Any = None, store: Any = None, driver: Optional[int] = None,
                 timeout: float = 120.0, listeners: Any = None, name: str = "run", pause_before_calls: bool = False,
                 edits: Optional[dict] = None):
        self._plan = planned_edits(edits) if edits is not None else {}
        if not dist.is_available() or not dist.is_initialized():
            raise CollectiveError("a collective run needs an initialised process group: call "
                                  "torch.distributed.init_process_group first (torchrun sets its environment)")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise SchemaRunError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if driver is not None and (type(driver) is not int or not 0 <= driver < self.world):
            raise SchemaRunError(f"driver must be a rank of the group (0..{self.world - 1}) or None, got {driver!r}")
        self.driver = driver
        self.timeout = float(timeout)
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        prefix = f"nnsp/collective/{name}"
        sequence = _SEQUENCES.get(prefix, 0)
        _SEQUENCES[prefix] = sequence + 1
        self.store = dist.PrefixStore(f"{prefix}/{sequence}/", base)
        backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.interpreter = SchemaInterpreter(listeners=listeners)
        self._steps = self.interpreter.step_run(schema, scope, pause_before_calls=bool(pause_before_calls))
        self.breakpoints: list[CollectiveBreakpoint] = []
        self.current: Optional[StepInfo] = None
        self.pause: Optional[CallPause] = None  # paused before a sub-block call (after `current`)
        self.previous: Optional[StepInfo] = None
        self.ended = False
        self.outputs: Optional[list] = None
        self.stop: Optional[dict] = None
        self.hits: list[dict] = []
        self._frames: dict[int, dict] = {}  # depth -> the frame last seen there (so a new call is an entry)
        self._agreements = 0
        self._commands = 0
        self._failed = False

    # --- breakpoints (local: a hit on any rank stops all) --------------------------------------------------

    def break_at(self, *, step: int = 0, line: int = 0, file: str = "", block: str = "", var: str = "") -> CollectiveBreakpoint:
        """A breakpoint at a step index, a source line, a block's entry or a variable (see CollectiveBreakpoint)."""
        given = [key for key, value in (("step", step), ("line", line), ("block", block), ("var", var)) if value]
        if not given or (len(given) > 1 and set(given) != {"block", "var"}):
            raise SchemaRunError("break_at takes one place: step=, line= (with file=), block=, or var= (with block=)")
        for key, value in (("step", step), ("line", line)):
            if type(value) is not int or value < 0:
                raise SchemaRunError(f"break_at: {key} must be a positive int, got {value!r}")
        self._publish("break_at", {"step": step, "line": line, "file": file, "block": block, "var": var})
        kind = "var" if var else given[0]
        label = {"step": f"step {step}", "line": f"line {line}", "block": block, "var": var}[kind]
        return self._add(CollectiveBreakpoint(kind, step=step, line=line, file=file, block=block, var=var, label=label))

    def break_on_nonfinite(self) -> CollectiveBreakpoint:
        """Stop every rank at the first step where any rank's value has a NaN or an Inf."""
        self._publish("break_on_nonfinite", {})
        return self._add(CollectiveBreakpoint("nonfinite", label="first NaN or Inf"))

    def break_when(self, predicate: Callable[[StepInfo], Any], label: str = "") -> CollectiveBreakpoint:
        """Stop every rank at the first step where `predicate(step)` is true on any rank. A predicate
        is code, so it is never sent to the other ranks: set it on each rank that should evaluate it."""
        if not callable(predicate):
            raise SchemaRunError(f"break_when needs a callable taking a StepInfo, got {type(predicate).__name__}")
        return self._add(CollectiveBreakpoint("when", when=predicate,
                                              label=label or getattr(predicate, "__name__", "the predicate")))

    def clear_breakpoints(self) -> None:
        self._publish("clear_breakpoints", {})
        self.breakpoints.clear()

    def _add(self, bp: CollectiveBreakpoint) -> CollectiveBreakpoint:
        self.breakpoints.append(bp)
        return bp

    # --- commands --------------------------------------------------------------------------------------------

    def step(self) -> Optional[StepInfo | CallPause]:
        """One step on every rank; the new current step (None when the run ended). With
        `pause_before_calls=True` the next stop may be the pause before a sub-block call: the
        `CallPause` is returned (and kept in `pause`; `current` stays the step before it)."""
        self._publish("step", {})
        return self._go(lambda step, previous, entry: _STEPPED, pauses=True)

    def continue_(self) -> Optional[StepInfo]:
        """Run every rank until a breakpoint hits on one of them (all stop at that step) or the run ends (None).

        The ranks first agree on how: when a rank has a breakpoint on values (NaN, a predicate) or the
        ranks' place breakpoints differ, every step is agreed; when every rank has the same place
        breakpoints only, each rank runs on its own to its next hit (the same step on every rank, as
        they run the same instructions) and they agree there, so a Continue costs one agreement per stop.
        """
        self._publish("continue_", {})
        if self.ended:
            raise SchemaRunError("the collective run has ended; start another with collective_step_run")
        on_values = any(bp.kind in _ON_VALUES for bp in self.breakpoints)
        places = zlib.crc32(repr(sorted((bp.kind, bp.step, bp.line, bp.file, bp.block, bp.var)
                                        for bp in self.breakpoints)).encode()) & 0x7FFFFFFF
        slots = self._agree(on_values, 0, 0, places, _MODE, "the start of a Continue")
        every_step = any(slots[:self.world]) or slots[self.world + 2] != -slots[self.world + 6]
        return self._go(self._check, every_step)

    def finish(self) -> list:
        """Run every rank to the end, past every breakpoint; the outputs (also in `outputs`). The ranks
        agree once, at the end (that they ran the same number of steps and ended)."""
        self._publish("finish", {})
        if not self.ended:
            self._go(lambda step, previous, entry: "", every_step=False)
        return self.outputs

    def edit(self, values: Any, *, out_var: Optional[str] = None, frame_depth: Optional[int] = None,
             placement: Any = None, shape: Any = None, dtype: Any = None) -> None:
        """Replace a variable of the current step on every rank with its part of the logical `values`.

        Defaults: the variable the current step bound, in its frame. `placement` (plain tensors only):
        None or Replicate() gives every rank `values`; Shard(d) gives rank r its `torch.chunk` piece
        along d. A DTensor variable is sharded by its own placements. `shape`/`dtype`: the logical
        shape and dtype when they change on purpose. Nothing changes on any rank unless every rank can
        apply its part.
        """
        if not isinstance(values, torch.Tensor) or is_dtensor(values):
            raise EditError("an edit across ranks gives the whole (logical) value as a plain tensor, got "
                            f"{type(values).__name__}")
        self._publish("edit", {"values": values, "out_var": out_var, "frame_depth": frame_depth,
                               "placement": list(placement_of(placement)) if placement is not None else None,
                               "shape": list(shape) if shape is not None else None,
                               "dtype": str(dtype) if dtype is not None else None})
        self._edit(values, out_var, frame_depth, placement, shape, dtype)

    def close(self) -> None:
        """Unwind the paused run on this rank (and, from the driver, on every rank)."""
        if self.driver is not None and self.rank == self.driver and not self._failed:
            self._publish("close", {})
        self._steps.close()
        self.ended = True

    def __enter__(self) -> "CollectiveRun":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            if not isinstance(exc, CollectiveError):
                self._report(exc)
            if not self.ended:  # unwind this rank's paused run; the others end with their own errors
                self.ended = True
                self._steps.close()
        elif not self.ended:
            self.close()

    # --- the driver and its followers --------------------------------------------------------------------

    def follow(self) -> Optional[list]:
        """On a rank other than the driver: carry out the driver's commands until its run ends or is
        closed; returns this rank's outputs (None when closed before the end)."""
        if self.driver is None or self.rank == self.driver:
            raise SchemaRunError("follow() is for the ranks other than the driver of a run made with driver=<rank>")
        while True:
            op, kwargs = self._next_command()
            if op == "close":
                self._steps.close()
                self.ended = True
                return None
            if op == "edit":
                self._edit(kwargs["values"], kwargs["out_var"], kwargs["frame_depth"], kwargs["placement"],
                           kwargs["shape"], kwargs["dtype"])
            elif op == "break_at":
                self.break_at(**kwargs)
            else:
                getattr(self, op)()
            if self.ended:
                return self.outputs

    def _publish(self, op: str, kwargs: dict) -> None:
        if self.driver is None or self.rank != self.driver:
            return
        buffer = io.BytesIO()
        torch.save({"op": op, "kwargs": kwargs}, buffer)
        self.store.set(f"cmd/{self._commands}", buffer.getvalue())
        self._commands += 1

    def _next_command(self) -> tuple[str, dict]:
        key = f"cmd/{self._commands}"
        self._poll(lambda: self.store.check([key]), f"command {self._commands} from the driver (rank {self.driver})",
                   deadline=None)
        raw = self.store.get(key)
        self._commands += 1
        try:  # the store is shared by the group's processes: read it as data, never as code
            command = torch.load(io.BytesIO(raw), weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise CollectiveError(f"command {self._commands - 1} in the store is not one the driver wrote: {exc}")
        op, kwargs = command.get("op") if isinstance(command, dict) else None, \
            command.get("kwargs") if isinstance(command, dict) else None
        if op not in _COMMANDS or not isinstance(kwargs, dict) or set(kwargs) - set(_COMMANDS[op]):
            raise CollectiveError(f"command {self._commands - 1} in the store is not one the driver writes: {op!r}")
        if op == "edit":
            if kwargs.get("dtype") is not None:
                kwargs["dtype"] = getattr(torch, str(kwargs["dtype"]).replace("torch.", ""), kwargs["dtype"])
            kwargs = {key: kwargs.get(key) for key in _COMMANDS["edit"]}
        return op, kwargs

    # --- inside ----------------------------------------------------------------------------------------------

    def _check(self, step: StepInfo, previous: Optional[StepInfo], entry: bool) -> str:
        for bp in self.breakpoints:
            reason = bp.hit(step, previous, entry)
            if reason:
                bp.hits += 1
                return reason
        return ""

    def _go(self, decide: Callable[[StepInfo, Optional[StepInfo], bool], str],
            every_step: bool = True, pauses: bool = False) -> Optional[StepInfo | CallPause]:
        if self.ended:
            raise SchemaRunError("the collective run has ended; start another with collective_step_run")
        while True:
            step = self._advance()
            if isinstance(step, CallPause):
                if not pauses:
                    continue
                self._agree_step(step, _STEPPED)
                return self.pause
            reason = ""
            if step is not None and step.step_index in self._plan:
                for planned in self._plan[step.step_index]:
                    self._edit(**{key: planned.get(key) for key in EDIT_KEYS})
            if step is not None:
                entry = self._entry(step)
                try:
                    reason = decide(step, self.previous, entry)
                except BaseException as exc:
                    self._report(exc)
                    raise
            if not (every_step or reason or step is None):
                continue
            self._agree_step(step, reason)
            if self.ended and self._plan:
                self._missed_edits()
            if self.ended or self.stop is not None:
                return self.current

    def _missed_edits(self) -> None:
        last = self.previous.step_index if self.previous is not None else 0
        missed = [step for step in self._plan if step > last]
        if missed:  # every rank ran the same steps (just agreed), so every rank raises this
            raise EditError(f"edits for step{'s' if len(missed) > 1 else ''} {', '.join(map(str, missed))} never "
                            f"applied: the run ended after {last} steps (its outputs are in run.outputs)")

    def _entry(self, step: StepInfo) -> bool:
        """Whether `step` is the first own step of a call: its frame is not the one last seen at its depth."""
        frame = step.scope_frames[step.frame_depth] if step.scope_frames else None
        known = self._frames.get(step.frame_depth)
        if known is frame:
            return False
        self._frames[step.frame_depth] = frame
        for depth in [d for d in self._frames if d > step.frame_depth]:
            del self._frames[depth]
        return True

    def _advance(self) -> Optional[StepInfo | CallPause]:
        self.pause = None
        try:
            step = next(self._steps)
        except StopIteration as done:
            self.outputs = done.value
            self.ended = True
            self.previous, self.current = self.current, None
            return None
        except BaseException as exc:
            self._raise_failure(exc)
            raise
        if isinstance(step, CallPause):
            self.pause = step
            return step
        self.previous, self.current = self.current, step
        return step

    def _agree_step(self, step: Optional[StepInfo | CallPause], reason: str) -> None:
        # at the end: the number of steps run (ranks that ran different instructions differ there too)
        call = isinstance(step, CallPause)
        index = step.after_step if call else step.step_index if step is not None else \
            (self.previous.step_index if self.previous else 0)
        fingerprint = step_fingerprint(step)
        ended = int(step is None)
        if reason and reason != _STEPPED:  # a step every rank was told to take needs no word on why
            self.store.set(f"stop/{self._agreements}/{self.rank}", reason)
        slots = self._agree(bool(reason), ended, index, fingerprint, _STEP, f"step {index}" if step else f"the end, after {index} steps")
        stops = [rank for rank in range(self.world) if slots[rank]]
        highs = slots[self.world:self.world + 3]
        lows = [-value for value in slots[self.world + 4:self.world + 7]]
        if highs != lows:
            self._failed_elsewhere(f"step {index}")
            (ended_low, index_low, _), (ended_high, index_high, _) = lows, highs
            what = "ended on some ranks only" if ended_low != ended_high else \
                f"steps {index_low}..{index_high}" if index_low != index_high else "the same step index, other instructions"
            self._failed = True
            self._steps.close()  # every rank raises here, so the group stays usable for another run
            self.ended = True
            raise RanksDivergedError(
                f"the ranks no longer run the same instructions ({what}; this rank {self.rank} is at "
                f"{_where(step) if step else 'the end'}): data-dependent control flow differs "
                "between ranks, so they cannot stop together; step each rank on its own with step_run")
        self.stop = None
        if stops and not ended:
            reasons = {rank: _STEPPED if reason == _STEPPED else self.store.get(f"stop/{self._agreements - 1}/{rank}").decode()
                       for rank in stops}
            self.stop = {"step": index, "block": step.block_path, "var": "" if call else step.out_var, "reasons": reasons}
            if call:
                self.stop["call"] = step.callee_path
            self.hits.append(self.stop)

    def _agree(self, flag: bool, ended: int, index: int, fingerprint: int, phase: int, what: str) -> list[int]:
        """One all_reduce(MAX) of [a flag slot per rank, ended, index, fingerprint, phase, and the four
        negated]: the same layout for every agreement, so ranks in different phases (one in a Continue,
        one in an edit) see it in `phase` instead of mixing up their tensors."""
        values = [ended, index, fingerprint, phase]
        tensor = torch.zeros(self.world + 8, dtype=torch.int64)
        tensor[self.rank] = int(flag)
        tensor[self.world:] = torch.tensor(values + [-value for value in values], dtype=torch.int64)
        tensor = tensor.to(self.device)
        self._agreements += 1
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._poll(work.is_completed, what, deadline=time.monotonic() + self.timeout)
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - a peer that went away: say which, when it said so
            self._raise_failure(exc)
            raise
        slots = tensor.cpu().tolist()
        if slots[self.world + 3] != -slots[self.world + 7]:
            self._failed_elsewhere(what)
            self._failed = True
            raise RanksDivergedError(f"the ranks gave different commands (rank {self.rank} was at {what}; the others "
                                     "at another step, the start of a Continue or an edit): every rank must give the "
                                     "same commands in the same order, or use driver= and follow()")
        return slots

    def _poll(self, done: Callable[[], bool], what: str, deadline: Optional[float]) -> None:
        spins = 0
        while not done():
            spins += 1
            if spins < 200:
                continue
            failure = self._failure()
            if failure is not None:
                self._failed = True
                raise RankFailedError(*failure, where=f" while rank {self.rank} waited at {what}")
            if deadline is not None and time.monotonic() > deadline:
                # told to the others too: a late rank would otherwise pair with this rank's abandoned
                # collective and wait at the next one
                self._report(CollectiveTimeoutError(f"it waited {self.timeout:.0f} s at {what} for the other ranks"))
                raise CollectiveTimeoutError(
                    f"rank {self.rank} waited {self.timeout:.0f} s at {what} and the other ranks neither answered nor "
                    "reported a failure (a rank killed, or stuck in code outside `with run:`); pass timeout= for "
                    "longer waits")
            time.sleep(min(0.02, 0.0002 * (spins - 199)))

    def _failed_elsewhere(self, what: str) -> None:
        """Before saying the ranks diverged: a rank that failed (and left a collective behind, which a
        late rank then completed) is the real news."""
        failure = self._failure()
        if failure is not None and failure[0] != self.rank:
            self._failed = True
            raise RankFailedError(*failure, where=f" (rank {self.rank} found out at {what})")

    def _failure(self) -> Optional[tuple[int, str, str]]:
        try:
            if not self.store.check(["failed"]):
                return None
            raw = self.store.get("failed")
        except Exception as exc:  # noqa: BLE001 - the store's host went away: nothing more can be agreed
            self._failed = True
            raise CollectiveError(f"rank {self.rank} cannot reach the group's store ({type(exc).__name__}: {exc}); the "
                                  "process holding it (rank 0, or torchrun's agent) has exited, so the run cannot "
                                  "go on") from exc
        try:
            data = json.loads(raw.decode())
            return int(data["rank"]), str(data["type"]), str(data["message"])
        except (ValueError, KeyError, TypeError):
            return -1, "an unreadable failure record", "the store's failure key holds no JSON record"

    def _report(self, exc: BaseException) -> None:
        """Tell the other ranks this rank failed (first failure wins; a collective error is not news)."""
        if self._failed or (isinstance(exc, CollectiveError) and not isinstance(exc, CollectiveTimeoutError)):
            return
        self._failed = True
        record = json.dumps({"rank": self.rank, "type": type(exc).__name__, "message": str(exc)[:2000]})
        try:
            self.store.compare_set("failed", "", record)
        except Exception:  # noqa: BLE001 - the store itself is gone: nothing more can be told
            pass

    def _raise_failure(self, exc: BaseException) -> None:
        """After a local exception: raise RankFailedError when another rank failed first, else report it."""
        failure = self._failure()
        if failure is not None and failure[0] != self.rank:
            self._failed = True
            raise RankFailedError(*failure, where=f" (rank {self.rank} then got {type(exc).__name__})") from exc
        self._report(exc)

    def _edit(self, values: Any, out_var: Optional[str], frame_depth: Optional[int], placement: Any, shape: Any,
              dtype: Any) -> None:
        step = self.current
        if self.pause is not None:
            raise EditError(f"the collective run is paused before the call of {self.pause.callee_path}, which is not a "
                            f"step: nothing can be edited here; edit at step {self.pause.after_step} (or plan it with "
                            "edits=), or step() into the call")
        if step is None:
            raise EditError("the collective run is not paused at a step: step() or continue_() first")
        depth = step.frame_depth if frame_depth is None else frame_depth
        name = out_var or step.out_var
        frame = step.scope_frames[depth] if isinstance(depth, int) and 0 <= depth < len(step.scope_frames) else {}
        old, applied, error = frame.get(name), False, ""
        try:
            local = local_part(values, old, placement, self.rank, self.world)
            local_shape = tuple(local.shape) if shape is not None else None
            step.edit(values=local, shape=local_shape, dtype=dtype, frame_depth=frame_depth, out_var=out_var)
            applied = True
        except EditError as exc:
            error = str(exc)
        except BaseException as exc:
            self._report(exc)
            raise
        if error:
            self.store.set(f"edit/{self._agreements}/{self.rank}", error)
        slots = self._agree(bool(error), 0, step.step_index, value_fingerprint(values), _EDIT,
                            f"the edit of {name!r} at step {step.step_index}")
        refused = [rank for rank in range(self.world) if slots[rank]]
        differ = slots[self.world + 2] != -slots[self.world + 6]
        if not refused and not differ:
            return
        if applied:  # undo: every rank keeps the value it had
            step.edit(values=old, shape=tuple(old.shape) if isinstance(old, torch.Tensor) else None,
                      dtype=old.dtype if isinstance(old, torch.Tensor) else None, frame_depth=frame_depth, out_var=out_var)
        if refused:
            reasons = "; ".join(f"rank {rank}: {self.store.get(f'edit/{self._agreements - 1}/{rank}').decode()}"
                                for rank in refused)
            raise EditError(f"the edit of {name!r} was applied on no rank, since {reasons}")
        raise EditError(f"the edit of {name!r} was applied on no rank: the ranks gave different logical values "
                        "(an edit across ranks takes the same whole tensor on every rank; with driver=, give it on "
                        "the driver only)")


def _where(step: StepInfo | CallPause) -> str:
    if isinstance(step, CallPause):
        return f"the call of {step.callee_path} in {step.block_path or 'the root'}"
    return f"{step.block_path}:{step.out_var}"


def collective_step_run(schema: Any, scope: dict, *, group: Any = None, store: Any = None, driver: Optional[int] = None,
                        timeout: float = 120.0, listeners: Any = None, name: str = "run", pause_before_calls: bool = False,
                        edits: Optional[dict] = None) -> CollectiveRun:
    """A stepped run of `schema` on `scope` (this rank's inputs) that every rank of `group` steps together.

    Call it on every rank, in the same order (the runs of a store are matched by their order). See the
    module docstring for the commands; `store` defaults to the process group's store (torchrun's
    TCPStore); `driver=<rank>` makes that rank the only one giving commands (the others `follow()`);
    `timeout`: the longest wait, in seconds, for the other ranks at a step. `pause_before_calls=True`:
    `step()` also stops before each sub-block call. `edits`: planned edits by step index, each
    `run.edit`'s keywords (`values`: the whole value; `placement`, `out_var`, `frame_depth`, `shape`,
    `dtype`), given the same on every rank; bad entries raise here, before any step.
    """
    return CollectiveRun(schema, scope, group=group, store=store, driver=driver, timeout=timeout,
                         listeners=listeners, name=name, pause_before_calls=pause_before_calls, edits=edits)
