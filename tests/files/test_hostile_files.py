"""Every file of the hostile corpus is refused with a typed error, runs nothing and allocates little.

The corpus (tests/support/hostile_corpus.py) mutates valid schema and trace files and adds hand-written
attacks whose payloads all aim at one canary file. For each entry: loading raises the expected
SchemaFormatError subclass, the canary does not exist afterwards, the peak of Python allocations
while loading stays within FileLimits.max_decode_ratio (4) times the file (a file under 64 KiB
counting as 64 KiB; a load with the model may add the model's own cost, measured alone), and no
tensor of a refused trace is materialised. Real files (GPT-2 and Llama built from their configs,
their schemas and traces) load within the same bound; the decoder's charges bound what it allocates.
"""

import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from tests.support.hostile_bombs import BOMB_BYTES, BUILDERS, PAYLOADS
from tests.support.hostile_corpus import CanaryModel, build_corpus, model_factory, touch_canary
from tests.support.hostile_memory import bound, load_peak, model_cost, peak_of, real_files, warm

from nnschemaparser import SchemaInterpreter
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    SMALL_FILE_BYTES,
    UnsafeReferenceError,
    decode_budget,
    parse_json,
)
from nnschemaparser.files import file_format, trace_file
from nnschemaparser.files.schema_file import load_schema
from nnschemaparser.files.trace_file import load_trace

CANARY = Path(tempfile.gettempdir()) / f"nnschemaparser-canary-{os.getpid()}"
CORPUS = build_corpus(str(CANARY))
RATIO = 4  # the issue's bound: a load's memory within 4 times the file


@pytest.fixture(scope="module", autouse=True)
def warmed(tmp_path_factory):
    """The allowlist's table is built once per process, before any file is measured."""
    warm(tmp_path_factory.mktemp("warm"))


@pytest.fixture(scope="module")
def corpus_model_cost():
    """What a bound load spends on the corpus model itself (lowering and encoding it), measured alone."""
    return model_cost(model_factory())


@pytest.fixture
def no_tensor_materialised(monkeypatch):
    calls = []
    original = trace_file.materialise
    monkeypatch.setattr(trace_file, "materialise", lambda *args: calls.append(len(args[1])) or original(*args))
    yield calls


@pytest.mark.parametrize("entry", CORPUS, ids=[entry.name for entry in CORPUS])
def test_hostile_file_is_refused_with_a_typed_error_and_runs_nothing(entry, tmp_path, no_tensor_materialised,
                                                                      corpus_model_cost):
    path = tmp_path / "hostile.bin"
    path.write_bytes(entry.data)
    model = model_factory() if entry.kind == "schema" and entry.with_model else None
    peak, error = load_peak(path, entry.kind, entry.limits, model)
    assert isinstance(error, entry.error), f"{entry.name}: {type(error).__name__}: {error}"
    assert isinstance(error, SchemaFormatError)
    assert str(error), "the error must say what is wrong"
    assert not CANARY.exists(), f"{entry.name}: code from the file ran"
    size = len(entry.data)
    own = corpus_model_cost if model is not None else 0  # the model's lowering: the model's cost, not the file's
    assert peak - own <= bound(size, entry.limits), (f"{entry.name}: loading took {(peak - own) / size:.2f} times "
                                                     f"its {size} bytes")
    if size >= SMALL_FILE_BYTES and (entry.limits is None or entry.limits.max_decode_ratio <= RATIO):
        assert peak - own <= RATIO * size
    if entry.notes.get("bound"):
        assert size >= BOMB_BYTES - 64
        assert isinstance(error, FileLimitError) and "FileLimits(max_decode_ratio=...)" in str(error)
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
    from tests.support.hostile_corpus import _inputs, base_files

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


def test_a_nested_empty_list_bomb_of_the_issues_size_is_refused_typed_within_the_bound(tmp_path):
    """Issue 13: 16 MiB cost +800 MiB before its refusal (64 MiB, a MemoryError under a 3 GiB cap).

    Its identical containers decode to one shared object, so the document is a table of pointers
    (2.3 times the file) and the record checks refuse it. Measured by the decoder's own charges
    (tracemalloc would take minutes on 16 MiB; the tests below show the charges bound what it
    allocates).
    """
    unit = b"[[],[[]],{}],"
    text = b"[" + unit * (16 * 1024 * 1024 // len(unit)) + b"[]]"
    limits = FileLimits()
    budget = decode_budget(len(text), limits, "bomb", held=len(text))
    document = parse_json(text, limits, "bomb", budget)
    assert budget.peak <= RATIO * len(text), f"{budget.peak / len(text):.2f} times the file"
    path = tmp_path / "bomb.json"
    path.write_bytes(text)
    with pytest.raises(MalformedFileError, match="top level"):
        load_schema(path)
    assert len(document) == 16 * 1024 * 1024 // len(unit) + 1


def test_a_dense_bomb_is_refused_by_the_budget_naming_the_fix(tmp_path):
    path = tmp_path / "bomb.json"
    path.write_bytes(b"[" + b"[]," * (256 * 1024 // 3) + b"[]]")
    size = path.stat().st_size
    peak, error = peak_of(lambda: load_schema(path))
    assert isinstance(error, FileLimitError)
    assert "4 times the text" in str(error) and "FileLimits(max_decode_ratio=...)" in str(error)
    assert peak <= RATIO * size, f"{peak / size:.2f} times the file"


def _charged_and_measured(text, limits=FileLimits(max_decode_ratio=10 ** 6)):
    budget = decode_budget(len(text), limits, "t")
    peak, error = peak_of(lambda: parse_json(text, limits, "t", budget))
    assert error is None, error
    return budget.peak, peak


# What the decoder's charges do not cover, whatever the text: the match object and token in hand
# (the charges count every object decoding keeps or piles up).
UNCHARGED = 2048


@pytest.mark.parametrize("text", [b"[]", b"{}", b'{"a":[1,2.5,"x",{"b":null}]}', PAYLOADS["floats"][0][:4096] + b"]",
                                  b'{"k": "\\u00e9\\"x"}', "{\"str input\": [1, 2, [3]]}"])
def test_the_decoders_charges_bound_what_decoding_allocates(text):
    charged, measured = _charged_and_measured(text)
    assert measured <= charged + UNCHARGED, f"{measured} allocated, {charged} charged"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_decoders_charges_bound_what_every_bomb_kind_allocates(name):
    charged, measured = _charged_and_measured(BUILDERS[name][0](50_000))
    assert measured <= charged + UNCHARGED, f"{name}: {measured} allocated, {charged} charged"


def test_a_memory_error_while_decoding_is_a_typed_refusal(monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(file_format, "decode_bounded", exhausted)
    with pytest.raises(FileLimitError, match="out of memory"):
        parse_json(b"{}", FileLimits(), "t")


def test_decoded_size_limits_refuse_a_real_file_when_set_low(tmp_path):
    from tests.support.hostile_corpus import base_files

    path = tmp_path / "schema.json"
    path.write_bytes(base_files()["schema"])
    assert load_schema(path) is not None
    with pytest.raises(FileLimitError, match="max_decoded_bytes"):
        load_schema(path, limits=FileLimits(max_decoded_bytes=4096))
    # a 26 KB file counts as 64 KiB: at 1x it may take 64 KiB, less than it needs (about 100 KB)
    with pytest.raises(FileLimitError, match="times the text"):
        load_schema(path, limits=FileLimits(max_decode_ratio=1))


def test_the_default_decode_ratio_is_the_issues_bound():
    assert FileLimits().max_decode_ratio == RATIO
    assert bound(0) == RATIO * SMALL_FILE_BYTES == 256 * 1024


# --- real files -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformer_files(tmp_path_factory):
    """GPT-2 and Llama built from their configs: their schema files (with the model) and traces."""
    return real_files(tmp_path_factory.mktemp("real"))


@pytest.mark.parametrize("index", range(4), ids=["gpt2-schema", "gpt2-trace", "llama-schema", "llama-trace"])
def test_real_files_load_within_four_times_their_size(index, transformer_files):
    label, kind, path, model = transformer_files[index]
    size = path.stat().st_size
    assert size >= SMALL_FILE_BYTES, "a real file big enough for the ratio to be the bound"
    peak, error = load_peak(path, kind)
    assert error is None, error
    assert peak <= RATIO * size, f"{label}: {peak / size:.2f} times the file"
    if model is not None:
        peak, error = load_peak(path, kind, model=model)
        assert error is None, error
        own = model_cost(model)
        assert peak - own <= RATIO * size, f"{label} with the model: {(peak - own) / size:.2f} times the file"


@pytest.mark.parametrize("index", range(4), ids=["gpt2-schema", "gpt2-trace", "llama-schema", "llama-trace"])
def test_the_decoders_charges_bound_what_a_real_file_allocates(index, transformer_files):
    charged, measured = _charged_and_measured(Path(transformer_files[index][2]).read_bytes()
                                              if transformer_files[index][1] == "schema" else
                                              _header(transformer_files[index][2]))
    assert measured <= charged + UNCHARGED, f"{measured} allocated, {charged} charged"


def _header(path):
    import struct

    data = Path(path).read_bytes()
    return data[8:8 + struct.unpack("<Q", data[:8])[0]]
