"""A capture_run(keep=...) that decides per step (here: with `limits`) observes only the blocks the selector
can keep from: the others run their plain generated code, counting tensors, and the kept steps are exactly
those of a full capture filtered after. Without, the kept logged program runs (tests/traces/test_logged_keep.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from nnschemaparser import CaptureLimits, KeepMissedWarning, SchemaInterpreter, capture_run
from nnschemaparser.traces.recorder import ActivationRecorder
from nnschemaparser.traces.selection import keep_selector
from tests.support.debugger_models import llama_case
from tests.support.trace_models import parse


def _filtered(trace, prefixes):
    return [s for s in trace if any(s.block_path == p or s.block_path.startswith(p + ".") for p in prefixes)]


def _same_steps(kept, expected):
    assert expected and len(kept) == len(expected)
    for a, b in zip(kept, expected):
        assert (a.step, a.container_id, a.description, a.frame_depth) == (b.step, b.container_id, b.description,
                                                                          b.frame_depth)
        assert torch.equal(a.value, b.value)


def test_a_capture_of_two_llama_layers_equals_the_full_capture_filtered():
    model, inputs, schema = llama_case(4)
    with torch.no_grad():
        eager = model(**inputs).logits
        full = capture_run(schema, dict(inputs))
        kept = capture_run(schema, dict(inputs), keep="model.layers.1, model.layers.3.mlp")
    assert torch.equal(kept.outputs[0].logits, eager) and torch.equal(full.outputs[0].logits, eager)
    _same_steps(list(kept.trace), _filtered(full.trace, ["model.layers.1", "model.layers.3.mlp"]))


class _Watching(ActivationRecorder):
    def __init__(self, **options):
        super().__init__(**options)
        self.entered: list[str] = []

    def on_block_enter(self, event):
        self.entered.append(event.path)


def test_blocks_outside_the_selector_are_not_observed():
    model, inputs, schema = llama_case(4)
    selector = keep_selector("model.layers.2.self_attn")
    observe = selector.blocks_to_observe(schema)
    watching = _Watching(keep=selector)
    with torch.no_grad():
        SchemaInterpreter(listeners=[watching], observe=observe).run(schema, dict(inputs))
    entered = set(watching.entered)
    assert "model.layers.2.self_attn" in entered and "model.layers.2" in entered and "model" in entered
    assert not any(p.startswith(("model.layers.0", "model.layers.1", "model.layers.3")) for p in entered)
    assert "model.layers.2.mlp" not in entered and "model.norm" not in entered
    everything = _Watching(keep=selector)
    with torch.no_grad():
        SchemaInterpreter(listeners=[everything]).run(schema, dict(inputs))
    assert "model.layers.0.mlp" in everything.entered  # the check above could fail


def test_a_selector_naming_no_block_observes_every_block():
    _, _, schema = llama_case(1)
    assert keep_selector("op=*linear").blocks_to_observe(schema) is None
    assert keep_selector("slot=activation").blocks_to_observe(schema) is None
    only_root = keep_selector("slot=output").blocks_to_observe(schema)
    assert only_root == frozenset({id(schema)} | {id(m) for m in schema.methods.values()})


class _Loop(nn.Module):
    """An unobserved block with a data-dependent loop and branch, before the kept one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(int(x.abs().sum().item()) % 3 + 1):
            x = self.lin(x)
            if x.sum() > 0:
                x = x * 2
            else:
                x = x - 1
        return x, x.shape[0]


class _Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = _Loop()
        self.second = nn.Linear(4, 4)

    def forward(self, x):
        y, n = self.first(x)
        return self.second(y) + n


def test_kept_steps_after_an_unobserved_loop_keep_their_full_capture_numbers():
    torch.manual_seed(0)
    model = _Pair()
    for seed in range(3):  # different inputs take the loop a different number of times
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))
        schema = parse(model, {"x": x})
        full = capture_run(schema, {"x": x})
        kept = capture_run(schema, {"x": x}, keep="second")
        assert torch.equal(kept.outputs[0], full.outputs[0])
        _same_steps(list(kept.trace), _filtered(full.trace, ["second"]))


class _Scale(nn.Module):
    def forward(self, x):
        return x * 3


class _Bump(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x


class _KeptThenBumped(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale, self.bump = _Scale(), _Bump()

    def forward(self, x):
        return self.bump(self.scale(x))


# A capture that must decide per step (here: limits) runs partly observed; without, the kept logged
# program (traces/keep_plan.py) sees every in-place change and every call, as observe_all=True does.
_PARTLY = {"limits": CaptureLimits(max_tensors=10 ** 6, max_bytes=10 ** 12)}


def test_a_kept_value_changed_in_place_by_an_unobserved_block_is_dropped_and_says_why():
    x = torch.randn(3)
    schema = parse(_KeptThenBumped(), {"x": x})
    fast = capture_run(schema, {"x": x.clone()}, keep="scale", **_PARTLY)
    observed = capture_run(schema, {"x": x.clone()}, keep="scale", observe_all=True)
    logged = capture_run(schema, {"x": x.clone()}, keep="scale")
    (kept,) = [s for s in observed.trace if s.out_var != "x"] or [None]
    assert kept is not None and torch.equal(kept.value, x * 3)  # observed everywhere: cloned before the add_
    (dropped,) = [s for s in fast.trace if s.container_id == kept.container_id]
    assert dropped.value is None and "not observe" in dropped.omitted and "observe_all=True" in dropped.omitted
    (copied,) = [s for s in logged.trace if s.container_id == kept.container_id]
    assert torch.equal(copied.value, x * 3) and copied.omitted is None


class _Tagged(torch.Tensor):
    """A tensor subclass: an unobserved block binding one counts it as a tensor, as observing does."""


class _Mixed(nn.Module):
    """An unobserved block binding tensors, a tensor subclass and values that are never tensors."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, extra=None):
        tagged = x.as_subclass(_Tagged) * 2
        n = -1
        pair = (x, tagged)
        missing = extra is None
        flag = not missing
        label = f"{n}:{flag}"
        first, second = pair
        y = self.lin(first) + second.as_subclass(torch.Tensor)
        return y.reshape(n, 4), label


class _MixedThenKept(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixed, self.kept = _Mixed(), nn.Linear(4, 4)

    def forward(self, x):
        y, label = self.mixed(x)
        return self.kept(y) * len(label)


def test_kept_numbers_count_tensor_subclasses_and_skip_values_that_are_never_tensors():
    torch.manual_seed(0)
    model, x = _MixedThenKept(), torch.randn(2, 4)
    schema = parse(model, {"x": x})
    with torch.no_grad():
        full = capture_run(schema, {"x": x})
        kept = capture_run(schema, {"x": x}, keep="kept")
    assert torch.equal(kept.outputs[0], full.outputs[0])
    assert any(type(s.value) is _Tagged for s in full.trace if s.block_path == "mixed")  # a subclass was bound
    _same_steps(list(kept.trace), _filtered(full.trace, ["kept"]))


def test_steps_of_blocks_the_selector_cannot_keep_are_numbered_but_not_recorded():
    model, inputs, schema = llama_case(2)
    with torch.no_grad():
        full = capture_run(schema, dict(inputs))
        # the root is observed (it leads to the kept layer) but nothing of its own is kept
        kept = capture_run(schema, dict(inputs), keep="model.layers.1:*")
    root_steps = [s for s in full.trace if s.block_path == "model" and s.slot_type == "activation"]
    assert root_steps and not any(s.block_path == "model" for s in kept.trace)
    _same_steps(list(kept.trace), _filtered(full.trace, ["model.layers.1"]))


def _layer_outputs_by_hooks(model, inputs, layers):
    outputs = []

    def hook(module, args, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def test_a_call_term_keeps_the_layer_outputs_hooks_see_observing_only_the_caller():
    model, inputs, schema = llama_case(4)
    keep = "call=model.layers.1, call=model.layers.3"
    watching = _Watching(keep=keep)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # every call it names is recorded: nothing to say
        full = capture_run(schema, dict(inputs))
        kept = capture_run(schema, dict(inputs), keep=keep)
        hooked = _layer_outputs_by_hooks(model, inputs, [model.model.layers[1], model.model.layers[3]])
        SchemaInterpreter(listeners=[watching], observe=watching.keep.blocks_to_observe(schema)).run(
            schema, dict(inputs))
    expected = [s for s in full.trace if s.op_name in ("model.layers.1", "model.layers.3")]
    assert [s.block_path for s in expected] == ["model", "model"]  # the caller's steps, the layer loop's
    _same_steps(list(kept.trace), expected)
    assert all(torch.equal(step.value, value) for step, value in zip(kept.trace, hooked))
    assert "model" in watching.entered and not any(p.startswith("model.layers") for p in watching.entered)


class _Target(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * 2


class _CallsWhatItIsGiven(nn.Module):
    def forward(self, x, fn):
        return fn(x + 1)  # a module the source does not name: a call of a value


class _Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(x)


class _Handing(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = _CallsWhatItIsGiven(), _Target(), _Wrapper()

    def forward(self, x):
        return self.b(self.a(x, self.b)) + self.c(x)


def test_a_call_term_finds_callers_a_level_down_and_reports_a_call_it_could_not_see():
    x = torch.randn(2, 4)
    schema = parse(_Handing(), {"x": x})
    with torch.no_grad():
        full = capture_run(schema, {"x": x})
        calls_of_b = [s for s in full.trace if s.op_name == "b"]
        assert [s.block_path for s in calls_of_b] == ["a", "_Handing"]
        with pytest.warns(KeepMissedWarning, match=r"b called from a.*keep='a call=b'"):
            missed = capture_run(schema, {"x": x}, keep="call=b", **_PARTLY)
        _same_steps(list(missed.trace), calls_of_b[1:])  # the call from the root, seen; a's was not
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            named = capture_run(schema, {"x": x}, keep="a call=b, _Handing call=b", **_PARTLY)
            everywhere = capture_run(schema, {"x": x}, keep="call=b", observe_all=True)
            logged = capture_run(schema, {"x": x}, keep="call=b")  # decided per instruction: both calls
            inner = capture_run(schema, {"x": x}, keep="call=c.inner", **_PARTLY)
    _same_steps(list(named.trace), calls_of_b)
    _same_steps(list(everywhere.trace), calls_of_b)
    _same_steps(list(logged.trace), calls_of_b)
    _same_steps(list(inner.trace), [s for s in full.trace if s.op_name == "c.inner"])
    observed = keep_selector("call=c.inner").blocks_to_observe(schema)
    assert {b.path for b in schema.iter_blocks() if id(b) in observed} == {"", "c"}  # c calls it, not a nor b


def test_a_call_term_that_keeps_nothing_says_why_a_tuple_returning_block_binds_no_tensor():
    _, inputs, schema = llama_case(2)
    with torch.no_grad():
        with pytest.warns(KeepMissedWarning, match=r"'call=model.layers.0.self_attn' kept nothing.*tuple") as said:
            record = capture_run(schema, dict(inputs), keep="call=model.layers.0.self_attn, call=model.layers.1")
    assert [w.filename for w in said] == [__file__]  # it points at the capture_run call
    assert [s.op_name for s in record.trace] == ["model.layers.1"]
    assert not any("model.layers.1" in str(w.message) for w in said)
