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

from hostile_bombs import BOMB_BYTES, BUILDERS, PAYLOADS
from hostile_corpus import CanaryModel, build_corpus, model_factory, touch_canary

from nnschemaparser import SchemaInterpreter
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    UnsafeReferenceError,
    decoded_size_bound,
    parse_json,
)
from nnschemaparser.files.schema_file import load_schema
from nnschemaparser.files.trace_file import load_trace

CANARY = Path(tempfile.gettempdir()) / f"nnschemaparser-canary-{os.getpid()}"
CORPUS = build_corpus(str(CANARY))
# Python allocations while loading one file: at most the decoded-size bound (FileLimits.max_decode_ratio
# times the file) plus a fixed allowance for what does not depend on the file (the model's own
# lowering when loading with the model, caches); a bomb refused by the decoded-size bound before
# decoding costs at most 4 times its size.
SLACK = 1024 * 1024
PRESCAN_RATIO = 4


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
    limits = entry.limits or FileLimits()
    size = len(entry.data)
    assert peak <= limits.max_decode_ratio * max(size, 4096) + SLACK, f"{entry.name}: loading allocated {peak} bytes"
    if entry.notes.get("prescan"):
        assert size >= BOMB_BYTES - 64
        assert peak <= PRESCAN_RATIO * size, f"{entry.name}: {peak / size:.2f} times its size before it was refused"
        assert isinstance(info.value, FileLimitError) and "decode" in str(info.value)
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


def test_the_corpus_has_a_bomb_for_every_container_kind_in_every_json_text():
    names = {entry.name for entry in CORPUS}
    for payload in PAYLOADS:
        assert f"bomb-{payload}" in names and f"bomb-bare-{payload}" in names
        for label in ("activation", "gradient"):
            assert f"trace-{label}-header-bomb-{payload}" in names
            assert f"trace-{label}-metadata-bomb-{payload}" in names


@pytest.mark.parametrize("mebibytes", [16, 64])
def test_a_nested_empty_list_bomb_of_the_issues_size_is_refused_typed_before_decoding(mebibytes, tmp_path):
    """Issue 13: 16 MiB cost +800 MiB before its refusal, 64 MiB a MemoryError under a 3 GiB cap."""
    path = tmp_path / "bomb.json"
    unit = b"[[],[[]],{}],"
    path.write_bytes(b"[" + unit * (mebibytes * 1024 * 1024 // len(unit)) + b"[]]")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(FileLimitError, match="decode"):
            load_schema(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= PRESCAN_RATIO * size, f"{peak / size:.2f} times the file"


@pytest.mark.parametrize("text", [b"[]", b"{}", b'{"a":[1,2.5,"x",{"b":null}]}', PAYLOADS["floats"][0][:4096] + b"]"])
def test_the_decoded_size_bound_bounds_what_decoding_allocates(text):
    tracemalloc.start()
    try:
        parse_json(text, FileLimits(max_decode_ratio=10 ** 6), "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= decoded_size_bound(text)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_decoded_size_bound_holds_for_every_bomb_kind(name):
    text = BUILDERS[name][0](200_000)
    tracemalloc.start()
    try:
        parse_json(text, FileLimits(max_decode_ratio=10 ** 6), "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= decoded_size_bound(text), f"{name}: {peak} > {decoded_size_bound(text)}"


def test_a_memory_error_while_decoding_is_a_typed_refusal(monkeypatch):
    import json as json_module

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(json_module, "loads", exhausted)
    with pytest.raises(FileLimitError, match="out of memory"):
        parse_json(b"{}", FileLimits(), "t")


def test_decoded_size_limits_refuse_a_real_file_when_set_low(tmp_path):
    from hostile_corpus import base_files

    path = tmp_path / "schema.json"
    path.write_bytes(base_files()["schema"])
    assert load_schema(path) is not None
    with pytest.raises(FileLimitError, match="max_decoded_bytes"):
        load_schema(path, limits=FileLimits(max_decoded_bytes=4096))
    with pytest.raises(FileLimitError, match="times the text"):
        load_schema(path, limits=FileLimits(max_decode_ratio=2))
