"""The execution core: instructions compiled once into closures over a frame dict, then run.

One set of execution rules serves every driver. `Program(root)` compiles the plain form: each
instruction becomes a small closure that reads operands from the frame, calls the real torch
callable and binds the result; nothing else runs. `Program(root, observer)` compiles the same rules
wrapped with calls to an `Observer` (block enter/exit, after each leaf instruction, before a mutating
one): listeners, captures and stepping are all observers, and a plain run pays for none of them.

Control flow travels as return values of the closures: None (go on), BREAK, CONTINUE, RETURN (the
value is in the frame under RETURN_SLOT). User exceptions propagate unchanged, with one note per
block naming the instruction and the forward's file:line.

Depends on schema, notation, intrinsics and errors; knows nothing about listeners' formats or views.
"""

from __future__ import annotations

import sys
import types
from operator import itemgetter
from typing import Any, Callable, Optional

import torch
from torch import nn

from .argument_binding import bind_arguments, block_qualname, nested_qualname
from .errors import SchemaRunError
from .notation import instruction_text
from .unbound_reads import unbound_error
from .schema import (
    BlockInstruction,
    BreakInstruction,
    Const,
    ContinueInstruction,
    ControlInstruction,
    DeleteInstruction,
    FunctionInstruction,
    FunctionSchema,
    Instruction,
    ModelBlockSchema,
    OpInstruction,
    RaiseInstruction,
    ReturnInstruction,
    SliceOf,
    TryInstruction,
    VarRef,
    WithInstruction,
)

__all__ = ["Program", "Observer", "InterpretedFunction", "BREAK", "CONTINUE", "RETURN", "RETURN_SLOT",
           "StepAbandoned"]

BREAK = "<break>"
CONTINUE = "<continue>"
RETURN = "<return>"
RETURN_SLOT = "$return"
_Module = nn.Module
_MISSING = object()


class StepAbandoned(BaseException):
    """Thrown into a paused stepped run to unwind it; never caught by `except` clauses of the model."""


class Observer:
    """What an observed program reports. Every hook is a no-op here; subclasses override some."""

    def enter_block(self, block: ModelBlockSchema, frame: dict) -> None:
        """A block (forward or method) starts, with its bound frame."""

    def exit_block(self, block: ModelBlockSchema, frame: dict, result: Any) -> None:
        """A block returned `result`."""

    def fail_block(self, block: ModelBlockSchema, frame: dict, exc: BaseException) -> None:
        """A block raised `exc` (it may still be caught by the caller's try)."""

    def before(self, instr: Instruction, frame: dict) -> None:
        """A mutating instruction is about to run (its operands may change in place)."""

    def after(self, instr: Instruction, frame: dict) -> None:
        """A leaf instruction ran; its value (if any) is `frame[instr.out_var]`."""

    def enter_function(self, fn: "InterpretedFunction", frame: dict) -> None:
        """A closure, lambda or comprehension helper starts."""

    def exit_function(self, fn: "InterpretedFunction", frame: dict) -> None:
        """A closure returned or raised."""


# --- operands ---------------------------------------------------------------------------------


def _operand(op: Any) -> tuple[str, Any]:
    """('const', value) | ('var', name) | ('fn', getter(frame))."""
    if isinstance(op, VarRef):
        return "var", op.name
    if isinstance(op, Const):
        return "const", op.value
    if isinstance(op, SliceOf):
        parts = [_operand(p) for p in (op.lower, op.upper, op.step)]
        if all(k == "const" for k, _ in parts):
            return "const", slice(*(v for _, v in parts))
        getters = [_getter(k, v) for k, v in parts]
        lo, hi, st = getters
        return "fn", lambda f: slice(lo(f), hi(f), st(f))
    if isinstance(op, tuple):
        parts = [_operand(p) for p in op]
        if all(k == "const" for k, _ in parts):
            return "const", tuple(v for _, v in parts)
        if all(k == "var" for k, _ in parts) and len(parts) > 1:
            get = itemgetter(*(v for _, v in parts))
            return "fn", get
        getters = [_getter(k, v) for k, v in parts]
        return "fn", lambda f: tuple([g(f) for g in getters])
    if isinstance(op, list):
        getters = [_getter(*_operand(p)) for p in op]
        return "fn", lambda f: [g(f) for g in getters]
    if isinstance(op, dict):
        items = [(_getter(*_operand(k)), _getter(*_operand(v))) for k, v in op.items()]
        return "fn", lambda f: {k(f): v(f) for k, v in items}
    return "const", op


def _getter(kind: str, value: Any) -> Callable[[dict], Any]:
    if kind == "const":
        return lambda f: value
    if kind == "var":
        return itemgetter(value)
    return value


def _args_builder(args: list, kwargs: dict, star_args: tuple, args_var: Optional[str],
                  kwargs_var: Optional[str]) -> tuple[Optional[tuple], Callable[[dict], tuple[list, dict]]]:
    """Returns (simple_var_names or None, build(frame) -> (args, kwargs))."""
    compiled = [_operand(a) for a in args]
    kw_compiled = {k: _operand(v) for k, v in kwargs.items()}
    simple = (not kwargs and not star_args and args_var is None and kwargs_var is None
              and all(k == "var" for k, _ in compiled))
    template = [v if k == "const" else None for k, v in compiled]
    var_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "var"]
    fn_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "fn"]
    kw_template = {k: v for k, (kind, v) in kw_compiled.items() if kind == "const"}
    kw_vars = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "var"]
    kw_fns = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "fn"]
    stars = frozenset(star_args)

    def build(f: dict) -> tuple[list, dict]:
        a = template.copy()
        for i, name in var_slots:
            a[i] = f[name]
        for i, g in fn_slots:
            a[i] = g(f)
        if stars:
            flat = []
            for i, item in enumerate(a):
                if i in stars:
                    flat.extend(item)
                else:
                    flat.append(item)
            a = flat
        if args_var is not None:
            a.extend(f[args_var])
        kw = kw_template.copy() if kw_template else {}
        for k, name in kw_vars:
            kw[k] = f[name]
        for k, g in kw_fns:
            kw[k] = g(f)
        if kwargs_var is not None:
            extra = f[kwargs_var]
            for k in extra:
                if k in kw:
                    raise TypeError(f"got multiple values for keyword argument '{k}'")
            kw.update(extra)
        return a, kw

    return (tuple(v for _, v in compiled) if simple else None), build


# --- closures ---------------------------------------------------------------------------------


class InterpretedFunction:
    """A closure, lambda or comprehension helper of the schema, callable like the Python original."""

    __slots__ = ("program", "schema", "unit", "outer", "defaults", "__name__", "__qualname__")

    def __init__(self, program: "Program", schema: FunctionSchema, unit: "_Unit", outer: dict, defaults: dict):
        self.program = program
        self.schema = schema
        self.unit = unit
        self.outer = outer
        self.defaults = defaults
        self.__name__ = schema.name
        self.__qualname__ = unit.qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        unit = self.unit
        frame = unit.bind(args, kwargs, self.defaults)
        outer = self.outer
        for name in unit.free_vars:
            if name in outer and name not in frame:
                frame[name] = outer[name]
        observer = self.program.observer
        if observer is not None:
            observer.enter_function(self, frame)
        try:
            return unit.run(frame) if unit.lazy is None else unit.generate(frame, outer)
        finally:
            for name in unit.nonlocal_vars:
                if name in frame:
                    outer[name] = frame[name]
            if observer is not None:
                observer.exit_function(self, frame)

    def __repr__(self) -> str:
        return f"<interpreted function {self.schema.name}>"


def _rebind_wrapper(fn: Callable, replacement: Callable) -> Optional[Callable]:
    """Rebuild decorator wrappers around `replacement` instead of the innermost function.

    Each `functools.wraps` level closes over the function it wraps; a copy of the wrapper whose cell
    holds `replacement` keeps the decorator's own behaviour. Returns None when a level does not
    close over the function it wraps.
    """
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        return replacement
    new_inner = _rebind_wrapper(inner, replacement)
    if new_inner is None or not isinstance(fn, types.FunctionType) or not fn.__closure__:
        return None
    cells = list(fn.__closure__)
    hit = False
    for i, cell in enumerate(cells):
        try:
            contents = cell.cell_contents
        except ValueError:
            continue
        if contents is inner:
            cells[i] = types.CellType(new_inner)
            hit = True
    if not hit:
        return None
    rebuilt = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    rebuilt.__kwdefaults__ = fn.__kwdefaults__
    return rebuilt


def rebindable(fn: Callable) -> bool:
    return _rebind_wrapper(fn, lambda *a, **k: None) is not None


# --- the compiled unit of one function body ---------------------------------------------------


class _Unit:
    """One FunctionSchema compiled for one block (module) and one program mode."""

    def __init__(self, program: "Program", block: ModelBlockSchema, schema: FunctionSchema, *, is_block: bool,
                 qualname: Optional[str] = None):
        self.program = program
        self.block = block
        self.schema = schema
        self.is_block = is_block
        self.module = block.module
        self.free_vars = schema.free_vars
        self.nonlocal_vars = schema.nonlocal_vars
        self.params = tuple(schema.params)
        self.simple = schema.vararg is None and schema.kwarg is None and not schema.kwonly
        self.self_name = schema.self_name if is_block else None
        self.weights = tuple(schema.weight_refs.items())
        module = self.module
        # Registered parameters/buffers are read from their dict directly (what Module.__getattr__
        # would return); anything else falls back to getattr at each call.
        self.direct_weights = all(
            attr in getattr(module, "_parameters", {}) or attr in getattr(module, "_buffers", {})
            for _, attr in self.weights) and not any(hasattr(type(module), attr) for _, attr in self.weights)
        self.label = f"{block.name}.{schema.name}" if is_block else schema.name
        self.qualname = qualname or (block_qualname(block, self.label) if is_block else schema.name)
        self.body = program.compile_list(schema.body, self)
        # A generator expression's helper runs lazily, one element per `next`, as CPython's does.
        self.lazy = program.compile_lazy(schema.body, self) if not is_block and schema.name == "<gencomp>" else None

    # binding follows CPython's rules and messages
    def bind(self, args: tuple, kwargs: dict, defaults: Optional[dict] = None) -> dict:
        params = self.params
        if self.simple and not kwargs and len(args) == len(params):
            frame = dict(zip(params, args))
        else:
            frame = self._bind_general(args, kwargs, self.schema.defaults if defaults is None else defaults)
        if self.self_name is not None:
            frame[self.self_name] = self.module
        if self.weights:
            module = self.module
            if self.direct_weights:
                params = module._parameters
                buffers = module._buffers
                for ref, attr in self.weights:
                    value = params.get(attr, _MISSING)
                    if value is _MISSING:
                        value = buffers[attr] if attr in buffers else getattr(module, attr)
                    frame[ref] = value
            else:
                for ref, attr in self.weights:
                    frame[ref] = getattr(module, attr)
        return frame

    def _bind_general(self, args: tuple, kwargs: dict, defaults: dict) -> dict:
        return bind_arguments(self.qualname, self.schema, self.params, self.self_name is not None, args, kwargs,
                              defaults)

    def generate(self, frame: dict, outer: dict) -> Any:
        """Start a generator expression: its first iterable is iterated now, the rest on demand."""
        frame[".0"] = iter(frame[".0"])
        return self._generator(frame, outer)

    def _generator(self, frame: dict, outer: dict) -> Any:
        _blk = self
        walker = _walk_lazy(self.lazy, frame)
        while True:
            # Free variables are read when an element is computed (late binding), walrus targets
            # written back at once: the cells CPython would share with the enclosing function.
            for name in self.free_vars:
                if name in outer:
                    frame[name] = outer[name]
                else:
                    frame.pop(name, None)
            try:
                value = next(walker)
            except StopIteration:
                return
            except KeyError as exc:
                unbound = _unbound_error(exc, self)
                _annotate(unbound or exc, self, sys._getframe(0))
                if unbound is None:
                    raise
                raise unbound from None
            except BaseException as exc:
                if not isinstance(exc, StepAbandoned):
                    _annotate(exc, self, sys._getframe(0))
                raise
            finally:
                for name in self.nonlocal_vars:
                    if name in frame:
                        outer[name] = frame[name]
            yield value

    def run(self, frame: dict) -> Any:
        """Run the body in `frame`; returns the returned value."""
        _blk = self
        try:
            for fn in self.body:
                signal = fn(frame)
                if signal is not None:
                    if signal is RETURN:
                        return frame.pop(RETURN_SLOT)
                    raise SyntaxError(f"'{signal}' outside loop in {self.label}")
            return None
        except KeyError as exc:
            unbound = _unbound_error(exc, self)
            _annotate(unbound or exc, self, sys._getframe(0))
            if unbound is None:
                raise
            raise unbound from None
        except BaseException as exc:
            if not isinstance(exc, StepAbandoned):
                _annotate(exc, self, sys._getframe(0))
            raise


def _annotate(exc: BaseException, unit: _Unit, here: Any) -> None:
    """Add one note naming the instruction of `unit` that was running when `exc` passed through."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not here:
        tb = tb.tb_next
    instr = None
    if tb is not None:
        tb = tb.tb_next
    while tb is not None:
        local = tb.tb_frame.f_locals
        if "_blk" in local:
            break
        candidate = local.get("_i")
        if isinstance(candidate, Instruction):
            instr = candidate
        tb = tb.tb_next
    if instr is None:
        return
    where = f" at {instr.location}" if instr.location is not None else ""
    note = f"while executing `{instruction_text(instr)}` in {unit.label}{where}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def _unbound_error(exc: KeyError, unit: _Unit) -> Optional[BaseException]:
    return unbound_error(exc, __file__, unit.free_vars, unit.schema.name)


_LAZY_RUN, _LAZY_YIELD, _LAZY_FOR, _LAZY_IF = range(4)


def _walk_lazy(steps: list, f: dict) -> Any:
    """Run the steps of a generator expression's helper, yielding each element instead of appending it."""
    for step in steps:
        kind = step[0]
        if kind == _LAZY_RUN:
            if step[1](f) is not None:  # the helper's return: the elements are done
                return
        elif kind == _LAZY_YIELD:
            args, _ = step[1](f)
            yield args[1]
        elif kind == _LAZY_FOR:
            _, condition, cond_var, bind_var, body = step
            for fn in condition:
                fn(f)
            for item in f[cond_var]:
                f[bind_var] = item
                yield from _walk_lazy(body, f)
        else:
            _, condition, cond_var, body, else_body = step
            for fn in condition:
                fn(f)
            yield from _walk_lazy(body if f[cond_var] else else_body, f)


def _is_element(instr: Instruction) -> bool:
    """The `$result.append(element)` the lowering emits at the heart of a comprehension helper."""
    return (isinstance(instr, OpInstruction) and instr.target is list.append and bool(instr.args)
            and instr.args[0] == VarRef("$result"))


def _holds_element(instr: Instruction) -> bool:
    if _is_element(instr):
        return True
    if isinstance(instr, ControlInstruction):
        return any(_holds_element(i) for i in instr.body) or any(_holds_element(i) for i in instr.else_body)
    return False


def _fusable_method_call(first: Instruction, second: Instruction) -> bool:
    return (type(first) is OpInstruction and first.target is getattr and len(first.args) == 2
            and isinstance(first.args[1], str) and not first.kwargs and not first.star_args
            and first.out_var.startswith("$") and type(second) is OpInstruction
            and isinstance(second.target, VarRef) and second.target.name == first.out_var
            and not _mentions(second, first.out_var))


def _mentions(instr: OpInstruction, name: str) -> bool:
    def walk(op: Any) -> bool:
        if isinstance(op, VarRef):
            return op.name == name
        if isinstance(op, (list, tuple)):
            return any(walk(o) for o in op)
        if isinstance(op, dict):
            return any(walk(k) or walk(v) for k, v in op.items())
        if isinstance(op, SliceOf):
            return walk(op.lower) or walk(op.upper) or walk(op.step)
        return False

    return walk(instr.args) or walk(instr.kwargs) or name in (instr.args_var, instr.kwargs_var)


def _run_list(fns: list, f: dict) -> Any:
    for fn in fns:
        signal = fn(f)
        if signal is not None:
            return signal
    return None


from torch.nn.modules import module as _module_impl  # noqa: E402


def _global_hook_dicts() -> tuple:
    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks")
    return tuple(getattr(_module_impl, name) for name in names if hasattr(_module_impl, name))


_GLOBAL_HOOK_DICTS = _global_hook_dicts()


def _GLOBAL_HOOKS_ACTIVE() -> bool:
    for hooks in _GLOBAL_HOOK_DICTS:
        if hooks:
            return True
    return False


def _call_with_hooks(module: nn.Module, args: Any, kwargs: dict, direct: Callable) -> Any:
    """`Module._call_impl`'s forward-hook protocol around `direct` (the schema of the forward)."""
    has_backward = (module._backward_hooks or module._backward_pre_hooks
                    or getattr(_module_impl, "_global_backward_hooks", None)
                    or getattr(_module_impl, "_global_backward_pre_hooks", None))
    if has_backward:
        return module(*args, **kwargs)  # backward hooks wrap tensors: let the real call do it exactly
    args = tuple(args)
    pre_kwargs = getattr(module, "_forward_pre_hooks_with_kwargs", {})
    for hook_id, hook in (*_module_impl._global_forward_pre_hooks.items(), *module._forward_pre_hooks.items()):
        if hook_id in pre_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    hook_kwargs = getattr(module, "_forward_hooks_with_kwargs", {})
    always = getattr(module, "_forward_hooks_always_called", {})
    global_always = getattr(_module_impl, "_global_forward_hooks_always_called", {})
    try:
        result = direct(args, kwargs)
    except BaseException:
        for hook_id, hook in (*_module_impl._global_forward_hooks.items(), *module._forward_hooks.items()):
            if hook_id in always or hook_id in global_always:
                try:
                    if hook_id in hook_kwargs:
                        hook(module, args, kwargs, None)
                    else:
                        hook(module, args, None)
                except Exception:
                    pass
        raise
    for hook_id, hook in (*_module_impl._global_forward_hooks.items(), *module._forward_hooks.items()):
        if hook_id in hook_kwargs:
            hook_result = hook(module, args, kwargs, result)
        else:
            hook_result = hook(module, args, result)
        if hook_result is not None:
            result = hook_result
    return result


class Program:
    """A schema tree compiled for one mode: plain (`observer=None`) or observed."""

    def __init__(self, root: ModelBlockSchema, observer: Optional[Observer] = None):
        self.root = root
        self.observer = observer
        self.units: dict[int, _Unit] = {}
        self.invokers: dict[int, Callable] = {}
        self.module_invokers: dict[int, Callable] = {}
        self.by_module: dict[int, ModelBlockSchema] = {}
        for block in root.iter_blocks():
            if block.module is not None and block.method_name is None:
                self.by_module.setdefault(id(block.module), block)

    # -- running blocks ---------------------------------------------------------------------

    def unit(self, block: ModelBlockSchema) -> _Unit:
        unit = self.units.get(id(block))
        if unit is None:
            if block.signature is None:
                raise SchemaRunError(f"block {block.path or block.name!r} has no lowered forward to run")
            unit = _Unit(self, block, block.signature, is_block=True)
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
        else:
            direct = self._direct(block)
            module = block.module

            def invoke(args: Any, kwargs: dict) -> Any:
                if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                        or module._backward_pre_hooks or _GLOBAL_HOOKS_ACTIVE()):
                    return _call_with_hooks(module, args, kwargs, direct)
                return direct(args, kwargs)
        self.invokers[id(block)] = invoke
        return invoke

    def _direct(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """Run `block`'s schema (inside its forward's decorators, if any), without module hooks."""
        unit = self.unit(block)
        if block.wrapper is not None:
            runner = self._wrapped_runner(block, unit)
            module = block.module
            return lambda args, kwargs: runner(module, *args, **kwargs)
        bind, run = unit.bind, unit.run
        observer = self.observer
        if observer is None:
            return lambda args, kwargs: run(bind(args, kwargs))
        observed_run = self._observed_run
        return lambda args, kwargs: observed_run(observer, block, unit, bind(args, kwargs))

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
    def _observed_run(observer: Observer, block: ModelBlockSchema, unit: "_Unit", frame: dict) -> Any:
        observer.enter_block(block, frame)
        try:
            result = unit.run(frame)
        except BaseException as exc:
            observer.fail_block(block, frame, exc)
            raise
        observer.exit_block(block, frame, result)
        return result

    def _wrapped_runner(self, block: ModelBlockSchema, unit: _Unit) -> Callable:
        runner = getattr(unit, "wrapped_runner", None)
        if runner is None:
            observer = self.observer

            def inner(module: Any, *args: Any, **kwargs: Any) -> Any:
                frame = unit.bind(args, kwargs)
                if observer is None:
                    return unit.run(frame)
                return Program._observed_run(observer, block, unit, frame)

            runner = _rebind_wrapper(block.wrapper, inner)
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
            return self.call_block(root, (), dict(scope))
        known = set(sig.params) | set(sig.kwonly)
        unknown = [k for k in scope if k not in known and sig.kwarg is None]
        if unknown:
            raise SchemaRunError(f"scope has {', '.join(map(repr, unknown))}, which {root.name}.forward does not take; "
                                 f"its inputs are: {', '.join(sig.params + sig.kwonly) or '(none)'}")
        missing = [p for p in sig.params if p not in scope and p not in sig.defaults]
        if missing:
            raise SchemaRunError(f"scope is missing the input{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(map(repr, missing))} of {root.name}.forward; pass them as "
                                 f"scope={{{', '.join(repr(m) + ': ...' for m in missing)}}}")
        return self.call_block(root, (), dict(scope))

    # -- compilation ------------------------------------------------------------------------

    def compile_list(self, instrs: list[Instruction], unit: _Unit) -> list[Callable]:
        if self.observer is not None:
            return [self.compile(instr, unit) for instr in instrs]
        # Plain runs fuse `$t = getattr(obj, 'm')` + `out = obj.m(...)` into one closure: nobody
        # observes the bound method, and half the dispatches of method-heavy code disappear.
        compiled = []
        index = 0
        while index < len(instrs):
            instr = instrs[index]
            if index + 1 < len(instrs) and _fusable_method_call(instr, instrs[index + 1]):
                compiled.append(self.compile_method_call(instr, instrs[index + 1], unit))
                index += 2
                continue
            compiled.append(self.compile(instr, unit))
            index += 1
        return compiled

    def compile_method_call(self, fetch: OpInstruction, call: OpInstruction, unit: _Unit) -> Callable:
        kind, receiver = _operand(fetch.args[0])
        get_receiver = _getter(kind, receiver)
        attr = fetch.args[1]
        out = call.out_var
        simple, build = _args_builder(call.args, call.kwargs, call.star_args, call.args_var, call.kwargs_var)
        call_value = self.call_value
        empty: dict = {}
        if simple is not None and kind == "var":
            names = simple

            def run_method_simple(f: dict, _i=call, _r=fetch) -> None:
                f[out] = call_value(getattr(f[receiver], attr), [f[n] for n in names], empty)

            return run_method_simple

        def run_method(f: dict, _i=call, _r=fetch) -> None:  # _r: the fused getattr, for error reports
            method = getattr(get_receiver(f), attr)
            a, kw = build(f)
            f[out] = call_value(method, a, kw)

        return run_method

    def compile_lazy(self, instrs: list[Instruction], unit: _Unit) -> list[tuple]:
        """The steps `_walk_lazy` runs: loops and ifs around the element are walked, the rest compiled."""
        steps: list[tuple] = []
        for instr in instrs:
            if _is_element(instr):
                _, build = _args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
                steps.append((_LAZY_YIELD, build))
            elif _holds_element(instr) and instr.kind == "for":
                steps.append((_LAZY_FOR, self.compile_list(instr.condition, unit), instr.cond_var, instr.bind_var,
                              self.compile_lazy(instr.body, unit)))
            elif _holds_element(instr):
                steps.append((_LAZY_IF, self.compile_list(instr.condition, unit), instr.cond_var,
                              self.compile_lazy(instr.body, unit), self.compile_lazy(instr.else_body, unit)))
            else:
                steps.append((_LAZY_RUN, self.compile(instr, unit)))
        return steps

    def compile(self, instr: Instruction, unit: _Unit) -> Callable:
        kind = type(instr).__name__
        fn = getattr(self, "compile_" + kind)(instr, unit)
        observer = self.observer
        if observer is None or isinstance(instr, (ControlInstruction, TryInstruction, WithInstruction)):
            return fn
        after = observer.after
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

    def compile_OpInstruction(self, instr: OpInstruction, unit: _Unit) -> Callable:
        out = instr.out_var
        simple, build = _args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
        target = instr.target
        if isinstance(target, VarRef):
            tname = target.name
            call_value = self.call_value

            def run_dynamic(f: dict, _i=instr) -> None:
                a, kw = build(f)
                f[out] = call_value(f[tname], a, kw)

            return run_dynamic
        t = target
        if simple is not None:
            n = len(simple)
            if n == 1:
                (a0,) = simple

                def run1(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0])

                return run1
            if n == 2:
                a0, a1 = simple

                def run2(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0], f[a1])

                return run2
            if n == 3:
                a0, a1, a2 = simple

                def run3(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0], f[a1], f[a2])

                return run3
            if n == 0:
                def run0(f: dict, _i=instr) -> None:
                    f[out] = t()

                return run0
            get = itemgetter(*simple)

            def run_n(f: dict, _i=instr) -> None:
                f[out] = t(*get(f))

            return run_n

        def run(f: dict, _i=instr) -> None:
            a, kw = build(f)
            f[out] = t(*a, **kw)

        return run

    def compile_BlockInstruction(self, instr: BlockInstruction, unit: _Unit) -> Callable:
        out = instr.out_var
        _, build = _args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
        ref = instr.block_ref
        call_block = self.call_block
        if instr.callee_var is not None:
            callee = instr.callee_var
            call_value = self.call_value
            method = ref.method
            simple, _ = _args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
            if simple is not None and method is None:
                names = simple
                empty: dict = {}

                def run_dynamic_block_simple(f: dict, _i=instr) -> None:
                    f[out] = call_value(f[callee], [f[n] for n in names], empty)

                return run_dynamic_block_simple

            def run_dynamic_block(f: dict, _i=instr) -> None:
                a, kw = build(f)
                target = f[callee]
                if method is not None:
                    target = getattr(target, method)
                f[out] = call_value(target, a, kw)

            return run_dynamic_block
        owner = unit.block
        try:
            block = owner.find(ref.path)
        except KeyError:
            block = None
        if block is not None and ref.method is not None:
            block = block.methods.get(ref.method)
        if block is None:
            # The child is not in the schema (None at parse time, or replaced since): call it live.
            path, method = ref.path, ref.method
            module = owner.module

            def run_live(f: dict, _i=instr) -> None:
                a, kw = build(f)
                target = module
                for part in path.split(".") if path else ():
                    target = target[int(part)] if part.lstrip("-").isdigit() else getattr(target, part)
                if method is not None:
                    target = getattr(target, method)
                f[out] = target(*a, **kw)

            return run_live

        invoker = self.invoker

        def run_block(f: dict, _i=instr) -> None:
            a, kw = build(f)
            f[out] = invoker(block)(a, kw)

        return run_block

    def compile_ControlInstruction(self, instr: ControlInstruction, unit: _Unit) -> Callable:
        condition = self.compile_list(instr.condition, unit)
        body = self.compile_list(instr.body, unit)
        else_body = self.compile_list(instr.else_body, unit)
        cond_var = instr.cond_var
        if instr.kind == "if":
            def run_if(f: dict, _i=instr) -> Any:
                for fn in condition:
                    fn(f)
                if f[cond_var]:
                    return _run_list(body, f) if body else None
                return _run_list(else_body, f) if else_body else None

            return run_if
        if instr.kind == "while":
            def run_while(f: dict, _i=instr) -> Any:
                while True:
                    for fn in condition:
                        fn(f)
                    if not f[cond_var]:
                        break
                    signal = _run_list(body, f)
                    if signal is not None:
                        if signal is BREAK:
                            return None
                        if signal is CONTINUE:
                            continue
                        return signal
                return _run_list(else_body, f) if else_body else None

            return run_while
        bind_var = instr.bind_var
        index_var = instr.index_var

        def run_for(f: dict, _i=instr) -> Any:
            for fn in condition:
                fn(f)
            iterable = f[cond_var]
            position = 0
            for item in iterable:
                f[bind_var] = item
                if index_var is not None:
                    f[index_var] = position
                    position += 1
                signal = _run_list(body, f)
                if signal is not None:
                    if signal is BREAK:
                        return None
                    if signal is CONTINUE:
                        continue
                    return signal
            return _run_list(else_body, f) if else_body else None

        return run_for

    def compile_TryInstruction(self, instr: TryInstruction, unit: _Unit) -> Callable:
        body = self.compile_list(instr.body, unit)
        handlers = [(classes, name, self.compile_list(hbody, unit))
                    for classes, name, hbody in zip(instr.handlers, instr.handler_names, instr.handler_bodies)]
        else_body = self.compile_list(instr.else_body, unit)
        final_body = self.compile_list(instr.final_body, unit)

        def run_try(f: dict, _i=instr) -> Any:
            try:
                try:
                    try:
                        signal = _run_list(body, f)
                    except KeyError as missed:  # an unbound read is a NameError for the handlers too
                        unbound = _unbound_error(missed, unit)
                        if unbound is None:
                            raise
                        raise unbound from None
                except StepAbandoned:
                    raise
                except BaseException as exc:
                    for classes, name, hbody in handlers:
                        if not classes or isinstance(exc, classes):
                            if name is not None:
                                f[name] = exc
                            try:
                                return _run_list(hbody, f)
                            finally:
                                if name is not None:
                                    f.pop(name, None)
                    raise
                if signal is not None:
                    return signal
                return _run_list(else_body, f) if else_body else None
            except KeyError as missed:  # from a handler or the else body: before `finally` rebinds the name
                unbound = _unbound_error(missed, unit)
                if unbound is None:
                    raise
                raise unbound from None
            finally:
                if final_body:
                    final_signal = _run_list(final_body, f)
                    if final_signal is not None:
                        return final_signal  # noqa: B012 - a return in finally overrides, as in Python

        return run_try

    def compile_WithInstruction(self, instr: WithInstruction, unit: _Unit) -> Callable:
        body = self.compile_list(instr.body, unit)
        context_var = instr.context_var
        bind_var = instr.bind_var

        def run_with(f: dict, _i=instr) -> Any:
            with f[context_var] as value:
                if bind_var is not None:
                    f[bind_var] = value
                return _run_list(body, f)

        return run_with

    def compile_FunctionInstruction(self, instr: FunctionInstruction, unit: _Unit) -> Callable:
        schema = instr.function
        qualname = nested_qualname(unit.qualname, unit.schema.name, unit.is_block, schema.name)
        inner = _Unit(self, unit.block, schema, is_block=False, qualname=qualname)
        out = instr.out_var
        positional = schema.params
        default_ops = [(_getter(*_operand(d))) for d in instr.defaults]
        default_names = positional[len(positional) - len(default_ops):] if default_ops else []
        kw_defaults = {k: _getter(*_operand(v)) for k, v in instr.kw_defaults.items()}
        program = self

        def run_function(f: dict, _i=instr) -> None:
            defaults = {name: g(f) for name, g in zip(default_names, default_ops)}
            for k, g in kw_defaults.items():
                defaults[k] = g(f)
            f[out] = InterpretedFunction(program, schema, inner, f, defaults)

        return run_function

    def compile_RaiseInstruction(self, instr: RaiseInstruction, unit: _Unit) -> Callable:
        exc_get = _getter(*_operand(instr.exc)) if instr.exc is not None else None
        cause_get = _getter(*_operand(instr.cause)) if instr.has_cause else None

        def run_raise(f: dict, _i=instr) -> None:
            if exc_get is None:
                active = sys.exc_info()[1]
                if active is None:
                    raise RuntimeError("No active exception to reraise")
                raise active
            exc = exc_get(f)
            if cause_get is not None:
                raise exc from cause_get(f)
            raise exc

        return run_raise

    def compile_DeleteInstruction(self, instr: DeleteInstruction, unit: _Unit) -> Callable:
        names = tuple(instr.names)

        def run_delete(f: dict, _i=instr) -> None:
            for name in names:
                if name not in f:
                    raise UnboundLocalError(f"cannot access local variable '{name}' where it is not associated "
                                            "with a value")
                del f[name]

        return run_delete

    def compile_ReturnInstruction(self, instr: ReturnInstruction, unit: _Unit) -> Callable:
        names = tuple(instr.out_vars)
        if not names:
            def run_return_none(f: dict, _i=instr) -> str:
                f[RETURN_SLOT] = None
                return RETURN

            return run_return_none
        if len(names) == 1 and not instr.as_tuple:
            (name,) = names

            def run_return(f: dict, _i=instr) -> str:
                f[RETURN_SLOT] = f[name]
                return RETURN

            return run_return
        get = itemgetter(*names)
        single = len(names) == 1

        def run_return_tuple(f: dict, _i=instr) -> str:
            value = get(f)
            f[RETURN_SLOT] = (value,) if single else value
            return RETURN

        return run_return_tuple

    def compile_BreakInstruction(self, instr: BreakInstruction, unit: _Unit) -> Callable:
        return lambda f, _i=instr: BREAK

    def compile_ContinueInstruction(self, instr: ContinueInstruction, unit: _Unit) -> Callable:
        return lambda f, _i=instr: CONTINUE
