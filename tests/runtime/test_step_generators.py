"""step_run as a chain of generators (runtime/step_generators.py): the same steps as the greenlet run."""

import functools
import threading

import pytest
import torch
from torch import nn

from nnschemaparser import EditError, NNParser, SchemaInterpreter, SchemaRunError
from nnschemaparser.runtime import step_generators
from nnschemaparser.runtime.interpreter import _programs
from tests.support.diverge_models import gpt2, llama


def _steps(schema, scope, generators, **options):
    """(steps, outputs, path) of a stepped run through the generator path or the greenlet run; `path`
    names the pool of the program that ran it ("idle_generators" or "idle_step")."""
    saved = step_generators.GENERATOR_STEPS
    step_generators.GENERATOR_STEPS = generators
    try:
        for key in ("idle_generators", "idle_step"):
            _programs(schema).pop(key, None)
        interpreter = SchemaInterpreter()
        with torch.no_grad():
            steps = list(interpreter.step_run(schema, dict(scope), **options))
    finally:
        step_generators.GENERATOR_STEPS = saved
    used = [key for key in ("idle_generators", "idle_step") if _programs(schema).get(key)]
    return steps, interpreter.step_outputs, used


def _assert_same_steps(new, old):
    assert len(new) == len(old) and new
    for a, b in zip(new, old):
        assert (a.step_index, a.block_path, a.frame_depth, a.kind, a.out_var) == \
            (b.step_index, b.block_path, b.frame_depth, b.kind, b.out_var)
        assert a.instruction is b.instruction
        if isinstance(b.value, torch.Tensor):
            assert isinstance(a.value, torch.Tensor) and torch.equal(a.value, b.value), a.step_index
        else:
            assert type(a.value) is type(b.value), a.step_index


def _outputs_equal(a, b):
    first, second = a[0], b[0]
    logits = getattr(first, "logits", first)
    assert torch.equal(logits, getattr(second, "logits", second))


@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
def test_a_transformers_model_steps_the_same_as_generators_and_in_a_greenlet(build):
    model, inputs = build()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    new, new_out, new_path = _steps(schema, inputs, True)
    old, old_out, old_path = _steps(schema, inputs, False)
    assert new_path == ["idle_generators"] and old_path == ["idle_step"], "each run took the path it names"
    _assert_same_steps(new, old)
    _outputs_equal(new_out, old_out)
    with torch.no_grad():
        assert torch.equal(new_out[0].logits, model(**inputs).logits)


def logged(fn):
    """A decorator of the kind transformers puts on forwards: library code around the schema's body."""
    calls = []

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        calls.append("in")
        try:
            return fn(self, *args, **kwargs) * 2
        finally:
            calls.append("out")

    wrapper.calls = calls
    return wrapper


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @logged
    def forward(self, x):
        y = self.lin(x)
        return y.relu()


class Called(nn.Module):
    """Overrides `__call__`: library code that calls the schema's forward back."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs) - 1

    def forward(self, x):
        return self.lin(x) * 3


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Decorated()
        self.called = Called()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        h = self.inner(x)
        h = self.called(h)
        return self.head(h) + 1


def _outer():
    torch.manual_seed(0)
    model = Outer().eval()
    x = torch.randn(2, 4)
    model.head.register_forward_hook(lambda module, args, out: out * 5)  # a hook: foreign code around a block
    return model, x, NNParser.parse_model(model=model, inputs_tensors_values={"x": x})


def test_blocks_called_back_by_decorators_hooks_and_call_overrides_still_step():
    model, x, schema = _outer()
    new, new_out, new_path = _steps(schema, {"x": x}, True)
    old, old_out, old_path = _steps(schema, {"x": x}, False)
    assert new_path == ["idle_generators"] and old_path == ["idle_step"]
    _assert_same_steps(new, old)
    paths = {step.block_path for step in new}
    assert {"inner", "inner.lin", "called", "called.lin", "head"} <= paths, "steps inside each called-back body"
    with torch.no_grad():
        assert torch.equal(new_out[0], model(x)) and torch.equal(old_out[0], model(x))


def test_edits_apply_at_their_step_the_same_way_on_both_paths():
    model, x, schema = _outer()
    plain, _, _ = _steps(schema, {"x": x}, False)
    at = next(step for step in plain if step.block_path == "inner.lin" and step.kind == "op")
    edits = {at.step_index: [{"values": torch.ones(2, 4)}]}
    new, new_out, _ = _steps(schema, {"x": x}, True, edits=edits)
    old, old_out, _ = _steps(schema, {"x": x}, False, edits=edits)
    _assert_same_steps(new, old)
    assert torch.equal(new[at.step_index - 1].value, torch.ones(2, 4))
    assert torch.equal(new_out[0], old_out[0]) and not torch.equal(new_out[0], model(x))
    # an edit made at a paused step (StepInfo.edit) reaches the rest of the run as well
    outputs = []
    for generators in (True, False):
        step_generators.GENERATOR_STEPS = generators
        try:
            interpreter = SchemaInterpreter()
            with torch.no_grad():
                for step in interpreter.step_run(schema, {"x": x}):
                    if step.step_index == at.step_index:
                        step.edit(values=torch.full((2, 4), 0.5))
        finally:
            step_generators.GENERATOR_STEPS = True
        outputs.append(interpreter.step_outputs[0])
    assert torch.equal(outputs[0], outputs[1])


def test_closing_the_generator_inside_a_decorated_block_unwinds_its_library_code():
    model, x, schema = _outer()
    calls = Decorated.forward.calls
    calls.clear()
    steps = SchemaInterpreter().step_run(schema, {"x": x})
    with torch.no_grad():
        step = next(step for step in steps if step.block_path == "inner.lin")
    assert calls == ["in"], "paused inside the decorator's call of the body"
    steps.close()
    assert calls == ["in", "out"], "closing unwound the decorator's frame"
    with pytest.raises(EditError, match="the run has ended"):
        step.edit(values=torch.zeros(2, 4))
    new, out, path = _steps(schema, {"x": x}, True)  # the program went back to its pool in a usable state
    assert path == ["idle_generators"] and torch.equal(out[0], model(x).detach())


def test_a_run_of_generators_refuses_to_be_advanced_from_another_thread():
    _, x, schema = _outer()
    steps = SchemaInterpreter().step_run(schema, {"x": x})
    next(steps)
    errors = []

    def advance():
        try:
            next(steps)
        except SchemaRunError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=advance)
    thread.start()
    thread.join()
    assert errors and "thread that started it" in errors[0]
    steps.close()


def test_a_model_whose_blocks_live_code_reaches_steps_in_a_greenlet():
    class Helper(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.lin, x, use_reentrant=False) + 1

    torch.manual_seed(0)
    model, x = Helper().eval(), torch.randn(2, 4)
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
    new, new_out, new_path = _steps(schema, {"x": x}, True)
    old, _, _ = _steps(schema, {"x": x}, False)
    assert "idle_step" in new_path, "a block lent to live code keeps the greenlet run"
    _assert_same_steps(new, old)
    assert "lin" in {step.block_path for step in new}
    assert torch.equal(new_out[0], model(x))


def test_a_statement_nested_past_pythons_limits_steps_the_same_through_its_part(tmp_path):
    import importlib.util
    import sys

    depth = 16
    lines = ["from torch import nn", "", "", "class Nested(nn.Module):", "    def forward(self, x):", "        y = x + 1"]
    for level in range(depth):
        indent = "        " + "    " * level
        lines += [f"{indent}for i{level} in range(1):", f"{indent}    y = y * 2 + {level}"]
    lines.append("        return y - 1")
    path = tmp_path / "nested_model.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location("nested_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nested_model"] = module
    try:
        spec.loader.exec_module(module)
        model, x = module.Nested(), torch.randn(2, 3)
        schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": x})
        new, new_out, new_path = _steps(schema, {"x": x}, True)
        assert new_path == ["idle_generators"]
        assert _programs(schema)["idle_generators"][0]._parts, "the deep statement was compiled apart"
        old, old_out, _ = _steps(schema, {"x": x}, False)
        _assert_same_steps(new, old)
        assert torch.equal(new_out[0], model(x)) and torch.equal(old_out[0], model(x))
    finally:
        sys.modules.pop("nested_model", None)


def test_layers_of_one_source_share_the_rewritten_code_and_step_as_themselves():
    # the first step_run rewrites each block's code as a generator once per text, not once per block
    # (a 32-layer model rewrote 200 blocks: 2 s); each layer still reports its own block
    model, inputs = llama(layers=3)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    old, _, _ = _steps(schema, inputs, False)
    new, _, path = _steps(schema, inputs, True)  # second: `_steps` empties both pools first
    assert path == ["idle_generators"]
    _assert_same_steps(new, old)
    program = _programs(schema)["idle_generators"][0]
    blocks = {block.path: block for block in schema.iter_blocks()}
    # the MLPs run as generators of their own; transformers' decorated layers run their bodies bare
    for made, name in ((program.generators, "mlp"), (program.bare, "")):
        functions = [made.get(id(blocks[f"model.layers.{i}" + (f".{name}" if name else "")])) for i in range(3)]
        assert all(functions), name
        assert len({id(fn.__code__) for fn in functions}) == 1, f"the three {name or 'layer'}s share one code object"
        assert len({id(fn.__globals__) for fn in functions}) == 3, "each over its own block's names"
    assert {f"model.layers.{i}.mlp" for i in range(3)} <= {step.block_path for step in new}
