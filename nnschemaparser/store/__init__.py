"""The store stage (after `files`, before `widget`), activations as a dataset: many inputs captured into an on-disk store, read back and queried.

`manifest` (the layout on disk, the schema identity, the manifest and the commit records),
`statistics` (the per-step statistics of an input's values), `torch_figures` (their torch engine's
reductions), `native` (their one-pass C kernel,
`_statistics.c`, built on first use), `step_table` (the statistics' columns: the Parquet schema and
a unit's Arrow table), `step_names` (an input's step fields: the logged run's columns where it can, and
the per-schema caches of their metadata), `shards` (safetensors files,
checked and memory-mapped), `reductions` (mergeable per-variable mean, variance, histograms and
top-k), `writer` (what one process writes: blocks of inputs, committed one by one, resumable),
`rows` (a batched input split into rows, each a sample; the padding mask), `guard` (no symbolic links
inside a store, files created without following one, one writer at a time),
`dataset` (`capture_dataset`: one process, N forked processes in a gloo group, or a torchrun
launch), `reader` (`TraceStore`: DataFrames, DuckDB SQL, lazy tensors, traces, reductions), `stacked`
(`stack`: one value over many samples as one tensor; `TokenBatches`: its token rows in shuffled batches).
The keep selector itself is `traces.selection` (capture_run takes it too).

May import: `schema`, `runtime`, `parser`, `traces`, `files`.
"""

from .dataset import capture_dataset
from .guard import StoreBusyError, StoreLinkError
from .manifest import SchemaIdentity, StoreIncompleteError, StoreMismatchError, StoreOptions, schema_identity
from .reader import TraceStore
from .reductions import Reduction
from .stacked import TokenBatches
from ..traces.selection import KeepSelector, KeepTerm, keep_selector

__all__ = ["capture_dataset", "TraceStore", "Reduction", "TokenBatches", "StoreMismatchError", "StoreIncompleteError", "StoreBusyError",
           "StoreLinkError",
           "SchemaIdentity", "StoreOptions", "schema_identity", "KeepSelector", "KeepTerm", "keep_selector"]
