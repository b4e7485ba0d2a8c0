"""`retain_freed_memory` (traces/heap.py): glibc keeps freed blocks for reuse, and captures stay exact.

It changes malloc for the whole process, so what it does is run in a child process; the pytest
process never calls it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnschemaparser import HeapRetention, retain_freed_memory

ROOT = Path(__file__).resolve().parents[2]
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

CHILD = textwrap.dedent("""
    import ctypes, json, resource, sys

    libc = ctypes.CDLL("libc.so.6")
    libc.posix_memalign.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t)
    libc.free.argtypes = (ctypes.c_void_p,)

    def aligned_block_faults(rounds=8, size=1024 * 1024):
        # torch's allocation pattern: posix_memalign(64, n), written, freed; the faults of each round
        faults = []
        for _ in range(rounds):
            block = ctypes.c_void_p()
            assert libc.posix_memalign(ctypes.byref(block), 64, size) == 0
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ctypes.memset(block, 1, size)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
            libc.free(block)
        return faults

    faults_before = max(aligned_block_faults()[1:])  # first, while no freed block of that size waits in the heap
    import torch
    from nnschemaparser import NNParser, capture_run, retain_freed_memory
    from tests.support.diverge_models import gpt2

    model, inputs = gpt2(layers=1, seq=64, n_embd=512, n_head=8)  # MLP values of 512 KiB, above glibc's 128 KiB
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    with torch.no_grad():
        before = capture_run(schema, dict(inputs))
        settings = retain_freed_memory()
        faults_after = aligned_block_faults()[-1]
        captures = [capture_run(schema, dict(inputs)) for _ in range(3)]
        eager = model(**inputs).logits
    steps = [[s.value for s in record.trace.steps] for record in [before] + captures]
    def same(a, b):
        if not isinstance(a, torch.Tensor):
            return type(a) is type(b)
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    exact = all(len(other) == len(steps[0]) and all(map(same, steps[0], other)) for other in steps[1:])
    tensors = sum(isinstance(t, torch.Tensor) for t in steps[0])
    print(json.dumps({"settings": [settings.mmap_threshold, settings.trim_threshold, settings.libc_version],
                      "faults_before": faults_before, "faults_after": faults_after, "steps": tensors,
                      "exact": exact, "outputs": all(torch.equal(r.outputs[0].logits, eager) for r in captures)}))
""")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc parameters exist only with glibc")
def test_retained_memory_reuses_freed_blocks_and_captures_stay_exact():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["settings"][:2] == [32 * 1024 * 1024, 1 << 30]
    assert result["settings"][2] == platform.libc_ver()[1]
    # glibc's default maps a freed-then-requested aligned block afresh (a fault per 4 KiB page) again and again;
    # once the freed memory is retained, the same block is served from the heap with no fault
    assert result["faults_before"] >= 200
    assert result["faults_after"] <= 8
    assert result["steps"] > 20
    assert result["exact"] and result["outputs"]


@pytest.mark.parametrize("kwargs, words", [
    ({"mmap_threshold": 64 * 1024 * 1024}, "over glibc's bound"),
    ({"mmap_threshold": -1}, "an int >= 0"),
    ({"trim_threshold": 1.5}, "an int >= 0"),
    ({"trim_threshold": True}, "an int >= 0"),
    ({"trim_threshold": 1 << 40}, "does not fit mallopt's int"),
])
def test_thresholds_out_of_range_are_refused_before_anything_is_set(kwargs, words):
    with pytest.raises(ValueError, match=words):
        retain_freed_memory(**kwargs)


def test_heap_retention_is_a_plain_record():
    settings = HeapRetention(1, 2, "2.36")
    assert (settings.mmap_threshold, settings.trim_threshold, settings.libc_version) == (1, 2, "2.36")
    with pytest.raises(AttributeError):
        settings.mmap_threshold = 3
