"""The oracle: one program run eagerly and through its schema, compared bit for bit.

A program is imported from a real .py file (the parser reads forwards from files), its `Model` is
built from a fixed seed, and the same inputs go to the eager forward and to the schema, each run from
the same model state and RNG seed (`preserved_state` puts the state back between runs). The schema is
parsed with `resolve=False`, so nothing the interpreter does is hidden by the parser's fallback of
re-dispatching a failing child to its real module; it then runs in the three runtime modes (plain,
observed with a trace listener, stepped). Each must give what eager gives:

* the same outputs: tensors by `torch.equal` (NaN where eager has NaN), same containers and types;
* or the same exception: same type, same `str()`;
* the same buffers, parameters and plain attributes afterwards, and the same (mutated) inputs.

When eager succeeds (with and without grad: the resolution run is under no_grad), `parse_model`
with example values must also resolve without skipping a block the lowering accepted. Parsing must
leave the model's parameters, buffers and training flags as they were. An error of nnschemaparser
itself (anything but the lowering's documented refusal) is an internal error.

Depends on nnschemaparser's public API, torch, and the suite's `exactness` comparison helper.
"""

from __future__ import annotations

import hashlib
import importlib.util
import linecache
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from nnschemaparser import NNParser, NNSchemaError, SchemaInterpreter, TraceRecorder, UnsupportedSyntaxError
from nnschemaparser.runtime.interpreter import outputs_list
from nnschemaparser.parser.model_parser import preserved_state

from tests.support.exactness import assert_same_structure

__all__ = ["Outcome", "check_source", "check_model", "assert_schema_matches_eager_or_raises_alike"]

_SEED = 1234  # every run starts from this RNG state: dropout and rand_like draw the same numbers


@dataclass
class Outcome:
    """The verdict on one program: match, divergence, internal_error or invalid_program."""

    verdict: str
    category: str = ""
    detail: str = ""
    refusals: list[str] = field(default_factory=list)
    eager_error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.verdict == "match"

    def describe(self) -> str:
        head = f"{self.verdict}: {self.category}" if self.category else self.verdict
        return f"{head}\n{self.detail}" if self.detail else head


@dataclass
class _Run:
    value: Any
    error: Optional[BaseException]
    state: dict


# --- loading programs ---------------------------------------------------------------------------


def import_source(source: str, directory: Path) -> Any:
    """Write `source` to a fresh .py file under `directory` and import it as a module."""
    name = "fuzz_program_" + hashlib.sha1(source.encode()).hexdigest()[:16]
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def check_source(source: str, directory: Path) -> Outcome:
    """Import the program `source` and check its `Model` on `make_inputs()`."""
    try:
        module = import_source(source, directory)
    except Exception as exc:  # the generator wrote something Python does not accept
        return Outcome("invalid_program", "import failed", _exc_text(exc))
    try:
        torch.manual_seed(0)
        model = module.Model()
        model.train(bool(module.TRAIN))
        inputs = module.make_inputs()
    except Exception as exc:
        return Outcome("invalid_program", "construction failed", _exc_text(exc))
    finally:
        sys.modules.pop(module.__name__, None)
    try:  # a program of the names family puts its module names back before each run
        return check_model(model, inputs, before_run=getattr(module, "reset_names", None))
    finally:
        linecache.cache.pop(getattr(module, "__file__", None), None)  # the file is temporary


# --- the comparison -----------------------------------------------------------------------------


def check_model(model: nn.Module, inputs: dict[str, Any], before_run: Optional[Callable[[], None]] = None) -> Outcome:
    """Compare eager against the schema of `model` on `inputs` in every runtime mode (`before_run`:
    called before each run, e.g. to put back module names the forward rebinds)."""
    before = _state(model)
    try:
        schema = NNParser.parse_model(model, resolve=False)
    except Exception as exc:
        return Outcome("internal_error", "parse_model(resolve=False) raised", _exc_text(exc))
    changed = _state_difference(before, _state(model))
    if changed:
        return Outcome("internal_error", "parsing changed the model", changed)
    refusals = [f"{block.path or block.name}: {block.skip_reason}" for block in schema.iter_blocks()
                if block.skip_reason is not None]
    eager = _execute(model, lambda kw: model(**kw), inputs, before_run)
    runners: dict[str, Callable[[dict], Any]] = {
        "plain": lambda kw: SchemaInterpreter().call(schema, **kw),
        "observed": lambda kw: SchemaInterpreter(capture_values=True, listeners=[TraceRecorder()]).call(schema, **kw),
        "stepped": lambda kw: _stepped(schema, kw),
    }
    eager_error = _exc_text(eager.error) if eager.error is not None else None
    for mode, runner in runners.items():
        result = _execute(model, runner, inputs, before_run)
        expected = outputs_list(eager.value) if mode == "stepped" else eager.value
        problem = _compare(eager, result, expected)
        if problem is not None:
            verdict = "internal_error" if _is_ours(result.error) else "divergence"
            return Outcome(verdict, f"{mode}: {problem[0]}", problem[1], refusals, eager_error)
    if eager.error is None:
        refused_paths = {b.path for b in schema.iter_blocks() if b.skip_reason is not None}
        problem = _resolution_problem(model, inputs, refused_paths)
        if problem is not None:
            return Outcome("internal_error", problem[0], problem[1], refusals, eager_error)
    return Outcome("match", refusals=refusals, eager_error=eager_error)


def assert_schema_matches_eager_or_raises_alike(model: nn.Module, inputs: dict[str, Any]) -> Outcome:
    """The oracle as an assertion, for regression tests: fails with the divergence it finds."""
    outcome = check_model(model, inputs)
    assert outcome.ok, outcome.describe()
    return outcome


def _stepped(schema: Any, scope: dict) -> list:
    interpreter = SchemaInterpreter(capture_values=True)
    for _ in interpreter.step_run(schema, scope=scope):
        pass
    return interpreter.step_outputs


def _execute(model: nn.Module, call: Callable[[dict], Any], inputs: dict,
             before_run: Optional[Callable[[], None]] = None) -> _Run:
    scope = _clone(inputs)
    if before_run is not None:
        before_run()
    with preserved_state(model):
        torch.manual_seed(_SEED)
        try:
            value, error = _clone(call(scope)), None
        except Exception as exc:
            value, error = None, exc
        state = _state(model)
        state["inputs"] = _clone(scope)
    return _Run(value, error, state)


def _compare(eager: _Run, result: _Run, expected: Any) -> Optional[tuple[str, str]]:
    if eager.error is not None or result.error is not None:
        if eager.error is None:
            return "the schema raised where eager returned", _exc_text(result.error, traceback=True)
        if result.error is None:
            return "eager raised where the schema returned", _exc_text(eager.error)
        if type(eager.error) is not type(result.error) or str(eager.error) != str(result.error):
            return ("a different exception",
                    f"eager:  {_exc_text(eager.error)}\nschema: {_exc_text(result.error, traceback=True)}")
    else:
        try:
            assert_same_structure(_nan_aware(expected), _nan_aware(result.value))
        except AssertionError as exc:
            return "different outputs", str(exc)
    difference = _state_difference(eager.state, result.state)
    if difference:
        return "different state after the run", difference
    return None


def _resolution_problem(model: nn.Module, inputs: dict, refused: set) -> Optional[tuple[str, str]]:
    before = _state(model)
    if _execute(model, lambda kw: _no_grad_call(model, kw), inputs).error is not None:
        return None  # resolution runs under no_grad, where this eager forward takes another path and raises
    torch.manual_seed(_SEED)  # the resolution run draws the random numbers the eager run drew
    try:
        schema = NNParser.parse_model(model, inputs_tensors_values=_clone(inputs))
    except Exception as exc:
        return "parse_model with example values raised", _exc_text(exc, traceback=True)
    failed = [f"{b.path or b.name}: {b.skip_reason}" for b in schema.iter_blocks()
              if b.skip_reason is not None and b.path not in refused]
    if failed:
        return "the resolution run skipped a block the lowering accepted", "\n".join(failed)
    changed = _state_difference(before, _state(model))
    if changed:
        return "parse_model with example values changed the model", changed
    return None


def _no_grad_call(model: nn.Module, inputs: dict) -> Any:
    with torch.no_grad():
        return model(**inputs)


def _is_ours(error: Optional[BaseException]) -> bool:
    return isinstance(error, NNSchemaError) and not isinstance(error, UnsupportedSyntaxError)


# --- values -------------------------------------------------------------------------------------


class _NanAware:
    """A float tensor or float holding NaN: equal to another with NaN in the same places."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, _NanAware):
            return False
        a, b = self.value, other.value
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, float("inf"), float("-inf")),
                                                                 b.nan_to_num(0.0, float("inf"), float("-inf")))

    def __repr__(self) -> str:
        return f"NaN-holding {self.value!r}"


def _nan_aware(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and bool(value.isnan().any()):
            return _NanAware(value)
        return value
    if isinstance(value, float) and math.isnan(value):
        return _NanAware(value)
    return _map(value, _nan_aware)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return _map(value, _clone)


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return type(value)((k, fn(v)) for k, v in value.items()) if type(value) is dict else value
    if isinstance(value, list) and type(value) is list:
        return [fn(v) for v in value]
    if isinstance(value, tuple):
        items = [fn(v) for v in value]
        if type(value) is tuple:
            return tuple(items)
        try:
            return type(value)(items)
        except TypeError:
            return type(value)(*items)
    return value


def _state(model: nn.Module) -> dict:
    """Parameters, buffers, plain attributes and training flags, by qualified name (cloned)."""
    state: dict[str, Any] = {}
    for prefix, module in model.named_modules():
        for store in ("_parameters", "_buffers"):
            for name, value in getattr(module, store).items():
                state[f"{prefix}.{name}"] = None if value is None else value.detach().clone()
        for name, value in module.__dict__.items():
            if not name.startswith("_"):
                state[f"{prefix}.{name}"] = _clone(value)
    return state


def _state_difference(a: dict, b: dict) -> str:
    if a.keys() != b.keys():
        return f"entries {sorted(set(a) ^ set(b))} exist on one side only"
    for key in a:
        try:
            assert_same_structure(_nan_aware(a[key]), _nan_aware(b[key]), key)
        except AssertionError as exc:
            return str(exc)
    return ""


def _exc_text(exc: BaseException, traceback: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if traceback:
        notes = getattr(exc, "__notes__", None)
        if notes:
            text += "\n  " + "\n  ".join(notes)
    return text
