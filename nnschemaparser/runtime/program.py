"""`Program`: a schema tree compiled for one mode, and the calls between its functions.

A `Program` caches what it compiles (one `CompiledFunction` per block and per closure, each one
generated Python function from `codegen`) and the invokers that run a block as
`module(*args, **kwargs)` would: the module's forward hooks around the schema (`hooks`), decorators
re-applied around it (`functions.rebind_wrapper`), a class's own `__call__` honoured (the schema as
the forward it calls), modules held in variables dispatched by identity to their block, a forward
replaced on the instance run as its schema while the instance holds it. `Program(root)` is the plain form, where nothing but the generated code runs;
`Program(root, observer)` writes the observer's calls into the generated code (listeners,
captures and stepping); `calls=True` also reports each sub-block call before it runs;
`tensor_results=True` calls `after` only where an instruction bound a tensor (or returned).

The program holds the schema's blocks only weakly, so a cache of programs keyed by the root
(`programs_for`) lets a dropped schema and everything compiled for it be freed.

Depends on the schema, `codegen`, `functions`, `binding`, `hooks` and `listeners`.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from typing import Any, Callable, Optional

from torch import nn

from ..schema.errors import SchemaRunError
from ..schema.model import BlockInstruction, FunctionInstruction, FunctionSchema, Instruction, ModelBlockSchema, OpInstruction, VarRef
from .binding import binder, block_qualname, entry_signature, nested_qualname, root_call
from .codegen import CodeGenerator
from .coverage import active_detector
from .lending import lending, lent_values
from .static_calls import referenced_block, static_call
from .instructions import operand_reader, uses_frame
from .functions import InterpretedFunction, rebind_wrapper, rebindable
from .hooks import GLOBAL_HOOK_DICTS, call_with_hooks, global_hooks_active
from .listeners import Observer, observed_run as _observed_run

__all__ = ["Program", "CompiledFunction", "programs_for", "callee_label", "entry_signature", "Observer",
           "InterpretedFunction", "rebindable"]

_Module = nn.Module


def callee_label(block: ModelBlockSchema) -> str:
    """How a call of `block` is named: its path (`transformer.h.1.attn`), a method schema's with its
    method (`transformer.h.1.attn._attn`), the root's by its name."""
    path = block.path or block.name
    return f"{path}.{block.method_name}" if block.method_name else path


class CompiledFunction:
    """One FunctionSchema compiled for one block (module) and one program mode: the generated
    function, how a call binds to it, and what its failure notes say."""

    def __init__(self, program: "Program", block: ModelBlockSchema, schema: FunctionSchema, *, is_block: bool,
                 qualname: Optional[str] = None):
        self.program = program
        self._block = weakref.ref(block)
        self.schema = schema
        self.is_block = is_block
        self.module = block.module
        self.free_vars = schema.free_vars
        self.nonlocal_vars = schema.nonlocal_vars
        self.params = tuple(schema.params)
        self.simple = schema.vararg is None and schema.kwarg is None and not schema.kwonly
        self.self_name = schema.self_name if is_block else None
        # What `self_name` is bound to: the module, or its class for a `@classmethod` forward.
        self.self_value = self.module
        if is_block and self.self_name is not None and self.module is not None:
            raw = inspect.getattr_static(type(self.module), block.method_name or "forward", None)
            if isinstance(raw, classmethod):
                self.self_value = type(self.module)
        self.weights = tuple(schema.weight_refs.items())
        module = self.module
        # Registered parameters/buffers are read from their dicts (what Module.__getattr__ would
        # return); anything else through getattr at each use.
        self.direct_weights = module is not None and all(
            attr in getattr(module, "_parameters", {}) or attr in getattr(module, "_buffers", {})
            for _, attr in self.weights) and not any(hasattr(type(module), attr) for _, attr in self.weights)
        self.label = f"{block.name}.{schema.name}" if is_block else schema.name
        # (class, attribute, function) the block was lowered from: the generated code checks it holds
        self.parsed_from = block.parsed_from if is_block else None
        self.dispatch = block.dispatch if is_block and block.method_name is None else None
        self.qualname = qualname or (block_qualname(block, self.label) if is_block else schema.name)
        self.binder = binder(self.qualname, schema, self.params, self.self_name is not None)
        # A generator expression's helper runs lazily, one element per `next`, as CPython's does.
        self.lazy = not is_block and schema.name == "<gencomp>"
        # Plain runs keep variables as fast locals unless the function needs a frame dict.
        self.why_frame = "the run is observed" if program.observer is not None or not is_block else \
            program.frame_reason(block) or uses_frame(schema, self.weights)
        self.frame = self.why_frame is not None
        generated = CodeGenerator(program, self, frame=self.frame, generator=self.lazy).generate()
        self.function = generated.function
        self.source = generated.source
        self.generated = generated

    @property
    def block(self) -> ModelBlockSchema:
        block = self._block()
        if block is None:
            raise SchemaRunError("the schema this program was compiled for no longer exists")
        return block

    def bind(self, args: tuple, kwargs: dict, defaults: Optional[dict] = None) -> dict:
        """The frame of a call: CPython's binding, with its messages."""
        if self.simple and not kwargs and len(args) == len(self.params):
            frame = dict(zip(self.params, args))
        else:
            frame = self.binder(args, kwargs, self.schema.defaults if defaults is None else defaults)
        if self.self_name is not None:
            frame[self.self_name] = self.self_value
        return frame


class Program:
    """A schema tree compiled for one mode: plain (`observer=None`) or observed."""

    def __init__(self, root: ModelBlockSchema, observer: Optional[Observer] = None, calls: bool = False,
                 tensor_results: bool = False, counter: Optional[list] = None):
        self._root = weakref.ref(root)
        self.observer = observer
        # A plain program with a counter (a one-item list) adds to `counter[0]` each tensor an
        # instruction binds, where an observed program would report one (runtime/partial.py).
        self.counter = counter if observer is None else None
        # `elsewhere(block)`: another program that runs `block` instead of this one, or None
        # (partly observed runs: unobserved blocks run counted plain code, runtime/partial.py).
        self.elsewhere: Optional[Callable[[ModelBlockSchema], Optional["Program"]]] = None
        # `watch(module)`: told of each module this program calls through a value (`call_value`)
        # before it runs (a counted program's calls an observed run would report, runtime/partial.py)
        self.watch: Optional[Callable[[Any], None]] = None
        self.observe_calls = observer is not None and calls
        # what closures (`InterpretedFunction`) tell of their frames: the observer, or a logged run's marks
        self.frame_observer: Optional[Observer] = observer
        self.tensor_results = observer is not None and tensor_results
        self.units: dict[int, CompiledFunction] = {}
        self.invokers: dict[int, Callable] = {}
        self.module_invokers: dict[int, Callable] = {}
        self._by_module: dict[int, Any] = {}
        self._lent: Optional[list] = None
        self.live_log: dict = {}  # helpers live code ran while this program ran (`lending`)
        for block in root.iter_blocks():
            if block.module is not None and block.method_name is None:
                self._by_module.setdefault(id(block.module), weakref.ref(block))

    @property
    def root(self) -> ModelBlockSchema:
        root = self._root()
        if root is None:
            raise SchemaRunError("the schema this program was compiled for no longer exists")
        return root

    def block_of(self, module: Any) -> Optional[ModelBlockSchema]:
        """The forward block of `module` in this schema (None when it has none)."""
        ref = self._by_module.get(id(module))
        return ref() if ref is not None else None

    # -- compiled functions -------------------------------------------------------------------

    def unit(self, block: ModelBlockSchema) -> CompiledFunction:
        unit = self.units.get(id(block))
        if unit is None:
            if block.signature is None:
                raise SchemaRunError(f"block {block.path or block.name!r} has no lowered forward to run")
            unit = CompiledFunction(self, block, block.signature, is_block=True)
            self.units[id(block)] = unit
        return unit

    def frame_reason(self, block: ModelBlockSchema) -> Optional[str]:
        """Why this program runs `block` with a frame dict where a plain run would not (None here)."""
        return None

    def part(self, unit: CompiledFunction, instrs: list) -> Callable[[dict], Any]:
        """A statement nested past Python's limits, as a function over `unit`'s frame."""
        return CodeGenerator(self, unit, frame=True, part_of=instrs).generate().function

    # -- invokers: a block run as `module(*args, **kwargs)` would ----------------------------------

    def invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """A cached `invoke(args, kwargs)` running `block` as `module(*args, **kwargs)` would.

        A forward block runs the module's forward hooks around the schema exactly as
        `Module._call_impl` does (transformers collects hidden states with such hooks); with backward
        hooks registered, the call goes to the real module.
        """
        invoke = self.invokers.get(id(block))
        if invoke is not None:
            return invoke
        other = self.elsewhere(block) if self.elsewhere is not None else None
        if other is not None:
            invoke = self.invokers[id(block)] = other.invoker(block)
            return invoke
        if block.skip_reason is not None or block.module is None:
            block_ref = weakref.ref(block)

            def invoke(args: Any, kwargs: dict) -> Any:
                return self.call_block(block_ref(), tuple(args), kwargs)
        elif block.self_attr is not None:
            invoke = self._object_call(block)
        elif block.method_name is not None:
            invoke = self._direct(block)
        elif type(block.module).__call__ is not _Module.__call__:
            invoke = self._through_call_override(block.module, self._direct(block))
        else:
            direct, module, lowered = self._direct(block), block.module, block.instance_forward
            target, first = self._fast_target(block)
            if lowered is not None:  # a forward replaced on the instance: checked at each call
                def invoke(args: Any, kwargs: dict) -> Any:
                    return call_with_hooks(module, args, kwargs, direct, lowered)
            elif len(GLOBAL_HOOK_DICTS) != 4:
                def invoke(args: Any, kwargs: dict) -> Any:
                    if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                            or module._backward_pre_hooks or global_hooks_active() or "forward" in module.__dict__):
                        return call_with_hooks(module, args, kwargs, direct, lowered)
                    return direct(args, kwargs)
            elif target is not None:
                g0, g1, g2, g3 = GLOBAL_HOOK_DICTS

                # the common case written out: the hook test, then the generated forward itself (or
                # the forward's decorators re-applied around it)
                def invoke(args: Any, kwargs: dict) -> Any:
                    if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                            or module._backward_pre_hooks or g0 or g1 or g2 or g3
                            or "forward" in module.__dict__):
                        return call_with_hooks(module, args, kwargs, direct, lowered)
                    return target(first, *args, **kwargs)
            else:
                g0, g1, g2, g3 = GLOBAL_HOOK_DICTS

                def invoke(args: Any, kwargs: dict) -> Any:
                    if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                            or module._backward_pre_hooks or g0 or g1 or g2 or g3
                            or "forward" in module.__dict__):
                        return call_with_hooks(module, args, kwargs, direct, lowered)
                    return direct(args, kwargs)
        self.invokers[id(block)] = invoke
        return invoke

    def lazy_invoker(self, block: ModelBlockSchema, env: dict, name: str) -> Callable[[Any, dict], Any]:
        """A stand-in for `invoker(block)` in generated code: the first call compiles the callee
        and puts its invoker in the generated function's globals in its place (compiling every
        callee up front would compile the whole tree, and a block that calls itself forever)."""
        block_ref = weakref.ref(block)

        def first_call(args: Any, kwargs: dict) -> Any:
            invoke = self.invoker(block_ref())
            env[name] = invoke
            return invoke(args, kwargs)

        return first_call

    def _fast_target(self, block: ModelBlockSchema) -> tuple:
        """(target, first) such that `target(first, *args, **kwargs)` runs `block`'s forward in a
        plain run: the generated function with its module (or the decorators around it); (None, None)
        when the forward keeps a frame dict or takes no `self`."""
        unit = self.unit(block)
        if unit.frame or unit.self_name is None:
            return None, None
        if block.wrapper is None:
            return unit.function, unit.self_value
        if unit.self_value is not block.module:
            return None, None
        return self._wrapped_runner(block, unit), block.module

    @staticmethod
    def _through_call_override(module: nn.Module, direct: Callable[[Any, dict], Any]) -> Callable[[Any, dict], Any]:
        """Run a module whose class overrides `__call__` through that override, the schema as its forward.

        The override (PyG's `Aggregation.__call__` fills `dim_size`, transformers' checkpointing
        layers) runs as in eager; while it runs, the instance's `forward` is the schema, so the
        `self.forward(...)` that `Module._call_impl` makes (with the module's hooks) runs the schema.
        The instance attribute is put back as it was afterwards, also when the call fails.
        """
        call = type(module).__call__
        absent = object()

        def schema_forward(*args: Any, **kwargs: Any) -> Any:
            return direct(args, kwargs)

        def invoke(args: Any, kwargs: dict) -> Any:
            state = module.__dict__
            saved = state.get("forward", absent)
            state["forward"] = schema_forward
            try:
                return call(module, *args, **kwargs)
            finally:
                if saved is absent:
                    state.pop("forward", None)
                else:
                    state["forward"] = saved

        return invoke

    def _object_call(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """Run the schema of `module.<attr>.__call__` with `self` the object the module holds now;
        an object of another class (a processor set since parsing) is called as it is."""
        unit = self.unit(block)
        module, attr, lowered = block.module, block.self_attr, block.function
        if lowered is None:  # a loaded schema (load_schema checked the source is the model's)
            lowered = inspect.getattr_static(type(getattr(module, attr, None)), "__call__", None)
        fn, observer, block_ref = unit.function, self.observer, weakref.ref(block)

        def invoke(args: Any, kwargs: dict) -> Any:
            target = getattr(module, attr)
            if type(target).__call__ is not lowered:
                return target(*args, **kwargs)
            if not unit.frame:
                return fn(target, *args, **kwargs)
            frame = unit.binder(args, kwargs, unit.schema.defaults)
            frame[unit.self_name] = target
            if observer is None:
                return fn(frame)
            return _observed_run(observer, block_ref(), fn, frame)

        return invoke

    def _direct(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """Run `block`'s schema (inside its forward's decorators, if any), without module hooks."""
        unit = self.unit(block)
        target, first = self._fast_target(block)
        if target is not None:
            return lambda args, kwargs: target(first, *args, **kwargs)
        if block.wrapper is not None:
            runner = self._wrapped_runner(block, unit)
            if block.read_from is not None:  # a cached function called by name: no module
                return lambda args, kwargs: runner(*args, **kwargs)
            module = block.module
            return lambda args, kwargs: runner(module, *args, **kwargs)
        fn, self_name, self_value = unit.function, unit.self_name, unit.self_value
        if not unit.frame:  # a forward without `self` (a staticmethod)
            return lambda args, kwargs: fn(*args, **kwargs)
        params, simple, count = unit.params, unit.simple, len(unit.params)
        defaults, general = unit.schema.defaults, unit.binder
        observer = self.observer
        block_ref = weakref.ref(block)

        def direct(args: Any, kwargs: dict) -> Any:  # the binding, then the run, in one call
            if simple and not kwargs and len(args) == count:
                frame = dict(zip(params, args))
            else:
                frame = general(args, kwargs, defaults)
            if self_name is not None:
                frame[self_name] = self_value
            if observer is None:
                return fn(frame)
            return _observed_run(observer, block_ref(), fn, frame)

        return direct

    def _wrapped_runner(self, block: ModelBlockSchema, unit: CompiledFunction) -> Callable:
        runner = getattr(unit, "wrapped_runner", None)
        if runner is None:
            observer = self.observer
            fn = unit.function
            block_ref = weakref.ref(block)

            if unit.frame:
                skip = 0 if block.read_from is not None else 1  # a cached function called by name: no module

                def inner(*args: Any, **kwargs: Any) -> Any:
                    frame = unit.bind(args[skip:], kwargs)
                    if observer is None:
                        return fn(frame)
                    return _observed_run(observer, block_ref(), fn, frame)
            elif block.read_from is not None or unit.self_name is not None and unit.self_value is block.module:
                inner = fn  # the generated forward takes `self` as the original does
            else:
                self_value = unit.self_value

                def inner(module: Any, *args: Any, **kwargs: Any) -> Any:
                    if unit.self_name is None:
                        return fn(*args, **kwargs)
                    return fn(self_value, *args, **kwargs)

            if inner is not fn:  # a decorator may read its function's name (`deprecate_kwarg`'s warning)
                functools.update_wrapper(inner, inspect.unwrap(block.wrapper), updated=())
                del inner.__wrapped__
            runner = rebind_wrapper(block.wrapper, inner)
            if runner is None:
                raise SchemaRunError(f"the decorator of {block.name}.forward cannot be re-applied around the schema")
            unit.wrapped_runner = runner
        return runner

    def call_block(self, block: ModelBlockSchema, args: tuple, kwargs: dict) -> Any:
        """Run `block` as a call `module(*args, **kwargs)` would."""
        if block.skip_reason is not None:
            module = block.module
            if module is None:
                raise SchemaRunError(f"block {block.path or block.name!r} was skipped ({block.skip_reason}) and "
                                     "has no live module to run; load the schema with model=...")
            detector = active_detector()
            if detector is not None:  # counted; what runs inside the call is this block's region
                detector.note_skipped(block, sys._getframe(1))
            try:
                if block.method_name is None:
                    return module(*args, **kwargs)
                if block.function is not None:
                    return block.function(module, *args, **kwargs)
                return getattr(module, block.method_name)(*args, **kwargs)
            finally:
                if detector is not None:
                    detector.left_skipped()
        if block.module is None:
            raise SchemaRunError(f"block {block.path or block.name!r} has no live module: weights are not part of "
                                 "a saved schema; load it with load_schema(path, model=your_model) to run it")
        return self.invoker(block)(args, kwargs)

    def call_value(self, target: Any, args: Any, kwargs: dict) -> Any:
        """Call a runtime value; a module with a block in this schema runs its block."""
        if isinstance(target, _Module):
            invoke = self.module_invokers.get(id(target))
            if invoke is None:
                block = self.block_of(target)
                if block is None:
                    return target(*args, **kwargs)
                invoke = self.module_invokers[id(target)] = self.invoker(block)
            if self.watch is not None:
                self.watch(target)
            return invoke(args, kwargs)
        return target(*args, **kwargs)

    # -- what the code generator asks for ------------------------------------------------------

    def static_call(self, instr: BlockInstruction, unit: CompiledFunction, env: dict) -> Any:
        """How a call of the child at `instr.block_ref.path` runs (`static_calls.static_call`)."""
        return static_call(instr, unit)

    def closure_maker(self, instr: FunctionInstruction, unit: CompiledFunction) -> Callable[[dict], Any]:
        """`make(f)`: the closure a `def` / lambda / comprehension binds, over the frame `f`."""
        schema = instr.function
        qualname = nested_qualname(unit.qualname, unit.schema.name, unit.is_block, schema.name)
        inner = CompiledFunction(self, unit.block, schema, is_block=False, qualname=qualname)
        positional = schema.params
        default_ops = [operand_reader(d) for d in instr.defaults]
        default_names = positional[len(positional) - len(default_ops):] if default_ops else []
        kw_defaults = {k: operand_reader(v) for k, v in instr.kw_defaults.items()}

        def make(f: dict) -> InterpretedFunction:
            defaults = {name: read(f) for name, read in zip(default_names, default_ops)}
            for key, read in kw_defaults.items():
                defaults[key] = read(f)
            return InterpretedFunction(self, schema, inner, f, defaults)

        return make

    def announcer(self, instr: Instruction, unit: CompiledFunction) -> Optional[Callable[[dict], None]]:
        """For a call of a sub-block, `announce(frame)` telling the observer what it is about to call;
        None for any other instruction. A call of a module value (`layer(x)` over a ModuleList) is
        announced only when the value is a module with a block here (not for a tensor's method)."""
        before_call = self.observer.before_call
        block_of = self.block_of
        if isinstance(instr, BlockInstruction):
            ref = instr.block_ref
            if instr.callee_var is not None:
                name, method = instr.callee_var, ref.method

                def announce_value(f: dict) -> None:
                    block = block_of(f.get(name))
                    if block is not None and method is not None:
                        block = block.methods.get(method)
                    before_call(instr, f, block, callee_label(block) if block is not None else
                                name + (f".{method}" if method else ""))

                return announce_value
            owner = unit.block
            block = referenced_block(owner, ref)
            label = callee_label(block) if block is not None else ".".join(
                part for part in (owner.path, ref.path, ref.method) if part)
            block_ref = weakref.ref(block) if block is not None else None

            def announce(f: dict) -> None:
                before_call(instr, f, block_ref() if block_ref is not None else None, label)

            return announce
        if isinstance(instr, OpInstruction) and isinstance(instr.target, VarRef):
            name = instr.target.name

            def announce_module(f: dict) -> None:
                value = f.get(name)
                if isinstance(value, _Module):
                    block = block_of(value)
                    if block is not None:
                        before_call(instr, f, block, callee_label(block))

            return announce_module
        return None

    def lending(self):
        """While a run goes, the modules live code reaches carry the schema as their `forward` (`lending`)."""
        if self._lent is None:
            self._lent = lent_values(self)
        return lending(self._lent)

    # -- running the root ---------------------------------------------------------------------

    def run_root(self, scope: dict) -> Any:
        """Run the root block with `scope` mapping input names to values; returns what forward returns."""
        root = self.root
        args, kwargs = self.root_arguments(scope)
        if root.skip_reason is not None or root.signature is None:
            return self.call_block(root, args, kwargs)
        if self._lent or self._lent is None:
            with self.lending():
                return self.call_block(root, args, kwargs)
        return self.call_block(root, args, kwargs)

    def root_arguments(self, scope: dict) -> tuple:
        """(args, kwargs) of the root's call for the inputs `scope`, or a SchemaRunError naming a
        missing or unknown input."""
        root = self.root
        sig = root.signature
        if root.skip_reason is not None or sig is None:
            return root_call(entry_signature(root.module, None), scope, f"{root.name}.forward")
        known = set(sig.params) | set(sig.kwonly) | ({sig.vararg} if sig.vararg else set())
        unknown = [k for k in scope if k not in known and sig.kwarg is None]
        if unknown:
            inputs = sig.params + ([sig.vararg] if sig.vararg else []) + sig.kwonly
            raise SchemaRunError(f"scope has {', '.join(map(repr, unknown))}, which {root.name}.forward does not take; "
                                 f"its inputs are: {', '.join(inputs) or '(none)'}")
        missing = [p for p in sig.params if p not in scope and p not in sig.defaults]
        if missing:
            raise SchemaRunError(f"scope is missing the input{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(map(repr, missing))} of {root.name}.forward; pass them as "
                                 f"scope={{{', '.join(repr(m) + ': ...' for m in missing)}}}")
        return root_call(entry_signature(root.module, sig), scope, f"{root.name}.forward")

    def call_root(self, args: tuple, kwargs: dict) -> Any:
        """Run the root block as `model(*args, **kwargs)`: the arguments are passed as given."""
        if self._lent or self._lent is None:
            with self.lending():
                return self.call_block(self.root, tuple(args), dict(kwargs))
        return self.call_block(self.root, tuple(args), dict(kwargs))


# Programs compiled for a schema, kept as long as the schema lives (weakly keyed by its root; a
# program refers to its blocks only weakly, so the entry goes with the schema).
_PROGRAMS: "weakref.WeakKeyDictionary[ModelBlockSchema, dict]" = weakref.WeakKeyDictionary()


def programs_for(root: ModelBlockSchema) -> dict:
    """The cache of programs compiled for the schema `root`: {"plain": Program | None, pools...}."""
    cache = _PROGRAMS.get(root)
    if cache is None:
        cache = _PROGRAMS[root] = {"plain": None}
    return cache

