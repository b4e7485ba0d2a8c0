"""Safetensors files of a store: written with safetensors, read back memory-mapped after checking them.

`write_shard` writes a file (tensors and a string metadata) in safetensors' layout from the tensors'
storage through a reused staging buffer, with O_DIRECT where the file system takes it (`write_bytes`;
`encode_shard`: the same layout through safetensors, in memory); `ShardFile` opens one:
it reads the 8-byte length and the JSON header only (bounded by FileLimits and decoded with the
strict bounded decoder), checks every entry as trace files' entries are checked
(`files.trace_file.safetensors_layout`: known dtype, shape within bounds whose strides fit 64 bits, byte
range inside the file and matching the shape, ranges tiling the data exactly). `tensor(key)` of at
least `MAPPED` bytes is a view of a copy-on-write mapping of its own (the pages shared with the page
cache, nothing read until touched, and a write into it changes that tensor only); a smaller one is
a copy. So no two reads share memory a write could reach.

Depends on files (limits, JSON, the safetensors dtype table); never on the runtime or views.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from ..files.file_format import FileLimitError, FileLimits, MalformedFileError, decode_budget, is_object, parse_json
from ..files.trace_file import SAFETENSORS_DTYPES, safetensors_layout
from .guard import create

_CODES = {dtype: code for code, (dtype, _) in SAFETENSORS_DTYPES.items()}

__all__ = ["encode_shard", "write_shard", "write_bytes", "direct_writes", "ShardFile", "MAPPED"]

_ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to the device's block: 4 KiB covers it
_STAGE = 8 * 2 ** 20  # bytes: a shard's bytes are gathered in a buffer of this size and written a buffer at a time
_staging = threading.local()  # each thread's staging buffer (page-aligned anonymous memory), kept for the next shard
# bytes: a tensor read of at least this many is a view of a mapping of its own; a smaller one is copied (a mapping
# per small tensor would spend the process's mappings, 65530 on Linux, on a list of reads)
MAPPED = 64 * 1024


def encode_shard(tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None) -> bytes:
    """The safetensors bytes of `tensors` (CPU, contiguous, none sharing memory) with string `metadata`."""
    try:
        import safetensors.torch as st
    except ImportError:  # pragma: no cover - a declared dependency
        raise ImportError("the store writes tensors with safetensors: pip install safetensors") from None
    return st.save(tensors, metadata=metadata)


def direct_writes() -> bool:
    """Whether shards are written with O_DIRECT where the file system takes it (`NNSCHEMAPARSER_DIRECT_WRITES=0`:
    never, every shard goes through the page cache)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    return os.environ.get("NNSCHEMAPARSER_DIRECT_WRITES", "1").strip().lower() not in ("0", "no", "off", "false")


def write_shard(path: Path, tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None) -> int:
    """Write `tensors` (CPU, contiguous) to `path` as a safetensors file, synced; returns its size.

    The layout is safetensors' own (8-byte little-endian header length, the JSON header padded with
    spaces to 8 bytes, the tensors' bytes back to back, widest element first, so every tensor is
    aligned to its element size), written without assembling the file in memory: the bytes are
    gathered in a staging buffer of `_STAGE` bytes, reused from shard to shard, and written a
    buffer at a time (`write_bytes`). The files read back with `safetensors.safe_open`
    (tests/store/test_writer.py)."""
    if sys.byteorder == "big":  # pragma: no cover - safetensors is little-endian: let it convert
        data = encode_shard(tensors, metadata)
        with open(create(path), "wb", closefd=True) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return len(data)
    # widest element first (every tensor stays aligned to its element size), then by dtype, then as given
    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, tensor in tensors.items():
        by_dtype.setdefault(tensor.dtype, []).append(key)
    dtypes = sorted(by_dtype, key=lambda d: -torch.empty((), dtype=d).element_size())
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    position = 0
    pieces: list[Any] = []
    for dtype in dtypes:
        code = _CODES[dtype]
        width = torch.empty((), dtype=dtype).element_size()
        for key in by_dtype[dtype]:
            tensor = tensors[key]
            nbytes = tensor.numel() * width
            header[key] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [position, position + nbytes]}
            position += nbytes
            if nbytes:
                pieces.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    write_bytes(path, [len(text).to_bytes(8, "little"), text] + pieces)
    return 8 + len(text) + position


def write_bytes(path: Path, pieces: list) -> str:
    """Write the bytes-like `pieces` one after the other to `path` and sync it; returns how: "direct" or "buffered".

    Either way the bytes go through this thread's staging buffer, `_STAGE` bytes of page-aligned memory
    kept from call to call (one copy, into memory already mapped). Where the file system takes O_DIRECT
    (`direct_writes()`), each full buffer goes from it to the disk without passing through the page
    cache, and the last one is padded to `_ALIGN` and the file cut back to its size. This spares the
    copy into the page cache and the fresh pages it needs: on a virtual machine that hands freed memory
    back to its host, a buffered write of a 144 MiB shard cost 240-390 ms of CPU, the direct one 25
    (`python bench/bench_store.py --only write` shows it in the store's figures). The file's bytes are
    the same either way. A file system that refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and
    network file systems: EINVAL or EOPNOTSUPP on open or on a write) gets the buffered write, the file
    written again from the start."""
    if direct_writes():
        try:
            fd = create(path, direct=True)
        except OSError as exc:
            if exc.errno not in _NO_DIRECT:
                raise
        else:
            try:
                _write_through_stage(fd, pieces, direct=True)
                os.fsync(fd)
                return "direct"
            except OSError as exc:
                if exc.errno not in _NO_DIRECT:
                    raise
            finally:
                os.close(fd)
    with open(create(path), "wb", closefd=True) as handle:  # a new file, never through a link (guard.create)
        _write_through_stage(handle.fileno(), pieces, direct=False)
        os.fsync(handle.fileno())
    return "buffered"


_NO_DIRECT = {errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def _stage() -> memoryview:
    view = getattr(_staging, "view", None)
    if view is None or len(view) != _STAGE:
        # anonymous and private: page-aligned, and a process forked later (capture_dataset(world=N)) gets
        # its own copy on its first write instead of sharing the parent's bytes (mmap's default is shared)
        private = getattr(mmap, "MAP_PRIVATE", None)  # None on Windows, which never forks
        memory = mmap.mmap(-1, _STAGE, flags=private) if private is not None else bytearray(_STAGE)
        _staging.view = view = memoryview(memory)
    return view


def _write_through_stage(fd: int, pieces: list, direct: bool) -> None:
    stage = _stage()
    fill = total = 0
    for piece in pieces:
        piece = memoryview(piece).cast("B")
        start, end = 0, len(piece)
        while start < end:
            take = min(end - start, _STAGE - fill)
            stage[fill:fill + take] = piece[start:start + take]
            fill, start = fill + take, start + take
            if fill == _STAGE:
                _write_all(fd, stage)
                total, fill = total + fill, 0
    if fill:
        if direct:  # O_DIRECT writes whole blocks: pad the last one, then cut the file back to its size
            padded = -(-fill // _ALIGN) * _ALIGN
            stage[fill:padded] = bytes(padded - fill)
            _write_all(fd, stage[:padded])
            os.ftruncate(fd, total + fill)
        else:
            _write_all(fd, stage[:fill])


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):  # a short write (a signal, a full disk) goes on where it stopped, or raises
        view = view[os.write(fd, view):]


class ShardFile:
    """One checked safetensors file of a store, mapped read-only (copy-on-write) when first read."""

    def __init__(self, path: Path, limits: FileLimits, expected_size: Optional[int] = None):
        self.path = path
        source = str(path)
        try:
            handle = open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)), "rb")
        except FileNotFoundError:
            raise MalformedFileError(f"{source}: the store names this file but it is missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
                raise MalformedFileError(f"{source}: a symbolic link; a store's files are read only as plain "
                                         "files (remove the link)") from None
            raise
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if expected_size is not None and size != expected_size:
                raise MalformedFileError(f"{source}: {size} bytes, the store's commit says {expected_size}")
            if size < 8:
                raise MalformedFileError(f"{source}: {size} bytes is too short for a safetensors file (truncated?)")
            length = int.from_bytes(handle.read(8), "little")
            if length > limits.max_header_bytes:
                raise FileLimitError(f"{source}: the header claims {length} bytes, over the limit of "
                                     f"{limits.max_header_bytes}")
            if 8 + length > size:
                raise MalformedFileError(f"{source}: the header claims {length} bytes but only {size - 8} follow its "
                                         "length (truncated?)")
            header_bytes = handle.read(length)
        # the memory of the header's decoding is bounded by the whole file's size, as for a trace file
        budget = decode_budget(size, limits, source, held=len(header_bytes))
        header = parse_json(header_bytes, limits, f"{source} (header)", budget)
        if not is_object(header):
            raise MalformedFileError(f"{source}: the safetensors header is not a JSON object")
        metadata = header.get("__metadata__", {})
        if not is_object(metadata) or any(type(v) is not str for v in metadata.values()):
            raise MalformedFileError(f"{source}: __metadata__ must map names to strings")
        self.metadata: dict[str, str] = dict(metadata)
        layout = safetensors_layout(header, 8 + length, size - 8 - length, limits, source)
        self.layout: dict[str, tuple[torch.dtype, tuple, int]] = layout
        self.size = size
        self._map: Optional[mmap.mmap] = None

    def keys(self) -> list[str]:
        return list(self.layout)

    def _open(self) -> Any:
        handle = open(os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)), "rb")
        if os.fstat(handle.fileno()).st_size != self.size:
            handle.close()
            raise MalformedFileError(f"{self.path}: the file changed size since the store was opened")
        return handle

    def mapping(self) -> mmap.mmap:
        """The whole file, mapped once (copy-on-write) for the store's own reads, which copy out of it (never
        handed to a caller: a write into a view of it would change every later read)."""
        if self._map is None:
            with self._open() as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._map

    def region(self, offset: int, nbytes: int) -> tuple[mmap.mmap, int]:
        """A mapping of its own of the bytes [offset, offset + nbytes) (copy-on-write: pages shared with the page
        cache until written, a write changing that mapping only), and where `offset` lies in it."""
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        with self._open() as handle:
            mapped = mmap.mmap(handle.fileno(), offset + nbytes - start, access=mmap.ACCESS_COPY, offset=start)
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
            # a hint that the tensor's pages will be read: the kernel reads them ahead in large requests
            # instead of one page fault at a time (a 4 MiB tensor off the disk: a third faster here)
            mapped.madvise(mmap.MADV_WILLNEED)
        return mapped, offset - start

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor `key`, which shares no memory a write could reach with any other read: at least `MAPPED`
        bytes, a view of a copy-on-write mapping of its own (pages read when touched); under, a copy."""
        dtype, shape, offset = self.layout[key]
        count = math.prod(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        nbytes = count * dtype.itemsize
        if nbytes < MAPPED:
            tensor = torch.frombuffer(self.mapping(), dtype=dtype, count=count, offset=offset).reshape(shape)
            return tensor.clone() if sys.byteorder == "little" else _swapped(tensor)
        mapped, at = self.region(offset, nbytes)
        tensor = torch.frombuffer(mapped, dtype=dtype, count=count, offset=at).reshape(shape)
        if offset % dtype.itemsize or sys.byteorder == "big":
            tensor = tensor.clone() if sys.byteorder == "little" else _swapped(tensor)
        return tensor

    def tensors(self) -> dict[str, Any]:
        return {key: self.tensor(key) for key in self.layout}


def _swapped(tensor: torch.Tensor) -> torch.Tensor:  # pragma: no cover - big-endian machines only
    raw = tensor.contiguous().view(torch.uint8).reshape(-1, tensor.element_size()).flip(1)
    return raw.reshape(-1).view(tensor.dtype).reshape(tensor.shape).clone()
