"""Models of issue 14 (items 7-11, 14): TorchScript and compiled children, bound local functions,
tuple subclasses, lazy modules, imports on branches that never run, and real wrappers.

`run_every_way` is the check each wrapper test makes: parse, then `run`, `capture_run` and
`step_run` must each equal eager (from the same state and RNG) bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter, capture_run
from nnschemaparser.parser.equality import first_mismatch


class Small(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


class HoldsScripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.scripted = torch.jit.script(Small())

    def forward(self, x):
        return self.scripted(self.pre(x)) * 2


class HoldsTraced(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.traced = torch.jit.trace(Small(), torch.randn(2, 4))

    def forward(self, x):
        return self.traced(self.pre(x)) - 1


class HoldsCompiled(nn.Module):
    def __init__(self, compile_fn: Callable):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.compiled = compile_fn(Small())

    def forward(self, x):
        return self.compiled(self.pre(x))


class BindsLocalFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        def shifted(module, y, shift=1.0):
            return module.fc(y) + shift

        bound = shifted.__get__(self)
        return bound(x) * bound(x, shift=2.0)


class Opaque(tuple):
    """A tuple whose iteration raises: only its data can be compared."""

    def __iter__(self):
        raise RuntimeError("Opaque results cannot be iterated")


class ReturnsOpaque(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return Opaque((y, y.sum()))


class HoldsOpaqueChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ReturnsOpaque()

    def forward(self, x):
        out = self.inner(x)
        return tuple.__getitem__(out, 0) * tuple.__getitem__(out, 1)


class HoldsLazy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lazy = nn.LazyLinear(3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.lazy(x).tanh())


class NpuRMSNorm(nn.Module):
    """The shape of diffusers' RMSNorm: an accelerator-only import on a branch the CPU never takes."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + torch.arange(dim) / 10)
        self.on_npu = False

    def forward(self, hidden_states):
        if self.on_npu:
            import torch_npu_is_not_installed

            return torch_npu_is_not_installed.npu_rms_norm(hidden_states, self.weight, epsilon=self.eps)[0]
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return hidden_states * self.weight


class NormedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = NpuRMSNorm(4)

    def forward(self, x):
        return self.norm(self.proj(x))


class ImportsLate(nn.Module):
    """Every import form on a branch chosen by an input: each fails only when its branch runs."""

    def forward(self, x, which: int = 0):
        if which == 1:
            import torch_npu_is_not_installed  # noqa: F401
        elif which == 2:
            from torch_npu_is_not_installed.contrib import fused as f2  # noqa: F401
        elif which == 3:
            import torch_npu_is_not_installed.ops as ops  # noqa: F401
        elif which == 4:
            from torch import name_torch_does_not_have  # noqa: F401
        elif which == 5:
            from . import sibling_that_does_not_exist  # noqa: F401
        return x + which


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Small()
        self.second = Small()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        x = checkpoint(self.first, x, use_reentrant=False)
        x = self.drop(x)
        return checkpoint(self.second, x, use_reentrant=True)


# --- the check of every way to run -------------------------------------------------------------------


def _fresh(inputs: dict) -> dict:
    return {k: v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
            for k, v in inputs.items()}


def _same(expected: Any, actual: Any, what: str) -> None:
    mismatch = first_mismatch(expected, actual)
    assert mismatch is None, f"{what}: {mismatch}"


def run_every_way(model: nn.Module, inputs: dict, *, eager: Optional[nn.Module] = None, seed: int = 0,
                  twin: bool = True) -> Any:
    """Parse `model`; `run`, `capture_run` and `step_run` must each equal eager bit for bit.

    `eager` is the module eager runs (default `model`); with `twin`, eager runs on a deep copy, so
    its in-place effects (BatchNorm statistics) do not leak into the schema's run; every run starts
    from `seed`. Returns the schema and the steps of the stepped run.
    """
    schema = NNParser.parse_model(model, inputs_tensors_values=_fresh(inputs))
    reference = eager if eager is not None else model

    def eager_output() -> Any:
        module = copy.deepcopy(reference) if twin else reference
        torch.manual_seed(seed)
        return module(**_fresh(inputs))

    expected = eager_output()
    torch.manual_seed(seed)
    _same(expected, SchemaInterpreter().call(schema, **_fresh(inputs)), "call")
    expected = eager_output()
    torch.manual_seed(seed)
    (ran,) = SchemaInterpreter().run(schema, _fresh(inputs))
    _same(expected, ran, "run")
    expected = eager_output()
    torch.manual_seed(seed)
    record = capture_run(schema, _fresh(inputs))
    _same(expected, record.outputs[0], "capture_run")
    assert len(record.trace) > 0
    expected = eager_output()
    torch.manual_seed(seed)
    steps = []
    generator = SchemaInterpreter().step_run(schema, _fresh(inputs))
    while True:
        try:
            steps.append(next(generator))
        except StopIteration as stop:
            outputs = stop.value
            break
    _same(expected, outputs[0], "step_run")
    return schema, steps


def _local(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A DTensor's local shard (FSDP2 parameters and gradients); any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def gradients_match(model: nn.Module, inputs: dict, *, schema: Any, seed: int = 0) -> int:
    """Backward through eager and through the schema from the same state: every parameter's
    gradient (and every input's) must be equal bit for bit. Returns how many gradients compared."""
    def grads_after(run: Callable[[dict], Any]) -> tuple[list, list]:
        model.zero_grad(set_to_none=True)
        fresh = _fresh(inputs)
        torch.manual_seed(seed)
        out = run(fresh)
        out.float().sum().backward()
        params = [_local(p.grad).clone() if p.grad is not None else None for p in model.parameters()]
        given = [v.grad.clone() for v in fresh.values() if isinstance(v, torch.Tensor) and v.requires_grad]
        return params, given

    eager_params, eager_inputs = grads_after(lambda fresh: model(**fresh))
    schema_params, schema_inputs = grads_after(lambda fresh: SchemaInterpreter().call(schema, **fresh))
    model.zero_grad(set_to_none=True)
    compared = 0
    for index, (e, s) in enumerate(zip(eager_params + eager_inputs, schema_params + schema_inputs)):
        assert (e is None) == (s is None), f"gradient {index}: present in one run only"
        if e is not None:
            assert torch.equal(e, s), f"gradient {index} differs"
            compared += 1
    return compared
