"""Module constructs in forward, each in a tiny module, run through the schema and compared exactly.

Covers getattr with f-strings, ModuleList slicing and negative indexing, zip/reversed/enumerate over
ModuleLists, ModuleDict dispatch and iteration, Sequential subclasses iterating and indexing `self`,
zero-arg and explicit `super().forward`, helper and recursive methods, explicit `.forward()` calls,
shared children, direct parameter and buffer use, static methods and properties.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.lowering.exactly import randn, run, seeded  # noqa: F401 (seeded: the autouse fixture)


# ---------------------------------------------------------------------------------------- getattr


class GetattrLayers(nn.Module):
    def __init__(self, num_layers=3):
        super().__init__()
        self.num_layers = num_layers
        for i in range(num_layers):
            setattr(self, f"layer{i}", nn.Linear(4, 4))

    def forward(self, x):
        for i in range(self.num_layers):
            x = torch.relu(getattr(self, f"layer{i}")(x))
        extra = getattr(self, "extra", None)
        if extra is not None:
            x = extra(x)
        return x


def test_getattr_with_fstring_layer_name_and_default():
    run(GetattrLayers(), x=randn(2, 4))


# ---------------------------------------------------------------------------------------- ModuleList


class ModuleListSlicing(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(5)])

    def forward(self, x):
        h = self.layers[0](x)
        for layer in self.layers[1:]:
            h = torch.tanh(layer(h))
        skip = self.layers[-1](x)
        for layer in self.layers[::2]:
            skip = skip + layer(x)
        for layer in self.layers[1:-1]:
            skip = skip * 0.5 + layer(skip)
        return h, skip


def test_modulelist_slicing_and_negative_indexing():
    run(ModuleListSlicing(), x=randn(3, 4))


class ModuleListByIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = self.layers[i](x) + x
        return self.layers[-2](x) + self.layers[len(self.layers) - 1](x)


def test_modulelist_indexed_by_loop_counter_and_len():
    run(ModuleListByIndex(), x=randn(2, 4))


class ModuleListZipReversedEnumerate(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoders = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.decoders = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        skips = []
        for i, enc in enumerate(self.encoders):
            x = torch.relu(enc(x))
            if i % 2 == 0:
                skips.append(x)
        for enc, dec in zip(self.encoders, self.decoders):
            x = x + dec(enc(x))
        for dec in reversed(self.decoders):
            x = dec(x)
        for skip, dec in zip(reversed(skips), self.decoders):
            x = x + dec(skip)
        return x


def test_zip_reversed_and_enumerate_over_modulelists():
    run(ModuleListZipReversedEnumerate(), x=randn(2, 4))


# ---------------------------------------------------------------------------------------- ModuleDict


class ModuleDictDispatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({
            "cls": nn.Linear(4, 3),
            "reg": nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)),
        })

    def forward(self, x, task: str = "cls"):
        out = self.heads[task](x)
        if "aux" in self.heads:
            out = out + self.heads["aux"](x)
        return out


@pytest.mark.parametrize("task", ["cls", "reg"])
def test_moduledict_dispatch_by_key_from_string_input(task):
    run(ModuleDictDispatch(), x=randn(2, 4), task=task)


def test_moduledict_dispatch_by_default_key():
    run(ModuleDictDispatch(), x=randn(2, 4))


class ModuleDictIteration(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleDict({
            "a": nn.Linear(4, 2),
            "b": nn.Linear(4, 2),
            "c": nn.Linear(4, 2),
        })

    def forward(self, x):
        outputs = {name: branch(x) for name, branch in self.branches.items()}
        total = sum(branch(x) for branch in self.branches.values())
        keys = list(self.branches.keys())
        for name in self.branches:
            outputs[name] = outputs[name] + total
        return outputs, keys, len(self.branches)


def test_moduledict_items_values_keys_and_iteration():
    run(ModuleDictIteration(), x=randn(2, 4))


# ---------------------------------------------------------------------------------------- Sequential subclasses


class IteratingSequential(nn.Sequential):
    def forward(self, x):
        for i, module in enumerate(self):
            x = module(x)
            if i == 0:
                first = x
        return x + first.sum()


def test_sequential_subclass_forward_iterates_self():
    model = IteratingSequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    run(model, x=randn(2, 4))


class IndexingSequential(nn.Sequential):
    def forward(self, x):
        h = self[0](x)
        for module in self[1:-1]:
            h = module(h)
        return self[-1](h) + self[0](x).mean() * len(self)


def test_sequential_subclass_indexes_and_slices_self():
    model = IndexingSequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 4))
    run(model, x=randn(2, 4))


# ---------------------------------------------------------------------------------------- super().forward


class ScaledSequential(nn.Sequential):
    def forward(self, x):
        return super().forward(x) * 2


class ExplicitSuperSequential(nn.Sequential):
    def forward(self, x):
        return super(ExplicitSuperSequential, self).forward(x + 1)


def test_zero_arg_super_forward():
    run(ScaledSequential(nn.Linear(3, 3), nn.ReLU()), x=randn(2, 3))


def test_explicit_class_super_forward():
    run(ExplicitSuperSequential(nn.Linear(3, 3), nn.Tanh()), x=randn(2, 3))


class BaseBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x)


class DerivedBlock(BaseBlock):
    def __init__(self):
        super().__init__()
        self.extra = nn.Linear(3, 3)

    def forward(self, x):
        base = super().forward(x)
        return self.extra(base) + base


class DerivedTwiceBlock(DerivedBlock):
    def forward(self, x):
        return super().forward(x) - BaseBlock.forward(self, x)


def test_super_forward_of_custom_base_module():
    run(DerivedBlock(), x=randn(2, 3))


def test_super_forward_through_two_levels_and_unbound_base_call():
    run(DerivedTwiceBlock(), x=randn(2, 3))


# ---------------------------------------------------------------------------------------- methods


class HelperMethods(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def _project(self, x, gain=1.0):
        return self.lin(x) * gain

    def _block(self, x):
        return self.norm(self._project(x, gain=0.5) + x)

    @staticmethod
    def _squash(t):
        return t / (1 + t.abs())

    @property
    def width(self):
        return self.lin.out_features

    def forward(self, x):
        y = self._block(x)
        y = self._squash(self._project(y))
        return y * self.width


def test_helper_methods_static_method_and_property():
    run(HelperMethods(), x=randn(3, 4))


class RecursiveMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def _refine(self, x, depth):
        if depth == 0:
            return x
        return self._refine(torch.tanh(self.lin(x)) + x, depth - 1)

    def forward(self, x, depth: int = 3):
        return self._refine(x, depth)


@pytest.mark.parametrize("depth", [0, 3])
def test_recursive_method_with_bounded_depth(depth):
    run(RecursiveMethod(), x=randn(2, 4), depth=depth)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, scale=1.0):
        return self.lin(x) * scale


class ExplicitForwardCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        a = self.inner.forward(x)
        b = self.inner(x, scale=2.0)
        c = self.inner.forward(x, 0.5)
        return a + b + c


def test_explicit_forward_call_on_child_and_kwargs_call():
    run(ExplicitForwardCall(), x=randn(2, 3))


class SharedChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(3, 3)
        self.alias = self.shared

    def forward(self, x):
        return self.alias(self.shared(self.shared(x)))


def test_shared_child_called_several_times():
    run(SharedChild(), x=randn(2, 3))


class ThreeLevels(nn.Module):
    def __init__(self):
        super().__init__()
        self.outer = nn.Sequential(ExplicitForwardCall(), nn.ReLU(), nn.Sequential(Inner(), nn.Tanh()))

    def forward(self, x):
        return self.outer(x)


def test_children_nested_three_levels():
    run(ThreeLevels(), x=randn(2, 3))


class DirectParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.gate = nn.Parameter(torch.full((3,), 0.5))
        self.register_buffer("offset", torch.arange(3.0))

    def forward(self, x):
        y = F.linear(x, self.lin.weight, self.lin.bias)
        y = y * torch.sigmoid(self.gate) + self.offset
        return y @ self.lin.weight.t()


def test_direct_use_of_parameters_and_buffers():
    run(DirectParameters(), x=randn(2, 3))


class TrainingAwareChildren(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.block(x)
        if self.training:
            h = h + 0.1 * torch.randn_like(h)
        return self.head(h)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_children_follow_train_and_eval_mode(train):
    run(TrainingAwareChildren(), train=train, x=randn(6, 4))
