"""Capture memory (traces/capture_memory.py): a dropped capture's heap kept for the next one, and given back.

The pin changes the process's heap, so everything runs in child processes (one per setting); the
pytest process only checks arguments.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nnschemaparser import CaptureMemory, keep_capture_memory

ROOT = Path(__file__).resolve().parents[2]
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

CHILD = textwrap.dedent("""
    import dataclasses, gc, json, resource, sys, time
    import torch
    from nnschemaparser import (NNParser, capture_memory_held, capture_run, keep_capture_memory,
                                release_capture_memory, retain_freed_memory)
    from nnschemaparser.traces import capture_memory
    from tests.support.diverge_models import gpt2

    setting = sys.argv[1]
    if setting == "off":
        keep_capture_memory(False)
    elif setting == "idle":  # long enough that a slow machine cannot pass it between a capture and a look
        keep_capture_memory(idle_seconds=60.0)

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def held():
        return dataclasses.asdict(capture_memory_held())

    def same(a, b):
        if not isinstance(a, torch.Tensor):
            return type(a) is type(b)
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

    # MLP values of 1 MiB, above glibc's first mapping threshold (128 KiB): the first capture's are
    # mapped, and unmapping them raises the threshold, so the later ones come from the heap
    model, inputs = gpt2(layers=2, seq=64, n_embd=512, n_head=8)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    out = {"setting": setting}
    torch.set_num_threads(1)
    with torch.no_grad():
        eager = model(**inputs).logits
        counts = []
        for _ in range(6):  # a user's loop: capture, read, drop, and an eager run between
            start = faults()
            record = capture_run(schema, dict(inputs))
            counts.append(faults() - start)
            del record
            model(**inputs)
        out.update(faults=counts[2:], held=held())
        if setting == "idle":
            # no capture for longer than idle_seconds: the watch thread releases the pin the loop left
            keep_capture_memory(idle_seconds=0.2)
            deadline = time.monotonic() + 30
            while capture_memory_held().pin_bytes and time.monotonic() < deadline:
                time.sleep(0.05)
            out["after_idle"] = held()
            print(json.dumps(out))
            sys.exit(0)
        if setting == "pin":
            out["released_first"] = release_capture_memory()
            # a pin placed now that every cache of the run is made: nothing long-lived lands below it
            capture_run(schema, dict(inputs))  # and dropped
            out["held_warm"] = held()
            gc.collect()
            before = rss()
            out["released"] = release_capture_memory()
            out["rss_drop"] = before - rss()
            out["after_release"] = held()
            out["release_again"] = release_capture_memory()
        # two records kept at once, on the heap earlier captures freed: equal to each other and to eager
        first, second = capture_run(schema, dict(inputs)), capture_run(schema, dict(inputs))
        steps = [[s.value for s in record.trace.steps] for record in (first, second)]
        out["steps"] = len(steps[0])
        out["exact"] = (len(steps[0]) == len(steps[1]) and all(map(same, *steps))
                        and all(torch.equal(r.outputs[0].logits, eager) for r in (first, second)))
        # dropped together: twice what one capture kept is past the bound, so the next capture's start
        # releases the pin
        del first, second, steps
        out["two_dropped"] = held()
        capture_memory.capture_started()
        out["after_bound_check"] = held()
        if setting == "pin":
            capture_run(schema, dict(inputs))
            out["switched_off"] = dataclasses.asdict(keep_capture_memory(False))
        else:  # switched on again, once retain_freed_memory() keeps freed memory for the whole process
            keep_capture_memory(True)
            retain_freed_memory()
            for _ in range(3):
                capture_run(schema, dict(inputs))
            out["after_retain"] = held()
    print(json.dumps(out))
""")

# An allocator other than glibc's, preloaded as jemalloc or tcmalloc would be: its own `malloc` and
# friends (here forwarding to glibc's internal entry points, so the test needs no allocator package).
SHIM = """
#include <stddef.h>
extern void *__libc_malloc(size_t); extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t); extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t a, size_t b) { return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { return __libc_memalign(a, n); }
void *valloc(size_t n) { return __libc_memalign(4096, n); }
int posix_memalign(void **r, size_t a, size_t n) {
    void *p = __libc_memalign(a, n); if (!p) return 12; *r = p; return 0;
}
"""


def run_child(setting: str, preload: str = "") -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, "-c", CHILD, setting], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def unpinned():
    return run_child("off")


@pytest.fixture(scope="module")
def pinned():
    return run_child("pin")


@pytest.mark.skipif(not GLIBC, reason="the pin is placed only with glibc's malloc")
def test_later_captures_reuse_the_freed_heap_and_release_gives_it_back(pinned, unpinned):
    assert pinned["exact"] and unpinned["exact"] and pinned["steps"] > 20
    # without the pin glibc trims what each dropped capture freed, and the next one faults it in again
    # (the median: now and then a block that outlives a capture lands at the top and keeps it once)
    control = sorted(unpinned["faults"])[len(unpinned["faults"]) // 2]
    assert control >= 1000
    assert unpinned["held"]["placed"] == 0 and unpinned["held"]["pin_bytes"] == 0
    # with it, the next capture's values land on the freed chunks below it: no fresh pages (the median
    # again: now and then a block made by one capture lands where the next one's values would go)
    assert sorted(pinned["faults"])[len(pinned["faults"]) // 2] * 10 <= control
    assert sum(pinned["faults"]) * 3 <= sum(unpinned["faults"])
    held = pinned["held"]
    assert held["enabled"] and held["reason"] == "" and held["placed"] >= 1 and held["pin_bytes"] >= 64 * 1024
    assert held["retained_bytes"] >= 8 * 2 ** 20  # the dropped capture's values, kept below the pin
    assert held["retained_bytes"] <= held["bound_bytes"]
    assert pinned["released_first"] >= held["retained_bytes"]
    # the release gives it back to the system: the pin is freed and the heap trimmed
    warm = pinned["held_warm"]
    assert warm["pin_bytes"] > 0 and warm["retained_bytes"] >= 8 * 2 ** 20
    assert pinned["released"] >= warm["retained_bytes"]
    assert pinned["rss_drop"] >= warm["retained_bytes"] // 2
    assert pinned["after_release"]["pin_bytes"] == 0 and pinned["after_release"]["retained_bytes"] == 0
    assert pinned["release_again"] == 0


@pytest.mark.skipif(not GLIBC, reason="the pin is placed only with glibc's malloc")
def test_pin_is_released_past_its_bound_and_when_switched_off(pinned):
    two = pinned["two_dropped"]
    assert two["pin_bytes"] > 0 and two["retained_bytes"] > two["bound_bytes"]  # two captures' worth below it
    assert pinned["after_bound_check"]["pin_bytes"] == 0  # a capture's start gives it back
    off = pinned["switched_off"]
    assert not off["enabled"] and off["pin_bytes"] == 0 and off["retained_bytes"] == 0


@pytest.mark.skipif(not GLIBC, reason="the pin is placed only with glibc's malloc")
def test_pin_is_released_by_the_watch_once_no_capture_ran_for_idle_seconds():
    # a separate process: a capture after a release may land wholly in the holes the released captures
    # left below blocks still in use, where no pin can be placed (nor is needed); the loop's pin stands
    idle = run_child("idle")
    held = idle["held"]
    assert held["pin_bytes"] > 0 and held["idle_seconds"] == 60.0 and held["retained_bytes"] <= held["bound_bytes"]
    after = idle["after_idle"]
    assert after["pin_bytes"] == 0 and after["retained_bytes"] == 0 and after["idle_seconds"] == 0.2


@pytest.mark.skipif(not GLIBC, reason="retain_freed_memory needs glibc")
def test_nothing_is_pinned_once_retain_freed_memory_keeps_freed_memory(unpinned):
    held = unpinned["after_retain"]
    assert held["enabled"] and held["placed"] == 0 and held["pin_bytes"] == 0
    assert "retain_freed_memory() was called" in held["reason"]


@pytest.mark.skipif(not GLIBC or shutil.which("cc") is None, reason="needs glibc and a C compiler for the allocator")
def test_nothing_is_pinned_with_another_allocator(tmp_path):
    source = tmp_path / "shim.c"
    source.write_text(SHIM)
    library = tmp_path / "libshim.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    result = run_child("pin", preload=str(library))
    assert result["exact"]
    assert result["held"]["placed"] == 0 and result["held"]["pin_bytes"] == 0 and result["held"]["bound_bytes"] == 0
    assert "malloc is not glibc's" in result["held"]["reason"]
    assert result["released"] == 0 and result["after_release"]["pin_bytes"] == 0


@pytest.mark.parametrize("kwargs, error, words", [
    ({"enabled": "yes"}, TypeError, "True or False"),
    ({"enabled": 1}, TypeError, "True or False"),
    ({"idle_seconds": 0}, ValueError, "> 0"),
    ({"idle_seconds": -1.5}, ValueError, "> 0"),
    ({"idle_seconds": True}, ValueError, "> 0"),
    ({"idle_seconds": "10"}, ValueError, "> 0"),
])
def test_bad_settings_are_refused_before_anything_changes(kwargs, error, words):
    with pytest.raises(error, match=words):
        keep_capture_memory(**kwargs)


def test_capture_memory_is_a_plain_record():
    held = CaptureMemory(True, "", 0, 0, 0, 10.0, 0, 0)
    with pytest.raises(AttributeError):
        held.pin_bytes = 1


DATASET_CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile
    import torch
    from nnschemaparser import NNParser, capture_dataset, capture_memory_held, keep_capture_memory
    from tests.support.diverge_models import gpt2

    keep_capture_memory(sys.argv[1] == "pin")
    torch.set_num_threads(1)
    model, inputs = gpt2(layers=2, seq=64, n_embd=512, n_head=8)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    counts = []
    with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
        for k in range(4):  # each store a fresh one, as a sweep of several datasets would write
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            capture_dataset(schema, [dict(inputs)] * 3, f"{folder}/s{k}", keep="h.1", progress=False)
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
    print(json.dumps({"faults": counts[1:], "placed": capture_memory_held().placed}))
""")


@pytest.mark.skipif(not GLIBC, reason="the pin is placed only with glibc's malloc")
def test_capture_dataset_inputs_reuse_the_heap_the_last_input_freed():
    def child(setting: str) -> dict:
        done = subprocess.run([sys.executable, "-c", DATASET_CHILD, setting], cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    pinned, unpinned = child("pin"), child("off")
    assert pinned["placed"] >= 1 and unpinned["placed"] == 0
    # the store's own files and buffers fault too, alike in both: the capture's values are what differ
    # summed over three stores: the first store after the one that placed the pin may find no freed
    # heap below it, and glibc's adaptive thresholds now and then spare one unpinned store its faults
    assert sum(pinned["faults"]) * 2 <= sum(unpinned["faults"]), (pinned, unpinned)
