"""The parser: builds the block tree of a live model and resolves shapes with one protected run.

`NNParser.parse_model` lowers every module's forward (and the methods it calls) into a block, keeps
every sub-module even if no run visits it, then runs the schema once on example inputs to fill
`resolved` shapes and dtypes. A child whose source cannot be lowered, that has no Python forward
(TorchScript, a `torch.compile` wrapper, a replaced forward: `special_modules`), or whose schema
fails where the eager module does not, is re-dispatched to the real module and listed in `skipped`;
so is a root that runs live, under the key "<root>". A `torch.compile(model)` root is parsed as the
module it wraps. The model's parameters, buffers, plain attributes, training flags and the RNG are
restored after that run, and so is what a lazy module's first call changes (its class, hooks and
uninitialised tensors).

Depends on schema (model, notation, errors), lowering (source, statements), runtime (program,
binding, functions), equality and special_modules; never on listeners or views.
"""

from __future__ import annotations

import copy
import math
import operator
from typing import Any, Iterator, Mapping, Optional

import torch
from torch import nn

from ..runtime.binding import root_call
from ..runtime.coverage import LiveCallDetector, dispatched_calls, merge_live_calls
from .live_calls import (helpers_of, lend_reached, python_rng_states, set_python_rng_states, skipped_key,
                         unreached_rows)
from ..runtime.functions import failing_block
from ..runtime.program import Observer, Program, entry_signature, rebindable
from .backward_check import backward_rows
from .dispatch import known_dispatch
from .equality import first_mismatch
from .special_modules import held_modules, is_compiled, opaque_reason, replaced_forward, weight_repr
from .state_guard import preserved_state
from ..schema.errors import NNSchemaError, ParseError, SourceUnavailableError, UnsupportedSyntaxError
from ..lowering.statements import MethodRequest, lower_function
from ..schema.notation import value_repr
from ..schema.model import ModelBlockSchema, TensorReprWithValue
from ..lowering.source import unwrap_function

__all__ = ["NNParser", "preserved_state", "example_inputs", "opaque_reason", "weight_repr"]

_MAX_SKIP_RETRIES = 64


def _qualified_type(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _has_forward(module: nn.Module) -> bool:
    forward = type(module).forward
    return getattr(forward, "__name__", "") != "_forward_unimplemented"


def _defining_class(cls: type, attr: str) -> Optional[type]:
    for klass in cls.__mro__:
        if attr in klass.__dict__:
            return klass
    return None


def _children(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """Direct child blocks; containers without a forward (ModuleList, ModuleDict) are flattened."""
    for name, child in module._modules.items():
        if child is None:
            continue
        key = f"{prefix}{name}"
        if opaque_reason(child) is not None or _has_forward(child):
            yield key, child
        else:
            yield from _children(child, key + ".")


class _BlockBuilder:
    """Builds one ModelBlockSchema per module instance, lowering forwards and requested methods."""

    def __init__(self) -> None:
        self.built: dict[int, ModelBlockSchema] = {}
        # ids of the root's registered modules, and of the modules given blocks as held ones
        self.registered: Optional[set] = None
        self.held: set = set()
        self.in_held = 0  # building inside a module held past registration

    def build(self, module: nn.Module, path: str) -> ModelBlockSchema:
        if self.registered is None:
            self.registered = {id(m) for m in module.modules()}
        cls = type(module)
        block = ModelBlockSchema(name=cls.__name__, path=path, module_type=_qualified_type(cls), module=module)
        for name, value in list(module._parameters.items()) + list(module._buffers.items()):
            if value is not None:
                block.weights[name] = weight_repr(value)
        opaque = opaque_reason(module)
        replacement = replaced_forward(module) if opaque is not None else None
        if opaque is not None and replacement is None:
            block.skip_reason = opaque
            return block
        for key, child in _children(module):
            if self.in_held and id(child) in self.registered:
                continue  # a sub-module of the root put into the held model (a bridge component): its
                # block is at its registered path, and runs there (lent when the held model calls it)
            child_path = f"{path}.{key}" if path else key
            block.sub_blocks[key] = self.build(child, child_path)
        for key, child in held_modules(module):
            if id(child) in self.registered or id(child) in self.held:
                continue  # a back reference (the root, a parent) or one already given a block
            self.held.add(id(child))
            self.in_held += 1
            try:
                block.sub_blocks[key] = self.build(child, f"{path}.{key}" if path else key)
            finally:
                self.in_held -= 1
        if replacement is not None:  # a forward replaced on the instance: its function is the forward
            try:
                self.lower_replaced_forward(block, replacement)
            except (UnsupportedSyntaxError, SourceUnavailableError) as exc:
                self.skip(block, f"{opaque} (its replacement cannot be lowered: {exc})")
            return block
        if not _has_forward(module):
            block.skip_reason = f"{cls.__name__} has no forward of its own"
            return block
        try:
            self.lower_forward(block)
        except (UnsupportedSyntaxError, SourceUnavailableError) as exc:
            self.skip(block, str(exc))
        return block

    @staticmethod
    def skip(block: ModelBlockSchema, reason: str) -> None:
        block.skip_reason = reason
        block.body = []
        block.signature = None
        block.methods = {}

    def lower_forward(self, block: ModelBlockSchema) -> None:
        module = block.module
        forward = type(module).forward
        owner = _defining_class(type(module), "forward")
        raw = owner.__dict__["forward"] if owner is not None else forward
        if isinstance(raw, (staticmethod, classmethod)):
            self.lower_unbound_forward(block, raw, owner)
            return
        fn = unwrap_function(forward)
        dispatch = known_dispatch(forward, module) if fn is not forward else None
        if dispatch is not None:
            # the implementation the wrapper picks for this configuration is what runs: lower it
            fn = unwrap_function(dispatch.chosen)
            block.dispatch = dispatch
        elif fn is not forward:
            if not rebindable(forward):
                raise UnsupportedSyntaxError(
                    f"{block.name}.forward is wrapped by a decorator that does not close over the function it "
                    "wraps, so the schema cannot run inside it")
            block.wrapper = forward
        requests: list[MethodRequest] = []
        signature = lower_function(fn, module=module, owner=_defining_class(type(module), "forward"),
                                   requests=requests)
        block.signature = signature
        block.body = signature.body
        block.input_defaults = dict(signature.defaults)
        if owner is not None:
            block.parsed_from = (owner, "forward", raw)
        self.lower_requests(block, requests)

    def lower_replaced_forward(self, block: ModelBlockSchema, function: Any) -> None:
        """A forward replaced on the instance by a function bound to it: lowered as the forward, and
        run while the instance holds that forward (`instance_forward`); replaced again, the call is the
        real module's, as for any forward replaced after parsing."""
        requests: list[MethodRequest] = []
        signature = lower_function(function, module=block.module, owner=None, requests=requests)
        block.signature = signature
        block.body = signature.body
        block.input_defaults = dict(signature.defaults)
        block.instance_forward = block.module.__dict__["forward"]
        self.lower_requests(block, requests)

    def lower_unbound_forward(self, block: ModelBlockSchema, raw: Any, owner: type) -> None:
        """A `@staticmethod` forward takes no `self`; a `@classmethod` one takes the class first.

        Both are lowered as plain functions (no `self.<attr>` to resolve); a classmethod's first
        parameter becomes the block's `self_name`, which the runtime binds to the module's class.
        """
        fn = raw.__func__
        if unwrap_function(fn) is not fn:
            raise UnsupportedSyntaxError(f"{block.name}.forward is a decorated {type(raw).__name__}, which the "
                                         "schema cannot run inside its decorators")
        requests: list[MethodRequest] = []
        signature = lower_function(fn, module=None, owner=owner, requests=requests)
        if isinstance(raw, classmethod):
            if not signature.params:
                raise UnsupportedSyntaxError(f"{block.name}.forward is a classmethod without a 'cls' parameter")
            signature.self_name = signature.params.pop(0)
            signature.defaults.pop(signature.self_name, None)
        block.signature = signature
        block.body = signature.body
        block.input_defaults = dict(signature.defaults)
        self.lower_requests(block, requests)

    def lower_requests(self, block: ModelBlockSchema, requests: list[MethodRequest]) -> None:
        pending = list(requests)
        while pending:
            request = pending.pop(0)
            try:
                target = block.find(request.path)
            except KeyError:
                continue  # the runtime calls the live method when the block is absent
            if target.skip_reason is not None:
                continue
            if request.key in target.methods:
                if request.as_value:
                    target.methods[request.key].reached_live = True
                continue
            method_block = ModelBlockSchema(name=target.name, path=target.path, module_type=target.module_type,
                                            module=target.module, method_name=request.key,
                                            sub_blocks=target.sub_blocks, methods=target.methods,
                                            function=request.function, reached_live=request.as_value,
                                            self_attr=request.self_attr, read_from=request.binding)
            target.methods[request.key] = method_block  # placeholder first: recursion finds it
            fn = unwrap_function(request.function)
            if fn is not request.function:
                if rebindable(request.function):
                    method_block.wrapper = request.function
                else:
                    method_block.skip_reason = (f"method {request.key} is wrapped by a decorator that does not "
                                                "close over the function it wraps")
                    continue
            more: list[MethodRequest] = []
            try:
                owner_object = target.module if request.self_attr is None else getattr(target.module, request.self_attr)
                if request.binding is not None:  # a cached function called by name: no `self`
                    owner_object = None
                signature = lower_function(fn, module=owner_object, owner=request.owner, requests=more)
            except (UnsupportedSyntaxError, SourceUnavailableError) as exc:
                # The method runs as the real Python method; its block stays listed as skipped.
                method_block.skip_reason = str(exc)
                continue
            method_block.signature = signature
            method_block.body = signature.body
            if request.self_attr is None and request.owner is not None and \
                    request.owner.__dict__.get(request.key.rsplit(".", 1)[-1]) is request.function:
                method_block.parsed_from = (request.owner, request.key.rsplit(".", 1)[-1], request.function)
            method_block.input_defaults = dict(signature.defaults)
            pending.extend(MethodRequest(path=f"{request.path}.{r.path}".strip(".") if request.path else r.path,
                                         key=r.key, function=r.function, owner=r.owner, as_value=r.as_value)
                           for r in more)


def _collect_skipped(block: ModelBlockSchema) -> dict[str, str]:
    skipped = {f"{key}()": method.skip_reason for key, method in block.methods.items()
               if method.skip_reason is not None}
    for key, child in block.sub_blocks.items():
        if child.skip_reason is not None:
            skipped[key] = child.skip_reason
        for sub_key, reason in _collect_skipped(child).items():
            skipped[f"{key}.{sub_key}"] = reason
    block.skipped = skipped
    return skipped


ROOT_KEY = "<root>"


def _list_skipped(root: ModelBlockSchema) -> None:
    """Fill `skipped` of every block; a root that runs live is listed first, under "<root>"."""
    _collect_skipped(root)
    if root.skip_reason is not None:
        root.skipped = {ROOT_KEY: root.skip_reason, **root.skipped}
    for row in root.live_calls:  # what the detector saw run live is listed too
        if row["kind"] not in ("helper", "unwatched"):
            root.skipped.setdefault(skipped_key(row, ROOT_KEY), row["reason"])
    root.live_calls.extend(unreached_rows(root))  # and what is skipped is in coverage()


# --- protected runs ---------------------------------------------------------------------------


def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    text = str(value).replace("torch.", "")
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype):
        raise ParseError(f"unknown dtype {value!r}; use a torch dtype or its name, e.g. 'torch.float32' or 'int64'")
    return dtype


_MAX_EXAMPLE_ELEMENTS = 2 ** 31


def _example_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A shape of non-negative ints with a sane element count, or a ParseError saying what is wrong."""
    try:
        dims = tuple(shape)
        if any(isinstance(d, bool) for d in dims):
            raise TypeError
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise ParseError(f"the shape of input {name!r} must be a tuple of ints (or, for the extras of a "
                         f"forward(*{name}), a list of such tuples), got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ParseError(f"the shape of input {name!r} has a negative dimension: {dims}; dimensions are >= 0")
    if math.prod(dims) > _MAX_EXAMPLE_ELEMENTS:
        raise ParseError(f"the shape {dims} of input {name!r} asks for {math.prod(dims)} elements, more than the "
                         f"{_MAX_EXAMPLE_ELEMENTS} an example input may have; shapes only need to be representative, "
                         "or pass the tensor itself as inputs_tensors_values=")
    return dims


def example_inputs(shapes: Optional[Mapping[str, Any]], dtypes: Optional[Mapping[str, Any]],
                   values: Optional[Mapping[str, Any]], device: Optional[torch.device] = None) -> dict[str, Any]:
    """Inputs for the resolution run: given values (cloned), else random tensors of the given shape/dtype.

    A list of shapes (`{"args": [(2, 3), (2, 3)]}`) makes a tuple of tensors: the extras of a
    `forward(*args)`, all of the name's dtype.
    """
    shapes = dict(shapes or {})
    dtypes = dict(dtypes or {})
    values = dict(values or {})
    for name in dtypes:
        if name not in shapes and name not in values:
            raise ParseError(f"inputs_tensors_dtypes names {name!r} but no shape or value is given for it; "
                             f"add inputs_tensors_shapes={{{name!r}: (...)}}")
    scope: dict[str, Any] = {}
    generator = torch.Generator().manual_seed(0)
    def random(name: str, shape: Any) -> torch.Tensor:
        shape = _example_shape(name, shape)
        dtype = _dtype(dtypes.get(name, torch.float32))
        try:
            if dtype.is_floating_point or dtype.is_complex:
                tensor = torch.randn(shape, generator=generator).to(dtype)
            elif dtype == torch.bool:
                tensor = torch.randint(0, 2, shape, generator=generator).bool()
            else:
                tensor = torch.randint(0, 8, shape, generator=generator).to(dtype)
        except (RuntimeError, MemoryError) as exc:
            raise ParseError(f"cannot make an example input {name!r} of shape {shape} and dtype {dtype}: {exc}; "
                             "pass smaller shapes, or the tensor itself as inputs_tensors_values=") from None
        return tensor.to(device) if device is not None else tensor

    for name, shape in shapes.items():
        if name in values:
            continue
        if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, (list, tuple)) for s in shape):
            scope[name] = tuple(random(name, s) for s in shape)  # the positional extras of *args
        else:
            scope[name] = random(name, shape)
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            if name in shapes and tuple(value.shape) != tuple(shapes[name]):
                raise ParseError(f"input {name!r}: the value has shape {tuple(value.shape)} but "
                                 f"inputs_tensors_shapes says {tuple(shapes[name])}; make them agree")
            value = value.detach().clone().requires_grad_(value.requires_grad)
        scope[name] = value
    return scope


class _Resolver(Observer):
    """Fills `resolved` of each executed instruction and the inputs/outputs of each entered block."""

    def __init__(self) -> None:
        self.entered: set[int] = set()  # ids of the blocks the run entered

    def enter_block(self, block: ModelBlockSchema, frame: dict) -> None:
        self.entered.add(id(block))
        if not block.inputs and block.signature is not None:
            sig = block.signature
            names = list(sig.params) + ([sig.vararg] if sig.vararg else []) + list(sig.kwonly) + \
                ([sig.kwarg] if sig.kwarg else [])
            block.inputs = {n: value_repr(frame[n]) for n in names if n in frame}

    def exit_block(self, block: ModelBlockSchema, frame: dict, result: Any) -> None:
        if not block.outputs:
            values = tuple.__iter__(result) if isinstance(result, tuple) else (result,)  # not a subclass's
            block.outputs = [value_repr(v) for v in values]

    def after(self, instr, frame: dict) -> None:
        if instr.out_var and instr.out_var in frame:
            instr.resolved = value_repr(frame[instr.out_var])


def _failing_block(exc: BaseException, program: Program) -> Optional[ModelBlockSchema]:
    """The innermost forward block running when `exc` was raised (from the generated frames)."""
    found = failing_block(exc)
    if found is not None and found.method_name is not None:
        found = program.block_of(found.module) or found
    return found


class NNParser:
    """Parses a live `nn.Module` into a ModelBlockSchema tree."""

    @staticmethod
    def parse_model(model: nn.Module, inputs_tensors_shapes: Optional[Mapping[str, Any]] = None,
                    inputs_tensors_dtypes: Optional[Mapping[str, Any]] = None,
                    inputs_tensors_values: Optional[Mapping[str, Any]] = None, *,
                    resolve: bool = True, verify: bool = True, grad_free: bool = True) -> ModelBlockSchema:
        """Lower `model` into a schema and resolve shapes/dtypes with one protected run.

        Inputs are given by name (the forward's parameter names): shapes and dtypes are enough
        (random values are made); values, where given, are used as they are (cloned first). They
        are passed as `model(x, ...)` would get them: positionally in the signature's order while
        each is given, the rest by keyword. The positional extras of a `forward(*args)` are given
        as a tuple or list under the vararg's name (`inputs_tensors_values={"args": (x, y)}`, or
        `inputs_tensors_shapes={"args": [(2, 3), (2, 3)]}`);
        other names go to forward's `**kwargs`. A forward that needs no inputs needs no example.
        The runs happen under `torch.no_grad()` (they only read values, so no autograd graph is kept);
        a forward that needs autograd (it calls `torch.autograd.grad`) fails there and is parsed again
        under the grad mode of the caller. `grad_free=False` runs them under the caller's grad mode
        from the start (the CLI's seed contract: every run of the model has autograd on).
        """
        if not isinstance(model, nn.Module):
            if isinstance(model, type) and issubclass(model, nn.Module):
                raise ParseError(f"parse_model needs a module instance, got the class {model.__name__}; "
                                 f"construct it first: model={model.__name__}(...)")
            raise ParseError(f"parse_model needs an nn.Module instance, got {type(model).__name__}")
        while is_compiled(model):  # torch.compile(m): the schema is the code of m, which it compiles
            model = model._orig_mod
        root = _BlockBuilder().build(model, "")
        root.name = type(model).__name__
        _list_skipped(root)
        if not resolve:
            return root
        if not (inputs_tensors_shapes or inputs_tensors_values) and _needs_inputs(model, root):
            raise ParseError("parse_model needs example inputs to resolve shapes: pass inputs_tensors_shapes="
                             "{'x': (2, 16)} (and inputs_tensors_dtypes) or inputs_tensors_values={'x': tensor}; "
                             "or pass resolve=False to skip resolution")
        device = next((p.device for p in model.parameters()), None)
        scope = example_inputs(inputs_tensors_shapes, inputs_tensors_dtypes, inputs_tensors_values, device)
        if grad_free and torch.is_grad_enabled():
            # The runs only read values: without an autograd graph they hold no saved activations
            # (a second and third forward's worth of memory). A forward that needs autograd
            # (`torch.autograd.grad`) fails there, and is parsed again under the caller's grad mode.
            try:
                with torch.no_grad():
                    NNParser._resolve(model, root, scope, verify)
            except ParseError:
                root = _BlockBuilder().build(model, "")
                root.name = type(model).__name__
                NNParser._resolve(model, root, scope, verify)
        else:
            NNParser._resolve(model, root, scope, verify)
        _list_skipped(root)
        return root

    @staticmethod
    def _resolve(model: nn.Module, root: ModelBlockSchema, scope: dict, verify: bool = True) -> None:
        for _ in range(_MAX_SKIP_RETRIES):
            resolver = _Resolver()
            program = Program(root, resolver)
            try:
                with preserved_state(model):
                    rng = torch.get_rng_state()
                    states = python_rng_states()
                    with LiveCallDetector(root) as detector:
                        result = program.run_root(_fresh(scope))
                if lend_reached(root, detector.calls):
                    for block in root.iter_blocks():
                        block.inputs, block.outputs = {}, []
                    continue  # run again: live code now reaches those blocks' schemas
                root.live_calls = [call.as_row() for call in
                                   merge_live_calls(detector.calls, dispatched_calls(detector, resolver.entered),
                                                    helpers_of(program.live_log.values()))]
                suspects = _verify(model, root, scope, rng, result, states) if verify else []
                if not suspects:  # exact: then what one backward pass runs live, where it may
                    root.live_calls.extend(backward_rows(model, root, scope))
                    return
                for block in suspects:
                    _BlockBuilder.skip(block, "its schema gave a result different from eager on the example "
                                              "inputs, so it runs as the real module")
                if root in suspects:
                    return
            except NNSchemaError as exc:
                if isinstance(exc, ParseError):
                    raise
                failing = _failing_block(exc, program)
                if failing is None or failing is root:
                    raise ParseError(f"the schema of {root.name} cannot run on the example inputs: {exc}") from exc
                _BlockBuilder.skip(failing, f"interpreting failed: {type(exc).__name__}: {exc}")
            except Exception as exc:
                eager_error = _eager_error(model, root, scope)
                if eager_error is not None:
                    raise ParseError(
                        f"{root.name} raises {type(eager_error).__name__} on the example inputs in eager mode too "
                        f"({eager_error}); check the input names, shapes and dtypes") from eager_error
                failing = _failing_block(exc, program)
                if failing is None:
                    failing = root
                _BlockBuilder.skip(failing, f"interpreting failed where eager does not: {type(exc).__name__}: {exc}")
                if failing is root:
                    for block in root.iter_blocks():
                        block.inputs, block.outputs = {}, []
                    return
            for block in root.iter_blocks():
                block.inputs, block.outputs = {}, []
        raise ParseError(f"gave up resolving {root.name} after {_MAX_SKIP_RETRIES} skipped children")


def _verify(model: nn.Module, root: ModelBlockSchema, scope: dict, rng: torch.Tensor,
            result: Any, states: Optional[tuple] = None) -> list[ModelBlockSchema]:
    """Run eager from the same state and RNG; return the innermost blocks whose result differs.

    Empty when the schema's result equals eager's exactly. Otherwise both are run again with a
    recording forward hook on every module (the runtime runs module hooks as `_call_impl` does, so
    both runs see the same hooks), and a block is a suspect when its module's first output differs
    while none of its interpreted sub-blocks' does (the error is in its own body).
    """
    try:
        with preserved_state(model):
            torch.set_rng_state(rng)
            set_python_rng_states(states)
            expected = _eager_call(model, root, scope)
    except Exception:  # eager fails where the schema ran: nothing to compare against
        return []
    if first_mismatch(expected, result) is None:
        return []
    recorded: dict[int, Any] = {}

    def record(module: nn.Module, args: Any, output: Any) -> None:
        recorded.setdefault(id(module), output)

    handles = [m.register_forward_hook(record) for m in model.modules()]
    try:
        with preserved_state(model):
            torch.set_rng_state(rng)
            set_python_rng_states(states)
            _eager_call(model, root, scope)
        eager_outputs, recorded = recorded, {}
        with preserved_state(model):
            torch.set_rng_state(rng)
            set_python_rng_states(states)
            Program(root).run_root(_fresh(scope))
        schema_outputs = recorded
    except Exception:
        return [root]
    finally:
        for handle in handles:
            handle.remove()
    blocks = [b for b in root.iter_blocks() if b.method_name is None and b.skip_reason is None]
    differing = {id(b) for b in blocks
                 if id(b.module) in eager_outputs and id(b.module) in schema_outputs
                 and first_mismatch(eager_outputs[id(b.module)], schema_outputs[id(b.module)]) is not None}
    suspects = [b for b in blocks if id(b) in differing
                and not any(inner is not b and id(inner) in differing for inner in b.iter_blocks())]
    return suspects or [root]


def _fresh(scope: dict) -> dict:
    """A private copy of the example inputs for one run: the model may change them in place (a KV
    cache, a list it appends to), and the caller's values must stay as they were."""
    return {k: _private_copy(v) for k, v in scope.items()}


def _private_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # not copyable: used as given
        return value


def _needs_inputs(model: nn.Module, root: ModelBlockSchema) -> bool:
    """True unless a call `model()` binds: every input has a default (or there is none)."""
    sig = entry_signature(model, root.signature)
    if sig is None:
        return True
    return any(p not in sig.defaults for p in list(sig.params) + list(sig.kwonly))


def _eager_call(model: nn.Module, root: ModelBlockSchema, scope: dict) -> Any:
    """`model(x, ...)` on a fresh copy of the example inputs, bound as the schema's run binds them."""
    args, kwargs = root_call(entry_signature(model, root.signature), _fresh(scope), f"{root.name}.forward")
    return model(*args, **kwargs)


def _eager_error(model: nn.Module, root: ModelBlockSchema, scope: dict) -> Optional[BaseException]:
    try:
        with preserved_state(model):
            _eager_call(model, root, scope)
    except Exception as exc:  # the user's own failure, reported as such
        return exc
    return None

