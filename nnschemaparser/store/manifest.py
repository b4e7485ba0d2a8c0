"""A store's layout on disk, the schema identity it is written for, its manifest and its commit records.

    store/
      manifest.json                       format, version, schema identity, options, summary
      commits/unit-BBBBBB-SSSSSSSSS.json  one per committed unit of inputs (block B, first sample S)
      steps/unit-...parquet               per-step statistics of the unit's inputs
      tensors/unit-...-KKK.safetensors    the kept tensors, shards of bounded size
      reductions/unit-...safetensors      the unit's partial reductions

Inputs are grouped in blocks of `block_size` consecutive sample ids; a rank writes whole blocks, and
a block's files become part of the store only when its commit record is renamed into `commits/`
(written after the files it names are on disk and synced). A file no commit names is an orphan of
a run that was killed, removed when a run takes that block up again. The commit records are the
truth of what the store holds; the manifest's summary (`complete`, `shards`) is rewritten when a run
ends.

Every file is read as hostile (files/file_format.py): strict bounded JSON, exact records, names
that must match the layout (no path leaves the store), sizes that must match the files.

Depends on schema and files; never on the runtime or views.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..files.file_format import (
    FileLimits,
    MalformedFileError,
    ModelMismatchError,
    check_header,
    dump_json,
    get_dict,
    get_int,
    get_list,
    get_opt_str,
    get_str,
    is_array,
    parse_json,
    read_bounded,
    record,
)
from ..schema.model import ModelBlockSchema
from .guard import check_not_link, create

__all__ = ["StoreMismatchError", "StoreIncompleteError", "SchemaIdentity", "schema_identity", "StoreOptions",
           "weights_fingerprint", "weights_difference",
           "Commit", "MANIFEST", "read_manifest", "write_manifest", "read_commits", "write_commit", "unit_name",
           "sync_write", "FORMAT_NAME", "FORMAT_VERSION"]

FORMAT_NAME = "nnschemaparser-store"
COMMIT_FORMAT = "nnschemaparser-store-commit"
FORMAT_VERSION = 1
# how a unit's figures were computed (store/native.py): torch's reductions; the C kernel's statistics with torch's
# fold of the reductions (native-1, stores of 0.x before the fold kernel); the C kernel's statistics and fold
STATISTICS_ENGINES = ("torch", "native-1", "native-2")
MANIFEST = "manifest.json"
_UNIT = re.compile(r"^unit-(\d{6})-(\d{9})$")
_FILE = {"steps": re.compile(r"^steps/unit-\d{6}-\d{9}\.parquet$"),
         "tensors": re.compile(r"^tensors/unit-\d{6}-\d{9}-\d{3}\.safetensors$"),
         "reductions": re.compile(r"^reductions/unit-\d{6}-\d{9}\.safetensors$")}


class StoreMismatchError(ModelMismatchError):
    """The store was written for another schema, or with other options, than the run that would append to it."""


class StoreIncompleteError(RuntimeError):
    """A run of capture_dataset did not write every input: a rank died or failed, or a file could not be written (a
    full disk). The committed inputs stay; run it again with the same inputs to complete it."""


@dataclass(frozen=True)
class SchemaIdentity:
    """What makes two schemas the same for a store: the hash of every block's source and path, the root
    module's class, and the root's input names."""

    source_hash: str
    model_class: str
    inputs: tuple[str, ...]
    # the fingerprint of the module's parameters and buffers (`weights_fingerprint`); None: not recorded (a store
    # written before it was), and then not compared. Kept in the manifest's "weights", beside the schema.
    weights: Optional[tuple] = field(default=None, compare=False)

    def to_json(self) -> dict:
        return {"source_hash": self.source_hash, "model_class": self.model_class, "inputs": list(self.inputs)}


_WHOLE = 1 << 20  # a tensor of at most this many bytes is hashed whole
_WINDOWS, _WINDOW = 16, 64 * 1024  # a larger one: 16 windows of 64 KiB, evenly spaced, first and last included


def _tensor_digest(tensor: Any) -> str:
    """A sha256 (24 hex digits) of a tensor's bytes: all of them up to 1 MiB, else 16 evenly spaced 64 KiB windows.
    "-" for a tensor with no bytes to read (meta, sparse, quantized)."""
    import torch

    try:
        flat = tensor.detach().reshape(-1)
        if flat.device.type == "meta" or flat.layout != torch.strided:
            return "-"
        width = flat.element_size()
        digest = hashlib.sha256()
        if flat.numel() * width <= _WHOLE:
            pieces = [flat]
        else:
            step = max(1, _WINDOW // width)
            last = flat.numel() - step
            pieces = [flat.narrow(0, (last * i) // (_WINDOWS - 1), step) for i in range(_WINDOWS)]
        for piece in pieces:  # hashed from the tensor's memory (a CPU piece is not copied)
            digest.update(piece.to("cpu").contiguous().view(torch.uint8).numpy())
        return digest.hexdigest()[:24]
    except (RuntimeError, TypeError):  # a dtype without a byte view
        return "-"


def weights_fingerprint(module: Any) -> Optional[tuple]:
    """((name, dtype, shape, digest), ...) of every parameter and buffer of `module`, in its order (a tied weight
    under each of its names); None without a module. Names, dtypes and shapes are exact; the digest reads every
    byte of a tensor up to 1 MiB and 1 MiB of a larger one in 16 spread windows (`_tensor_digest`): another
    checkpoint changes them all, a change confined to bytes between the windows of a large tensor is not seen.
    A 7B model costs about 0.3 GB of hashing; its copy to the CPU is the windows only."""
    if module is None or not hasattr(module, "named_parameters"):
        return None
    items = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    return tuple((name, str(t.dtype).replace("torch.", ""), tuple(int(d) for d in t.shape), _tensor_digest(t))
                 for name, t in items if t is not None)


def weights_difference(stored: tuple, current: tuple) -> Optional[str]:
    """What differs between two fingerprints, in words (None: the same weights)."""
    old = {item[0]: item for item in stored}
    new = {item[0]: item for item in current}
    gone, added = [n for n in old if n not in new], [n for n in new if n not in old]
    if gone or added:
        return (f"the parameters and buffers differ: {len(gone)} only in the store ({', '.join(gone[:3])}"
                f"{', ...' if len(gone) > 3 else ''}), {len(added)} only in this model ({', '.join(added[:3])}"
                f"{', ...' if len(added) > 3 else ''})")
    for name, (_, dtype, shape, digest) in old.items():
        _, dtype2, shape2, digest2 = new[name]
        if shape != shape2:
            return f"{name} has shape {list(shape)} in the store, {list(shape2)} in this model"
        if dtype != dtype2:
            return f"{name} is {dtype} in the store, {dtype2} in this model"
    for name, (_, _, _, digest) in old.items():
        if digest != new[name][3]:
            return f"weights differ: the first differing tensor is {name} (same shape and dtype, other values)"
    return None


def schema_identity(schema: ModelBlockSchema) -> SchemaIdentity:
    """The identity of `schema`: a sha256 over each block's path, type, method, forward source and skips; and the
    fingerprint of its module's weights (`weights_fingerprint`)."""
    digest = hashlib.sha256()
    for block in schema.iter_blocks():
        sig = block.signature
        item = [block.path, block.module_type, block.method_name or "", sig.source if sig is not None else "",
                sorted(block.skipped.items()), block.skip_reason or ""]
        digest.update(json.dumps(item, sort_keys=True, default=str).encode("utf-8"))
    sig = schema.signature
    names: list[str] = []
    if sig is not None:
        names = [p for p in sig.params if p != sig.self_name] + ([f"*{sig.vararg}"] if sig.vararg else []) + \
            list(sig.kwonly) + ([f"**{sig.kwarg}"] if sig.kwarg else [])
    module_class = type(schema.module).__qualname__ if schema.module is not None else schema.module_type
    return SchemaIdentity(digest.hexdigest(), module_class or schema.name, tuple(names),
                          weights_fingerprint(schema.module))


@dataclass(frozen=True)
class StoreOptions:
    """How a store is written; fixed when the store is created (a later run must use the same).

    `keep`: the selector text of the tensors written (None: the inputs only); `block_size`: inputs
    per unit (the grain of commits, resumption and the split over ranks); `shard_bytes`: the most
    tensor bytes in one safetensors shard; `bins`, `low`, `high`: the fixed histogram of every kept
    variable (`bins` equal bins over [low, high), plus under, over and NaN counts); `top_k`: the
    inputs kept per variable by the l2 norm of its tensor; `interventions`: the selectors of the
    interventions every run was made with (`Intervention.text()`, joined by "; "), None without;
    `batch_axis`: the axis a batched input's rows
    lie along (None: an input is one sample, its sample id its position among the inputs; an int: each row
    is a sample, numbered by a running count of rows over the inputs in order, store/rows.py), and `mask`: the
    text of the padding mask (an input's name, or `callable <qualname>`; None: no mask). A store written
    before rows has neither in its manifest: read as `None`, the inputs-as-samples it holds.
    """

    keep: Optional[str] = None
    block_size: int = 64
    shard_bytes: int = 256 * 1024 * 1024
    bins: int = 64
    low: float = -8.0
    high: float = 8.0
    top_k: int = 16
    interventions: Optional[str] = None
    batch_axis: Optional[int] = None
    mask: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("block_size", "shard_bytes", "bins", "top_k"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.block_size > 999_999 or self.bins > 1_000_000:
            raise ValueError("block_size is at most 999999 and bins at most 1000000")
        if not (isinstance(self.low, float) and isinstance(self.high, float) and self.low < self.high):
            raise ValueError(f"the histogram range needs floats low < high, got {self.low!r}, {self.high!r}")
        if self.batch_axis is not None and (type(self.batch_axis) is not int or not 0 <= self.batch_axis < 64):
            raise ValueError(f"batch_axis must be None or an axis (an int from 0), got {self.batch_axis!r}")
        if self.mask is not None and (type(self.mask) is not str or not self.mask):
            raise ValueError(f"mask must be None or the text of a mask, got {self.mask!r}")

    @property
    def rows(self) -> bool:
        """Whether a sample is a row of a batched input (sample ids: a running count of rows)."""
        return self.batch_axis is not None

    def to_json(self) -> dict:
        document = {"keep": self.keep, "block_size": self.block_size, "shard_bytes": self.shard_bytes,
                    "bins": self.bins, "low": self.low.hex(), "high": self.high.hex(), "top_k": self.top_k,
                    **({"interventions": self.interventions} if self.interventions is not None else {})}
        if self.rows or self.mask is not None:  # a store of whole inputs, unmasked, is written as before rows
            document.update(batch_axis=self.batch_axis, mask=self.mask,
                            sample_ids="running row count" if self.rows else "input index")
        return document


def _float_hex(obj: dict, key: str, where: str) -> float:
    text = get_str(obj, key, where, max_chars=64)
    try:
        return float.fromhex(text)
    except (ValueError, OverflowError):
        raise MalformedFileError(f"{where}.{key}: {text!r} is not a float in hex notation") from None


def _options(data: Any, where: str) -> StoreOptions:
    record(data, where, ("keep", "block_size", "shard_bytes", "bins", "low", "high", "top_k"),
           optional=("interventions", "batch_axis", "sample_ids", "mask"))
    rows = ("batch_axis", "sample_ids", "mask")
    if any(key in data for key in rows) and not all(key in data for key in rows):
        raise MalformedFileError(f"{where}: a store of rows gives batch_axis, sample_ids and mask together")
    batch_axis = get_int(data, "batch_axis", where, high=63) if data.get("batch_axis") is not None else None
    if "sample_ids" in data and data["sample_ids"] != ("running row count" if batch_axis is not None else
                                                       "input index"):
        raise MalformedFileError(f"{where}.sample_ids: {data['sample_ids']!r} with batch_axis {batch_axis!r}; "
                                 "rows (an axis) are numbered by a 'running row count', inputs by 'input index'")
    try:
        return StoreOptions(keep=get_opt_str(data, "keep", where), block_size=get_int(data, "block_size", where),
                            shard_bytes=get_int(data, "shard_bytes", where), bins=get_int(data, "bins", where),
                            low=_float_hex(data, "low", where), high=_float_hex(data, "high", where),
                            top_k=get_int(data, "top_k", where), batch_axis=batch_axis,
                            mask=get_opt_str(data, "mask", where) if "mask" in data else None,
                            interventions=get_opt_str(data, "interventions", where) if "interventions" in data else None)
    except ValueError as exc:
        raise MalformedFileError(f"{where}: {exc}") from None


def sync_write(path: Path, data: bytes) -> None:
    """Write `data` to a new file at `path` and flush it to the disk (a commit names only synced files); never
    through a symbolic link (guard.create)."""
    with open(create(path), "wb", closefd=True) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        sync_write(tmp, data)
        os.replace(tmp, path)
    finally:
        if tmp.exists() and not tmp.is_symlink():
            tmp.unlink()


def write_manifest(root: Path, identity: SchemaIdentity, options: StoreOptions, complete: list,
                   shards: list[str]) -> None:
    document = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "schema": identity.to_json(),
                "options": options.to_json(), "complete": complete, "shards": shards}
    if identity.weights is not None:
        document["weights"] = [[name, dtype, list(shape), digest] for name, dtype, shape, digest in identity.weights]
    _atomic(root / MANIFEST, dump_json(document))


def _weights(data: Any, limits: FileLimits, where: str) -> tuple:
    if not is_array(data) or len(data) > limits.max_tensors:
        raise MalformedFileError(f"{where}: expected an array of at most {limits.max_tensors} [name, dtype, shape, "
                                 "digest] items")
    items = []
    for index, item in enumerate(data):
        if (not is_array(item) or len(item) != 4 or any(type(item[i]) is not str for i in (0, 1, 3))
                or not is_array(item[2]) or len(item[2]) > limits.max_dims
                or any(type(d) is not int or d < 0 for d in item[2])):
            raise MalformedFileError(f"{where}[{index}]: expected [name, dtype, shape (ints), digest]")
        items.append((item[0], item[1], tuple(item[2]), item[3]))
    return tuple(items)


def read_manifest(root: Path, limits: FileLimits) -> tuple[SchemaIdentity, StoreOptions, list, list[str]]:
    """(identity, options, complete ranges, shard names) of the store at `root`; typed errors if malformed."""
    path = root / MANIFEST
    check_not_link(path, root)
    if not path.is_file():
        raise FileNotFoundError(f"{root} is not a store: it has no {MANIFEST}; write one with capture_dataset")
    source = str(path)
    document = parse_json(read_bounded(path, limits, "store manifest"), limits, source)
    check_header(document, FORMAT_NAME, FORMAT_VERSION, source)
    record(document, source, ("format", "version", "schema", "options", "complete", "shards"), optional=("weights",))
    raw = get_dict(document, "schema", source)
    record(raw, f"{source}.schema", ("source_hash", "model_class", "inputs"))
    inputs = get_list(raw, "inputs", f"{source}.schema")
    if any(type(name) is not str for name in inputs):
        raise MalformedFileError(f"{source}.schema.inputs: expected an array of names")
    weights = _weights(document["weights"], limits, f"{source}.weights") if "weights" in document else None
    identity = SchemaIdentity(get_str(raw, "source_hash", f"{source}.schema", max_chars=64),
                              get_str(raw, "model_class", f"{source}.schema", max_chars=1024), tuple(inputs), weights)
    options = _options(get_dict(document, "options", source), f"{source}.options")
    complete = [list(pair) for pair in get_list(document, "complete", source)]
    if any(len(pair) != 2 or any(type(v) is not int or v < 0 for v in pair) for pair in complete):
        raise MalformedFileError(f"{source}.complete: expected [first, last] pairs of sample ids")
    shards = list(get_list(document, "shards", source))
    if any(type(name) is not str or not _FILE["tensors"].match(name) for name in shards):
        raise MalformedFileError(f"{source}.shards: expected names such as 'tensors/unit-000000-000000000-000.safetensors'")
    return identity, options, complete, shards


def unit_name(block: int, first: int) -> str:
    return f"unit-{block:06d}-{first:09d}"


@dataclass(frozen=True)
class Commit:
    """One committed unit: its block, rank, samples, statistics file, tensor shards and reductions file."""

    name: str
    block: int
    rank: int
    samples: tuple[int, ...]
    steps_file: str
    rows: int
    shards: tuple[tuple[str, int], ...]  # (file, bytes)
    reductions_file: str
    sizes: tuple[tuple[str, int], ...]  # every file named, with its size in bytes
    statistics: str = "torch"  # the engine of the unit's figures (store/native.py); absent in older commits
    ranged: bool = False  # written as `sample_ranges` ([first, last] pairs: a store of rows), not `samples`

    def to_json(self) -> dict:
        document = {"format": COMMIT_FORMAT, "version": FORMAT_VERSION, "block": self.block, "rank": self.rank}
        if self.ranged:
            document["sample_ranges"] = _ranges(self.samples)
        else:
            document["samples"] = list(self.samples)
        document.update({"steps_file": self.steps_file, "rows": self.rows, "shards": [list(s) for s in self.shards],
                         "reductions_file": self.reductions_file, "sizes": [list(s) for s in self.sizes],
                         "statistics": self.statistics})
        return document


def _ranges(samples: Any) -> list[list[int]]:
    """Increasing ids as [first, last] pairs of consecutive runs."""
    ranges: list[list[int]] = []
    for s in samples:
        if ranges and ranges[-1][1] == s - 1:
            ranges[-1][1] = s
        else:
            ranges.append([s, s])
    return ranges


def _expand_ranges(document: dict, limits: FileLimits, source: str) -> list:
    """The sample ids of a commit's `sample_ranges`, checked before a list is made: pairs of ints, increasing and
    apart, at most as many ids as the commit has statistics rows and `limits.max_tensors`."""
    pairs = get_list(document, "sample_ranges", source)
    total, last = 0, -2
    for index, pair in enumerate(pairs):
        if (not is_array(pair) or len(pair) != 2 or any(type(v) is not int for v in pair)
                or not last + 1 < pair[0] <= pair[1]):
            raise MalformedFileError(f"{source}.sample_ranges[{index}]: expected [first, last] ids, increasing, each "
                                     "range after the one before")
        total, last = total + pair[1] - pair[0] + 1, pair[1]
    rows = document.get("rows")
    if total > limits.max_tensors or type(rows) is int and total > rows:
        raise MalformedFileError(f"{source}.sample_ranges: {total} samples, more than the commit's rows ({rows}) or "
                                 f"FileLimits.max_tensors ({limits.max_tensors})")
    return [s for first, end in pairs for s in range(first, end + 1)]


def write_commit(root: Path, commit: Commit) -> None:
    _atomic(root / "commits" / f"{commit.name}.json", dump_json(commit.to_json()))


def _file_name(value: Any, kind: str, unit: str, where: str) -> str:
    if type(value) is not str or not _FILE[kind].match(value) or not value.split("/", 1)[1].startswith(unit):
        raise MalformedFileError(f"{where}: {value!r} is not a {kind} file of {unit}; a commit names files "
                                 f"inside its store only ({kind}/{unit}...)")
    return value


def _read_commit(root: Path, path: Path, limits: FileLimits, block_size: int, rows: bool = False) -> Commit:
    source = str(path)
    unit = path.stem
    found = _UNIT.match(unit)
    if not found:
        raise MalformedFileError(f"{source}: a commit is named unit-BBBBBB-SSSSSSSSS.json")
    document = parse_json(read_bounded(path, limits, "store commit"), limits, source)
    check_header(document, COMMIT_FORMAT, FORMAT_VERSION, source)
    record(document, source, ("format", "version", "block", "rank", "steps_file", "rows", "shards",
                              "reductions_file", "sizes"), optional=("statistics", "samples", "sample_ranges"))
    if ("samples" in document) == ("sample_ranges" in document):
        raise MalformedFileError(f"{source}: a commit gives its samples as `samples` or (rows) `sample_ranges`, "
                                 "one of them")
    if ("sample_ranges" in document) != rows:
        raise MalformedFileError(f"{source}: a store of {'rows' if rows else 'inputs'} gives its samples as "
                                 f"{'sample_ranges' if rows else 'samples'}")
    statistics = document.get("statistics", "torch")
    if statistics not in STATISTICS_ENGINES:
        raise MalformedFileError(f"{source}.statistics: {statistics!r} is not an engine of the store's statistics "
                                 f"({', '.join(STATISTICS_ENGINES)})")
    block, first = int(found.group(1)), int(found.group(2))
    if get_int(document, "block", source) != block:
        raise MalformedFileError(f"{source}.block: does not match the commit's name")
    samples = _expand_ranges(document, limits, source) if rows else get_list(document, "samples", source)
    # a block holds `block_size` inputs: as many samples, numbered by input, or (rows) their rows, numbered
    # by a running count (so a block's ids are not known from its number: read_commits checks they are disjoint)
    if (not samples or any(type(s) is not int or s < 0 for s in samples)
            or list(samples) != sorted(set(samples)) or samples[0] != first
            or not rows and (len(samples) > block_size or any(s // block_size != block for s in samples))):
        raise MalformedFileError(f"{source}.samples: expected increasing sample ids of block {block} "
                                 f"(block size {block_size}), the first {first}")
    steps_file = _file_name(document["steps_file"], "steps", unit, f"{source}.steps_file")
    reductions_file = _file_name(document["reductions_file"], "reductions", unit, f"{source}.reductions_file")
    shards = []
    for index, item in enumerate(get_list(document, "shards", source)):
        if not is_array(item) or len(item) != 2 or type(item[1]) is not int:
            raise MalformedFileError(f"{source}.shards[{index}]: expected [file, bytes]")
        shards.append((_file_name(item[0], "tensors", unit, f"{source}.shards[{index}]"), item[1]))
    sizes = []
    for index, item in enumerate(get_list(document, "sizes", source)):
        if not is_array(item) or len(item) != 2 or type(item[0]) is not str or type(item[1]) is not int:
            raise MalformedFileError(f"{source}.sizes[{index}]: expected [file, bytes]")
        sizes.append((item[0], item[1]))
    named = {steps_file, reductions_file} | {s for s, _ in shards}
    if {name for name, _ in sizes} != named or len(sizes) != len(named):
        raise MalformedFileError(f"{source}.sizes: must give the size of each file the commit names, once")
    for name, size in sizes:
        target = root / name
        actual = target.stat().st_size if target.is_file() and not target.is_symlink() else None
        if actual is None:
            raise MalformedFileError(f"{source}: the file {name} it names is missing (or not a plain file)")
        if actual != size:
            raise MalformedFileError(f"{source}: {name} is {actual} bytes, the commit says {size} (changed or "
                                     "truncated after the commit)")
    return Commit(unit, block, get_int(document, "rank", source, high=1 << 20), tuple(samples), steps_file,
                  get_int(document, "rows", source), tuple(shards), reductions_file, tuple(sizes), statistics, rows)


def read_commits(root: Path, limits: FileLimits, block_size: int, rows: bool = False) -> list[Commit]:
    """The store's commits in unit order; a sample committed twice is refused. `rows`: the store's samples are
    rows (StoreOptions.rows), numbered by a running count."""
    folder = root / "commits"
    if not folder.is_dir():
        return []
    paths = sorted(p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    if len(paths) > limits.max_tensors:
        raise MalformedFileError(f"{folder}: {len(paths)} commits, over the limit of {limits.max_tensors}")
    commits = [_read_commit(root, path, limits, block_size, rows) for path in paths]
    if rows:  # a running count: each block's ids come after the ids of the blocks before it
        for before, after in zip(commits, commits[1:]):
            if before.samples[-1] >= after.samples[0]:
                raise MalformedFileError(f"{folder}: {after.name} starts at sample {after.samples[0]}, but "
                                         f"{before.name}, an earlier block, holds sample {before.samples[-1]}: the "
                                         "samples of a store of rows increase block by block")
    seen: dict[int, str] = {}
    for commit in commits:
        for sample in commit.samples:
            if sample in seen:
                raise MalformedFileError(f"{folder}: sample {sample} is committed twice ({seen[sample]} and "
                                         f"{commit.name})")
            seen[sample] = commit.name
    return commits
