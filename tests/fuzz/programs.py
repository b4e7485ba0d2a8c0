"""Whole fuzz programs: a Python module with a `Model(nn.Module)`, its children and `make_inputs()`.

`write_program(chooser)` assembles one module source from the grammar; `programs()` is the Hypothesis
strategy of them and `program_for_seed(seed)` the seeded one. A program is plain source text: the
oracle writes it to a real .py file and imports it, because the parser reads forwards from files.

Depends on `statements`, `grammar` and `choices`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from .choices import Chooser, DrawChooser, RandomChooser
from .grammar import Scope
from .statements import StatementGrammar

__all__ = ["Program", "write_program", "programs", "program_for_seed", "FAMILIES", "NAMES_HEADER"]


@dataclass(frozen=True)
class Program:
    """A generated module's source; `label` says where it came from (a seed, or Hypothesis)."""

    source: str
    label: str


_HEADER = '''"""A generated fuzz program ({label}): Model(nn.Module) and make_inputs()."""
import torch
import torch.nn.functional as F
from torch import nn

TRAIN = {train}


def scaled(t, k=2.0):
    return t * k


class Child(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.weight = nn.Parameter(torch.randn(4, 4) * 0.5)
        self.register_buffer("buf", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.scale = 0.5
        self.count = 0

    def forward(self, x):
'''

_MODEL = '''

class Base(nn.Module):
    def base_helper(self, t):
        return self.lin(t) * 0.5

    def scale_by(self, t, k=2):
        return t * k


class Model(Base):
    def scale_by(self, t, k=3):
        return super().scale_by(t, k=k) + t

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.weight = nn.Parameter(torch.randn(4, 4) * 0.5)
        self.register_buffer("buf", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.layers = nn.ModuleList([nn.Linear(4, 4), Child(), nn.Tanh()])
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": Child(), "c": nn.GELU()})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Child())
        self.child = Child()
        self.scale = 0.5
        self.count = 0

    def combine(self, *parts, weight=1.0, **extra):
        total = parts[0] * weight
        for part in parts[1:]:
            total = total + part
        for key in sorted(extra):
            total = total + extra[key]
        return total

    def helper(self, a, *rest, scale=1.0, **opts):
        a = a * scale
        for r in rest:
            a = a + r
        if 'bias' in opts:
            a = a + opts['bias']
'''

_SIGNATURES = [
    # (signature, scope variables, prologue lines, inputs beyond x)
    ("x, y, n=2, flag=True", {"tensor": ["x", "y"], "int": ["n"], "bool": ["flag"]}, [],
     ["y", "n?", "flag?"]),
    ("x, *args, y=None, n: int = 2, **kwargs", {"tensor": ["x", "y"], "int": ["n"], "seq": ["args"],
                                                "opts": ["kwargs"]},
     ["if y is None:", "    y = x.flip(0)"], ["y?", "n?", "bias?"]),
    ("x, y, mode: str = 'sum', n=3", {"tensor": ["x", "y"], "str": ["mode"], "int": ["n"]}, [],
     ["y", "mode?", "n?"]),
]


def _body(grammar: StatementGrammar, scope: Scope, depth: int, count: int) -> list[str]:
    grammar.lines = []
    grammar.body(scope, 2, count, depth)
    grammar.emit(2, f"return {grammar.returned(scope)}")
    return grammar.lines


# The "names" family's module names and the helpers that rebind them. The oracle puts them back
# (`reset_names()`) before each run, eager or not, and the Model's forward starts by doing it too, so
# that the parse's own runs start alike; what the forward and its Child read after a rebinding, and
# the names the forward returns last, must be what CPython reads.
NAMES_HEADER = '''
import types

G = 1.0
ACT = torch.relu
LIB = types.ModuleType("fuzz_names_lib")
LIB.K = 0.5
ACTS = {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu, "sigmoid": torch.sigmoid}


class Knobs:
    FACTOR = 2.0


def set_g(v):
    global G
    G = v


def use_act(name):
    global ACT
    ACT = ACTS[name]


def set_k(v):
    LIB.K = v


def bump():
    global G
    G = G * 2 + 1
    Knobs.FACTOR = Knobs.FACTOR - 0.5


def reset_names():
    global G, ACT
    G, ACT, LIB.K, Knobs.FACTOR = 1.0, torch.relu, 0.5, 2.0
'''

FAMILIES = (None, "names")


def write_program(c: Chooser, label: str = "hypothesis", seed: int = 0, family: str | None = None) -> Program:
    """One program: the Child forward, the Model helper and the Model forward, all generated.
    `family="names"` adds the names family (NAMES_HEADER); None writes the programs as before."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    grammar = StatementGrammar(c, unsupported=c.chance(3))
    grammar.names = family == "names"
    child_scope = Scope(owner="child", has_containers=False)
    child_scope.bind("x", "tensor")
    child = _body(grammar, child_scope, depth=1, count=c.integer(1, 3))

    helper_scope = Scope(owner="helper", has_containers=False)
    for name, kind in (("a", "tensor"), ("rest", "seq"), ("opts", "opts")):
        helper_scope.bind(name, kind)
    helper = _body(grammar, helper_scope, depth=2, count=c.integer(0, 3))

    signature, variables, prologue, extra = c.choice(_SIGNATURES)
    scope = Scope(owner="forward")
    for kind, names in variables.items():
        for name in names:
            scope.bind(name, kind)
    grammar.lines = ["        " + line for line in (["reset_names()"] if grammar.names else []) + prologue]
    grammar.body(scope, 2, c.integer(2, 8), c.integer(1, 3))
    returned = grammar.returned(scope)
    if grammar.names:  # the names as the forward reads them last, after whatever rebound them
        returned = f"({returned}, x * G + LIB.K * Knobs.FACTOR, ACT(x))"
    grammar.emit(2, f"return {returned}")
    forward = grammar.lines

    inputs = ['"x": torch.randn(2, 4, generator=g)']
    values = {"y": "torch.randn(2, 4, generator=g)", "n": str(c.integer(-1, 4)), "flag": c.choice(["True", "False"]),
              "mode": repr(c.choice(["sum", "abc"])), "bias": "torch.randn(2, 4, generator=g)"}
    for name in extra:
        optional = name.endswith("?")
        name = name.rstrip("?")
        if not optional or c.chance(50):
            inputs.append(f'"{name}": {values[name]}')
    header = _HEADER.format(label=label, train=c.choice(["False", "True"]))
    if grammar.names:  # before `class Child`: the header ends inside Child.forward's signature
        cut = header.index("\n\ndef scaled(")
        header = header[:cut] + "\n" + NAMES_HEADER + header[cut:]
    source = (header
              + "\n".join(child) + "\n" + _MODEL + "\n".join(helper)
              + f"\n\n    def forward(self, {signature}):\n" + "\n".join(forward)
              + "\n\n\ndef make_inputs():\n"
              + f"    g = torch.Generator().manual_seed({seed})\n"
              + "    return {" + ", ".join(inputs) + "}\n")
    return Program(source=source, label=label)


@st.composite
def programs(draw) -> Program:
    """The Hypothesis strategy of fuzz programs (shrinks toward short, simple forwards)."""
    return write_program(DrawChooser(draw))


def program_for_seed(seed: int, family: str | None = None) -> Program:
    """The program of a seed (of a family): the same source on every machine and run."""
    label = f"seed {seed}" if family is None else f"{family} seed {seed}"
    return write_program(RandomChooser(seed), label=label, seed=seed, family=family)
