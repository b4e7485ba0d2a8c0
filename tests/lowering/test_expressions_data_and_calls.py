"""Data and call constructs in forward, each in a tiny module, run through the schema and compared exactly.

Covers comprehensions and generator expressions, dict and starred displays, f-string keys, lambdas,
nested functions and closures (late binding, nonlocal), starred targets and starred arguments,
*args/**kwargs, chained assignment and tuple unpacking, subscript and augmented assignment, in-place
tensor methods, del, module-level helpers and constants, a decorated forward, scalar inputs with
defaults, and structured return values.
"""

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.lowering.exactly import randn, run, seeded  # noqa: F401 (seeded: the autouse fixture)


# module-level constants and helpers, read from forward
SCALE = 0.5
TAIL_SHAPE = (2, 2)
ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh}


def soft_clip(t, limit=1.0):
    return limit * torch.tanh(t / limit)


def residual(fn, t):
    return t + fn(t) * SCALE


# ---------------------------------------------------------------------------------------- comprehensions


class ListComprehensions(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        scaled = [row * i for i, row in enumerate(x)]
        positive = [row for row in x if row.sum() > 0]
        mapped = [self.lin(t) * k for k in (1.0, 2.0) for t in positive if k > 0]
        return torch.stack(scaled), torch.stack(positive), torch.stack(mapped)


def test_list_comprehension_with_tensor_condition_and_two_fors():
    x = torch.tensor([[1.0, 2.0, 3.0], [-3.0, 1.0, 0.0], [0.5, 0.5, -0.1], [-1.0, -1.0, 1.0]],
                     requires_grad=True)
    run(ListComprehensions(), x=x)


class NestedComprehension(nn.Module):
    def forward(self, x):
        grid = [[x[i] * j for j in range(3)] for i in range(x.shape[0])]
        flat = [t for row in grid for t in row if t.shape[0] > 0]
        return torch.stack([torch.stack(row) for row in grid]), len(flat)


def test_nested_list_comprehension_builds_grid():
    run(NestedComprehension(), x=randn(2, 4))


class DictAndSetComprehension(nn.Module):
    def forward(self, x):
        by_name = {f"row{i}": row * 2 for i, row in enumerate(x) if i % 2 == 0}
        sizes = {d for d in x.shape}
        norms = {name: t.norm() for name, t in by_name.items()}
        y = x.sum(0) if len(sizes) == 1 else x.mean(0)
        return by_name, norms, y, sorted(sizes)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3)])
def test_dict_and_set_comprehensions(shape):
    run(DictAndSetComprehension(), x=randn(*shape))


class GeneratorExpressions(nn.Module):
    def forward(self, x):
        total = sum(row.pow(2).sum() for row in x)
        has_big = any(row.max() > 3 for row in x)
        all_finite = all(torch.isfinite(row).all() for row in x)
        doubled = torch.stack(tuple(row * 2 for row in x if row.mean() > -10))
        return total, has_big, all_finite, doubled


def test_generator_expressions_in_sum_any_all_and_tuple():
    run(GeneratorExpressions(), x=randn(3, 2))


# ---------------------------------------------------------------------------------------- displays and f-strings


class DictDisplays(nn.Module):
    def forward(self, x):
        base = {"a": x, "b": x * 2}
        merged = {**base, "b": x * 3, **{"c": x + 1}, "d": [x.sum(), {"e": x.mean()}]}
        return merged


def test_dict_display_with_double_star_unpacking_and_overrides():
    run(DictDisplays(), x=randn(2, 2))


class StarredDisplays(nn.Module):
    def forward(self, x):
        parts = list(x.unbind(0))
        joined = torch.cat([*parts, x.sum(0)], dim=-1)
        as_tuple = (x.mean(0), *parts[1:])
        as_set_size = len({*range(3), *range(2, 5)})
        return joined, torch.stack(as_tuple) * as_set_size


def test_starred_list_tuple_and_set_displays():
    run(StarredDisplays(), x=randn(3, 2))


class FStringKeys(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(3, 2) for _ in range(3)])
        self.prefix = "head"

    def forward(self, x):
        out = {}
        for i, head in enumerate(self.heads):
            out[f"{self.prefix}_{i:02d}"] = head(x)
        out[f"shape_{x.shape[0]}x{x.shape[1]}"] = x * 2
        out[f"{'mean'}!{len(out)}"] = x.mean()
        return out


def test_fstrings_used_as_dict_keys():
    run(FStringKeys(), x=randn(2, 3))


# ---------------------------------------------------------------------------------------- lambdas


class Lambdas(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.5
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        act = lambda t: torch.relu(t) * self.scale  # noqa: E731
        add = lambda a, b=1.0: a + b  # noqa: E731
        rows = sorted(x.unbind(0), key=lambda t: t.sum().item())
        shifted = list(map(lambda t: t + 1, rows))
        return act(self.lin(x)), add(x), add(x, b=x), torch.stack(shifted)


def test_lambda_assigned_called_and_used_as_sort_key():
    run(Lambdas(), x=randn(4, 3))


class LambdaLoopBinding(nn.Module):
    def forward(self, x):
        late = [lambda t: t * k for k in range(1, 4)]
        early = [lambda t, k=k: t * k for k in range(1, 4)]
        return [f(x) for f in late], [f(x) for f in early]


def test_lambdas_late_bind_loop_variable_unless_default_arg():
    run(LambdaLoopBinding(), x=randn(2))


# ---------------------------------------------------------------------------------------- nested functions / closures


class NestedFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        def block(t, repeat=1, **opts):
            for _ in range(repeat):
                t = self.lin(t) * opts.get("gain", 1.0)
            return t

        return block(x), block(x, repeat=2, gain=0.5)


def test_nested_function_with_defaults_kwargs_and_self():
    run(NestedFunction(), x=randn(2, 3))


class ClosureAssignedLater(nn.Module):
    def forward(self, x):
        def scaled(t):
            return t * factor + offset

        factor = x.mean()
        offset = 2.0
        first = scaled(x)
        factor = factor * 3
        return first, scaled(x)


def test_closure_reads_variable_assigned_after_definition():
    run(ClosureAssignedLater(), x=randn(2, 3))


class ClosureNonlocal(nn.Module):
    def forward(self, x):
        count = 0
        total = torch.zeros_like(x)

        def accumulate(t):
            nonlocal count, total
            count += 1
            total = total + t * count
            return total

        for row_scale in (1.0, 2.0, 3.0):
            accumulate(x * row_scale)
        return total, count


def test_closure_modifies_enclosing_variables_via_nonlocal():
    run(ClosureNonlocal(), x=randn(3))


class TwoLevelClosure(nn.Module):
    def forward(self, x):
        calls = 0

        def outer(t):
            def inner(u):
                nonlocal calls
                calls += 1
                return u * 2

            return inner(inner(t))

        y = outer(x)
        return y + calls


def test_nonlocal_across_two_levels_of_nesting():
    run(TwoLevelClosure(), x=randn(3))


class RecursiveClosure(nn.Module):
    def forward(self, x):
        def apply(t, n):
            return t if n == 0 else apply(torch.sin(t), n - 1)

        return apply(x, 3)


def test_nested_function_calls_itself_recursively():
    run(RecursiveClosure(), x=randn(4))


# ---------------------------------------------------------------------------------------- starred targets / args


class StarredTargets(nn.Module):
    def forward(self, x):
        first, *rest = x.unbind(0)
        head, *middle, tail = x.unbind(0)
        *batch, features = x.shape
        a, *empty, b = x[:2].unbind(0)
        return first, torch.stack(rest), torch.stack(middle) + tail, head, batch, features, empty, a + b


def test_starred_assignment_targets_collect_rest_and_middle():
    run(StarredTargets(), x=randn(4, 3))


class StarredArgs(nn.Module):
    def forward(self, x):
        shape = x.shape[:2]
        a = x.view(*shape, -1)                      # star first
        b = x.reshape(x.shape[0], *x.shape[1:])     # star last
        order = (2, 1)
        c = x.permute(0, *order, 3)                 # star in the middle
        d = x.reshape(*x.shape[:1], *x.shape[1:3], -1)  # two stars
        e = torch.zeros(*TAIL_SHAPE) + x.sum()
        return a, b, c, d, e


def test_starred_arguments_in_any_position():
    run(StarredArgs(), x=randn(2, 3, 2, 2))


# ---------------------------------------------------------------------------------------- *args / **kwargs


class VarKeywordForward(nn.Module):
    def forward(self, x, *args, scale=1.0, **kwargs):
        assert not args
        for name in sorted(kwargs):
            x = x + kwargs[name]
        return x * scale, sorted(kwargs)


def test_forward_with_var_positional_and_var_keyword_signature():
    run(VarKeywordForward(), x=randn(2, 3), bias=randn(3), shift=randn(2, 3), scale=2.0)


def test_forward_var_keyword_empty_uses_defaults():
    run(VarKeywordForward(), x=randn(2, 3))


class CallSiteStars(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def _mix(self, *tensors, weight=1.0, bias=0.0):
        return sum(t * weight for t in tensors) + bias

    def forward(self, x):
        parts = [x, x * 2, self.lin(x)]
        opts = {"weight": 0.5, "bias": 1.0}
        mixed = self._mix(*parts, **opts)
        partial = self._mix(x, *parts[1:], weight=2.0)
        reduced = torch.sum(x, **{"dim": -1, "keepdim": True})
        padded = F.pad(x, **{"pad": (1, 1), "value": 0.5})
        projected = self.lin(*[x])
        return mixed, partial, reduced, padded, projected


def test_starred_args_and_double_star_kwargs_at_call_sites():
    run(CallSiteStars(), x=randn(2, 3))


# ---------------------------------------------------------------------------------------- assignment forms


class ChainedAssignment(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        a = b = self.lin(x)
        a = a + 1                      # rebinding a leaves b alone
        c = d = torch.zeros_like(x)
        c += x                         # in place: d is the same tensor
        first, second = halves = x.chunk(2, dim=0)
        return a, b, d, first + second, len(halves)


def test_chained_assignment_binds_one_object_to_all_targets():
    run(ChainedAssignment(), x=randn(4, 3))


class TupleUnpacking(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        (p, q), r = (x[0], x[1]), x.sum(0)
        a, b = b, a
        out, (h, c) = self.lstm(x)
        batch, seq, _ = x.shape
        return a - b, p * q + r, out, h, c, batch * seq


def test_tuple_unpacking_nested_swap_and_module_output():
    run(TupleUnpacking(), x=randn(2, 5, 3))


class SubscriptAssignment(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x).clone()
        y[:, 0] = 0.0
        y[:, 1:] = x[:, 1:] * 2
        y[0] += 1
        y[:, -1] *= x[:, 0]
        y[y < 0] = 0.0
        y[..., 1] -= 0.5
        parts = [x, x]
        parts[1] = x * 3
        store = {"acc": x * 1}
        store["acc"] += 1
        return y, parts, store


def test_subscript_and_augmented_subscript_assignment():
    run(SubscriptAssignment(), x=randn(3, 3))


class AugmentedAssignAliases(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        alias = y
        y += 1          # in place: alias sees it
        z = self.lin(x)
        keep = z
        z = z + 1       # rebinding: keep does not
        n = 2
        n *= 3
        names = ["a"]
        names += ["b"]
        return alias, keep, z * n, len(names)


def test_augmented_assignment_on_tensor_is_in_place():
    run(AugmentedAssignAliases(), x=randn(2, 3))


class InPlaceMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        y.add_(1.0).mul_(2)
        y.relu_()
        z = F.relu(self.lin(x) - 0.1, inplace=True) * 2
        z.clamp_(min=-0.5, max=0.5)
        z.masked_fill_(z > 0.4, 0.0)
        w = self.lin(x)
        view = w[:, :2]
        view.zero_()               # writes through the view into w
        return y, z, w


def test_in_place_tensor_methods_and_writes_through_views():
    run(InPlaceMethods(), x=randn(4, 3))


class InPlaceBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y - self.ema


def test_in_place_update_of_buffer_is_kept():
    run(InPlaceBuffer(), x=randn(4, 3))


class Deletes(nn.Module):
    def forward(self, x):
        tmp = x * 2
        y = tmp + 1
        del tmp
        tmp = y * 3
        parts = [x, x * 2, x * 3, x * 4]
        del parts[0]
        del parts[1:2]
        d = {"a": x, "b": x + 1}
        del d["a"]
        return tmp, parts, d


def test_del_names_list_items_slices_and_dict_keys():
    run(Deletes(), x=randn(2))


# ---------------------------------------------------------------------------------------- module-level helpers


class UsesModuleHelpers(nn.Module):
    def __init__(self, activation="tanh"):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.activation = activation

    def forward(self, x):
        act = ACTIVATIONS[self.activation]
        y = residual(lambda t: act(self.lin(t)), x)
        y = soft_clip(y, limit=SCALE * 4)
        return y.reshape(-1, *TAIL_SHAPE)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_module_level_helper_functions_and_constants(activation):
    run(UsesModuleHelpers(activation), x=randn(3, 4))


# ---------------------------------------------------------------------------------------- decorated forward


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


def scaled_output(factor):
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            return fn(self, *args, **kwargs) * factor
        return wrapper
    return decorate


class DecoratedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @passthrough
    def forward(self, x):
        return self.lin(x) + 1


class DecoratedScalingForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    @scaled_output(3.0)
    def forward(self, x, shift=0.0):
        return self.lin(x) + shift


def test_forward_decorated_with_functools_wraps_passthrough():
    run(DecoratedForward(), x=randn(2, 3))


def test_forward_decorated_with_functools_wraps_changing_output():
    run(DecoratedScalingForward(), x=randn(2, 3), shift=0.5)


# ---------------------------------------------------------------------------------------- scalar inputs


class ScalarInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, steps: int = 2, scale: float = 1.0, flip: bool = False, mask=None):
        for _ in range(steps):
            x = torch.tanh(self.lin(x)) * scale
        if flip:
            x = x.flip(-1)
        if mask is not None:
            x = x.masked_fill(mask, 0.0)
        return x


def test_scalar_inputs_int_float_bool_passed():
    run(ScalarInputs(), x=randn(2, 3), steps=3, scale=0.5, flip=True)


def test_scalar_inputs_fall_back_to_defaults():
    run(ScalarInputs(), x=randn(2, 3))


def test_optional_tensor_input_given():
    run(ScalarInputs(), x=randn(2, 3), mask=torch.tensor([[True, False, False], [False, False, True]]))


# ---------------------------------------------------------------------------------------- return values


class ReturnsTuple(nn.Module):
    def forward(self, x):
        return x * 2, x.sum(), x.shape[0]


class ReturnsDict(nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "loss": x.pow(2).mean(), "aux": None}


class ReturnsNested(nn.Module):
    def forward(self, x):
        h = x.tanh()
        return {"out": (h, [h.sum(0), {"deep": h.mean()}]), "list": [x, (x + 1, x + 2)], "n": len(x)}


class EarlyReturnInLoop(nn.Module):
    def forward(self, x):
        for i in range(10):
            x = x * 2
            if x.abs().sum() > 20:
                return x, i
        return x, -1


def test_returns_tuple_with_python_int():
    run(ReturnsTuple(), x=randn(3, 2))


def test_returns_dict_with_none_value():
    run(ReturnsDict(), x=randn(3, 2))


def test_returns_nested_structure():
    run(ReturnsNested(), x=randn(3, 2))


def test_early_return_from_inside_loop():
    run(EarlyReturnInLoop(), x=randn(3, 2))
