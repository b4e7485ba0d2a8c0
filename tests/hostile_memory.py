"""Per-file peak memory of loading the hostile corpus: `python tests/hostile_memory.py` prints the figures.

For every corpus entry: the file's size, the peak of Python allocations (tracemalloc) while it is
loaded and refused, and their ratio; then the largest ratio among bombs refused by the decoded-size
bound, among all files loaded without a model, and among all files. tests/test_hostile_files.py
asserts the same bounds entry by entry.
"""

from __future__ import annotations

import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hostile_corpus import build_corpus, model_factory  # noqa: E402

from nnschemaparser.files.schema_file import load_schema  # noqa: E402
from nnschemaparser.files.trace_file import load_trace  # noqa: E402


def measure() -> list[tuple[str, int, int, bool, bool]]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        canary = Path(folder) / "canary"
        path = Path(folder) / "hostile.bin"
        for entry in build_corpus(str(canary)):
            path.write_bytes(entry.data)
            model = model_factory() if entry.kind == "schema" and entry.with_model else None
            tracemalloc.start()
            try:
                if entry.kind == "schema":
                    load_schema(path, model=model, limits=entry.limits)
                else:
                    load_trace(path, limits=entry.limits)
            except Exception:  # noqa: BLE001 - the corpus is refused; the test checks how
                pass
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert not canary.exists(), entry.name
            rows.append((entry.name, len(entry.data), peak, bool(entry.notes.get("prescan")), entry.with_model))
    return rows


def main() -> None:
    rows = measure()
    for name, size, peak, _, _ in rows:
        print(f"{name:55s} {size:9d} B  peak {peak:10d} B  {peak / size if size else 0:7.2f}x")

    def worst(selected):
        name, size, peak, _, _ = max(selected, key=lambda r: r[2] / max(r[1], 1))
        return f"{peak / size:.2f}x ({name}, {size} B)"

    print(f"\n{len(rows)} files; largest peak/size:")
    print("  bombs refused by the decoded-size bound:", worst([r for r in rows if r[3]]))
    print("  bombs of 1 MiB and more:", worst([r for r in rows if r[1] >= 1 << 20]))
    print("  files of 1 MiB and more, not refused by the bound:", worst([r for r in rows if r[1] >= 1 << 20 and not r[3]]))
    print("  files of 16 KiB and more loaded without the model:", worst([r for r in rows if not r[4] and r[1] >= 1 << 14]))
    print("  files of 16 KiB and more (with the model: includes lowering the model):",
          worst([r for r in rows if r[1] >= 1 << 14]))
    print("  largest peak of any file:", max(r[2] for r in rows), "B")


if __name__ == "__main__":
    main()
