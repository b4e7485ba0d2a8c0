"""Models whose forwards hand work to code the schema does not lower: library helpers that take a
bound method or a module, processor objects, explicit `.forward` calls, parametrizations, private
names, call defaults, Python's own RNG. Shared by the live-call tests of several stages."""

from __future__ import annotations

import functools
import random

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint
from torch import nn
from torch.nn.utils import parametrize


def apply_twice(fn, x):
    """A library-style helper: calls what it is given (a module or a bound method)."""
    return fn(fn(x))


class Processor:
    """A diffusers-style attention processor: a plain object whose __call__ uses the module's children."""

    def __call__(self, attn, hidden):
        query = attn.to_q(hidden)
        key = attn.to_k(hidden)
        weights = torch.softmax(query @ key.transpose(-1, -2), dim=-1)
        return attn.to_out(weights @ hidden)


class HandsWorkAway(nn.Module):
    """Every way in which a forward's modules were run by code outside the schema."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.to_q = nn.Linear(4, 4)
        self.to_k = nn.Linear(4, 4)
        self.to_out = nn.Linear(4, 4)
        self.lins = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.processor = Processor()

    def chunk(self, x):
        return self.c(x).tanh()

    def forward(self, x):
        y = apply_twice(self.a, x)  # a module handed to a helper
        y = checkpoint.checkpoint(self.b, y, use_reentrant=False)
        y = functools.partial(self.c)(y)
        y = apply_twice(self.chunk, y)  # a bound method handed to a helper
        for lin in self.lins:
            y = lin.forward(y)  # an explicit forward call (PyG's ChebConv does this)
        return self.processor(self, y)


class Parametrized(nn.Module):
    """A weight computed when it is read (`register_parametrization`)."""

    class Symmetric(nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).transpose(-1, -2)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        parametrize.register_parametrization(self.fc, "weight", Parametrized.Symmetric())

    def forward(self, x):
        return self.fc(x) * 2


class Unregistered(nn.Module):
    """A module the forward reaches although it is no sub-module (kept in a plain list)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.hidden = [nn.Linear(4, 4)]

    def forward(self, x):
        return self.hidden[0](self.fc(x))


class PrivateNames(nn.Module):
    """`self.__scale` and `self.__helper(x)`: names CPython mangles to `_PrivateNames__...`."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.__scale = 3.0

    def __helper(self, x):
        return x * self.__scale

    def forward(self, x):
        return self.__helper(self.fc(x))


class CallDefaults(nn.Module):
    """Defaults Python evaluated at `def` time with calls (x-transformers: `embed_ids: dict = dict()`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, embed_ids: dict = dict(), offset=float(len("abc")), *, scale=max(1, 2)):
        return self.fc(x) * scale + offset + len(embed_ids)


class DrawsFromPythonRandom(nn.Module):
    """Layer dropout with Python's `random` and numpy (x-transformers draws from `random`)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(6)])

    def forward(self, x):
        for layer in self.layers:
            if random.random() < 0.5:
                continue
            x = layer(x) * float(np.random.rand())
        return x


SCALE = 0.5


def scale_helper(x):
    return x * 3


def make_closure_model():
    factor = [2.0]
    act = F.gelu

    class ClosureModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return act(self.fc(x)) * factor[0]

    return ClosureModel


class ReadsGlobals(nn.Module):
    """Reads a module global, a global function and a dotted chain rooted at a global (`F.gelu`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return scale_helper(F.gelu(self.fc(x))) * SCALE


class DeeplyNested(nn.Module):
    """Nested past the code generator's block limit, reading a module global at the bottom."""

    def forward(self, x):
        for _ in range(1):
            for _ in range(1):
                for _ in range(1):
                    for _ in range(1):
                        for _ in range(1):
                            for _ in range(1):
                                for _ in range(1):
                                    for _ in range(1):
                                        for _ in range(1):
                                            for _ in range(1):
                                                for _ in range(1):
                                                    for _ in range(1):
                                                        for _ in range(1):
                                                            for _ in range(1):
                                                                x = x * SCALE
        return x


FAST_IMPLEMENTATIONS = {}


def dispatching(cls):
    """A class decorator this package does not know, dispatching forward to a registered implementation."""
    original = cls.forward

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        implementation = FAST_IMPLEMENTATIONS.get(self.implementation, original)
        return implementation(self, *args, **kwargs)

    cls.forward = forward
    return cls


def fast_scale(self, x):
    return self.fc(x) * 2


@dispatching
class Dispatched(nn.Module):
    def __init__(self, implementation="fast"):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.implementation = implementation

    def forward(self, x):
        return self.fc(x) * 2


FAST_IMPLEMENTATIONS["fast"] = fast_scale


class HoldsDispatched(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Dispatched()
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.inner(x))
