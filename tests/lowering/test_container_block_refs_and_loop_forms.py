"""Where a call into a module container is recorded in the schema, and every loop form over one.

Covers the index variable a loop over a container names in its loop and block refs, chain marks on
Sequential calls, entries chosen by a variable or a constant index (and their schema-file round trip),
and each loop form (enumerate, slices, reversed, dict items and values, zip) calling the entries it
should, compared exactly with eager. Split from test_container_loops_and_module_calls.py.
"""

import pytest
import torch
from torch import nn

from tests.lowering.test_container_loops_and_module_calls import IndexingSequential, IteratingSequential
from tests.lowering.exactly import randn, run, seeded  # noqa: F401 (seeded: the autouse fixture)


# ------------------------------------------------------------ container positions and chains


class LoopAndChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.chain = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(self.chain(x))


def _instructions(body):
    for instr in body:
        yield instr
        if hasattr(instr, "condition"):  # a ControlInstruction's test: `prepare`, then its `condition` op
            yield from _instructions(instr.prepare + [instr.condition])
        for attr in ("body", "else_body"):
            yield from _instructions(getattr(instr, attr, None) or [])


def test_loop_over_a_module_container_names_its_index_variable_in_the_loop_and_the_block_ref():
    from nnschemaparser import BlockInstruction, ControlInstruction, SchemaInterpreter

    schema = run(LoopAndChain(), x=randn(2, 4))
    loop = next(i for i in schema.body if isinstance(i, ControlInstruction))
    assert loop.iter_container == "layers" and loop.index_var == "$layer_index"
    call = next(i for i in loop.body if isinstance(i, BlockInstruction))
    assert call.block_ref.path == "layers" and call.block_ref.index_var == loop.index_var
    # the variable holds the position of the entry the call dispatches to: layers.<index>
    seen = [(step.block_path, step.scope_frames[0].get("$layer_index"))
            for step in SchemaInterpreter().step_run(schema, {"x": torch.randn(2, 4)})
            if step.block_path.startswith("layers.") and step.frame_depth == 1]
    assert sorted(set(seen)) == [("layers.0", 0), ("layers.1", 1), ("layers.2", 2)]


def test_call_of_a_sequential_child_is_marked_as_a_chain_call_and_others_are_not():
    from nnschemaparser import BlockInstruction

    schema = run(LoopAndChain(), x=randn(2, 4))
    calls = {i.block_ref.path: i.splat_args for i in _instructions(schema.body) if isinstance(i, BlockInstruction)}
    assert calls == {"layers": False, "chain": True, "head": False}


class KeyedDispatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x, route: str = "b"):
        for key in ["a", route]:
            x = self.experts[key](x)
        position = 1
        return self.layers[position](x) + self.layers[0](x)


def test_call_of_a_container_entry_chosen_by_a_variable_names_that_variable_in_its_block_ref():
    from nnschemaparser import BlockInstruction

    schema = run(KeyedDispatch(), x=randn(2, 4))
    refs = [i.block_ref for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
    assert [(r.path, r.index_var) for r in refs[:2]] == [("experts", "key"), ("layers", "position")]
    # self.layers[0](x): the constant index is bound to a scope variable, which its BlockRef names
    assert len(refs) == 3 and refs[2].path == "layers" and _assigned_literals(schema.body)[refs[2].index_var] == 0


def test_container_positions_and_chain_marks_survive_a_schema_file(tmp_path):
    from nnschemaparser import BlockInstruction, ControlInstruction, SchemaInterpreter, load_schema, save_schema

    model = LoopAndChain().eval()
    schema = run(model, x=randn(2, 4, requires_grad=False))
    loaded = load_schema(save_schema(schema, tmp_path / "loop.schema.json"), model=model)
    loop = next(i for i in loaded.body if isinstance(i, ControlInstruction))
    calls = [i for i in _instructions(loaded.body) if isinstance(i, BlockInstruction)]
    assert loop.index_var == "$layer_index" and calls[0].block_ref.index_var == "$layer_index"
    assert [c.splat_args for c in calls] == [False, True, False]
    x = torch.randn(2, 4)
    assert torch.equal(SchemaInterpreter().run(loaded, {"x": x.clone()})[0], model(x))


# ------------------------------------------------------------ constant container indices


def _assigned_literals(body) -> dict:
    """out_var -> value for every `$t = <int or str literal>` instruction of `body` (nested bodies too)."""
    from nnschemaparser import OpInstruction

    return {i.out_var: i.args[0] for i in _instructions(body)
            if isinstance(i, OpInstruction) and i.qualified_name == "nnschemaparser.lowering.intrinsics.assign"
            and len(i.args) == 1 and type(i.args[0]) in (int, str)}


class ConstantEntries(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.experts = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})

    def forward(self, x):
        h = self.layers[0](x)
        h = self.layers[-1](h)
        h = self.seq[0](h)
        return self.experts["b"](h)


# (container path, constant, entry entered)
CONSTANT_CALLS = [("layers", 0, "layers.0"), ("layers", -1, "layers.2"), ("seq", 0, "seq.0"),
                  ("experts", "b", "experts.b")]


def test_a_constant_index_into_a_container_is_a_block_call_whose_index_var_holds_the_constant():
    from nnschemaparser import BlockInstruction, SchemaInterpreter

    model = ConstantEntries().eval()
    schema = run(model, x=randn(2, 4))
    calls = [i for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
    literals = _assigned_literals(schema.body)
    assert [(c.block_ref.path, literals[c.block_ref.index_var]) for c in calls] == [
        (path, key) for path, key, _ in CONSTANT_CALLS]
    assert all(c.callee_var is not None and c.block_ref.index_var.startswith("$t") for c in calls)
    # at run time each call enters the entry's own block, with its index variable in the caller's scope
    entered = {}
    for step in SchemaInterpreter().step_run(schema, {"x": torch.randn(2, 4)}):
        if step.frame_depth == 1 and step.block_path not in entered:
            entered[step.block_path] = {c.block_ref.index_var: step.scope_frames[0].get(c.block_ref.index_var)
                                        for c in calls}
    assert list(entered) == [entry for _, _, entry in CONSTANT_CALLS]
    for (path, key, entry), call in zip(CONSTANT_CALLS, calls):
        assert entered[entry][call.block_ref.index_var] == key


def test_a_constant_index_into_self_names_its_index_var_too():
    from nnschemaparser import BlockInstruction

    model = IndexingSequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 4))
    schema = run(model, x=randn(2, 4))
    literals = _assigned_literals(schema.body)
    calls = [i for i in _instructions(schema.body) if isinstance(i, BlockInstruction) and i.block_ref.path == ""]
    # the loop `for module in self[1:-1]` calls its entries by their index in self too
    assert [c.block_ref.index_var for c in calls if c.callee_var == "module"] == ["$module_key"]
    assert [literals[c.block_ref.index_var] for c in calls if c.callee_var != "module"] == [0, -1, 0]


def test_constant_index_block_refs_survive_a_schema_file_and_the_loaded_schema_runs_exactly(tmp_path):
    from nnschemaparser import BlockInstruction, SchemaInterpreter, load_schema, save_schema

    model = ConstantEntries().eval()
    schema = run(model, x=randn(2, 4, requires_grad=False))
    path = save_schema(schema, tmp_path / "constant.schema.json")
    original = [(i.block_ref, i.callee_var) for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
    for loaded in (load_schema(path), load_schema(path, model=model)):
        refs = [(i.block_ref, i.callee_var) for i in _instructions(loaded.body) if isinstance(i, BlockInstruction)]
        assert refs == original and len(refs) == 4
    x = torch.randn(2, 4)
    assert torch.equal(SchemaInterpreter().run(load_schema(path, model=model), {"x": x.clone()})[0], model(x))


# ------------------------------------------------------------ every loop form over a module container


def _called_entries(schema, x):
    """(entry path called, BlockRef path, value of the BlockRef's index_var) for every call of a
    container entry the root makes, read at the pause before the call."""
    from nnschemaparser import BlockInstruction, SchemaInterpreter
    from nnschemaparser.runtime.interpreter import CallPause

    seen = []
    for event in SchemaInterpreter().step_run(schema, {"x": x}, pause_before_calls=True):
        if isinstance(event, CallPause) and event.frame_depth == 0 and isinstance(event.instruction, BlockInstruction):
            ref = event.instruction.block_ref
            seen.append((event.callee_path, ref.path, event.frame.get(ref.index_var, "<unbound>")))
    return seen


def _entry(path, key):
    return f"{path}.{key}" if path else str(key)


class _Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.norms = nn.ModuleList([nn.LayerNorm(4) for _ in range(3)])
        self.experts = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4), "c": nn.Linear(4, 4)})
        self.encoder = nn.Module()
        self.encoder.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])


def LoopForm(forward):
    """A module with containers whose forward is `forward(self, x)` (one loop form)."""
    return type(f"LoopForm_{forward.__name__}", (_Containers,), {"forward": forward})()


def enumerate_default(self, x):
    for i, layer in enumerate(self.layers):
        x = layer(x) * (i + 1)
    return x


def enumerate_start_1(self, x):
    for i, layer in enumerate(self.layers, start=1):
        x = layer(x) * i
    return x


def enumerate_index_rebound(self, x):
    for i, layer in enumerate(self.layers):
        i = i * 2
        x = layer(x) + i
    return x


def enumerate_of_a_slice(self, x):
    for i, layer in enumerate(self.layers[1:]):
        x = layer(x) - i
    return x


def slice_from_1(self, x):
    for layer in self.layers[1:]:
        x = torch.tanh(layer(x))
    return x


def slice_to_n(self, x):
    n = len(self.layers) - 1
    for layer in self.layers[:n]:
        x = layer(x)
    return x


def slice_step_2(self, x):
    for layer in self.layers[::2]:
        x = layer(x)
    return x


def slice_backwards(self, x):
    for layer in self.layers[-1::-2]:
        x = layer(x)
    return x


def reversed_container(self, x):
    for layer in reversed(self.layers):
        x = layer(x)
    return x


def reversed_slice(self, x):
    for layer in reversed(self.layers[1:]):
        x = layer(x)
    return x


def dict_items(self, x):
    total = 0
    for name, expert in self.experts.items():
        total = total + expert(x) * len(name)
    return total


def dict_items_key_rebound(self, x):
    for name, expert in self.experts.items():
        name = name.upper()
        x = expert(x)
    return x


def dict_values(self, x):
    for expert in self.experts.values():
        x = expert(x)
    return x


def zip_two_containers(self, x):
    for layer, norm in zip(self.layers, self.norms):
        x = norm(layer(x))
    return x


def zip_slice_and_reversed(self, x):
    for layer, norm in zip(self.layers[1:], reversed(self.norms)):
        x = norm(layer(x))
    return x


def nested_container(self, x):
    for block in self.encoder.blocks:
        x = block(x)
    return x


# form -> ([(BlockRef.path, BlockRef.index_var)], (iter_container, index_var), entries called in order)
LOOP_FORMS = {
    enumerate_default: ([("layers", "i")], ("layers", "i"), ["layers.0", "layers.1", "layers.2", "layers.3"]),
    enumerate_start_1: ([("layers", "$layer_index")], ("layers", "$layer_index"),
                        ["layers.0", "layers.1", "layers.2", "layers.3"]),
    enumerate_index_rebound: ([("layers", "$layer_index")], ("layers", "$layer_index"),
                              ["layers.0", "layers.1", "layers.2", "layers.3"]),
    enumerate_of_a_slice: ([("layers", "$layer_key")], ("layers", "i"), ["layers.1", "layers.2", "layers.3"]),
    slice_from_1: ([("layers", "$layer_key")], ("layers", "$layer_index"), ["layers.1", "layers.2", "layers.3"]),
    slice_to_n: ([("layers", "$layer_key")], ("layers", "$layer_index"), ["layers.0", "layers.1", "layers.2"]),
    slice_step_2: ([("layers", "$layer_key")], ("layers", "$layer_index"), ["layers.0", "layers.2"]),
    slice_backwards: ([("layers", "$layer_key")], ("layers", "$layer_index"), ["layers.3", "layers.1"]),
    reversed_container: ([("layers", "$layer_key")], ("layers", "$layer_index"),
                         ["layers.3", "layers.2", "layers.1", "layers.0"]),
    reversed_slice: ([("layers", "$layer_key")], ("layers", "$layer_index"), ["layers.3", "layers.2", "layers.1"]),
    dict_items: ([("experts", "name")], ("experts", "$expert_index"), ["experts.a", "experts.b", "experts.c"]),
    dict_items_key_rebound: ([("experts", "$expert_key")], ("experts", "$expert_index"),
                             ["experts.a", "experts.b", "experts.c"]),
    dict_values: ([("experts", "$expert_key")], ("experts", "$expert_index"), ["experts.a", "experts.b", "experts.c"]),
    zip_two_containers: ([("layers", "$layer_index"), ("norms", "$layer_index")], (None, "$layer_index"),
                         ["layers.0", "norms.0", "layers.1", "norms.1", "layers.2", "norms.2"]),
    zip_slice_and_reversed: ([("layers", "$layer_key"), ("norms", "$norm_key")], (None, "$layer_index"),
                             ["layers.1", "norms.2", "layers.2", "norms.1", "layers.3", "norms.0"]),
    nested_container: ([("encoder.blocks", "$block_index")], ("encoder.blocks", "$block_index"),
                       ["encoder.blocks.0", "encoder.blocks.1"]),
}


@pytest.mark.parametrize("form", list(LOOP_FORMS), ids=lambda f: f.__name__)
def test_each_loop_form_over_a_container_calls_its_entries_as_blocks_by_their_index_or_key(form):
    from nnschemaparser import BlockInstruction, ControlInstruction

    refs, (iter_container, index_var), entries = LOOP_FORMS[form]
    schema = run(LoopForm(form), x=randn(2, 4))  # exact outputs and gradients
    loop = next(i for i in _instructions(schema.body) if isinstance(i, ControlInstruction) and i.kind == "for")
    assert (loop.iter_container, loop.index_var) == (iter_container, index_var)
    calls = [i for i in _instructions(loop.body) if isinstance(i, BlockInstruction)]
    assert [(c.block_ref.path, c.block_ref.index_var) for c in calls] == refs
    assert all(c.callee_var is not None for c in calls), "the call dispatches on the module the loop yields"
    # at each call, the BlockRef's index_var holds the index or key of the entry really called
    called = _called_entries(schema, torch.randn(2, 4))
    assert [entry for entry, _, _ in called] == entries
    assert [_entry(path, key) for _, path, key in called] == entries


def test_a_loop_over_self_in_a_sequential_subclass_calls_its_entries_by_index():
    from nnschemaparser import BlockInstruction, ControlInstruction

    model = IteratingSequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    schema = run(model, x=randn(2, 4))
    loop = next(i for i in schema.body if isinstance(i, ControlInstruction) and i.kind == "for")
    assert (loop.iter_container, loop.index_var) == ("", "i")
    call = next(i for i in _instructions(loop.body) if isinstance(i, BlockInstruction))
    assert (call.block_ref.path, call.block_ref.index_var) == ("", "i")
    assert [(entry, key) for entry, _, key in _called_entries(schema, torch.randn(2, 4))] == [
        ("0", 0), ("1", 1), ("2", 2)]


def test_a_zip_of_a_container_with_a_list_calls_the_entries_and_a_loop_over_a_list_is_no_container_loop():
    from nnschemaparser import BlockInstruction, ControlInstruction

    def forward(self, x):
        for scale in [1.0, 2.0]:
            x = x * scale
        for layer, scale in zip(self.layers, [0.5, 1.5, 2.5]):
            x = layer(x) * scale
        return x

    schema = run(LoopForm(forward), x=randn(2, 4))
    loops = [i for i in _instructions(schema.body) if isinstance(i, ControlInstruction) and i.kind == "for"]
    assert [(loop.iter_container, loop.index_var) for loop in loops] == [(None, None), (None, "$layer_index")]
    calls = [i for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
    assert [(c.block_ref.path, c.block_ref.index_var, c.callee_var) for c in calls] == [
        ("layers", "$layer_index", "layer")]
    assert [e for e, _, _ in _called_entries(schema, torch.randn(2, 4))] == ["layers.0", "layers.1", "layers.2"]


def test_a_container_entry_replaced_after_parsing_runs_in_its_loop_as_the_new_module():
    from nnschemaparser import SchemaInterpreter

    for form in (enumerate_default, slice_from_1, reversed_container, dict_values, zip_two_containers):
        model = LoopForm(form).eval()
        schema = run(model, x=randn(2, 4, requires_grad=False))
        model.layers[2] = nn.Linear(4, 4)  # a module the schema has no block for
        model.experts["b"] = nn.Linear(4, 4)
        x = torch.randn(2, 4)
        assert torch.equal(SchemaInterpreter().run(schema, {"x": x.clone()})[0], model(x)), form.__name__
        called = [entry for entry, _, _ in _called_entries(schema, x.clone())]
        assert "layers.2" not in called and "experts.b" not in called, form.__name__


def test_loop_forms_survive_a_schema_file_and_the_loaded_schema_runs_exactly(tmp_path):
    from nnschemaparser import BlockInstruction, ControlInstruction, SchemaInterpreter, load_schema, save_schema

    for form in LOOP_FORMS:
        model = LoopForm(form).eval()
        schema = run(model, x=randn(2, 4, requires_grad=False))
        path = save_schema(schema, tmp_path / f"{form.__name__}.schema.json")

        def fields(block):
            return ([(i.iter_container, i.index_var) for i in _instructions(block.body)
                     if isinstance(i, ControlInstruction)],
                    [(i.block_ref, i.callee_var) for i in _instructions(block.body) if isinstance(i, BlockInstruction)])

        for loaded in (load_schema(path), load_schema(path, model=model)):
            assert fields(loaded) == fields(schema), form.__name__
        x = torch.randn(2, 4)
        loaded = load_schema(path, model=model)
        assert torch.equal(SchemaInterpreter().run(loaded, {"x": x.clone()})[0], model(x)), form.__name__
        assert [e for e, _, _ in _called_entries(loaded, x.clone())] == LOOP_FORMS[form][2], form.__name__


def test_the_dump_says_which_container_a_view_loop_iterates():
    from nnschemaparser.schema.dump import format_schema

    assert "FOR layer IN self.layers:" in format_schema(run(LoopAndChain(), x=randn(2, 4)))
    text = format_schema(run(LoopForm(slice_from_1), x=randn(2, 4)))
    assert "OVER self.layers:" in text and "$layer_key = " in text and "entry_keys(" in text
    text = format_schema(run(LoopForm(zip_two_containers), x=randn(2, 4)))
    assert "OVER self." not in text  # a zip iterates no single container


def test_bert_encoder_loop_names_enumerate_index_as_the_index_var():
    transformers = pytest.importorskip("transformers")
    from nnschemaparser import BlockInstruction, ControlInstruction, NNParser, SchemaInterpreter

    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (1, 6))
    schema = NNParser.parse_model(model, inputs_tensors_values={"input_ids": ids})
    encoder = schema.find("encoder")
    loop = next(i for i in _instructions(encoder.body) if isinstance(i, ControlInstruction) and i.kind == "for")
    assert (loop.iter_container, loop.index_var) == ("layer", "i")
    call = next(i for i in _instructions(loop.body) if isinstance(i, BlockInstruction))
    assert (call.block_ref.path, call.block_ref.index_var, call.callee_var) == ("layer", "i", "layer_module")
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
        assert torch.equal(SchemaInterpreter().call(schema, input_ids=ids).last_hidden_state, expected)
    from nnschemaparser.runtime.interpreter import CallPause

    entered = [(event.callee_path, event.frame.get("i")) for event in
               SchemaInterpreter().step_run(schema, {"input_ids": ids}, pause_before_calls=True)
               if isinstance(event, CallPause) and event.instruction is call]
    assert entered == [("encoder.layer.0", 0), ("encoder.layer.1", 1)]


class BackwardsList(nn.ModuleList):
    def __iter__(self):
        return iter(list(self._modules.values())[::-1])


def test_a_container_subclass_with_its_own_iteration_order_is_not_called_by_position():
    from nnschemaparser import BlockInstruction, ControlInstruction

    def forward(self, x):
        for layer in self.backwards:
            x = layer(x)
        for i, layer in enumerate(self.backwards):
            x = layer(x) + i
        return x

    model = LoopForm(forward)
    model.backwards = BackwardsList([nn.Linear(4, 4) for _ in range(3)])
    schema = run(model, x=randn(2, 4))
    loops = [i for i in _instructions(schema.body) if isinstance(i, ControlInstruction) and i.kind == "for"]
    # the loop still counts its positions, but position 0 is backwards.2: no BlockRef claims otherwise
    assert [(loop.iter_container, loop.index_var) for loop in loops] == [("backwards", "$layer_index"), (None, None)]
    assert not [i for i in _instructions(schema.body) if isinstance(i, BlockInstruction)]
