"""capture_dataset: capture many inputs into a store, in this process or spread over a torch.distributed group.

Three ways to run, one store format:

- `world=None` outside a launcher, or `world=1`: this process writes every block.
- `world=N`: N processes are forked here (Linux, macOS: the schema and the inputs are inherited,
  nothing is pickled), joined into a gloo group on 127.0.0.1 (a free port), each writing the blocks
  `b % N == rank`. When one dies or fails, the others are stopped and StoreIncompleteError names it;
  the blocks committed stay, and a rerun writes only the missing inputs. A forked rank runs torch on
  one thread, set before its first op: fork copies the calling thread only, so the OpenMP pool of a
  process that has run a multi-threaded op (every notebook has: `parse_model` runs the forward) is
  gone in the child, and a parallel region there would wait forever for its threads; with one
  thread no region starts a team (what DataLoader workers and torchrun do too). Each rank beats a
  heartbeat from a thread of its own; a rank silent for `liveness` seconds (stopped by a signal or a
  debugger, frozen holding the interpreter) is named, and every rank is stopped.
- under `torchrun` (RANK and WORLD_SIZE set; on several machines, torchrun's rendezvous joins them):
  every process runs the same script and calls capture_dataset with the same inputs; each writes
  its blocks, the group meets at a barrier, and rank 0 rewrites the manifest. The store's folder
  must be shared by the machines (a network file system).

Which process writes a block never changes its content (statistics, tensors, reductions): a store
written by 1, 2 or 4 processes holds the same rows and tensors and bit-equal reductions, as long as
the processes run torch with the same number of threads. Forked ranks run one thread each, so a
store written with `world=N` equals one written by one process at `torch.set_num_threads(1)`; ops
that split work over threads (large matrix products and reductions) may differ in the last bits
from a one-process store written with more threads.

Depends on schema, files, traces and the store's own modules.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from ..files.file_format import FileLimits
from ..schema.model import ModelBlockSchema
from ..traces.interventions import interventions_of
from ..traces.selection import keep_selector
from ..traces.wrapped import check_keep_reaches
from .manifest import StoreIncompleteError, StoreOptions, read_commits
from .guard import StoreLock
from .reader import TraceStore
from .rows import Batching, mask_text
from .writer import RankSummary, discard_new_store, finalize_store, prepare_store, refuse_foreign_folder, write_rank

__all__ = ["capture_dataset", "write_gathered", "sharded_parts"]

_TIMEOUT = datetime.timedelta(minutes=30)
_BEAT_SECONDS = 1.0  # how often a forked rank's heartbeat thread writes its time


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Progress:
    """A tqdm bar of inputs with inputs/s and bytes written (None when tqdm is missing or it is off)."""

    def __init__(self, enabled: bool, total: Optional[int]):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="input", desc="capture_dataset")
        self.bytes = 0

    def __call__(self, inputs: int, written: int) -> None:
        if self.bar is not None:
            self.bytes += written
            self.bar.update(inputs)
            self.bar.set_postfix_str(f"{self.bytes / 2 ** 20:.1f} MiB written", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def capture_dataset(schema: ModelBlockSchema, inputs: Iterable[Any], store: str | os.PathLike, keep: Any = None, *,
                    world: Optional[int] = None, block_size: int = 64, shard_bytes: int = 256 * 1024 * 1024,
                    bins: int = 64, low: float = -8.0, high: float = 8.0, top_k: int = 16, progress: bool = True,
                    limits: Optional[FileLimits] = None, liveness: Optional[float] = 60.0,
                    interventions: Any = None, batch_axis: Optional[int] = 0, mask: Any = None) -> TraceStore:
    """Capture each input of `inputs` (scopes, tensors, tuples or DataLoader batches) into the store at `store`.

    Each row of a batched input is a sample (`batch_axis=0`, the default: the inputs' first axis; see
    store/rows.py), with its own statistics, kept tensors, reductions and top-k; sample ids count rows
    over the inputs in order. `batch_axis=None` keeps each input whole, one sample, its id its position
    in `inputs`. `mask`: the name of an input whose zeros are padding (`"attention_mask"`), or a
    callable of the input's scope giving a [batch, positions] mask: masked positions are left out of
    the statistics, reductions and top-k of the values laid out [batch, positions, ...].

    Writes per-step statistics of every step (Parquet), the tensors `keep` names (a selector as for
    capture_run, e.g. `"transformer.h.*.attn:attn_output"`; the root's inputs are always kept) in
    safetensors shards of at most `shard_bytes`, and reductions per kept variable (mean and variance
    per element and per channel, a `bins`-bin histogram over [low, high), the `top_k` samples by l2).
    `block_size` inputs make a unit (the grain of commits and of the split over processes). A store
    that exists is resumed: inputs already committed are skipped (iterate the same inputs, or more of
    them, to complete or extend it); one written for
    another schema or with other options raises StoreMismatchError. `world=N` spreads the work over N
    processes (module docstring); with it, a rank that sends no heartbeat for `liveness` seconds
    (stopped, or frozen holding the interpreter) ends the run with StoreIncompleteError naming it
    (None: wait for the group's own 30-minute timeout). Returns the TraceStore.

    `interventions` ({selector: fn or tensor}, as for capture_run) is applied in every input's run:
    the store holds the changed runs. The manifest records the interventions' selectors (their
    functions cannot be written), so resuming the store with other interventions, or with none, is
    refused (StoreMismatchError); resuming it with other functions at the same selectors is not
    detected: keep them with the store's code.
    """
    selector, batching, options = _options(schema, keep, block_size, shard_bytes, bins, low, high, top_k,
                                           interventions, batch_axis, mask)
    limits = limits or FileLimits()
    root = Path(store)
    launched = world is None and "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    sharded = sharded_parts(schema)
    if sharded and (launched or (world or 1) > 1):
        raise ValueError(f"the model is sharded ({sharded}): its ranks must run every input together, so "
                         "capture_dataset cannot split the inputs over them. Use nnschemaparser.distributed."
                         "capture_sharded_dataset(schema, inputs, store, keep=...) on every rank: each value is "
                         "gathered whole and rank 0 writes the store")
    if world is not None and (type(world) is not int or world < 1):
        raise ValueError(f"world must be a positive int (processes), got {world!r}")
    if liveness is not None and (isinstance(liveness, bool) or not isinstance(liveness, (int, float))
                                 or not liveness > 0):
        raise ValueError(f"liveness must be a positive number of seconds or None, got {liveness!r}")
    total = len(inputs) if hasattr(inputs, "__len__") else None  # type: ignore[arg-type]
    if launched:
        return _as_launched_rank(root, schema, inputs, options, selector, limits, progress, total, batching,
                                 interventions)
    folder_existed, new = root.exists(), not (root / "manifest.json").exists()
    if new:
        refuse_foreign_folder(root)
    root.mkdir(parents=True, exist_ok=True)
    with StoreLock(root):  # one writer at a time (store/guard.py): a second one gets StoreBusyError naming this one
        try:
            identity = prepare_store(root, schema, options, limits)
            if world is None or world == 1:
                bar = _Progress(progress, total)
                try:
                    write_rank(root, schema, inputs, options, selector, limits, progress=bar, batching=batching,
                               interventions=interventions)
                finally:
                    bar.close()
            else:
                _run_forked(root, schema, inputs, options, selector, limits, world, liveness, batching, interventions)
        except BaseException as exc:
            # a store this call created and that holds no input is refused whole: nothing is left behind
            if new and discard_new_store(root, folder_existed) and hasattr(exc, "add_note"):
                exc.add_note(f"capture_dataset: no input was committed, so the new store {root} was removed")
            raise
        finalize_store(root, identity, options, limits)
    return TraceStore(root, limits=limits, check_shards=False)


def _options(schema: ModelBlockSchema, keep: Any, block_size: int, shard_bytes: int, bins: int, low: float,
             high: float, top_k: int, interventions: Any, batch_axis: Optional[int], mask: Any) -> tuple:
    """The selector, the batching and the StoreOptions of a capture (checked)."""
    if not isinstance(schema, ModelBlockSchema):
        raise TypeError(f"schema must be a ModelBlockSchema (NNParser.parse_model(...)), got {type(schema).__name__}")
    selector = keep_selector(keep)
    check_keep_reaches(schema, selector)  # before a store is made: a keep of a wrapped model's paths is refused
    batching = Batching(batch_axis, mask)
    texts = "; ".join(item.text() for item in interventions_of(interventions)) if interventions is not None else None
    options = StoreOptions(keep=selector.text() if selector is not None else None, block_size=block_size,
                           shard_bytes=shard_bytes, bins=bins, low=float(low), high=float(high), top_k=top_k,
                           interventions=texts, batch_axis=batch_axis, mask=mask_text(mask))
    return selector, batching, options


def sharded_parts(schema: ModelBlockSchema) -> str:
    """Why the schema's model is sharded over ranks ('' when it is not): a DTensor parameter or buffer
    (FSDP2, torch's and transformers' tensor parallelism), or a forward a tensor-parallel style replaced."""
    model = schema.module
    if model is None:
        return ""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor: nothing is sharded
        return ""
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if isinstance(tensor, DTensor):
            return f"{name} is a DTensor placed {tuple(tensor.placements)}"
    for name, module in model.named_modules():
        if getattr(module.__dict__.get("forward"), "__name__", "") == "tp_forward":
            return f"{name or 'the root'} runs a tensor-parallel style's forward"
    return ""


def write_gathered(store: str | os.PathLike, schema: ModelBlockSchema, inputs: Iterable[Any], run: Any, keep: Any = None,
                   *, block_size: int = 64, shard_bytes: int = 256 * 1024 * 1024, bins: int = 64, low: float = -8.0,
                   high: float = 8.0, top_k: int = 16, progress: bool = True, limits: Optional[FileLimits] = None,
                   batch_axis: Optional[int] = 0, mask: Any = None, identity: Any = None) -> TraceStore:
    """Every rank of the initialised default group runs every input with `run` (a collective that gives rank 0
    the whole values: the distributed stage's `capture_sharded_dataset` and `capture_pipeline_dataset`), and
    rank 0 writes them: the store of one process. Rank 0 prepares the store, the others check it; all return
    the TraceStore. `identity` (a SchemaIdentity) stands for `schema`'s in the manifest: a pipeline's stages'."""
    import torch.distributed as dist

    selector, batching, options = _options(schema, keep, block_size, shard_bytes, bins, low, high, top_k, None,
                                           batch_axis, mask)
    limits = limits or FileLimits()
    root = Path(store)
    rank = dist.get_rank()
    with contextlib.ExitStack() as held:
        if rank == 0:
            if not (root / "manifest.json").exists():
                refuse_foreign_folder(root)
            root.mkdir(parents=True, exist_ok=True)
            held.enter_context(StoreLock(root))  # one writer at a time, as capture_dataset
            identity = prepare_store(root, schema, options, limits, identity)
        dist.barrier()
        if rank != 0:
            prepare_store(root, schema, options, limits, identity)  # checks what rank 0 created
        # every rank reads the commits before rank 0 can add one: its first commit needs every rank's runs
        bar = _Progress(progress and rank == 0, len(inputs) if hasattr(inputs, "__len__") else None)  # type: ignore
        try:
            write_rank(root, schema, inputs, options, selector, limits, progress=bar, batching=batching, run=run,
                       write=rank == 0)
        finally:
            bar.close()
        if rank == 0:
            finalize_store(root, identity, options, limits)
    dist.barrier()
    return TraceStore(root, limits=limits)


def _as_launched_rank(root: Path, schema: ModelBlockSchema, inputs: Iterable[Any], options: StoreOptions,
                      selector: Any, limits: FileLimits, progress: bool, total: Optional[int],
                      batching: Batching, interventions: Any = None) -> TraceStore:
    """One rank of a torchrun launch: rank 0 prepares the store, every rank writes its blocks."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", timeout=_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if rank == 0:
            identity = prepare_store(root, schema, options, limits)
        dist.barrier()
        if rank != 0:
            identity = prepare_store(root, schema, options, limits)  # checks what rank 0 created
        bar = _Progress(progress and rank == 0, total)
        try:
            summary = write_rank(root, schema, inputs, options, selector, limits, rank, world, bar, batching,
                                 interventions)
        finally:
            bar.close()
        summaries: list = [None] * world
        dist.all_gather_object(summaries, summary)
        if rank == 0:
            finalize_store(root, identity, options, limits)
        dist.barrier()
    finally:
        if owned:
            dist.destroy_process_group()
    return TraceStore(root, limits=limits)


def _rank_main(rank: int, world: int, port: int, root: str, schema: ModelBlockSchema, inputs: Iterable[Any],
               options: StoreOptions, selector: Any, limits: FileLimits, beats: Any, batching: Batching,
               interventions: Any = None) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # before any op: the parent's OpenMP pool was not copied by fork (module docstring)
    threading.Thread(target=_beat, args=(beats, rank), name=f"capture_dataset rank {rank} heartbeat",
                     daemon=True).start()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=_TIMEOUT)
    try:
        summary = write_rank(Path(root), schema, inputs, options, selector, limits, rank, world, batching=batching,
                             interventions=interventions)
        summaries: list = [None] * world
        dist.all_gather_object(summaries, summary)
        dist.barrier()  # no rank tears the group down while another still talks to it
    finally:
        dist.destroy_process_group()
    # a finished rank leaves at once: gloo's thread destructors at a normal exit abort now and then
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _beat(beats: Any, rank: int) -> None:
    """A forked rank's heartbeat: its clock time (CLOCK_MONOTONIC, one clock for every process of the
    machine) in the shared array, every `_BEAT_SECONDS`, for as long as the process runs."""
    while True:
        beats[rank] = time.monotonic()
        time.sleep(_BEAT_SECONDS)


def _process_state(pid: int) -> str:
    """What the kernel says a process is doing, in words (Linux's /proc; '' elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return {"T": "stopped by a signal (SIGSTOP, SIGTSTP, Ctrl-Z)", "t": "stopped by a debugger",
            "D": "waiting on the disk", "Z": "exited, not yet reaped", "R": "running",
            "S": "sleeping"}.get(state, f"in state {state}")


def _silent_rank(context: Any, beats: Any, liveness: float) -> Optional[tuple[int, float]]:
    """(rank, seconds silent) of the rank whose heartbeat is the oldest, when older than `liveness`."""
    now = time.monotonic()
    ages = {rank: now - beats[rank] for rank, process in enumerate(context.processes)
            if process.exitcode is None}  # a rank that has exited is join's to report
    if not ages:
        return None
    rank = max(ages, key=ages.__getitem__)
    return (rank, ages[rank]) if ages[rank] > liveness else None


def _committed(root: Path, limits: FileLimits, options: StoreOptions) -> int:
    return len({s for c in read_commits(root, limits, options.block_size, options.rows) for s in c.samples})


def _run_forked(root: Path, schema: ModelBlockSchema, inputs: Iterable[Any], options: StoreOptions, selector: Any,
                limits: FileLimits, world: int, liveness: Optional[float] = 60.0,
                batching: Optional[Batching] = None, interventions: Any = None) -> None:
    import multiprocessing.sharedctypes

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        raise RuntimeError("capture_dataset(world=N) needs torch.distributed with the gloo backend; use world=1")
    beats = multiprocessing.sharedctypes.RawArray("d", [time.monotonic()] * world)
    args = (world, _free_port(), str(root), schema, inputs, options, selector, limits, beats,
            batching or Batching(None), interventions)
    context = mp.start_processes(_rank_main, args=args, nprocs=world, join=False, start_method="fork")
    silent = None
    try:
        while not context.join(timeout=_BEAT_SECONDS):
            silent = _silent_rank(context, beats, liveness) if liveness is not None else None
            if silent is not None:
                break
    except Exception as exc:  # ProcessExitedException / ProcessRaisedException: the others were stopped
        rank = getattr(exc, "error_index", None)
        code = getattr(exc, "exit_code", None)
        how = f"died with exit code {code}" if code is not None else "failed"
        raise StoreIncompleteError(f"rank {rank} of {world} {how}; the store keeps the "
                                   f"{_committed(root, limits, options)} inputs committed so far. Run capture_dataset "
                                   f"again with the same inputs to write only the missing ones.\n{exc}") from None
    finally:
        state = _process_state(context.processes[silent[0]].pid) if silent is not None else ""
        for process in context.processes:
            if process.is_alive():
                process.kill()  # SIGKILL ends a stopped process too
                process.join(10)
    if silent is not None:
        rank, age = silent
        pid = context.processes[rank].pid
        raise StoreIncompleteError(
            f"rank {rank} of {world} (pid {pid}) sent no heartbeat for {age:.0f} s"
            + (f"; its process was {state}" if state else "")
            + f". Every rank was stopped; the store keeps the {_committed(root, limits, options)} inputs committed so "
            "far. Run capture_dataset again with the same inputs to write only the missing ones (pass a larger "
            "liveness= if a rank may legitimately hold the interpreter that long).")
