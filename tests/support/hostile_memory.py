"""Per-file peak memory of loading files: `python tests/support/hostile_memory.py` prints the figures.

For every entry of the hostile corpus, and for real files (the schemas and activation traces of
GPT-2 and Llama built from their configs, nnschemaparser.validation.zoo): the file's size, the peak
of Python allocations (tracemalloc) while it is loaded or refused, and the ratio. A load with the
model also lowers the model and encodes that lowering to compare it with the file: that is the
model's cost, not the file's, so it is measured alone (`model_cost`) and shown apart. The
allowlist's table, built once per process, is built before measuring (`warm`).
tests/files/test_hostile_files.py asserts the same bound, file by file: FileLimits.max_decode_ratio (4)
times the file, a file under SMALL_FILE_BYTES (64 KiB) counting as 64 KiB.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: make `tests.support` importable

from tests.support.hostile_corpus import base_files, build_corpus, model_factory  # noqa: E402

from nnschemaparser.files.file_format import SMALL_FILE_BYTES, FileLimits  # noqa: E402
from nnschemaparser.files.schema_codec import SchemaEncoder  # noqa: E402
from nnschemaparser.files.schema_file import load_schema, save_schema  # noqa: E402
from nnschemaparser.files.trace_file import load_trace, save_trace  # noqa: E402
from nnschemaparser.files.verification import lower_model  # noqa: E402

__all__ = ["bound", "peak_of", "load_peak", "model_cost", "real_files", "warm"]


def bound(size: int, limits: Optional[FileLimits] = None) -> int:
    """What loading a `size`-byte file may allocate: max_decode_ratio times it, 64 KiB at least."""
    return (limits or FileLimits()).max_decode_ratio * max(size, SMALL_FILE_BYTES)


def peak_of(action: Callable[[], Any]) -> tuple[int, Optional[BaseException]]:
    """The peak of Python allocations while `action` runs, and the exception it raised (or None)."""
    gc.collect()
    tracemalloc.start()
    error = None
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - a refusal is measured like a load
        error = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, error


def load_peak(path: Path, kind: str, limits: Optional[FileLimits] = None, model: Any = None):
    if kind == "schema":
        return peak_of(lambda: load_schema(path, model=model, limits=limits))
    return peak_of(lambda: load_trace(path, limits=limits))


def model_cost(model: Any) -> int:
    """The peak of what a bound load spends on the model itself: lowering it, encoding that lowering."""
    return peak_of(lambda: SchemaEncoder().document(lower_model(model)))[0]


def warm(folder: Path) -> None:
    """Build what a process builds once (the allowlist's table) before anything is measured."""
    for label, data in base_files().items():
        path = folder / f"warm-{label}"
        path.write_bytes(data)
        if label == "schema":
            load_schema(path, model=model_factory())
        else:
            load_trace(path)


def real_files(folder: Path) -> list[tuple[str, str, Path, Any]]:
    """(name, kind, path, model) of GPT-2's and Llama's schema and activation trace, built from configs."""
    from nnschemaparser import NNParser
    from nnschemaparser.traces.record import capture_run
    from nnschemaparser.validation.zoo import get_case

    files = []
    for name in ("gpt2", "llama"):
        case = get_case(name)
        model = case.build().eval()
        schema = NNParser.parse_model(model, inputs_tensors_values=case.make_inputs(model))
        files.append((f"{name}-schema", "schema", save_schema(schema, folder / f"{name}.json"), model))
        record = capture_run(block=schema, scope=case.make_inputs(model))
        files.append((f"{name}-trace", "trace", save_trace(record.trace, folder / f"{name}.safetensors"), None))
    return files


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        warm(folder)
        path = folder / "hostile.bin"
        canary = folder / "canary"
        corpus_cost = model_cost(model_factory())
        rows = []
        for entry in build_corpus(str(canary)):
            path.write_bytes(entry.data)
            model = model_factory() if entry.kind == "schema" and entry.with_model else None
            peak, _ = load_peak(path, entry.kind, entry.limits, model)
            assert not canary.exists(), entry.name
            rows.append((entry.name, len(entry.data), peak, corpus_cost if model is not None else 0,
                         bool(entry.notes.get("bound"))))
        real = []
        for label, kind, file, model in real_files(folder):
            size = file.stat().st_size
            real.append((label, size, load_peak(file, kind)[0], 0, False))
            if model is not None:
                real.append((label + " (with the model)", size, load_peak(file, kind, model=model)[0],
                             model_cost(model), False))

    def line(row) -> str:
        name, size, peak, cost, _ = row
        model = f"  (model's own: {cost / 1024:8.1f} KiB, file's: {(peak - cost) / size:5.2f}x)" if cost else ""
        ratio = f"{peak / size:6.2f}x" if size else "  (empty file)"
        return f"{name:58s} {size:9d} B  peak {peak:10d} B  {ratio}{model}"

    for row in rows + real:
        print(line(row))

    def worst(selected) -> str:
        if not selected:
            return "none"
        name, size, peak, cost, _ = max(selected, key=lambda r: (r[2] - r[3]) / max(r[1], 1))
        return f"{(peak - cost) / max(size, 1):.2f}x ({name}, {size} B)"

    big = SMALL_FILE_BYTES
    print(f"\n{len(rows)} corpus files, {len(real)} real loads; largest peak / size (a load with the model: less the "
          "model's own cost):")
    print(f"  corpus files of {big // 1024} KiB and more:", worst([r for r in rows if r[1] >= big]))
    print("  bombs refused by the memory budget:", worst([r for r in rows if r[4]]))
    print("  real files (GPT-2, Llama: schemas and traces):", worst(real))
    small = [r for r in rows if r[1] < big]
    print(f"  files under {big // 1024} KiB: at most {max(r[2] - r[3] for r in small) / 1024:.1f} KiB "
          f"(the bound: {bound(0) // 1024} KiB); the largest ratio {worst(small)}")
    print("  largest peak of any file:", max(r[2] for r in rows + real), "B")


if __name__ == "__main__":
    main()
