"""TraceStore: a store read back, as tables, SQL, memory-mapped tensors, traces and reductions.

Opening a store reads and checks its manifest and every commit record (strict bounded JSON, exact
fields, file names inside the store, sizes matching the files), the footer of each statistics
Parquet (its columns must be the store's, its row count the commit's, its decoded size bounded)
and the header of each safetensors file (files/ rules: dtypes, shapes and byte ranges checked
before a byte of data is touched; with `check_shards=False`, as `capture_dataset` returns the store
it just wrote, a commit's shard headers are checked when a tensor of one of its inputs is first
asked for, still before any of their data is read). Tensors are then views of the mapped files; statistics are read
by pyarrow (`steps`, `trace`) or by DuckDB (`query`), which sees them as the table `steps`.

Depends on schema, files, traces and the store's own modules; never on the runtime or views.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any, Optional

import torch

from ..files.file_format import FileLimitError, FileLimits, MalformedFileError, decode_budget, parse_json
from ..schema.model import TensorContainer
from ..traces.selection import value_name
from ..traces.trace import ActivationTrace, TraceStep
from .guard import check_no_links
from .manifest import Commit, read_commits, read_manifest
from .reductions import Reduction, ReductionState, decode_states
from .rows import MASK_KEY
from .shards import ShardFile
from .step_table import arrow_schema

__all__ = ["TraceStore", "NOT_KEPT"]

NOT_KEPT = "not kept in the store (its keep selector did not name it); its statistics are in store.steps"
_PARQUET_RATIO = 64  # decoded bytes a statistics file may claim per byte of file (real ones: under 10)
_BATCH_ROWS = 1 << 16  # rows decoded at a time, and counted, by `_read_file`
# `selection.value_name` in DuckDB's SQL, then `#n` from the second step of a name in an input: the `name`
# column of `steps`, worked out on reading (the Parquet files hold no such column, so stores of every version
# have it; `TraceStore.steps` works it out in Python, and a test holds the two equal)
_BASE_SQL = ("CASE WHEN slot_type = 'activation' AND op_name <> '' AND starts_with(description, 'Call to sub-block ') "
             "THEN op_name || ':output' WHEN block_path <> '' THEN block_path || ':' || out_var ELSE out_var END")
STEP_NAME_SQL = ("SELECT * EXCLUDE (_base, _n), CASE WHEN _n = 1 THEN _base ELSE _base || '#' || CAST(_n AS VARCHAR) "
                 "END AS name FROM (SELECT *, " + _BASE_SQL + " AS _base, row_number() OVER (PARTITION BY sample, "
                 + _BASE_SQL + " ORDER BY step) AS _n FROM {source})")


def _row_width(schema: Any) -> int:
    """The bytes a row decodes to at the least: fixed-width values, and a 4-byte offset per text or list value."""
    import pyarrow as pa

    return sum(f.type.bit_width // 8 if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) else
               1 if pa.types.is_boolean(f.type) else 4 for f in schema)


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise ImportError("TraceStore.query needs DuckDB: pip install 'nnschemaparser[store]' (or duckdb)") from None
    return duckdb


class TraceStore:
    """A store written by capture_dataset (see the package docstring for what it holds).

    `samples` lists the complete inputs; `steps` is one row per input and step (DataFrame);
    `query(sql)` runs DuckDB SQL over the table `steps`; `tensor(sample, container_id)` is a kept
    tensor, memory-mapped; `stack(name)` one value over many samples as one tensor; `tokens(name,
    batch_size)` its token rows in shuffled batches; `trace(sample)` an ActivationTrace of one input (kept tensors as values,
    the others None with `omitted` saying so); `scope(sample)` its tensor inputs; `reduction(name)`
    the merged reductions of a kept variable (`variables` lists them).
    """

    def __init__(self, path: str | os.PathLike, *, limits: Optional[FileLimits] = None, check_shards: bool = True):
        """Open the store at `path`, checking its manifest, commits and statistics footers; and, unless
        `check_shards=False`, every tensor shard's header now (with False, each commit's shards are
        checked when a tensor of one of its inputs is first asked for: capture_dataset returns its
        store so, having just written those files)."""
        self.path = Path(path)
        self.limits = limits or FileLimits()
        check_no_links(self.path, every_entry=False)  # each file a commit names is checked by read_commits
        self.identity, self.options, _, _ = read_manifest(self.path, self.limits)
        self.commits: list[Commit] = read_commits(self.path, self.limits, self.options.block_size, self.options.rows)
        self._by_sample: dict[int, Commit] = {s: c for c in self.commits for s in c.samples}
        self._decoded_ok: set[Path] = set()  # statistics files read within their bound (`_read_file`)
        self._check_parquet()
        self._opened: dict[str, ShardFile] = {}
        self._index: dict[str, str] = {}  # "sample/container_id" -> shard file, of the commits opened
        self._opened_commits: set[str] = set()
        if check_shards:
            for commit in self.commits:
                self._open_shards(commit)
        self._steps: Any = None
        self._reductions: Optional[dict[str, ReductionState]] = None
        self._named: Optional[dict[str, str]] = None  # `_aliases`

    def _open_shards(self, commit: Commit) -> None:
        """Check the headers of `commit`'s shards and index their tensors (once per commit)."""
        if commit.name in self._opened_commits:
            return
        for name, size in commit.shards:
            shard = ShardFile(self.path / name, self.limits, size)
            for key in shard.layout:
                if not self._key_matches(key, commit):
                    raise MalformedFileError(f"{self.path / name}: tensor {key!r} is not of a sample of "
                                             f"{commit.name}")
                if key in self._index:
                    raise MalformedFileError(f"{self.path / name}: tensor {key!r} is also in {self._index[key]}")
            for key in shard.layout:
                self._index[key] = name
            self._opened[name] = shard
        self._opened_commits.add(commit.name)

    @property
    def _where(self) -> dict[str, str]:
        """Every kept tensor's shard ("sample/container_id" -> file), every shard checked first."""
        for commit in self.commits:
            self._open_shards(commit)
        return self._index

    @property
    def _shards(self) -> dict[str, ShardFile]:
        for commit in self.commits:
            self._open_shards(commit)
        return self._opened

    @staticmethod
    def _key_matches(key: str, commit: Commit) -> bool:
        sample, slash, _ = key.partition("/")
        # ASCII digits within an int64 (int() of 5000 digits raises ValueError; "²" is a digit to isdigit)
        return bool(slash) and 0 < len(sample) <= 18 and sample.isascii() and sample.isdigit() and \
            int(sample) in commit.samples

    def _check_parquet(self) -> None:
        import pyarrow.parquet as pq

        expected = arrow_schema()
        for commit in self.commits:
            path = self.path / commit.steps_file
            try:
                meta = pq.read_metadata(path)
                schema = meta.schema.to_arrow_schema()
            except Exception as exc:  # pyarrow raises ArrowInvalid, OSError... for a file that is not Parquet
                raise MalformedFileError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
            if not schema.remove_metadata().equals(expected):
                raise MalformedFileError(f"{path}: its columns are not a store's statistics ({schema.names})")
            if meta.num_rows != commit.rows:
                raise MalformedFileError(f"{path}: {meta.num_rows} rows, its commit says {commit.rows}")
            decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            bound = self._bound(path)
            if decoded > bound:
                raise FileLimitError(f"{path}: claims {decoded} decoded bytes, over {_PARQUET_RATIO} times the file; "
                                     "refused as a decompression bomb")
            # what the rows decode to at the least: every row's fixed-width values and offsets (the row count is
            # the one decoding gives, and the commit's): a file of millions of constant rows stops here
            fixed = meta.num_rows * _row_width(expected)
            if fixed > bound:
                raise FileLimitError(f"{path}: {meta.num_rows} rows decode to at least {fixed} bytes, over the bound of "
                                     f"{bound} ({_PARQUET_RATIO} times the file, at most FileLimits.max_decoded_bytes); "
                                     "refused as a decompression bomb")

    def _bound(self, path: Path) -> int:
        """The most bytes a statistics file may decode to: 64 times its size (at least 64 KiB's worth), and at most
        FileLimits.max_decoded_bytes."""
        return min(_PARQUET_RATIO * max(os.path.getsize(path), 64 * 1024), self.limits.max_decoded_bytes)

    def _read_file(self, path: Path, sample: Optional[int] = None, check_only: bool = False) -> Any:
        """The statistics of one file (of one sample), decoded under the bound `_bound`, which counts what decoding
        gives, not what the file declares: it is read a batch of rows at a time, its text columns as dictionaries
        (each value once), and each text column is counted as the strings its rows expand to (a row's string is
        its own copy once decoded) before any row is expanded. Past the bound: FileLimitError naming the file, the
        column and the bound. `check_only`: the count only (the fixed-width columns from the row count, the others
        read), as before DuckDB reads the files."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        schema = arrow_schema()
        text = [f.name for f in schema if pa.types.is_string(f.type)]
        varying = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_list(f.type)]
        bound = self._bound(path)
        sizes = dict.fromkeys(schema.names, 0)
        batches = []
        try:
            handle = pq.ParquetFile(path, read_dictionary=text)
            rows = handle.metadata.num_rows
            if check_only:
                for name in schema.names:
                    if name not in varying:
                        sizes[name] = rows * _row_width(pa.schema([schema.field(name)]))
            for batch in handle.iter_batches(batch_size=_BATCH_ROWS, columns=varying if check_only else schema.names,
                                             use_threads=False):
                for name, column in zip(batch.schema.names, batch.columns):
                    if pa.types.is_dictionary(column.type):
                        values = column.dictionary
                        if values.nbytes > bound:
                            sizes[name] = values.nbytes
                        else:
                            lengths = pc.take(pc.binary_length(values), column.indices)
                            sizes[name] += 4 * (len(column) + 1) + (pc.sum(lengths).as_py() or 0)
                    else:
                        sizes[name] += column.nbytes
                if sum(sizes.values()) > bound:
                    break
                if not check_only:
                    if sample is not None:
                        batch = batch.filter(pc.equal(batch.column("sample"), sample))
                    batches.append(batch)
            handle.close()
            table = None if check_only or not batches else pa.Table.from_batches(batches)
        except Exception as exc:
            raise MalformedFileError(f"{path}: a statistics file could not be read ({type(exc).__name__}: {exc})") from None
        total = sum(sizes.values())
        if total > bound:
            column = max(sizes, key=sizes.get)
            raise FileLimitError(f"{path}: its rows decode to more than {bound} bytes ({total} so far; the column "
                                 f"{column!r} alone {sizes[column]}), over the bound of {_PARQUET_RATIO} times the "
                                 "file (at most FileLimits.max_decoded_bytes); refused as a decompression bomb. A "
                                 "store's statistics decode to a few times their file; pass limits=FileLimits("
                                 "max_decoded_bytes=...) only for a store you trust")
        self._decoded_ok.add(path)
        if check_only:
            return None
        if table is None:
            return schema.empty_table()
        try:
            return table.cast(schema)
        except Exception as exc:
            raise MalformedFileError(f"{path}: a statistics file could not be read ({type(exc).__name__}: {exc})") from None

    def __repr__(self) -> str:
        return (f"<TraceStore {self.path}: {len(self._by_sample)} inputs of {self.identity.model_class}, "
                f"{len(self._where)} tensors in {len(self._shards)} shards>")

    # -- what it holds ---------------------------------------------------------------------------

    @property
    def samples(self) -> list[int]:
        """The sample ids of the complete samples (inputs, or the rows of batched inputs), in order."""
        return sorted(self._by_sample)

    def __len__(self) -> int:
        return len(self._by_sample)

    @property
    def statistics_engines(self) -> dict[str, int]:
        """{engine: inputs}: how the figures of the `steps` were computed ("native-2", the one-pass C kernel of
        store/native.py, which folds the reductions too; "native-1", its statistics with torch's fold, in stores
        written before; "torch", torch's reductions). They round the last bits of a mean, std, abs_sum or l2 (and
        of a reduction's mean and var) differently; a store written on machines with and without a C compiler
        holds both."""
        engines: dict[str, int] = {}
        for commit in self.commits:
            engines[commit.statistics] = engines.get(commit.statistics, 0) + len(commit.samples)
        return engines

    def parquet_files(self) -> list[Path]:
        return [self.path / c.steps_file for c in self.commits]

    def _read_table(self, files: list[Path], sample: Optional[int] = None) -> Any:
        import pyarrow as pa

        tables = [self._read_file(f, sample) for f in files]  # each under its bound (`_read_file`)
        return pa.concat_tables(tables) if tables else arrow_schema().empty_table()

    @property
    def steps(self) -> Any:
        """One row per input and step (columns of store/step_table.py, and `name`: `h.3:output`, what a call of
        block `h.3` returned; `h.3.attn:attn_output`, a variable; `#n` for the n-th of a name in an input),
        sorted by sample and step."""
        if self._steps is None:
            table = self._read_table(self.parquet_files())
            steps = table.to_pandas().sort_values(["sample", "step"], kind="stable").reset_index(drop=True)
            steps["name"] = _names(steps)
            self._steps = steps
        return self._steps

    def query(self, sql: str) -> Any:
        """Run DuckDB `sql` over the statistics (the table `steps`, with the `name` column of `steps`); returns a
        DataFrame."""
        if not isinstance(sql, str):
            raise TypeError(f"sql must be a string, got {type(sql).__name__}")
        duckdb = _duckdb()
        for path in self.parquet_files():  # DuckDB decodes them as pyarrow would: each is counted first, once
            if path not in self._decoded_ok:
                self._read_file(path, check_only=True)
        files = [str(f) for f in self.parquet_files()]
        connection = duckdb.connect(":memory:")
        try:
            if files:
                listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                source = f"read_parquet([{listed}])"
            else:
                connection.register("steps_empty", arrow_schema().empty_table())
                source = "steps_empty"
            connection.execute("CREATE VIEW steps AS " + STEP_NAME_SQL.format(source=source))
            try:
                return connection.execute(sql).df()
            except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException):
                raise  # the query's own mistake, as DuckDB says it
            except duckdb.Error as exc:
                # a failure while reading: a statistics file corrupted past the footer checked on open
                # names itself here (pyarrow reads each in full); otherwise the error is the query's
                for path in self.parquet_files():
                    self._read_table([path])
                raise exc
        finally:
            connection.close()

    # -- tensors, traces, inputs ----------------------------------------------------------------

    def _commit_of(self, sample: int) -> Commit:
        if isinstance(sample, bool) or not isinstance(sample, numbers.Integral):  # numpy's ints are Integral
            raise TypeError(f"a sample id is an int, got {type(sample).__name__}")
        commit = self._by_sample.get(int(sample))
        if commit is None:
            raise KeyError(f"sample {sample} is not in this store ({len(self)} complete inputs"
                           f"{', ids ' + str(self.samples[0]) + '..' + str(self.samples[-1]) if self._by_sample else ''})")
        return commit

    def _place(self, sample: int, container_id: str) -> tuple[ShardFile, str]:
        """(shard, key) of a kept tensor, its commit's shards checked first."""
        self._open_shards(self._commit_of(sample))
        key = f"{int(sample)}/{container_id}"
        return self._opened[self._index[key]], key

    def _mask(self, sample: int) -> Optional[torch.Tensor]:
        """The mask kept beside `sample` (bool, store/rows.py), or None."""
        self._open_shards(self._commit_of(sample))
        key = f"{int(sample)}/{MASK_KEY}"
        name = self._index.get(key)
        return self._opened[name].tensor(key) if name is not None else None

    @property
    def batch_axis(self) -> Optional[int]:
        """The axis the store split its inputs' rows along (None: each input is one sample; store/rows.py)."""
        return self.options.batch_axis

    def mask(self, sample: int) -> Optional[torch.Tensor]:
        """The padding mask of `sample` (bool, True where a position counts; [1, positions] for a row), or None
        when the store was written without `mask=`."""
        return self._mask(sample)

    def stack(self, name: str, samples: Any = None, positions: Any = None) -> torch.Tensor:
        """The kept value `name` (`"h.3:output"`, or a container id) of `samples` (None: every sample keeping it;
        an iterable of ids, in its order) as one tensor, samples on dim 0: a store of rows gives [n, T, d] for
        GPT-2's layer output. A strided view of a mapping of its own when the samples lie evenly spaced in one
        shard, a copy otherwise; `positions` (an int, a slice or a list) indexes the positions axis. See
        store/stacked.py."""
        from .stacked import stack

        return stack(self, name, samples, positions)

    def tokens(self, name: str, batch_size: int, shuffle: bool = True, seed: int = 0, *, rank: int = 0,
               world: int = 1, drop_last: bool = False, index: bool = False) -> Any:
        """Batches [n, d] of the token rows of the kept value `name` over every sample and position (padding the
        store's mask marks left out), for SAE and probe training: shuffled by `seed`, process `rank` of `world`
        taking a disjoint part; `index=True` yields (batch, [n, 2] of (sample, position)). A torch
        IterableDataset (`DataLoader(..., batch_size=None)`); see store/stacked.py."""
        from .stacked import TokenBatches

        return TokenBatches(self, name, batch_size, shuffle, seed, rank, world, drop_last, index)

    def tensor(self, sample: int, container_id: str) -> torch.Tensor:
        """The kept tensor of step `container_id` (or of the step named so: `"h.3:output"`, see `steps`) of input
        `sample`. It shares no memory with another read: a view of a copy-on-write mapping of its own (a
        tensor of 64 KiB or more; written into, it changes, the store and later reads do not), or a copy.

        The view lies where safetensors puts it, aligned to its element size only: a matrix product run on it
        may round the last bits otherwise than on an aligned copy (BLAS picks its kernels by alignment), so
        replay an input from `scope(sample)` (aligned clones) to compare bit for bit with the stored steps."""
        self._open_shards(self._commit_of(sample))
        key = f"{int(sample)}/{container_id}"
        name = self._index.get(key)
        if name is None and isinstance(container_id, str) and ":" in container_id:  # a step's name
            rows = self.steps[(self.steps["sample"] == int(sample)) & (self.steps["name"] == container_id)]
            if len(rows):
                key = f"{int(sample)}/{rows['container_id'].iloc[0]}"
                name = self._index.get(key)
        if name is None:
            raise KeyError(f"sample {sample} has no kept tensor {container_id!r}: the store keeps "
                           f"{self.options.keep or 'the inputs only'}; its statistics are in store.steps")
        return self._opened[name].tensor(key)

    def trace(self, sample: int) -> ActivationTrace:
        """Input `sample` as an ActivationTrace: its steps in order, kept tensors as (mapped) values."""
        commit = self._commit_of(sample)
        self._open_shards(commit)
        table = self._read_table([self.path / commit.steps_file], int(sample))
        steps = []
        for row in table.to_pylist():
            key = f"{row['sample']}/{row['container_id']}"
            name = self._index.get(key)
            value = self._opened[name].tensor(key) if name is not None else None
            container = TensorContainer(shape=tuple(row["shape"]), dtype=row["dtype"], value=value,
                                        container_id=row["container_id"], slot_type=row["slot_type"])
            steps.append(TraceStep(row["step"], row["container_id"], row["description"], row["slot_type"],
                                   row["out_var"], row["op_name"], row["block_path"], container, None,
                                   row["frame_depth"], row["omitted"] if value is None and row["omitted"] else
                                   (None if value is not None else NOT_KEPT)))
        steps.sort(key=lambda s: s.step)
        return ActivationTrace(steps, root=self.identity.model_class)

    def scope(self, sample: int) -> dict:
        """The tensor inputs of `sample` ({name: tensor}), to run it again (the inspector, say)."""
        scope = {}
        for step in self.trace(sample):
            if step.slot_type == "input" and step.value is not None and "[" not in step.out_var:
                scope[step.out_var] = step.value.clone()
        return scope

    # -- reductions -----------------------------------------------------------------------------

    def _states(self) -> dict[str, ReductionState]:
        if self._reductions is None:
            o = self.options
            merged: dict[str, ReductionState] = {}
            for commit in self.commits:  # in unit order: the merge order is fixed, whoever wrote the units
                path = self.path / commit.reductions_file
                size = dict(commit.sizes)[commit.reductions_file]
                shard = ShardFile(path, self.limits, size)
                text = shard.metadata.get("reductions")
                if text is None:
                    raise MalformedFileError(f"{path}: no reductions metadata")
                # bounded by the whole file's size, as its header is (store/shards.py)
                budget = decode_budget(shard.size, self.limits, str(path), held=len(text))
                items = parse_json(text, self.limits, f"{path} (reductions)", budget)
                if not isinstance(items, tuple):
                    raise MalformedFileError(f"{path}: the reductions metadata is not an array")
                for name, state in decode_states(items, shard, o.bins, o.low, o.high, o.top_k, str(path)).items():
                    if name not in merged:
                        merged[name] = ReductionState(o.bins, o.low, o.high, o.top_k)
                    merged[name].merge(state)
            self._reductions = merged
        return self._reductions

    def _aliases(self) -> dict[str, str]:
        """{name: the key its reductions are written under}. The writer keys a kept variable's reductions by
        `block_path:out_var` and its binding's ordinal among the kept steps of an input (`GPT2Model:hidden_states#4`,
        the caller's fourth kept binding); each kept step of `steps` gives the name of its key. A key whose steps
        bear different names in different inputs (control flow that differs) keeps only its key."""
        if self._named is None:
            states = self._states()
            kept = self.steps[self.steps["kept"]]
            found: dict[str, set] = {}
            for _, rows in kept.groupby("sample", sort=False):
                seen: dict[str, int] = {}
                for block_path, out_var, name in zip(rows["block_path"], rows["out_var"], rows["name"]):
                    key = f"{block_path}:{out_var}"
                    count = seen[key] = seen.get(key, 0) + 1
                    key = key if count == 1 else f"{key}#{count}"
                    if key in states:
                        found.setdefault(key, set()).add(name)
            self._named = {next(iter(n)): key for key, n in found.items() if len(n) == 1}
        return self._named

    @property
    def variables(self) -> list[str]:
        """The kept variables that have reductions, by name (`h.3:output`, `h.3.attn:attn_output`; see `steps`).
        `reduction` takes these or the keys they are written under (`GPT2Model:hidden_states#4`)."""
        named = self._aliases()
        keys = set(named.values())
        return sorted(list(named) + [key for key in self._states() if key not in keys])

    def reduction(self, variable: str) -> Reduction:
        """The reductions of `variable` over the whole store (see store/reductions.py): a name of `variables`,
        or the caller's ordinal it is written under (`GPT2Model:hidden_states#4` for `h.3:output`)."""
        states = self._states()
        key = self._aliases().get(variable, variable) if isinstance(variable, str) else variable
        state = states.get(key)
        if state is None:
            import difflib

            known = self.variables
            close = difflib.get_close_matches(str(variable), known, n=3)
            raise KeyError(f"no reductions for {variable!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if
                                                              close else f"; the store has {len(known)} variables"))
        return Reduction.of(variable, state)


def _names(steps: Any) -> Any:
    """The `name` column of a `steps` DataFrame sorted by sample and step (`selection.value_name`, `#n` from the
    second step of a name in an input); `STEP_NAME_SQL` gives the same in DuckDB."""
    import pandas as pd

    base = pd.Series([value_name(*row) for row in zip(steps["block_path"], steps["out_var"], steps["op_name"],
                                                      steps["slot_type"], steps["description"])],
                     index=steps.index, dtype=object)
    if not len(base):
        return base
    n = pd.DataFrame({"s": steps["sample"], "b": base}).groupby(["s", "b"], sort=False).cumcount() + 1
    return base.where(n == 1, base + "#" + n.astype(str))
