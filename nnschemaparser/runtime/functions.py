"""Compiled function bodies: the unit of one body, interpreted closures, lazy generators, error notes.

`Unit` is one `FunctionSchema` compiled for one block and one program mode: CPython's argument
binding (fast path for plain positional calls), live reads of registered weights at each use, the run loop
that turns signals into a return value, and the lazy walk of a generator expression (one element per
`next`, free variables read late, as CPython does). `InterpretedFunction` is a closure, lambda or
comprehension helper of the schema, callable like the Python original. `rebind_wrapper` rebuilds a
forward's decorators around the schema. `annotate` adds one note per block to an exception passing
through (the instruction's text and the forward's file:line); `unbound_in` turns a frame-dict miss
into the UnboundLocalError/NameError CPython would raise.

Depends on the schema, `notation`, `argument_binding`, `unbound_reads` and `observer`.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any, Callable, Optional, TYPE_CHECKING

from ..schema.notation import instruction_text
from .argument_binding import binder, block_qualname
from .observer import ENGINE_FILES, RETURN, RETURN_SLOT, StepAbandoned
from .unbound_reads import unbound_error

if TYPE_CHECKING:  # pragma: no cover
    from .program import Program
from ..schema.model import ControlInstruction, FunctionSchema, Instruction, ModelBlockSchema, OpInstruction, VarRef

__all__ = ['InterpretedFunction', 'Unit', 'rebind_wrapper', 'rebindable', 'annotate', 'unbound_in', 'walk_lazy', 'is_element', 'holds_element', 'run_list', 'LAZY_RUN', 'LAZY_YIELD', 'LAZY_FOR', 'LAZY_IF']


_MISSING = object()




class InterpretedFunction:
    """A closure, lambda or comprehension helper of the schema, callable like the Python original."""

    __slots__ = ("program", "schema", "unit", "outer", "defaults", "__name__", "__qualname__")

    def __init__(self, program: "Program", schema: FunctionSchema, unit: "Unit", outer: dict, defaults: dict):
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

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        """Bind like a Python function: `fn.__get__(obj)` (or a class attribute read) is a bound method."""
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __repr__(self) -> str:
        return f"<interpreted function {self.schema.name}>"


def rebind_wrapper(fn: Callable, replacement: Callable) -> Optional[Callable]:
    """Rebuild decorator wrappers around `replacement` instead of the innermost function.

    Each `functools.wraps` level closes over the function it wraps; a copy of the wrapper whose cell
    holds `replacement` keeps the decorator's own behaviour. Returns None when a level does not
    close over the function it wraps.
    """
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        return replacement
    new_inner = rebind_wrapper(inner, replacement)
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
    return rebind_wrapper(fn, lambda *a, **k: None) is not None




class Unit:
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
        # What `self_name` is bound to: the module, or its class for a `@classmethod` forward.
        self.self_value = self.module
        if is_block and self.self_name is not None and self.module is not None:
            raw = inspect.getattr_static(type(self.module), block.method_name or "forward", None)
            if isinstance(raw, classmethod):
                self.self_value = type(self.module)
        self.weights = tuple(schema.weight_refs.items())
        module = self.module
        # Registered parameters/buffers are read from their dict directly (what Module.__getattr__
        # would return); anything else falls back to getattr at each call.
        self.direct_weights = all(
            attr in getattr(module, "_parameters", {}) or attr in getattr(module, "_buffers", {})
            for _, attr in self.weights) and not any(hasattr(type(module), attr) for _, attr in self.weights)
        self.label = f"{block.name}.{schema.name}" if is_block else schema.name
        self.qualname = qualname or (block_qualname(block, self.label) if is_block else schema.name)
        self._binder = binder(self.qualname, schema, self.params, self.self_name is not None)
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
            frame[self.self_name] = self.self_value
        return frame

    def weight_reader(self, refs: Any) -> Optional[Callable[[dict], None]]:
        """A `read(frame)` binding the weight refs among `refs` to the module's live values.

        Weights are read at each use, never cached at block entry: forward may reassign
        `self.b = ...` or call `register_buffer` (on a branch the example input never took), and
        every later read must see that, as `Module.__getattr__` would. Registered parameters and
        buffers are read from their dicts directly; anything else through getattr.
        """
        mapping = dict(self.weights)
        wanted = tuple((ref, mapping[ref]) for ref in dict.fromkeys(refs) if ref in mapping)
        if not wanted:
            return None
        module = self.module
        if not self.direct_weights:
            def read_attrs(f: dict) -> None:
                for ref, attr in wanted:
                    f[ref] = getattr(module, attr)

            return read_attrs
        params = module._parameters
        buffers = module._buffers
        if len(wanted) == 1:
            ((ref, attr),) = wanted

            def read_one(f: dict) -> None:
                value = params.get(attr, _MISSING)
                if value is _MISSING:
                    value = buffers[attr] if attr in buffers else getattr(module, attr)
                f[ref] = value

            return read_one

        def read_many(f: dict) -> None:
            for ref, attr in wanted:
                value = params.get(attr, _MISSING)
                if value is _MISSING:
                    value = buffers[attr] if attr in buffers else getattr(module, attr)
                f[ref] = value

        return read_many

    def _bind_general(self, args: tuple, kwargs: dict, defaults: dict) -> dict:
        return self._binder(args, kwargs, defaults)

    def generate(self, frame: dict, outer: dict) -> Any:
        """Start a generator expression: its first iterable is iterated now, the rest on demand."""
        frame[".0"] = iter(frame[".0"])
        return self._generator(frame, outer)

    def _generator(self, frame: dict, outer: dict) -> Any:
        _blk = self
        walker = walk_lazy(self.lazy, frame)
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
                unbound = unbound_in(exc, self)
                annotate(unbound or exc, self, sys._getframe(0))
                if unbound is None:
                    raise
                raise unbound from None
            except BaseException as exc:
                if not isinstance(exc, StepAbandoned):
                    annotate(exc, self, sys._getframe(0))
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
            unbound = unbound_in(exc, self)
            annotate(unbound or exc, self, sys._getframe(0))
            if unbound is None:
                raise
            raise unbound from None
        except BaseException as exc:
            if not isinstance(exc, StepAbandoned):
                annotate(exc, self, sys._getframe(0))
            raise


def annotate(exc: BaseException, unit: Unit, here: Any) -> None:
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
        if candidate is None and "_at" in local:  # a generated body: the instruction of the failing line
            candidate = local["_at"].get(tb.tb_lineno, (None,))[0]
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


def unbound_in(exc: KeyError, unit: Unit) -> Optional[BaseException]:
    return unbound_error(exc, ENGINE_FILES, unit.free_vars, unit.schema.name)


LAZY_RUN, LAZY_YIELD, LAZY_FOR, LAZY_IF = range(4)


def walk_lazy(steps: list, f: dict) -> Any:
    """Run the steps of a generator expression's helper, yielding each element instead of appending it."""
    for step in steps:
        kind = step[0]
        if kind == LAZY_RUN:
            if step[1](f) is not None:  # the helper's return: the elements are done
                return
        elif kind == LAZY_YIELD:
            args, _ = step[1](f)
            yield args[1]
        elif kind == LAZY_FOR:
            _, condition, cond_var, bind_var, body = step
            for fn in condition:
                fn(f)
            for item in f[cond_var]:
                f[bind_var] = item
                yield from walk_lazy(body, f)
        else:
            _, condition, cond_var, body, else_body = step
            for fn in condition:
                fn(f)
            yield from walk_lazy(body if f[cond_var] else else_body, f)


def is_element(instr: Instruction) -> bool:
    """The `$result.append(element)` the lowering emits at the heart of a comprehension helper."""
    return (isinstance(instr, OpInstruction) and instr.target is list.append and bool(instr.args)
            and instr.args[0] == VarRef("$result"))


def holds_element(instr: Instruction) -> bool:
    if is_element(instr):
        return True
    if isinstance(instr, ControlInstruction):
        return any(holds_element(i) for i in instr.body) or any(holds_element(i) for i in instr.else_body)
    return False


def run_list(fns: list, f: dict) -> Any:
    for fn in fns:
        signal = fn(f)
        if signal is not None:
            return signal
    return None
