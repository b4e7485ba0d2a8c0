"""Root inputs as a user passes them: `*args`, `**kwargs`, no inputs, positional binding seen by
hooks, the caller's grad mode at parse, and a root that runs live listed with its reason."""

import sys
import textwrap

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, ParseError, SchemaInterpreter, SchemaRunError, dump_schema
from nnschemaparser.inspection.cli import main


class WeightedSum(nn.Module):
    def forward(self, *args):
        total = args[0]
        for i, a in enumerate(args[1:]):
            total = total + a * (i + 2)
        return total


class ArgsAndKwargs(nn.Module):
    def forward(self, x, *args, **kwargs):
        return x + sum(args) + kwargs["bias"]


class NoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(3))

    def forward(self):
        return self.p * 2


def _xy():
    torch.manual_seed(0)
    return torch.randn(3), torch.randn(3)


def test_star_args_root_takes_its_extras_as_a_tuple_under_the_vararg_name():
    x, y = _xy()
    model = WeightedSum()
    schema = NNParser.parse_model(model, inputs_tensors_values={"args": (x, y)})
    assert schema.skip_reason is None and "args" in schema.inputs
    assert torch.equal(SchemaInterpreter().run(schema, {"args": (x, y)})[0], model(x, y))
    assert torch.equal(SchemaInterpreter().run(schema, {"args": [x, y, x]})[0], model(x, y, x))
    assert torch.equal(SchemaInterpreter().call(schema, x, y), model(x, y))


def test_star_args_and_kwargs_root_binds_extras_and_keywords():
    x, y = _xy()
    model = ArgsAndKwargs()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "args": (y,), "bias": y})
    assert schema.skip_reason is None
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x, "args": (y, y), "bias": x})[0],
                       model(x, y, y, bias=x))
    assert torch.equal(SchemaInterpreter().call(schema, x, y, bias=x), model(x, y, bias=x))


def test_vararg_value_that_is_not_a_sequence_is_refused_with_the_fix():
    x, y = _xy()
    schema = NNParser.parse_model(WeightedSum(), inputs_tensors_values={"args": (x, y)})
    with pytest.raises(SchemaRunError, match=r"tuple or list .*'args': \(y, z\)"):
        SchemaInterpreter().run(schema, {"args": x})


def test_root_without_inputs_parses_and_runs():
    model = NoInputs()
    schema = NNParser.parse_model(model)
    assert schema.skip_reason is None and schema.outputs
    assert torch.equal(SchemaInterpreter().run(schema, {})[0], model())
    assert torch.equal(SchemaInterpreter().call(schema), model())


def test_root_with_required_inputs_still_asks_for_examples():
    with pytest.raises(ParseError, match="needs example inputs"):
        NNParser.parse_model(nn.Linear(2, 2))


# -- positional binding seen by hooks ----------------------------------------------------------


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, y=None, *, scale=1.0):
        out = self.lin(x)
        return out if y is None else (out + y) * scale


def test_forward_pre_hooks_see_keyword_inputs_as_positional_at_parse_and_in_run():
    x, y = _xy()
    model = TwoInputs()
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append((len(args), sorted(kwargs))),
                                    with_kwargs=True)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "y": y, "scale": 2.0})
    assert schema.skip_reason is None
    assert seen and all(s == (2, ["scale"]) for s in seen)  # the schema's run and eager's, at parse
    seen.clear()
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x, "y": y, "scale": 2.0})[0], model(x, y, scale=2.0))
    assert seen == [(2, ["scale"]), (2, ["scale"])]
    seen.clear()
    SchemaInterpreter().run(schema, {"x": x})
    assert seen == [(1, [])]


def test_call_passes_keywords_as_given():
    x, y = _xy()
    model = TwoInputs()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x, "y": y})
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append((len(args), sorted(kwargs))),
                                    with_kwargs=True)
    assert torch.equal(SchemaInterpreter().call(schema, x, y=y), model(x, y=y))
    assert seen == [(1, ["y"]), (1, ["y"])]


# -- grad mode at parse ------------------------------------------------------------------------


class GradientPenalty(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Linear(3, 1)

    def forward(self, x):
        x = x.detach().requires_grad_(True)
        score = self.critic(x).sum()
        (grad,) = torch.autograd.grad(score, x, create_graph=True)
        return score + grad.pow(2).sum()


class HoldsPenalty(nn.Module):
    def __init__(self):
        super().__init__()
        self.penalty = GradientPenalty()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.penalty(self.lin(x))


@pytest.mark.parametrize("cls", [GradientPenalty, HoldsPenalty])
def test_forward_calling_autograd_grad_parses_under_the_callers_grad_mode(cls):
    x, _ = _xy()
    torch.manual_seed(0)
    model = cls()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is None and schema.skipped == {}
    got = SchemaInterpreter().run(schema, {"x": x})[0]
    expected = model(x)
    assert torch.equal(got, expected)
    got.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    assert any(g is not None for g in grads)
    model.zero_grad(set_to_none=True)
    expected.backward()
    for got_grad, p in zip(grads, model.parameters()):
        assert (got_grad is None and p.grad is None) or torch.equal(got_grad, p.grad)


def test_eager_is_blamed_only_when_eager_fails_in_the_same_grad_mode():
    x, _ = _xy()
    with torch.no_grad(), pytest.raises(ParseError, match="in eager mode too"):
        NNParser.parse_model(GradientPenalty(), inputs_tensors_values={"x": x})


# -- a root that runs live ---------------------------------------------------------------------


class ReadsItsOwnFrame(nn.Module):
    """Eager runs it; the schema cannot (its frame is not forward's)."""

    def forward(self, x):
        return sys._getframe().f_locals["x"] * 2


def test_root_running_live_is_listed_in_skipped_and_the_dump():
    x, _ = _xy()
    model = ReadsItsOwnFrame()
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    assert schema.skip_reason is not None
    assert "eager does not" in schema.skip_reason and "eager mode too" not in schema.skip_reason
    assert schema.skipped == {"<root>": schema.skip_reason}
    assert f"  - <root>: {schema.skip_reason}" in dump_schema(schema)
    assert torch.equal(SchemaInterpreter().run(schema, {"x": x})[0], model(x))


def test_cli_card_lists_a_root_that_runs_live(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the CLI writes its graph file into the current directory
    path = tmp_path / "live_root.py"
    path.write_text(textwrap.dedent('''
        import sys
        from torch import nn

        class ReadsItsOwnFrame(nn.Module):
            def forward(self, x):
                return sys._getframe().f_locals["x"] * 2
    '''))
    code = main([f"{path}:ReadsItsOwnFrame", "--input", "2,3"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "<root>: interpreting failed where eager does not" in out
    assert "notice: <root> runs eagerly" in err


def test_star_args_extras_may_be_given_as_a_list_of_shapes():
    schema = NNParser.parse_model(WeightedSum(), inputs_tensors_shapes={"args": [(2, 3), (2, 3)]},
                                  inputs_tensors_dtypes={"args": "float64"})
    assert schema.skip_reason is None
    assert schema.outputs[0].shape == (2, 3) and schema.outputs[0].dtype == "torch.float64"
    with pytest.raises(ParseError, match="list of such tuples"):
        NNParser.parse_model(WeightedSum(), inputs_tensors_shapes={"args": [(2, 3), "x"]})
