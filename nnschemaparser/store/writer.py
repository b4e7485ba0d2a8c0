"""What one process writes into a store: its blocks of inputs, each captured, reduced and committed.

`prepare_store` creates the store (or checks that an existing one was written for the same schema
and options: `StoreMismatchError` otherwise). `write_rank` walks the inputs, takes the blocks of
sample ids that are its own (block `b` belongs to rank `b % world`) and not yet committed, and for
each input captures every step under `torch.no_grad()` (the logged run read as columns where
capture_run would log it, otherwise capture_run: step_names.py), computes the
statistics of every step, puts the tensors the keep selector names (the root's inputs always:
they reopen a sample in the inspector) into the current shard (flushed to a file once it would pass
`shard_bytes`), and folds them into the unit's reductions. A kept value is held as the run made it,
not cloned, when it is a contiguous CPU tensor of at least 64 KiB that is the whole of its storage
(held.py): once the input's
record is gone (`_Unit.settle`, before the next input is read), one that anything else still refers
to (the caller's input, a module that keeps it, a view or base of it: the storage's and the tensor
object's reference counts say) is cloned then, so no later run or input can write into what the
shard holds. (The capture already stores a value changed in place during its own run as it was
bound.) At the end of a block its statistics Parquet and its reductions are written and synced, then
its commit record is renamed into place:
a process killed at any point loses at most the block it was writing, whose leftover files a
later run removes before it writes that block again.

Depends on schema, files, traces (selection, missed) and the store's own modules.
"""

from __future__ import annotations

import errno
import gc
import io
import itertools
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from ..files.file_format import FileLimits, dump_json
from ..schema.model import ModelBlockSchema
from ..traces.selection import KeepSelector
from .held import holdable, shared_clones
from .guard import FOLDERS, LOCK_FILE, check_no_links
from .manifest import (Commit, SchemaIdentity, StoreIncompleteError, StoreMismatchError, StoreOptions, read_commits,
                       read_manifest, schema_identity, sync_write, unit_name, weights_difference, write_commit,
                       write_manifest)
from .reductions import ReductionState, encode_states, fold_together
from .rows import MASK_KEY, Batching
from .shards import write_shard
from .step_names import StepNames
from .step_table import StepColumns

__all__ = ["prepare_store", "refuse_foreign_folder", "discard_new_store", "write_rank", "finalize_store", "as_scope", "RankSummary"]

# Parquet as the statistics are written: LZ4 (zstd costs twice the CPU for a file about 30% smaller),
# dictionaries for the text columns only (a float column's dictionary is hashed and then given up), and
# column statistics (which let DuckDB skip row groups) for the columns a query filters or sorts on by
# sample, step or count; the figures' own min/max per page are not worth their cost.
PARQUET_OPTIONS = dict(compression="lz4", use_dictionary=["container_id", "slot_type", "block_path", "out_var",
                                                          "op_name", "description", "dtype", "omitted"],
                       write_statistics=["sample", "step", "numel", "n_nan", "n_inf"])

_BATCH = 64  # occurrences of a variable folded into its reductions at once
_BATCH_ELEMENTS = 2 ** 21  # or fewer, when they hold this many elements (16 MiB in float64)

def as_scope(item: Any, schema: ModelBlockSchema) -> dict:
    """One input of the iterable as a scope: a mapping as it is, a tensor or a tuple by position."""
    if isinstance(item, dict):
        return dict(item)
    sig = schema.signature
    params = [p for p in sig.params if p != sig.self_name] if sig is not None else []
    if isinstance(item, torch.Tensor):
        item = (item,)
    if isinstance(item, (tuple, list)):
        if len(item) > len(params):
            raise TypeError(f"an input of {len(item)} values, but {schema.name}.forward takes {len(params)} "
                            f"({', '.join(params)}); give each input as a dict of them")
        return dict(zip(params, item))
    if hasattr(item, "keys") and hasattr(item, "__getitem__"):  # a transformers BatchEncoding, say
        return {key: item[key] for key in item.keys()}
    raise TypeError(f"an input must be a dict of {schema.name}.forward's arguments, a tensor or a tuple of them; "
                    f"got {type(item).__name__}")


def prepare_store(root: Path, schema: ModelBlockSchema, options: StoreOptions, limits: FileLimits,
                  identity: Optional[SchemaIdentity] = None) -> SchemaIdentity:
    """Create the store at `root`, or check that it was written for this schema (or `identity`) and these options."""
    check_no_links(root, every_entry=True)
    identity = identity or schema_identity(schema)
    if (root / "manifest.json").exists():
        found, stored, _, _ = read_manifest(root, limits)
        if found != identity:
            what = ("model class" if found.model_class != identity.model_class else
                    "inputs" if found.inputs != identity.inputs else "source (a block's code, path or skips)")
            raise StoreMismatchError(f"{root} was written for another schema: its {what} differs ({found.model_class} "
                                     f"{found.source_hash[:12]}, inputs {list(found.inputs)}; this one is "
                                     f"{identity.model_class} {identity.source_hash[:12]}, inputs "
                                     f"{list(identity.inputs)}). Write this schema's runs into another store")
        if stored != options:
            diff = [f"{k}: {a!r} there, {b!r} here" for k, a, b in
                    ((k, getattr(stored, k), getattr(options, k)) for k in vars(options)) if a != b]
            raise StoreMismatchError(f"{root} was written with other options ({'; '.join(diff)}); a store keeps "
                                     "its options: pass the same ones, or write another store")
        if found.weights is None:
            warnings.warn(f"{root} was written before stores recorded the model's weights: its inputs cannot be "
                          "checked against this model's, and none is recorded now (it would vouch for the inputs "
                          "already there). Write a new store to have the weights checked on every resume",
                          UserWarning, stacklevel=3)
            return replace(identity, weights=None)
        if identity.weights is not None:
            difference = weights_difference(found.weights, identity.weights)
            if difference is not None:
                raise StoreMismatchError(f"{root} was written with other weights of {identity.model_class}: "
                                         f"{difference}. A store holds the activations of one checkpoint: load the "
                                         "one it was written with, or write this model's runs into another store")
        return identity
    refuse_foreign_folder(root)
    try:
        for folder in FOLDERS:
            (root / folder).mkdir(parents=True, exist_ok=True)
        write_manifest(root, identity, options, [], [])
    except OSError as exc:
        raise StoreIncompleteError(f"{root}: the new store could not be created ({exc.strerror or exc}); no input "
                                   "was written. Free space (or fix the cause) and run capture_dataset again") from exc
    return identity


def refuse_foreign_folder(root: Path) -> None:
    """A folder that exists, holds something and is not a store is not written into (nor removed on a failure)."""
    if root.is_symlink() or root.exists() and (not root.is_dir() or any(p.name != LOCK_FILE for p in root.iterdir())):
        raise FileExistsError(f"{root} exists and is not a store (no manifest.json); give an empty or new folder")


def discard_new_store(root: Path, folder_existed: bool) -> bool:
    """Remove a store this run created when the run failed before committing an input: the folder is left
    as it was (gone, or empty). Returns whether it removed it; a store with a commit is left to resume."""
    commits = root / "commits"
    if commits.is_dir() and any(p.suffix == ".json" for p in commits.iterdir()):
        return False
    for folder in FOLDERS:
        if (root / folder).is_dir() and not (root / folder).is_symlink():
            shutil.rmtree(root / folder)
    (root / "manifest.json").unlink(missing_ok=True)
    for leftover in root.glob(".*.tmp"):  # a manifest being rewritten
        leftover.unlink()
    (root / LOCK_FILE).unlink(missing_ok=True)  # held until the caller's `with` ends; a writer waiting re-opens it
    if not folder_existed and not any(root.iterdir()):
        root.rmdir()
    return True


@dataclass
class RankSummary:
    """What one rank did: inputs captured and skipped (already committed), units and bytes written."""

    rank: int
    captured: int = 0
    skipped: int = 0
    units: int = 0
    bytes: int = 0
    seconds: float = 0.0
    samples: list = field(default_factory=list)


class _Unit:
    """The block being written: rows, the current shard, the reductions, the files written so far."""

    def __init__(self, root: Path, block: int, first: int, options: StoreOptions, kernel: Any = None):
        self.root, self.block, self.options = root, block, options
        self.kernel = kernel  # native.py's C code, which folds the reductions as it gives the statistics; or None
        self.name = unit_name(block, first)
        self.samples: list[int] = []
        self.rows = StepColumns()
        self.shard: dict[str, torch.Tensor] = {}
        self.shard_bytes = 0
        self.shards: list[tuple[str, int]] = []
        self.states: dict[str, ReductionState] = {}
        self.pending: dict[str, list] = {}  # variable -> [values, samples, steps, l2s] not folded yet
        self.unsettled: list[torch.Tensor] = []  # tensors of the current input kept as they were (`settle`)
        self.deferred: list[tuple] = []  # the current input's reductions, queued by `settle`

    def keep(self, key: str, value: torch.Tensor) -> torch.Tensor:
        """Put `value` into the current shard (flushing it first when it would pass shard_bytes): the tensor
        itself when it is a plain CPU tensor, contiguous and the whole of its storage (held until `settle`,
        which clones it then if anything but the unit still holds its storage), a contiguous CPU clone otherwise."""
        tensor = value.detach() if value.requires_grad else value
        nbytes = tensor.numel() * tensor.element_size()
        if holdable(tensor, nbytes):
            self.unsettled.append(tensor)
        else:
            tensor = tensor.to("cpu").clone(memory_format=torch.contiguous_format)
        if self.shard and self.shard_bytes + nbytes > self.options.shard_bytes:
            self.flush()
        self.shard[key] = tensor
        self.shard_bytes += nbytes
        return tensor

    def settle(self) -> None:
        """After an input's run and its record are gone (before the next input is read): a tensor `keep` held
        as it was is cloned now if anything but the unit still holds its storage (the caller's inputs, a
        module that kept it, a view of it), so no later run or input can write into what the unit writes;
        then the input's reductions are queued with the tensors as kept."""
        clones: dict[int, torch.Tensor] = {}
        if self.unsettled:
            clones = shared_clones(self.unsettled, itertools.chain(
                self.shard.values(), (entry[1] for entry in self.deferred if entry is not None)))
            if clones:
                for name, tensor in self.shard.items():
                    if id(tensor) in clones:
                        self.shard[name] = clones[id(tensor)]
            self.unsettled = []
        self.replay(clones)

    def defer(self, variable: str, tensor: torch.Tensor, mask: Any, batching: Batching, sample: int, step: int,
              l2: float) -> None:
        """Queue an occurrence of kept `tensor` (`batching.masked(tensor, mask)` when `mask` is not None) once the
        input is settled (or before a shard is written, whichever comes first)."""
        self.deferred.append((variable, tensor, mask, batching, sample, step, l2))

    def sample_done(self) -> None:
        """A sample's occurrences are deferred: `input_done` runs where they are queued."""
        self.deferred.append(None)

    def replay(self, clones: Optional[dict] = None) -> None:
        """Queue the deferred occurrences and run the deferred `input_done`s, in the order `_write_sample` made them
        (so the folds take the same batches as when each was queued at once)."""
        deferred, self.deferred = self.deferred, []
        for entry in deferred:
            if entry is None:
                self.input_done()
                continue
            variable, tensor, mask, batching, sample, step, l2 = entry
            if clones:
                tensor = clones.get(id(tensor), tensor)
            self.reduce(variable, tensor if mask is None else batching.masked(tensor, mask), sample, step, l2)

    def reduce(self, variable: str, value: torch.Tensor, sample: int, step: int, l2: float) -> None:
        """Queue an occurrence of `variable` (folded in by `input_done` or the commit)."""
        queue = self.pending.get(variable)
        if queue is None:
            queue = self.pending[variable] = [[], [], [], [], 0]
        queue[0].append(value)
        queue[1].append(sample)
        queue[2].append(step)
        queue[3].append(l2)
        queue[4] += value.numel()

    def input_done(self) -> None:
        """After an input's occurrences are queued: once a variable's queue holds `_BATCH` occurrences or
        `_BATCH_ELEMENTS` elements, every queue is folded in (`fold_together`), as before a shard is
        written (so the queues never hold a tensor the current shard does not) and at the unit's commit.
        What forms a batch depends on the unit's inputs only."""
        if any(len(q[0]) >= _BATCH or q[4] >= _BATCH_ELEMENTS for q in self.pending.values()):
            self.fold()

    def fold(self) -> None:
        """Fold every queued occurrence into its variable's state."""
        if not self.pending:
            return
        o = self.options
        states = []
        for variable in self.pending:
            state = self.states.get(variable)
            if state is None:
                state = self.states[variable] = ReductionState(o.bins, o.low, o.high, o.top_k)
            states.append(state)
        batches = [tuple(queue[:4]) for queue in self.pending.values()]
        self.pending = {}
        fold_together(states, batches, self.kernel)

    def flush(self) -> int:
        if not self.shard:
            return 0
        self.replay()
        self.fold()  # the queues hold tensors of this shard only
        name = f"tensors/{self.name}-{len(self.shards):03d}.safetensors"
        try:
            size = write_shard(self.root / name, self.shard)
        except OSError as exc:
            raise _WriteFailed(name, exc) from exc
        self.shards.append((name, size))
        self.shard, self.shard_bytes = {}, 0
        return size

    def commit(self, rank: int, statistics: str) -> Commit:
        import pyarrow.parquet as pq

        self.fold()
        self.flush()
        steps_file = f"steps/{self.name}.parquet"
        buffer = io.BytesIO()
        pq.write_table(self.rows.table(), buffer, **PARQUET_OPTIONS)
        tensors, described = encode_states(self.states)
        reductions_file = f"reductions/{self.name}.safetensors"
        writing = steps_file
        try:
            sync_write(self.root / steps_file, buffer.getvalue())
            writing = reductions_file
            size = write_shard(self.root / reductions_file, tensors,
                               {"reductions": dump_json(described["items"]).decode("ascii")})
            sizes = [(steps_file, len(buffer.getvalue())), (reductions_file, size)] + list(self.shards)
            commit = Commit(self.name, self.block, rank, tuple(self.samples), steps_file, len(self.rows),
                            tuple(self.shards), reductions_file, tuple(sorted(sizes)), statistics,
                            self.options.rows)
            writing = f"commits/{self.name}.json"
            write_commit(self.root, commit)
        except OSError as exc:
            raise _WriteFailed(writing, exc) from exc
        self.commit_sizes = commit.sizes
        return commit


class _WriteFailed(Exception):
    """A file of the unit could not be written (a full disk, a quota, an I/O error): `write_rank` says so."""

    def __init__(self, name: str, error: OSError):
        super().__init__(name, error)
        self.name, self.error = name, error


def _write_failure(root: Path, failed: _WriteFailed, block: int, kept: set[int], named: set[str]) -> StoreIncompleteError:
    """The error of a unit whose file could not be written, its partial files removed first."""
    try:
        _remove_orphans(root, block, named)
        cleaned = f"the files of block {block} written so far were removed"
    except OSError as exc:
        cleaned = f"the files of block {block} written so far could not all be removed ({exc}); the next run does it"
    error = failed.error
    cause = {errno.ENOSPC: "the disk is full", getattr(errno, "EDQUOT", -1): "the disk quota is used up"}.get(
        error.errno, "it failed")
    ids = sorted(kept)
    listed = f" (sample ids {ids[0]}..{ids[-1]})" if ids else ""
    return StoreIncompleteError(
        f"{root}: writing {failed.name} failed: {cause} ({error.strerror or error}). The store keeps the {len(ids)} "
        f"inputs committed{listed}; {cleaned}. Free space (or fix the cause) and run capture_dataset again with the "
        "same inputs: it writes only the missing ones.")


def _remove_orphans(root: Path, block: int, committed: set[str]) -> None:
    """Files of `block` that no commit names: what a killed run left of it."""
    prefix = f"unit-{block:06d}-"
    for folder in ("steps", "tensors", "reductions"):
        for path in (root / folder).glob(prefix + "*"):
            if f"{folder}/{path.name}" not in committed:
                path.unlink()
    for path in (root / "commits").glob(f".{prefix}*.tmp"):
        path.unlink()


def write_rank(root: Path, schema: ModelBlockSchema, inputs: Iterable[Any], options: StoreOptions,
               selector: Optional[KeepSelector], limits: FileLimits, rank: int = 0, world: int = 1,
               progress: Optional[Callable[[int, int], None]] = None,
               batching: Optional[Batching] = None, interventions: Any = None, run: Optional[Callable] = None,
               write: bool = True) -> RankSummary:
    """Capture this rank's missing inputs into the store (see the module docstring). `batching`: how inputs are
    split into rows (store/rows.py; None: each input one sample); each run is made with `interventions`
    (capture_run's). `run(schema, scope, interventions=)` replaces capture_run (a record with `outputs` and a
    `trace`: the distributed stage's gathered logical runs); `write=False` runs the same inputs and writes
    nothing (a rank of a sharded model whose values rank 0 writes: its runs take part in the collectives)."""
    started = time.perf_counter()
    batching = batching or Batching(None)
    commits = read_commits(root, limits, options.block_size, options.rows)
    done = {s for c in commits for s in c.samples}
    named = {name for c in commits for name, _ in c.sizes}
    summary = RankSummary(rank)
    unit: Optional[_Unit] = None
    size = options.block_size
    cleaned: set[int] = set()
    names = StepNames(selector, schema)

    def close() -> None:
        nonlocal unit
        if unit is not None and unit.samples:
            unit.commit(rank, names.summarise.engine)
            done.update(unit.samples)
            named.update(name for name, _ in unit.commit_sizes)
            summary.units += 1
            summary.bytes += sum(s for _, s in unit.shards)
        unit = None

    # The cyclic GC is paused while the inputs are captured, as capture_run pauses it for one run: the
    # tens of thousands of objects a record makes (freed by reference counting when the input is done)
    # would otherwise start a collection after every input that finds nothing to free. A collection
    # runs after each unit's commit instead, so a model whose runs make reference cycles frees them
    # every block, and the peak memory stays flat in the number of inputs.
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    offset = 0  # the first sample id of the next input: its position, or (rows) the rows before it
    try:
        for position, item in enumerate(inputs):
            block = position // size
            if unit is not None and unit.block != block:  # the unit is done before the next input is read
                close()
                if collecting:
                    gc.collect()
            scope = None
            sample = offset
            if batching.axis is not None:  # every rank counts every input's rows, so the ids agree
                scope = as_scope(item, schema)
                offset += batching.rows(scope)
            else:
                offset += 1
            if block % world != rank:
                continue
            if sample in done:
                summary.skipped += 1
                continue
            if not write:
                with torch.no_grad():
                    run(schema, scope if scope is not None else as_scope(item, schema), interventions=interventions)
                summary.captured += 1
                continue
            if unit is None:
                if block not in cleaned:
                    _remove_orphans(root, block, named)
                    cleaned.add(block)
                unit = _Unit(root, block, sample, options, names.summarise.kernel)
            written = _capture_one(unit, schema, scope if scope is not None else as_scope(item, schema), sample, names,
                                   batching, interventions, run)
            unit.settle()  # the run's record is gone: what the unit kept as it was is checked (cloned if shared)
            summary.captured += 1
            summary.samples.append(sample)
            if progress is not None:
                progress(1, written)
        close()
    except _WriteFailed as failed:
        raise _write_failure(root, failed, unit.block if unit is not None else -1, done, named) from failed.error
    finally:
        if collecting:
            gc.enable()
    summary.seconds = time.perf_counter() - started
    return summary


def _capture_one(unit: _Unit, schema: ModelBlockSchema, scope: dict, sample: int, names: StepNames,
                 batching: Optional[Batching] = None, interventions: Any = None, run: Optional[Callable] = None) -> int:
    return _summarise_one(unit, schema, scope, sample, names, batching or Batching(None), interventions, run)


def _summarise_one(unit: _Unit, schema: ModelBlockSchema, scope: dict, sample: int, names: StepNames,
                   batching: Batching, interventions: Any = None, run: Optional[Callable] = None) -> int:
    """Run one input and write its samples: itself, or (batching.axis) each of its rows (store/rows.py)."""
    rows = batching.rows(scope)
    mask = batching.mask_of(scope, rows)
    outputs, (numbers, descriptions, slot_types, out_vars, op_names, block_paths, values, depths, omitted, shapes,
              dtypes) = names.fields(schema, scope, interventions, run)
    if rows > 1:
        batching.check_outputs(outputs, rows, scope)
    (numbers, slot_types, block_paths, out_vars, op_names, descriptions, depths, shapes, dtypes, omitted), cids, named, \
        keepable = names.steady((numbers, slot_types, block_paths, out_vars, op_names, descriptions, depths, shapes, dtypes,
                      omitted))
    if names.selector is not None and not names.warned and not any(named):
        import warnings

        from ..traces.missed import KeepMissedWarning, kept_nothing_message

        names.warned = True  # once per capture_dataset: every later input is likely the same
        warnings.warn(KeepMissedWarning(kept_nothing_message(names.selector, f"input {sample}") +
                                        "; the store holds its statistics only"), stacklevel=4)
    meta = (numbers, cids, slot_types, block_paths, out_vars, op_names, descriptions, depths, dtypes, omitted, named,
            keepable)
    if rows == 1 and mask is None:  # an input that is one sample, as it is
        return _write_sample(unit, sample, meta, shapes, values, values, names.summarise(values, dtypes=names.dtypes),
                             None, batching)
    parts = batching.split(values, rows) if rows > 1 else [None] * len(values)
    axis = batching.axis
    row_shapes = shapes if rows == 1 else [
        tuple(1 if d == axis else n for d, n in enumerate(shape)) if p is not None else shape
        for shape, p in zip(shapes, parts)]
    written = 0
    maskable: Optional[list] = None  # the values the mask applies to: alike in every row (their shapes are)
    samples = []  # (row values, counted values, mask) of each row
    for r in range(rows):
        row = values if rows == 1 else [v if p is None else p[r] for v, p in zip(values, parts)]
        row_mask = mask if mask is None or axis is None else mask[r:r + 1]
        counted = row
        if row_mask is not None:
            if maskable is None:
                maskable = [i for i, (v, t) in enumerate(zip(row, slot_types))
                            if t != "input" and batching.masked(v, row_mask) is not v]
            counted = list(row)
            run = batching.run_of(row_mask)
            if run is not None:  # right or left padding: each value's run of positions, a view (rows.py)
                start, length = run
                for i in maskable:
                    counted[i] = row[i][0].narrow(0, start, length)
            else:
                for i in maskable:
                    counted[i] = batching.masked(row[i], row_mask)
        samples.append((row, counted, row_mask))
    # every row's values summarised in one call (one plan, one pass of the kernel; a value's figures are its
    # own whatever it is summarised with), then cut into rows
    everything = [v for _, counted, _ in samples for v in counted]
    figures = names.summarise(everything, tuple(batching.key(m) for _, _, m in samples))
    size = len(values)
    for r, (row, counted, row_mask) in enumerate(samples):
        written += _write_sample(unit, sample + r, meta, row_shapes, row, counted, figures.part(r * size, size),
                                 row_mask, batching)
    return written


def _write_sample(unit: _Unit, sample: int, meta: tuple, shapes: list, values: list, counted: list, figures: Any,
                  mask: Optional[torch.Tensor], batching: Batching) -> int:
    """One sample's rows of statistics, kept tensors and reductions: `values` as it holds them, `counted` as
    its figures count them (its unmasked positions), `figures` theirs; `mask` its mask, kept beside it."""
    numbers, cids, slot_types, block_paths, out_vars, op_names, descriptions, depths, dtypes, omitted, named, \
        keepable = meta
    kept = figures.counted & keepable  # a strided tensor, named or a root input
    unit.rows.add(sample, numbers, cids, slot_types, block_paths, out_vars, op_names, descriptions, depths, shapes,
                  dtypes, values, kept, omitted, figures)
    written = 0
    seen: dict[str, int] = {}  # bindings of each variable so far in this sample
    for i in np.flatnonzero(kept).tolist():
        value = unit.keep(f"{sample}/{cids[i]}", values[i])
        written += value.numel() * value.element_size()
        if named[i]:
            variable = f"{block_paths[i]}:{out_vars[i]}"
            count = seen[variable] = seen.get(variable, 0) + 1
            unit.defer(variable if count == 1 else f"{variable}#{count}", value,
                       None if counted[i] is values[i] else mask, batching, sample, numbers[i], figures.l2(i))
    if mask is not None:
        written += unit.keep(f"{sample}/{MASK_KEY}", mask).numel()
    unit.sample_done()
    unit.samples.append(sample)
    return written


def finalize_store(root: Path, identity: SchemaIdentity, options: StoreOptions, limits: FileLimits) -> None:
    """Rewrite the manifest's summary: the complete sample ranges and the shard index, from the commits."""
    try:
        _finalize(root, identity, options, limits)
    except OSError as exc:
        raise StoreIncompleteError(f"{root}: every input is committed, but the manifest's summary could not be "
                                   f"rewritten ({exc.strerror or exc}); the commits are the store's truth and stay. "
                                   "Free space (or fix the cause) and run capture_dataset again to rewrite it") from exc


def _finalize(root: Path, identity: SchemaIdentity, options: StoreOptions, limits: FileLimits) -> None:
    commits = read_commits(root, limits, options.block_size, options.rows)
    samples = sorted(s for c in commits for s in c.samples)
    ranges: list[list[int]] = []
    for s in samples:
        if ranges and ranges[-1][1] == s - 1:
            ranges[-1][1] = s
        else:
            ranges.append([s, s])
    shards = sorted(name for c in commits for name, _ in c.shards)
    write_manifest(root, identity, options, ranges, shards)
