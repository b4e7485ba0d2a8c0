"""Every file of the hostile corpus is refused with a typed error, runs nothing and allocates little.

The corpus (tests/hostile_corpus.py) mutates valid schema and trace files and adds hand-written
attacks whose payloads all aim at one canary file. For each entry: loading raises the expected
SchemaFormatError subclass, the canary does not exist afterwards, the peak of Python allocations
while loading stays under a bound, and safetensors never materialises a tensor of a refused trace.
"""

import os
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
import safetensors.torch

from hostile_corpus import CanaryModel, build_corpus, model_factory, touch_canary

from nnschemaparser import SchemaInterpreter
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import FileLimitError, FormatVersionError, MalformedFileError, UnsafeReferenceError
from nnschemaparser.files.schema_file import load_schema
from nnschemaparser.files.trace_file import load_trace

CANARY = Path(tempfile.gettempdir()) / f"nnschemaparser-canary-{os.getpid()}"
CORPUS = build_corpus(str(CANARY))
PEAK_LIMIT = 64 * 1024 * 1024  # bytes of Python allocations while loading one file (files are < 1 MiB)


@pytest.fixture
def no_tensor_materialised(monkeypatch):
    calls = []
    original = safetensors.torch.load
    monkeypatch.setattr(safetensors.torch, "load", lambda data: calls.append(len(data)) or original(data))
    yield calls


def _load(entry, path):
    if entry.kind == "schema":
        return load_schema(path, model=model_factory() if entry.with_model else None, limits=entry.limits)
    return load_trace(path, limits=entry.limits)


@pytest.mark.parametrize("entry", CORPUS, ids=[entry.name for entry in CORPUS])
def test_hostile_file_is_refused_with_a_typed_error_and_runs_nothing(entry, tmp_path, no_tensor_materialised):
    path = tmp_path / "hostile.bin"
    path.write_bytes(entry.data)
    tracemalloc.start()
    try:
        with pytest.raises(entry.error) as info:
            _load(entry, path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, SchemaFormatError)
    assert str(info.value), "the error must say what is wrong"
    assert not CANARY.exists(), f"{entry.name}: code from the file ran"
    assert peak < PEAK_LIMIT, f"{entry.name}: loading allocated {peak} bytes"
    assert no_tensor_materialised == [], f"{entry.name}: tensors were built before the file was refused"


def test_corpus_is_large_and_covers_every_refusal():
    assert len(CORPUS) >= 200
    kinds = Counter(entry.kind for entry in CORPUS)
    assert kinds["schema"] >= 100 and kinds["trace"] >= 100
    errors = Counter(entry.error for entry in CORPUS)
    for error in (MalformedFileError, FormatVersionError, FileLimitError, UnsafeReferenceError):
        assert errors[error] >= 10, error
    assert sum(entry.with_model for entry in CORPUS) >= 5


def test_the_canary_fires_when_its_payload_runs(tmp_path):
    """Guards the corpus: the payloads' target is a working canary, so its absence proves something."""
    canary = tmp_path / "canary"
    touch_canary(str(canary))
    assert canary.exists()


def test_the_base_files_the_corpus_mutates_load_and_run(tmp_path):
    """Guards the corpus: the unmutated files are valid, so each refusal comes from its mutation."""
    from hostile_corpus import _inputs, base_files

    files = base_files()
    schema_path = tmp_path / "base.json"
    schema_path.write_bytes(files["schema"])
    model = model_factory()
    loaded = load_schema(schema_path, model=model)
    expected = model(**_inputs())
    got = SchemaInterpreter().call(loaded, **_inputs())
    assert all(a.equal(b) for a, b in zip(expected, got))
    for label in ("activation", "gradient"):
        trace_path = tmp_path / f"{label}.safetensors"
        trace_path.write_bytes(files[label])
        assert len(load_trace(trace_path)) > 0
    assert isinstance(model, CanaryModel)
