"""What `HeldObjects` sees written into the objects names hold, and how it names each write
(parser/held_objects.py), on real objects: no mocks."""

from __future__ import annotations

import collections
import logging
import sys
import types

import torch

from nnschemaparser.parser.held_objects import HeldObjects
from nnschemaparser.parser.python_state import PythonState


class _Box:
    def __init__(self) -> None:
        self.count = 0
        self.cache: dict = {}
        self.deeper = {"inner": []}


class _Making(collections.OrderedDict):
    """A dict whose __getitem__ makes a new object each time (transformers' ACT2FN)."""

    def __getitem__(self, key):
        return list(super().__getitem__(key))


def _watch(**names) -> HeldObjects:
    held = HeldObjects()
    for name, value in names.items():
        held.add(f"m.{name}", value)
    return held


def test_writes_two_levels_in_are_named_by_the_path_to_them():
    box, counts, recent, total = _Box(), collections.defaultdict(int), collections.deque(), torch.zeros(3)
    held = _watch(BOX=box, COUNTS=counts, RECENT=recent, TOTAL=total)
    assert held.changed() == []
    box.count += 1
    box.cache["k"] = 1
    counts[5] += 1
    recent.append(1)
    total[1] += 1
    assert sorted(held.changed()) == ["m.BOX.cache['k']", "m.BOX.count", "m.COUNTS[5]", "m.RECENT[...]",
                                      "m.TOTAL (a tensor changed in place)"]


def test_a_write_three_levels_in_is_not_seen():
    box = _Box()
    held = _watch(BOX=box)
    box.deeper["inner"].append(1)  # BOX -> its dict `deeper` -> the list: one level past what is watched
    assert held.changed() == []
    box.deeper["new"] = 1
    assert held.changed() == ["m.BOX.deeper['new']"]


def test_a_dict_subclass_is_read_without_its_getitem():
    making = _Making(a=(1, 2))
    held = _watch(ACT=making)
    assert held.changed() == []  # its __getitem__ would give a new list on every read


def test_an_inference_tensor_is_compared_by_its_bits():
    with torch.inference_mode():
        frozen = torch.zeros(4)
    held = _watch(FROZEN=frozen)
    assert held.changed() == []
    with torch.inference_mode():
        frozen.add_(1)
    assert held.changed() == ["m.FROZEN (a tensor changed in place)"]


def test_a_global_generator_drawn_from_is_named():
    generator = torch.Generator().manual_seed(0)
    held = _watch(GEN=generator)
    torch.rand(2, generator=generator)
    assert held.changed() == ["m.GEN (a generator drew numbers)"]


def test_loggers_functions_and_modules_are_not_looked_into():
    logger = logging.getLogger("tests.held_objects")
    held = _watch(LOG=logger, FN=test_loggers_functions_and_modules_are_not_looked_into, MOD=types)
    assert held.items == []
    logger.isEnabledFor(logging.INFO)  # fills the logger's level cache: bookkeeping, not state


def test_a_run_watch_records_the_globals_of_modules_reached_at_run_time_and_keeps_a_tracer_set():
    module = types.ModuleType("held_objects_reached")
    exec("STATE = {'n': 0}\ndef bump():\n    STATE['n'] += 1\n", module.__dict__)
    calls: list = []

    def tracer(frame, event, arg):
        calls.append(frame.f_code.co_name)

    state = PythonState.empty()
    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        with state.watching_run():
            module.bump()  # found at run time: no name of a model leads to it
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(before)
    assert "bump" in calls  # the tracer that was set still saw the call
    assert state.changed() == ["held_objects_reached.STATE['n']"]


class _Refusing(collections.deque):
    def __iter__(self):
        raise RuntimeError("no iterating me")


def test_a_module_whose_globals_cannot_be_fingerprinted_is_said_and_the_run_goes_on():
    module = types.ModuleType("held_objects_refusing")
    exec("def run():\n    return 3\n", module.__dict__)
    module.ODD = _Refusing()
    state = PythonState.empty()
    with state.watching_run():
        assert module.run() == 3  # the refusal stays out of the run
    assert state.changed() == ["held_objects_refusing.ODD could not be fingerprinted (RuntimeError: no iterating me)"]


def test_an_object_that_refuses_to_be_read_is_said_not_skipped():
    held = _watch(ODD=_Refusing(), FINE=[1])
    assert held.changed() == ["m.ODD could not be fingerprinted (RuntimeError: no iterating me)"]
