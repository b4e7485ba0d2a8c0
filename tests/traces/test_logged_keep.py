"""capture_run(keep=...) through the kept logged program (traces/keep_plan.py) equals the observed kept capture.

A `keep=` selector is compiled per instruction into a logged program that appends only the kept
tensors, with their numbers in a capture of everything, and counts the rest. Each case runs the
same capture with `observe_all=True` (every step heard as it happens, the path before) and compares
the two record for record: numbers, container ids, paths, descriptions, depths, values `torch.equal`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, capture_run
from nnschemaparser.runtime.program import programs_for
from nnschemaparser.runtime.step_log import KEEP_PROGRAMS
from nnschemaparser.traces.keep_plan import keep_plan
from nnschemaparser.traces.logged import LogSpan
from nnschemaparser.traces.selection import keep_selector
from nnschemaparser.validation import zoo

from tests.support.diverge_models import gpt2, llama
from tests.traces.test_logged_capture import InPlace, assert_same_trace


def _parse(model, inputs):
    return NNParser.parse_model(model=model, inputs_tensors_values=dict(inputs))


def _both(schema, inputs, **options):
    logged = capture_run(schema, dict(inputs), **options)
    observed = capture_run(schema, dict(inputs), observe_all=True, **options)
    return logged, observed


SELECTORS = {
    "gpt2": ["call=**", "call=transformer.h.*", "transformer.h.1", "*:hidden_states", "op=*linear",
             "call=**, slot=output", "transformer.h.0.attn:attn_output call=**, slot=input", "op=Tensor.*"],
    "llama": ["call=**", "call=model.layers.*", "model.layers.1", "*:hidden_states", "op=*linear",
              "call=**, slot=output", "model.layers.0.self_attn call=**, slot=input", "op=Tensor.*",
              "call=model.layers.1.mlp.*_proj"],
}


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_kept_logged_capture_equals_the_observed_kept_capture_for_each_selector(build):
    model, inputs = build(layers=2)
    schema = _parse(model, inputs)
    with torch.no_grad():
        full = capture_run(schema, dict(inputs))
        numbers = {s.step: s for s in full.trace.steps}
        for keep in SELECTORS[build.__name__]:
            logged, observed = _both(schema, inputs, keep=keep)
            assert_same_trace(logged, observed)
            assert len(logged.trace) > 0, keep
            for step in logged.trace.steps:  # what a capture of everything holds at that number
                same = numbers[step.step]
                assert (same.container_id, same.out_var, same.block_path) == \
                    (step.container_id, step.out_var, step.block_path), keep
                assert torch.equal(same.value, step.value), keep
            for a, b in zip(logged.outputs, observed.outputs):
                assert torch.equal(a.last_hidden_state if hasattr(a, "last_hidden_state") else a.logits,
                                   b.last_hidden_state if hasattr(b, "last_hidden_state") else b.logits)


def test_every_module_output_is_what_forward_hooks_with_clone_see():
    model, inputs = llama(layers=2)
    schema = _parse(model, inputs)
    seen = {}

    def hook(module, args, out, name):
        if isinstance(out, torch.Tensor):
            seen.setdefault(name, out.clone())

    handles = [module.register_forward_hook(lambda m, a, out, name=name: hook(m, a, out, name))
               for name, module in model.named_modules() if name]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        record = capture_run(schema, dict(inputs), keep="call=**")
    assert any(isinstance(item, LogSpan) for item in record.trace._pending)
    kept = {s.op_name: s.value for s in record.trace.steps}
    assert set(seen) == set(kept) and len(seen) > 20  # every module returning a tensor, nothing else
    for name, value in seen.items():
        assert torch.equal(kept[name], value), name


@pytest.mark.parametrize("keep", ["InPlace:h", "InPlace", "call=fc", "*:g, call=**", "op=*relu"])
def test_kept_values_changed_in_place_later_are_kept_as_they_were_or_dropped_as_observed(keep):
    model, x = InPlace(), torch.randn(2, 4)
    schema = _parse(model, {"x": x})
    with torch.no_grad():
        logged, observed = _both(schema, {"x": x}, keep=keep)
    assert_same_trace(logged, observed)
    steps = {s.out_var: s for s in logged.trace.steps}
    if "h" in steps:  # kept, then changed by `h.mul_(2)`: the value as it was
        assert steps["h"].step in logged.recorder.changed_in_place
        assert torch.equal(steps["h"].value, model.fc(x))
    if "g" in steps:  # changed by an op the schema does not flag: dropped, as observed
        assert steps["g"].value is None and "changed in place" in steps["g"].omitted


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_a_kept_logged_capture_with_gradients_equals_the_observed_one(build):
    model, inputs = build(layers=1)
    schema = _parse(model, inputs)
    logged, observed = _both(schema, inputs, keep="call=**", capture_grads=True)
    assert_same_trace(logged, observed)
    for record in (logged, observed):
        record.outputs[0].logits.square().mean().backward()
    a, b = logged.gradients.steps, observed.gradients.steps
    assert len(a) == len(b) > 5
    for x, y in zip(a, b):
        assert (x.step, x.container_id, x.omitted) == (y.step, y.container_id, y.omitted)
        assert (x.tensor.value is None) == (y.tensor.value is None)
        assert x.tensor.value is None or torch.equal(x.tensor.value, y.tensor.value), x.container_id


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


class _Callees(nn.Module):
    """Callees read at run time: a loop over a ModuleList, a module held in a variable, fetched methods."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_Layer() for _ in range(3))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        pick = self.head
        method = x.tanh
        return pick(method()), x.sum()


@pytest.mark.parametrize("keep", ["call=layers.1", "call=layers.*", "call=**", "call=head", "op=Tensor.*",
                                  "op=*tanh", "op=layers.2", "layers.1", "_Callees", "*:x", "call=layers.*.fc"])
def test_callees_read_at_run_time_are_kept_as_observed(keep):
    model, x = _Callees(), torch.randn(2, 4)
    schema = _parse(model, {"x": x})
    with torch.no_grad():
        logged, observed = _both(schema, {"x": x}, keep=keep)
    assert_same_trace(logged, observed)
    assert len(logged.trace.steps) > 0


class _WithClosure(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(2))

    def forward(self, x):
        def twice(v):
            return torch.tanh(v) * 2

        for layer in self.layers:
            x = twice(layer(x))
        return x


def test_a_closure_runs_observed_only_where_the_selector_tells_its_callers_paths_apart():
    model, x = _WithClosure(), torch.randn(2, 3)
    schema = _parse(model, {"x": x})
    plan, why = keep_plan(schema, keep_selector("layers.0"))
    assert plan is None and "closure" in why and "layers.0" in why
    assert keep_plan(schema, keep_selector("_WithClosure"))[0] is None  # the root's path is not its children's
    with torch.no_grad():
        record = capture_run(schema, {"x": x}, keep="layers.0")
        assert not any(isinstance(item, LogSpan) for item in record.trace._pending)
        for keep in ("call=**", "**", "op=*tanh", "slot=activation"):
            assert keep_plan(schema, keep_selector(keep))[0] is not None
            logged, observed = _both(schema, {"x": x}, keep=keep)
            assert_same_trace(logged, observed)


def test_kept_programs_are_cached_per_selector_a_few_at_a_time():
    model, x = _Callees(), torch.randn(2, 4)
    schema = _parse(model, {"x": x})
    with torch.no_grad():
        capture_run(schema, {"x": x}, keep="call=layers.1")
        cache = programs_for(schema)["logging-kept"]
        program = cache[keep_selector("call=layers.1")]
        capture_run(schema, {"x": x}, keep="call=layers.1")
        assert cache[keep_selector("call=layers.1")] is program  # compiled once
        for k in range(KEEP_PROGRAMS + 2):
            capture_run(schema, {"x": x}, keep=f"call=layers.1, *:v{k}")
    assert len(cache) == KEEP_PROGRAMS


def test_a_call_term_that_keeps_nothing_is_still_said_by_a_logged_capture():
    model, inputs = gpt2(layers=1)
    schema = _parse(model, inputs)
    from nnschemaparser import KeepMissedWarning

    with torch.no_grad(), pytest.warns(KeepMissedWarning, match=r"'call=transformer.h.0.attn' kept nothing") as said:
        record = capture_run(schema, dict(inputs), keep="call=transformer.h.0.attn, call=transformer.h.0.mlp")
    assert [w.filename for w in said] == [__file__] and "mlp" not in str(said[0].message)
    assert any(isinstance(item, LogSpan) for item in record.trace._pending)
    assert [s.op_name for s in record.trace.steps] == ["transformer.h.0.mlp"]


def test_a_schema_captured_with_kept_logged_programs_is_freed_with_them():
    import gc
    import weakref

    model, x = _Callees(), torch.randn(2, 4)
    schema = _parse(model, {"x": x})
    with torch.no_grad():
        for keep in ("call=**", "op=Tensor.*", "layers.1"):
            record = capture_run(schema, {"x": x}, keep=keep)
            assert any(isinstance(item, LogSpan) for item in record.trace._pending)
    assert keep_selector("call=**") in programs_for(schema)["logging-kept"]
    gone = weakref.ref(schema)
    del schema, record
    gc.collect()
    assert gone() is None  # the plans and programs hold the schema only weakly


@pytest.mark.parametrize("case", zoo.fast_subset(), ids=lambda c: c.name)
def test_a_kept_logged_capture_equals_the_observed_one_on_the_fast_zoo(case):
    torch.manual_seed(0)
    model = case.build().eval()

    def fresh_inputs():  # a case's inputs may hold state a run changes (a KV cache): each run gets its own
        torch.manual_seed(1)
        return case.make_inputs(model)

    schema = _parse(model, fresh_inputs())
    with torch.no_grad():
        logged = capture_run(schema, fresh_inputs(), keep="call=**, op=Tensor.*")
        observed = capture_run(schema, fresh_inputs(), keep="call=**, op=Tensor.*", observe_all=True)
    assert_same_trace(logged, observed)
