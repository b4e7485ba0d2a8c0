"""The execution core: `Program` compiles a schema tree once into closures over a frame dict, then runs it.

One set of execution rules serves every driver. `Program(root)` compiles the plain form: each
instruction becomes a piece of Python source that reads operands from the frame, calls the real
torch callable and binds the result, and each list of instructions runs as one generated function
(`bodies.fuse_body`); nothing else runs. `Program(root, observer)` compiles the same pieces with
calls to an `Observer` in between (block enter/exit, after each leaf instruction, before a mutating
one): listeners, captures and stepping are all observers, and a plain run pays for none of them.
`Program(root, observer, calls=True)` also reports each sub-block call before it runs
(`Observer.before_call`: a child's forward, a method schema, a module value with a block); only
stepped runs that pause before calls compile it, so runs and captures pay nothing for it.
With `tensor_results=True` the observer is called after an instruction only where it bound a
tensor (or returned): what an observer whose listeners want nothing else would do anyway.

This module holds what ties the parts together: the cached invokers that run a block as
`module(*args, **kwargs)` would (hooks from `module_hooks`, decorators re-bound by `functions`),
dispatch of module values by identity, a class's own `__call__` honoured (the schema
as the forward it calls), the root's input checks, and `compile`, which picks the
`compile_<Instruction>` of the mixins `compile_calls.CallCompiler` and
`compile_control.ControlCompiler` and wraps it for the observer. User exceptions propagate
unchanged, with one note per block naming the instruction and the forward's file:line.

Depends on the schema, `errors` and the other runtime modules of the execution core; knows nothing
about listeners' formats or views.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from ..schema.errors import SchemaRunError
from .compile_calls import CallCompiler
from .compile_control import ControlCompiler
from .argument_binding import live_signature, root_call
from .functions import InterpretedFunction, Unit, rebind_wrapper, rebindable
from .module_hooks import GLOBAL_HOOK_DICTS, call_with_hooks, global_hooks_active
from .observer import BREAK, CONTINUE, RETURN, RETURN_SLOT, Observer, StepAbandoned
from .bodies import BodyEntry, IfPiece, fuse_body
from .operands import Piece, fusable_method_call, names_read, piece_closure

_Module = nn.Module
_MAX_NESTING = 24  # `if`s nested deeper run as closures (Python's parser limits indentation)
from ..schema.model import (BlockInstruction, BreakInstruction, ContinueInstruction, ControlInstruction, FunctionSchema,
                            Instruction, ModelBlockSchema, OpInstruction, ReturnInstruction, TryInstruction, VarRef,
                            WithInstruction, condition_instructions)

__all__ = ['Program', 'callee_label', 'entry_signature', 'Observer', 'InterpretedFunction', 'BREAK', 'CONTINUE', 'RETURN', 'RETURN_SLOT', 'StepAbandoned', 'rebindable']


def entry_signature(module: Any, forward_signature: Optional[FunctionSchema]) -> Optional[FunctionSchema]:
    """The parameters a call `module(...)` binds: those of the class's own `__call__` when it
    names some (PyG's `Aggregation.__call__(x, index, ...)`), else forward's (the schema's, or
    the live forward's when the block has none)."""
    if module is None:
        return forward_signature
    if type(module).__call__ is not _Module.__call__:
        own = live_signature(module.__call__)
        if own is not None and own.params:
            return own
    if forward_signature is None:
        return live_signature(module.forward)
    return forward_signature


def callee_label(block: ModelBlockSchema) -> str:
    """How a call of `block` is named: its path (`transformer.h.1.attn`), a method schema's with its
    method (`transformer.h.1.attn._attn`), the root's by its name."""
    path = block.path or block.name
    return f"{path}.{block.method_name}" if block.method_name else path


class Program(CallCompiler, ControlCompiler):
    """A schema tree compiled for one mode: plain (`observer=None`) or observed."""

    def __init__(self, root: ModelBlockSchema, observer: Optional[Observer] = None, calls: bool = False,
                 tensor_results: bool = False):
        self.root = root
        self.observer = observer
        self.observe_calls = observer is not None and calls
        # Observed for tensor results only: `after` is called where an instruction bound a tensor
        # (or returned), the only calls of an observer whose listeners want nothing else.
        self.tensor_results = observer is not None and tensor_results
        self.units: dict[int, Unit] = {}
        self.invokers: dict[int, Callable] = {}
        self.module_invokers: dict[int, Callable] = {}
        self.by_module: dict[int, ModelBlockSchema] = {}
        for block in root.iter_blocks():
            if block.module is not None and block.method_name is None:
                self.by_module.setdefault(id(block.module), block)

    # -- running blocks ---------------------------------------------------------------------

    def unit(self, block: ModelBlockSchema) -> Unit:
        unit = self.units.get(id(block))
        if unit is None:
            if block.signature is None:
                raise SchemaRunError(f"block {block.path or block.name!r} has no lowered forward to run")
            unit = Unit(self, block, block.signature, is_block=True)
            self.units[id(block)] = unit
        return unit

    def invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """A cached `invoke(args, kwargs)` running `block` as `module(*args, **kwargs)` would.

        A forward block runs the module's forward hooks around the schema exactly as
        `Module._call_impl` does (transformers collects hidden states with such hooks); with backward
        hooks registered, the call goes to the real module.
        """
        invoke = self.invokers.get(id(block))
        if invoke is not None:
            return invoke
        if block.skip_reason is not None or block.module is None:
            def invoke(args: Any, kwargs: dict, _block=block) -> Any:
                return self.call_block(_block, tuple(args), kwargs)
        elif block.method_name is not None:
            invoke = self._direct(block)
        elif type(block.module).__call__ is not _Module.__call__:
            invoke = self._through_call_override(block.module, self._direct(block))
        elif block.wrapper is not None or len(GLOBAL_HOOK_DICTS) != 4:
            direct = self._direct(block)
            module = block.module

            def invoke(args: Any, kwargs: dict) -> Any:
                if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                        or module._backward_pre_hooks or global_hooks_active() or "forward" in module.__dict__):
                    return call_with_hooks(module, args, kwargs, direct)
                return direct(args, kwargs)
        else:
            invoke = self._bound_invoker(block)
        self.invokers[id(block)] = invoke
        return invoke

    def _bound_invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """`invoke` for a forward block without decorators: the hook test, then `_direct` (the
        binding and the run in one call)."""
        direct = self._direct(block)
        module = block.module
        g0, g1, g2, g3 = GLOBAL_HOOK_DICTS

        def invoke(args: Any, kwargs: dict) -> Any:
            if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                    or module._backward_pre_hooks or g0 or g1 or g2 or g3 or "forward" in module.__dict__):
                return call_with_hooks(module, args, kwargs, direct)
            return direct(args, kwargs)

        return invoke

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

    def _direct(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """Run `block`'s schema (inside its forward's decorators, if any), without module hooks."""
        unit = self.unit(block)
        if block.wrapper is not None:
            runner = self._wrapped_runner(block, unit)
            module = block.module
            return lambda args, kwargs: runner(module, *args, **kwargs)
        params, simple, count = unit.params, unit.simple, len(unit.params)
        self_name, self_value, defaults, general = unit.self_name, unit.self_value, unit.schema.defaults, unit._binder
        observer, run, observed_run = self.observer, unit.run, self._observed_run

        def direct(args: Any, kwargs: dict) -> Any:  # Unit.bind, then the run, in one call
            if simple and not kwargs and len(args) == count:
                frame = dict(zip(params, args))
            else:
                frame = general(args, kwargs, defaults)
            if self_name is not None:
                frame[self_name] = self_value
            if observer is None:
                return run(frame)
            return observed_run(observer, block, unit, frame)

        return direct

    def call_block(self, block: ModelBlockSchema, args: tuple, kwargs: dict) -> Any:
        """Run `block` as a call `module(*args, **kwargs)` would."""
        if block.skip_reason is not None:
            module = block.module
            if module is None:
                raise SchemaRunError(f"block {block.path or block.name!r} was skipped ({block.skip_reason}) and "
                                     "has no live module to run; load the schema with model=...")
            if block.method_name is not None:
                if block.function is not None:
                    return block.function(module, *args, **kwargs)
                return getattr(module, block.method_name)(*args, **kwargs)
            return module(*args, **kwargs)
        if block.module is None:
            raise SchemaRunError(f"block {block.path or block.name!r} has no live module: weights are not part of "
                                 "a saved schema; load it with load_schema(path, model=your_model) to run it")
        return self.invoker(block)(args, kwargs)

    @staticmethod
    def _observed_run(observer: Observer, block: ModelBlockSchema, unit: "Unit", frame: dict) -> Any:
        observer.enter_block(block, frame)
        try:
            result = unit.run(frame)
        except BaseException as exc:
            observer.fail_block(block, frame, exc)
            raise
        observer.exit_block(block, frame, result)
        return result

    def _wrapped_runner(self, block: ModelBlockSchema, unit: Unit) -> Callable:
        runner = getattr(unit, "wrapped_runner", None)
        if runner is None:
            observer = self.observer

            def inner(module: Any, *args: Any, **kwargs: Any) -> Any:
                frame = unit.bind(args, kwargs)
                if observer is None:
                    return unit.run(frame)
                return Program._observed_run(observer, block, unit, frame)

            runner = rebind_wrapper(block.wrapper, inner)
            if runner is None:
                raise SchemaRunError(f"the decorator of {block.name}.forward cannot be re-applied around the schema")
            unit.wrapped_runner = runner
        return runner

    def call_value(self, target: Any, args: list, kwargs: dict) -> Any:
        """Call a runtime value; a module with a block in this schema runs its block."""
        if isinstance(target, _Module):
            invoke = self.module_invokers.get(id(target))
            if invoke is None:
                block = self.by_module.get(id(target))
                if block is None:
                    return target(*args, **kwargs)
                invoke = self.module_invokers[id(target)] = self.invoker(block)
            return invoke(args, kwargs)
        return target(*args, **kwargs)

    def run_root(self, scope: dict) -> Any:
        """Run the root block with `scope` mapping input names to values; returns what forward returns."""
        root = self.root
        sig = root.signature
        if root.skip_reason is not None or sig is None:
            live = entry_signature(root.module, None)
            return self.call_block(root, *root_call(live, scope, f"{root.name}.forward"))
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
        return self.call_block(root, *root_call(entry_signature(root.module, sig), scope, f"{root.name}.forward"))

    def call_root(self, args: tuple, kwargs: dict) -> Any:
        """Run the root block as `model(*args, **kwargs)`: the arguments are passed as given."""
        return self.call_block(self.root, tuple(args), dict(kwargs))

    # -- compilation ------------------------------------------------------------------------

    def compile_list(self, instrs: list[Instruction], unit: Unit) -> list[Callable]:
        """`instrs` as one generated function (see `bodies.fuse_body`): `[body]`, or `[]` for none."""
        if not instrs:
            return []
        return [fuse_body(self.body_entries(instrs, unit), self.observer, unit.module, unit.direct_weights,
                          self.tensor_results)]

    def body_entries(self, instrs: list[Instruction], unit: Unit, depth: int = 0) -> list[BodyEntry]:
        """One `BodyEntry` per instruction of `instrs` (an `if` with its branches written out)."""
        observer = self.observer
        entries = []
        index = 0
        while index < len(instrs):
            instr = instrs[index]
            # Plain runs fuse `$t = getattr(obj, 'm')` + `out = obj.m(...)` into one piece: nobody
            # observes the bound method, and half the dispatches of method-heavy code disappear.
            # Observed for tensor results, the same piece also binds the method (descriptions read
            # it), unless the call mutates: the observer's `before` reads the unfused frame then.
            if (observer is None or self.tensor_results) and index + 1 < len(instrs) \
                    and fusable_method_call(instr, instrs[index + 1]) \
                    and not (observer is not None and getattr(instrs[index + 1], "mutates", False)):
                call = instrs[index + 1]
                piece = self.compile_method_call(instr, call, unit, bind_method=observer is not None)
                entries.append(BodyEntry(call, instr, piece,
                                         self.weights_read(names_read(instr) + names_read(call), unit),
                                         True, False, None))
                index += 2
                continue
            control = isinstance(instr, (ControlInstruction, TryInstruction, WithInstruction))
            if isinstance(instr, ControlInstruction) and instr.kind == "if" and depth < _MAX_NESTING:
                item = IfPiece(self.body_entries(condition_instructions(instr), unit, depth + 1), instr.cond_var,
                               self.weights_read([instr.cond_var], unit),
                               self.body_entries(instr.body, unit, depth + 1),
                               self.body_entries(instr.else_body, unit, depth + 1))
                entries.append(BodyEntry(instr, None, item, (), False, False, None))
                index += 1
                continue
            if isinstance(instr, ReturnInstruction):
                item, ends = self.return_piece(instr), "return"
            elif isinstance(instr, (BreakInstruction, ContinueInstruction)):
                item = Piece("pass", {"_i": instr})
                ends = "break" if isinstance(instr, BreakInstruction) else "continue"
            else:
                item, ends = getattr(self, "compile_" + type(instr).__name__)(instr, unit), None
            announce = self._call_announcer(instr, unit) if self.observe_calls and not control else None
            entries.append(BodyEntry(instr, None, item, self.weights_read(names_read(instr), unit), not control,
                                     bool(getattr(instr, "mutates", False)), ends, announce))
            index += 1
        return entries

    @staticmethod
    def weights_read(names: list, unit: Unit) -> tuple:
        """The (ref, attr) weights among `names` that `unit` reads live before an instruction."""
        if not unit.weights or not names:
            return ()
        mapping = dict(unit.weights)
        return tuple((ref, mapping[ref]) for ref in dict.fromkeys(names) if ref in mapping)

    @staticmethod
    def fresh_weights(fn: Callable, names: list, unit: Unit) -> Callable:
        """`fn` preceded by a live read of the weights among `names` (see `Unit.weight_reader`)."""
        read = unit.weight_reader(names) if unit.weights and names else None
        if read is None:
            return fn

        def read_weights_first(f: dict, _fn=fn, _read=read) -> Any:
            _read(f)
            return _fn(f)

        return read_weights_first

    def _call_announcer(self, instr: Instruction, unit: Unit) -> Optional[Callable[[dict], None]]:
        """For a call of a sub-block, `announce(frame)` telling the observer what it is about to call;
        None for any other instruction. A call of a module value (`layer(x)` over a ModuleList) is
        announced only when the value is a module with a block here (not for a tensor's method)."""
        before_call = self.observer.before_call
        by_module = self.by_module
        if isinstance(instr, BlockInstruction):
            ref = instr.block_ref
            if instr.callee_var is not None:
                name, method = instr.callee_var, ref.method

                def announce_value(f: dict) -> None:
                    block = by_module.get(id(f.get(name)))
                    if block is not None and method is not None:
                        block = block.methods.get(method)
                    before_call(instr, f, block, callee_label(block) if block is not None else
                                name + (f".{method}" if method else ""))

                return announce_value
            try:
                block = unit.block.find(ref.path)
            except KeyError:
                block = None
            if block is not None and ref.method is not None:
                block = block.methods.get(ref.method)
            owner = unit.block.path
            label = callee_label(block) if block is not None else ".".join(
                part for part in (owner, ref.path, ref.method) if part)

            def announce(f: dict) -> None:
                before_call(instr, f, block, label)

            return announce
        if isinstance(instr, OpInstruction) and isinstance(instr.target, VarRef):
            name = instr.target.name

            def announce_module(f: dict) -> None:
                value = f.get(name)
                if isinstance(value, _Module):
                    block = by_module.get(id(value))
                    if block is not None:
                        before_call(instr, f, block, callee_label(block))

            return announce_module
        return None

    def compile(self, instr: Instruction, unit: Unit) -> Callable:
        return self.fresh_weights(self._compile(instr, unit), names_read(instr), unit)

    def _compile(self, instr: Instruction, unit: Unit) -> Callable:
        kind = type(instr).__name__
        fn = getattr(self, "compile_" + kind)(instr, unit)
        if isinstance(fn, Piece):
            fn = piece_closure("run", fn)
        observer = self.observer
        if observer is None or isinstance(instr, (ControlInstruction, TryInstruction, WithInstruction)):
            return fn
        after = observer.after
        if self.observe_calls:
            announce = self._call_announcer(instr, unit)
            if announce is not None:
                def observed_call(f: dict, _fn=fn, _i=instr, _announce=announce) -> Any:
                    _announce(f)
                    if _i.__class__ is OpInstruction and _i.mutates:
                        observer.before(_i, f)
                    signal = _fn(f)
                    after(_i, f)
                    return signal

                return observed_call
        if getattr(instr, "mutates", False):
            before = observer.before

            def observed_mutating(f: dict, _fn=fn, _i=instr) -> Any:
                before(_i, f)
                signal = _fn(f)
                after(_i, f)
                return signal

            return observed_mutating

        if isinstance(instr, ReturnInstruction):
            def observed_return(f: dict, _fn=fn, _i=instr) -> Any:
                signal = _fn(f)
                after(_i, f)
                return signal

            return observed_return

        def observed(f: dict, _fn=fn, _i=instr) -> Any:
            signal = _fn(f)
            after(_i, f)
            return signal

        return observed
