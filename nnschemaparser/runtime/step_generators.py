"""A stepped run without a greenlet switch a step: the blocks of its program run as generators.

`GeneratorProgram` is a stepped program (`Program` with a `SteppingObserver`) whose block
functions also exist as Python generators, made from the same generated text (`codegen.recompile`)
with three changes: the report after each instruction becomes `yield` of its StepInfo (built by
`SteppingObserver.step`, the same slots as `after` fills), a call of a block's invoker or of
`call_value` becomes `yield from` the callee's generator, and the block's enter / exit / failure is
told around its body in the generator itself (what `observed_run` does around a plain function).
The consumer's `next()` resumes the chain of `yield from` (a few levels, tens of ns each) where a
greenlet run pays two switches a step (bench/bench_step_run.py).

What the generators cannot yield through is code that is not generated. Only code the program
hands a block to can call one: a forward's decorators, a module's hooks or its own `__call__` (the
block's invoker runs there), and, kept out of this path, blocks lent to live code (`lending`),
closures the schema makes and generator blocks (`generator_steps_possible`,
`GeneratorProgram.stays_generated`). So a library function or a C op is called in place, and a
block with code around it runs its regular invoker in a *worker* greenlet (pooled, one per level
of nesting): when that code calls the block's body (the `function` of the program's block units),
the worker switches the body to the chain, which runs it as a generator (steps yielded as above)
and switches its result back. A decorated block costs four switches a call, not two a step. A
`part` of a deeply nested statement and a live child (`call_live`) run in a worker too; a plain
function's step there pauses by switching its StepInfo to the chain, which yields it.

Kept for the greenlet run (`SchemaInterpreter._steps`): captures, other instruction listeners,
interventions, pauses before calls, the schemas and lent blocks above, and
`GENERATOR_STEPS = False`.

Depends on the schema, `program`, `codegen`, `functions`, `hooks`, `lending`, `instructions` and `stepping`.
"""

from __future__ import annotations

import ast
import types
import weakref
from typing import Any, Callable, Iterator, Optional

import greenlet
from torch import nn

from ..schema.errors import SchemaRunError
from ..schema.model import FunctionInstruction, ModelBlockSchema, YieldInstruction
from .codegen import recompile
from .functions import call_live
from .hooks import global_hooks_active
from .instructions import walk_instructions
from .lending import lent_values
from .program import Program
from .stepping import SteppingObserver

__all__ = ["GeneratorProgram", "GENERATOR_STEPS", "generator_steps_possible"]

# Whether step_run may take the generator path (tests set it False to compare with the greenlet run).
GENERATOR_STEPS = True

_Module = nn.Module
getcurrent = greenlet.getcurrent


def generator_steps_possible(root: ModelBlockSchema, cache: dict) -> bool:
    """Whether a stepped run of `root` can run as generators: the schema makes no function of its own
    (a closure, lambda or comprehension, which code outside the generated code may call back) and
    has no generator block (a `@contextmanager` method, iterated by code outside); the answer is
    kept in `cache`, the root's programs. (`GeneratorProgram.stays_generated` asks the rest.)"""
    known = cache.get("generator_steps")
    if known is None:
        known = cache["generator_steps"] = not any(
            isinstance(instr, (FunctionInstruction, YieldInstruction))
            for block in root.iter_blocks() for schema in _functions(block) for instr in walk_instructions(schema.body))
    return known


def _functions(block: ModelBlockSchema) -> Iterator[Any]:
    for owner in (block, *getattr(block, "methods", {}).values()):
        if owner.signature is not None:
            yield owner.signature


class _Worker(greenlet.greenlet):
    """A greenlet running foreign code for the chain: one call per switch in, its outcome switched out."""


class _Done:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Body:
    """A worker asks the chain to run a block's body (a generator function over `frame`)."""

    __slots__ = ("function", "frame")

    def __init__(self, function: Callable, frame: dict) -> None:
        self.function = function
        self.frame = frame


def _work(fn: Callable, args: tuple, kwargs: dict) -> None:
    while True:
        try:
            out: Any = _Done(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - raised again in the chain, where the call was made
            out = _Raised(exc)
        fn, args, kwargs = getcurrent().parent.switch(out)


def _worker(what: str) -> _Worker:
    """The worker greenlet running now; outside one, the run reached `what` from code it calls in place."""
    current = getcurrent()
    if type(current) is not _Worker:
        raise SchemaRunError(f"a stepped run of generators reached {what} from code it runs in place (a C "
                             "function calling it back); step this model with "
                             "nnschemaparser.runtime.step_generators.GENERATOR_STEPS = False")
    return current


def pause_in_worker(info: Any) -> None:
    """The stepper's `switch` in a run of generators: a plain function's step, in a worker, goes to
    the chain, which yields it."""
    _worker(f"the schema (step {getattr(info, 'step_index', '?')})").parent.switch(info)


def _now(value: Any) -> Iterator[Any]:
    """A generator returning `value` at once (a foreign call made in place)."""
    return value
    yield  # noqa: unreachable - makes this a generator


class GeneratorProgram(Program):
    """A stepped program whose blocks also run as generators (see the module docstring)."""

    def __init__(self, root: ModelBlockSchema, observer: SteppingObserver):
        self._invoker_names: dict = {}
        self._parts: set = set()
        super().__init__(root, observer)
        self.generators: dict[int, Callable] = {}
        self.bare: dict[int, Callable] = {}
        self.gen_invokers: dict[int, Callable] = {}
        self.workers: list = []

    # -- what the regular compile tells us ---------------------------------------------------------
    def lazy_invoker(self, block: ModelBlockSchema, env: dict, name: str) -> Callable:
        self._invoker_names[(id(env), name)] = weakref.ref(block)
        return super().lazy_invoker(block, env, name)

    def part(self, unit: Any, instrs: list) -> Callable[[dict], Any]:
        function = super().part(unit, instrs)
        self._parts.add(function)
        return function

    def unit(self, block: ModelBlockSchema) -> Any:
        unit = self.units.get(id(block))
        if unit is None:
            unit = super().unit(block)
            # foreign code that calls the block (its decorators, hooks, `__call__`) reaches this:
            # the body goes to the chain
            unit.function = self._bounce(block)
        return unit

    def _bounce(self, block: ModelBlockSchema) -> Callable[[dict], Any]:
        block_ref = weakref.ref(block)

        def body(frame: dict) -> Any:
            worker = _worker(repr(block.path or block.name))
            return worker.parent.switch(_Body(self.generator(block_ref(), bare=True), frame))

        return body

    # -- the generator of a block ------------------------------------------------------------------
    def generator(self, block: ModelBlockSchema, bare: bool = False) -> Callable[[dict], Any]:
        """`block`'s generator function over its frame (`bare`: without telling its enter and exit)."""
        cache = self.bare if bare else self.generators
        function = cache.get(id(block))
        if function is None:
            generated = self.unit(block).generated
            env = generated.function.__globals__
            rewrite = _Rewrite(self, env, None if bare else weakref.ref(block))
            # blocks of one source (a model's layers) share the rewritten code: what the rewrite decides
            # rests on the text and on what each global name of it is (`_Rewrite._kind`)
            key = (generated.source, generated.filename, generated.positions, bare,
                   tuple(map(rewrite._kind, generated.function.__code__.co_names)))
            made = _GENERATOR_CODE.get(key)
            if made is None:
                function = recompile(generated, env, generated.function.__name__, rewrite.module)
                if len(_GENERATOR_CODE) >= _GENERATOR_CODE_LIMIT:
                    _GENERATOR_CODE.clear()
                _GENERATOR_CODE[key] = (function.__code__, tuple(rewrite.invokers))
            else:
                code, invokers = made
                rewrite.bind(invokers)
                function = types.FunctionType(code, env, generated.function.__name__)
                function.__qualname__ = generated.function.__qualname__
            cache[id(block)] = function
        return function

    def gen_invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        """`invoke(args, kwargs)` -> a generator running `block` as `module(*args, **kwargs)` would."""
        invoke = self.gen_invokers.get(id(block))
        if invoke is not None:
            return invoke
        module = block.module
        regular = self.invoker(block)
        in_worker = self.in_worker
        if (block.skip_reason is not None or module is None or block.self_attr is not None
                or block.method_name is not None or block.wrapper is not None
                or type(module).__call__ is not _Module.__call__ or block.instance_forward is not None
                or (self.elsewhere is not None and self.elsewhere(block) is not None)):
            def invoke(args: Any, kwargs: dict) -> Any:  # through the regular invoker, bodies bounced
                return in_worker(regular, (args, kwargs), {})
        else:
            unit = self.unit(block)
            function = self.generator(block)
            bind = unit.bind  # the call's frame, as a plain run binds it (program.py)

            def invoke(args: Any, kwargs: dict) -> Any:
                if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                        or module._backward_pre_hooks or global_hooks_active() or "forward" in module.__dict__):
                    return in_worker(regular, (args, kwargs), {})
                return function(bind(args, kwargs))
        self.gen_invokers[id(block)] = invoke
        return invoke

    def lazy_gen_invoker(self, block_ref: Any, env: dict, name: str) -> Callable[[Any, dict], Any]:
        def first_call(args: Any, kwargs: dict) -> Any:
            invoke = env[name] = self.gen_invoker(block_ref())
            return invoke(args, kwargs)
        return first_call

    def gen_call_value(self, target: Any, args: Any, kwargs: dict) -> Any:
        """`call_value` as a generator: a module with a block here runs its block's generator."""
        if isinstance(target, _Module):
            block = self.block_of(target)
            if block is not None:
                return self.gen_invoker(block)(args, kwargs)
        return _now(target(*args, **kwargs))  # what it calls reaches no block (`stays_generated`)

    def stays_generated(self) -> bool:
        """Whether nothing but the generated code can call the schema in this program's runs: no
        block is lent to live code (`lending`), so a library function, a module's real forward or
        a hook called in place reaches no block; what the program itself hands to code outside
        (a block's invoker, to its decorators, hooks or `__call__`) runs in a worker."""
        if self._lent is None:
            self._lent = lent_values(self)
        return not self._lent

    def in_worker(self, fn: Callable, args: Any, kwargs: dict) -> Iterator[Any]:
        """Call `fn(*args, **kwargs)` in a worker greenlet: a generator yielding the steps made in it
        (a block's body it calls back runs in the chain) and returning what the call returns."""
        pool = self.workers
        worker = pool.pop() if pool else _Worker(_work)
        worker.parent = getcurrent()
        out = worker.switch(fn, args, kwargs)
        while True:
            kind = type(out)
            if kind is _Done:
                pool.append(worker)
                return out.value
            if kind is _Raised:
                pool.append(worker)
                raise out.error
            try:
                result = (yield from out.function(out.frame)) if kind is _Body else (yield out)
            except BaseException as exc:  # noqa: BLE001 - the worker's code handles it (or it comes back)
                try:
                    worker.parent = getcurrent()
                except ValueError:  # dropped on another thread: the worker's frames go with its thread
                    raise exc from None
                out = worker.throw(exc)
            else:
                worker.parent = getcurrent()
                out = worker.switch(result)

    # -- the run -------------------------------------------------------------------------------------
    def steps(self, scope: dict, outcome: list) -> Iterator[Any]:
        """The stepped run of the root with `scope`: yields its steps; what forward returns is
        appended to `outcome` (a `for` over the steps, the cheapest loop, drops a return value)."""
        root = self.root
        args, kwargs = self.root_arguments(scope)
        if root.skip_reason is not None or root.signature is None:
            outcome.append((yield from self.in_worker(self.call_block, (root, args, kwargs), {})))
        elif self._lent or self._lent is None:
            with self.lending():
                outcome.append((yield from self.gen_invoker(root)(args, kwargs)))
        else:
            outcome.append((yield from self.gen_invoker(root)(args, kwargs)))


# Names the rewritten code reads, put in each function's globals next to the originals.
_STEP, _ENTER, _LEAVE, _FAIL, _BLOCK = "_nsp_step", "_nsp_enter", "_nsp_leave", "_nsp_fail", "_nsp_block"
# rewritten code objects by (text, file, positions, bare, the kinds of its global names): the envs differ
_GENERATOR_CODE: dict = {}
_GENERATOR_CODE_LIMIT = 4096
_CALL_VALUE, _FOREIGN = "_nsp_call_value", "_nsp_foreign"
_LOCAL_STEP, _LOCAL_RESULT, _LOCAL_ERROR = "_nsp_s", "_nsp_r", "_nsp_e"


def _name(text: str) -> ast.Name:
    return ast.Name(text, ast.Load())


class _Rewrite(ast.NodeTransformer):
    """A block's generated function made a generator (see the module docstring)."""

    def __init__(self, program: GeneratorProgram, env: dict, block_ref: Optional[Any]):
        self.program = program
        self.env = env
        self.block_ref = block_ref
        observer = program.observer
        self.after = observer.after
        env[_STEP] = observer.step
        env[_CALL_VALUE] = program.gen_call_value
        env[_FOREIGN] = program.in_worker
        self.invokers: list[str] = []  # the generated names of the blocks it calls (`bind` makes them)
        if block_ref is not None:
            self._bind_observe()

    def bind(self, invokers: tuple) -> None:
        """Put into this env what the code rewritten for another block of the same text reads."""
        env, program = self.env, self.program
        for name in invokers:
            gen_name = "_nsp_gen" + name
            if gen_name not in env:
                env[gen_name] = program.lazy_gen_invoker(program._invoker_names[(id(env), name)], env, gen_name)

    def _bind_observe(self) -> None:
        """What the code `_observe` writes reads: the block and the observer's block events."""
        self.env[_BLOCK] = self.block_ref
        observer = self.program.observer
        self.env[_ENTER], self.env[_LEAVE], self.env[_FAIL] = observer.enter_block, observer.exit_block, \
            observer.fail_block

    def module(self, tree: ast.Module) -> ast.Module:
        function = tree.body[0]
        function.body = [stmt for node in function.body for stmt in _as_list(self.visit(node))]
        if self.block_ref is not None:
            self._observe(function)
        return tree

    def _kind(self, name: str) -> str:
        env = self.env
        if (id(env), name) in self.program._invoker_names:
            return "invoke"
        value = env.get(name)
        if value is None:
            return ""
        if type(value) is types.MethodType:
            if value.__self__ is self.program.observer and value.__func__ is type(value.__self__).after:
                return "after"
            if value.__self__ is self.program and value.__func__ is Program.call_value:
                return "call_value"
        if value is call_live or (type(value) is types.FunctionType and value in self.program._parts):
            return "foreign"
        return ""

    # nested scopes cannot yield for the function: left as they are
    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_FunctionDef = visit_Lambda

    def visit_Expr(self, node: ast.Expr) -> Any:
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and self._kind(call.func.id) == "after":
            call.func = ast.copy_location(_name(_STEP), call.func)
            step = ast.Name(_LOCAL_STEP, ast.Store())
            assign = ast.copy_location(ast.Assign([step], call), node)
            test = ast.Compare(_name(_LOCAL_STEP), [ast.IsNot()], [ast.Constant(None)])
            pause = ast.Expr(ast.Yield(_name(_LOCAL_STEP)))
            return [assign, ast.copy_location(ast.If(test, [ast.copy_location(pause, node)], []), node)]
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Name):
            kind = self._kind(func.id)
            if kind == "invoke":
                name = "_nsp_gen" + func.id
                self.invokers.append(func.id)
                self.bind((func.id,))
                node.func = ast.copy_location(_name(name), func)
                return ast.copy_location(ast.YieldFrom(node), node)
            if kind == "call_value":
                node.func = ast.copy_location(_name(_CALL_VALUE), func)
                return ast.copy_location(ast.YieldFrom(node), node)
            if kind == "foreign":
                return ast.copy_location(ast.YieldFrom(ast.Call(_name(_FOREIGN), [func, ast.Tuple(node.args, ast.Load()),
                                                                                  _keywords(node.keywords)], [])), node)
        return node  # called in place: C code or a library's, which reaches no block (`stays_generated`)

    def _observe(self, function: ast.FunctionDef) -> None:
        """Tell the block's enter first, its exit at each return, its failure on an error."""
        block = ast.Call(_name(_BLOCK), [], [])

        class Returns(ast.NodeTransformer):
            def visit_Return(self, node: ast.Return) -> Any:
                value = node.value or ast.Constant(None)
                result = ast.Name(_LOCAL_RESULT, ast.Store())
                leave = ast.Expr(ast.Call(_name(_LEAVE), [block, _name("f"), _name(_LOCAL_RESULT)], []))
                return [ast.copy_location(ast.Assign([result], value), node), ast.copy_location(leave, node),
                        ast.copy_location(ast.Return(_name(_LOCAL_RESULT)), node)]

            def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
                return node

            visit_Lambda = visit_FunctionDef

        body = [stmt for node in function.body for stmt in _as_list(Returns().visit(node))]
        first = function.body[0]
        enter = ast.copy_location(ast.Expr(ast.Call(_name(_ENTER), [block, _name("f")], [])), first)
        fail = ast.Expr(ast.Call(_name(_FAIL), [block, _name("f"), _name(_LOCAL_ERROR)], []))
        handler = ast.ExceptHandler(_name("BaseException"), _LOCAL_ERROR, [fail, ast.Raise()])
        function.body = [enter, ast.copy_location(ast.Try(body, [handler], [], []), first)]


def _keywords(keywords: list) -> ast.AST:
    """`{'a': x, **k}` for a call's keywords."""
    return ast.Dict([ast.Constant(k.arg) if k.arg is not None else None for k in keywords],
                    [k.value for k in keywords])


def _as_list(node: Any) -> list:
    return node if isinstance(node, list) else [node]
