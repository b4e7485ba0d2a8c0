"""The one comparison helper of the suite: run eager, run the schema, compare bit for bit.

Every fixture and construct test goes through `assert_schema_matches_eager`, so "exact" means the
same thing everywhere: `torch.equal` on every output tensor (values, shapes, dtypes, container
structure), on every parameter gradient after the same backward pass, and on every buffer after the
run.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from nnschemaparser import NNParser, SchemaInterpreter


def assert_same_structure(expected: Any, actual: Any, where: str = "output") -> None:
    """Fail unless `actual` equals `expected` exactly: tensors by torch.equal, containers elementwise."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {type(actual).__name__}"
        assert expected.dtype == actual.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
        assert expected.shape == actual.shape, f"{where}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert torch.equal(expected, actual), f"{where}: values differ (max abs diff {(expected.double() - actual.double()).abs().max().item()})"
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a mapping, got {type(actual).__name__}"
        assert list(expected.keys()) == list(actual.keys()), f"{where}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same_structure(expected[key], actual[key], f"{where}[{key!r}]")
        return
    if isinstance(expected, (list, tuple)):
        assert type(expected) is type(actual), f"{where}: {type(actual).__name__} != {type(expected).__name__}"
        assert len(expected) == len(actual), f"{where}: length {len(actual)} != {len(expected)}"
        for index, (e, a) in enumerate(zip(expected, actual)):
            assert_same_structure(e, a, f"{where}[{index}]")
        return
    assert type(expected) is type(actual) and expected == actual, f"{where}: {actual!r} != {expected!r}"


def _float_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.requires_grad else []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _float_tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _float_tensors(v)]
    return []


def _clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else copy.deepcopy(v))
            for k, v in inputs.items()}


def assert_schema_matches_eager(
    model: nn.Module,
    inputs: dict[str, Any],
    *,
    train: bool = False,
    seed: int = 0,
    check_grads: bool = True,
) -> Any:
    """Parse `model`, run it eagerly and through the schema from the same state, compare exactly.

    `inputs` maps forward parameter names to values. In train mode both runs start from the same RNG
    seed and the same buffers, so dropout masks and BatchNorm statistics must match bit for bit.
    Returns the parsed schema for further assertions.
    """
    model.train(train)
    tensor_inputs = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    schema = NNParser.parse_model(
        model=model,
        inputs_tensors_shapes={k: tuple(v.shape) for k, v in tensor_inputs.items()},
        inputs_tensors_dtypes={k: str(v.dtype) for k, v in tensor_inputs.items()},
        inputs_tensors_values=_clone_inputs(inputs),
    )
    assert model.training == train, "parsing changed the model's training mode"

    twin = copy.deepcopy(model)  # same parameters and buffers; runs the eager side
    eager_inputs = _clone_inputs(inputs)
    schema_inputs = _clone_inputs(inputs)

    torch.manual_seed(seed)
    expected = twin(**eager_inputs)
    torch.manual_seed(seed)
    outputs = SchemaInterpreter().call(schema, **schema_inputs)
    assert_same_structure(expected, outputs)

    for (name, b_eager), (_, b_schema) in zip(twin.named_buffers(), model.named_buffers()):
        assert torch.equal(b_eager, b_schema), f"buffer {name} differs after the run"

    if check_grads:
        eager_leaves = _float_tensors(expected)
        schema_leaves = _float_tensors(outputs)
        if eager_leaves:
            sum(t.float().sum() for t in eager_leaves).backward()
            sum(t.float().sum() for t in schema_leaves).backward()
            for (name, p_eager), (_, p_schema) in zip(twin.named_parameters(), model.named_parameters()):
                if p_eager.grad is None:
                    assert p_schema.grad is None, f"{name}: schema produced a gradient eager did not"
                else:
                    assert p_schema.grad is not None, f"{name}: no gradient through the schema"
                    assert torch.equal(p_eager.grad, p_schema.grad), f"{name}: gradient differs"
            for key in inputs:
                a, b = eager_inputs[key], schema_inputs[key]
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    assert torch.equal(a.grad, b.grad), f"input {key}: gradient differs"
            model.zero_grad(set_to_none=True)
    return schema


def hooked_outputs(modules, call) -> list:
    """What forward hooks on `modules` see while `call()` runs (no grad), in call order: each module's
    output, the first element when it returns a tuple (a transformers layer's hidden states)."""
    import torch

    seen: list = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple) else out))
             for m in modules]
    try:
        with torch.no_grad():
            call()
    finally:
        for hook in hooks:
            hook.remove()
    return seen
