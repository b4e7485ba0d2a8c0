"""Prototype (not the package): a stepped run whose generated functions are generators, measured
against step_run on the tiny Llama. See the module docstring of bench_step_run.py for the method.

    PYTHONPATH=. python bench/proto_step_generators.py [--rounds N] [--layers N]

The stepped program's generated source of each block is rewritten with `ast`: each
`_after(_sites, i, f, value)` becomes `_s = _after(...)` / `if _s is not None: yield _s` (the
step goes to the consumer by `yield`, no greenlet switch), and each call of a block's invoker or
of `call_value` becomes `(yield from ...)` of a generator invoker. A forward with decorators
(transformers' `can_return_tuple`, `check_model_inputs`, ...: the root, each decoder layer and
attention of the Llama) runs its decorator code in a greenlet of its own; the decorator's call of
the forward switches back once to the generator chain, which runs the body as a generator and
switches the result back in: four switches per decorated call, none per step ("bounce").

Only what the Llama reaches is handled (no hooks, no closures called back, no parts); a step on a
path the prototype does not handle fails loudly (the stepper's switch raises).
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time
import weakref
from pathlib import Path

import greenlet
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from models import tiny_llama  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402
from nnschemaparser.runtime.binding import entry_signature, root_call  # noqa: E402
from nnschemaparser.runtime.functions import rebind_wrapper  # noqa: E402
from nnschemaparser.runtime.program import Program  # noqa: E402
from nnschemaparser.runtime.stepping import Stepper, SteppingObserver, StepInfo  # noqa: E402

_new = object.__new__
_Module = torch.nn.Module


class GenObserver(SteppingObserver):
    """`after` returns the step instead of switching to the consumer."""

    def after(self, sites, site, frame, value):  # type: ignore[override]
        stepper = self._stepper
        if self.conditions:
            return None
        stepper.index = index = stepper.index + 1
        frames = self._frames_tuple
        if frames is None:
            frames = self.frames_tuple()
        info = _new(StepInfo)
        info.step_index = index
        info.value = value
        info.scope_frames = frames
        info._sites = sites
        info._site = site
        info.block_path = self.path
        info._run = stepper
        if stepper.edits:
            for edit in stepper.edits.get(index, ()):
                info.edit(**edit)
        return info


class _Request:
    __slots__ = ("block", "args", "kwargs")

    def __init__(self, block, args, kwargs):
        self.block, self.args, self.kwargs = block, args, kwargs


getcurrent = greenlet.getcurrent


class _Done:
    __slots__ = ("value",)


class _Raised:
    __slots__ = ("error",)


def _bounce_back(module, *args, **kwargs):
    """The decorators' call of the forward, in a worker greenlet: the generator chain runs the body."""
    return getcurrent().parent.switch(_Request(None, args, kwargs))


def _worker(runner, args, kwargs):
    """A pooled greenlet running decorator code: one call per switch in, its outcome switched out."""
    while True:
        try:
            out = _Done()
            out.value = runner(*args, **kwargs)
        except BaseException as exc:  # handed to the chain, which raises it there
            out = _Raised()
            out.error = exc
        runner, args, kwargs = getcurrent().parent.switch(out)


class _Lazy:
    """Stands for an invoker while it is being built (a block whose body calls itself)."""

    def __init__(self, program, block):
        self.target = None

    def __call__(self, args, kwargs):
        return self.target(args, kwargs)


def _now(value):
    """A generator that returns `value` at once (a call_value of something that is not a block)."""
    return value
    yield


class GenProgram(Program):
    def __init__(self, root):
        self.invoker_blocks: dict = {}
        super().__init__(root, GenObserver())
        self.gen_units: dict = {}
        self.gen_invokers: dict = {}
        self.workers: list = []

    def lazy_invoker(self, block, env, name):
        self.invoker_blocks[(id(env), name)] = weakref.ref(block)
        return super().lazy_invoker(block, env, name)

    # -- the generator variant of a unit ---------------------------------------------------------
    def gen_function(self, block):
        fn = self.gen_units.get(id(block))
        if fn is not None:
            return fn
        unit = self.unit(block)
        env = unit.function.__globals__
        names = {}
        for name, value in env.items():
            if (id(env), name) in self.invoker_blocks:
                names[name] = ("invoke", self.invoker_blocks[(id(env), name)]())
            elif getattr(value, "__self__", None) is self and getattr(value, "__func__", None) is Program.call_value:
                names[name] = ("call_value", None)
            elif getattr(value, "__self__", None) is self.observer and getattr(value, "__name__", "") == "after":
                names[name] = ("after", None)
        tree = ast.parse(unit.source)
        tree = _Rewrite(names).visit(tree)
        _observe(tree.body[0])
        ast.fix_missing_locations(tree)
        genv = dict(env)
        genv["_blk"] = block
        genv["_enter"], genv["_leave"], genv["_fail"] = (self.observer.enter_block, self.observer.exit_block,
                                                         self.observer.fail_block)
        for name, (kind, block_) in names.items():
            if kind == "invoke":
                genv[name] = self.gen_invoker(block_)
            elif kind == "call_value":
                genv[name] = self.gen_call_value
            else:
                genv[name] = self.observer.after
        code = compile(tree, f"<gen {unit.label}>", "exec")
        local: dict = {}
        exec(code, genv, local)
        fn = self.gen_units[id(block)] = next(iter(local.values()))
        return fn

    def gen_body(self, block):
        """`body(args, kwargs)`: a generator running `block`'s generated generator as its call, observed."""
        unit = self.unit(block)
        fn = self.gen_function(block)
        observer = self.observer
        enter, leave, fail = observer.enter_block, observer.exit_block, observer.fail_block
        params, simple, count = unit.params, unit.simple, len(unit.params)
        defaults, general, self_name, self_value = unit.schema.defaults, unit.binder, unit.self_name, unit.self_value
        module = block.module

        def body(args, kwargs):
            if module._forward_hooks or module._forward_pre_hooks:
                raise RuntimeError("prototype: hooks are not handled")
            if simple and not kwargs and len(args) == count:
                frame = dict(zip(params, args))
            else:
                frame = general(args, kwargs, defaults)
            if self_name is not None:
                frame[self_name] = self_value
            return fn(frame)
        return body

    def gen_invoker(self, block):
        invoke = self.gen_invokers.get(id(block))
        if invoke is not None:
            return invoke
        module = block.module
        assert block.skip_reason is None and block.self_attr is None and block.method_name is None
        assert type(module).__call__ is _Module.__call__ and block.instance_forward is None
        self.gen_invokers[id(block)] = invoke = placeholder = _Lazy(self, block)
        body = self.gen_body(block)
        if block.wrapper is None:
            invoke = body
        else:
            runner = rebind_wrapper(block.wrapper, _bounce_back)
            pool = self.workers

            def invoke(args, kwargs):
                worker = pool.pop() if pool else greenlet.greenlet(_worker)
                worker.parent = getcurrent()
                out = worker.switch(runner, (module, *args), kwargs)
                while type(out) is _Request:
                    try:
                        result = yield from body(out.args, out.kwargs)
                    except BaseException as exc:
                        worker.parent = getcurrent()
                        out = worker.throw(exc)
                    else:
                        worker.parent = getcurrent()
                        out = worker.switch(result)
                pool.append(worker)
                if type(out) is _Raised:
                    raise out.error
                return out.value
        placeholder.target = invoke
        self.gen_invokers[id(block)] = invoke
        return invoke

    def gen_call_value(self, target, args, kwargs):
        if isinstance(target, _Module):
            block = self.block_of(target)
            if block is not None:
                return self.gen_invoker(block)(args, kwargs)
        return _now(target(*args, **kwargs))

    def gen_root(self, scope):
        root = self.root
        args, kwargs = root_call(entry_signature(root.module, root.signature), scope, root.name)
        with self.lending():
            return (yield from self.gen_invoker(root)(args, kwargs))


class _Rewrite(ast.NodeTransformer):
    def __init__(self, names):
        self.names = names

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and self.names.get(node.func.id, ("",))[0] in ("invoke", "call_value"):
            return ast.Yield(value=node) if TRAMPOLINE else ast.YieldFrom(value=node)
        return node

    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
                self.names.get(call.func.id, ("",))[0] == "after":
            return [ast.Assign(targets=[ast.Name("_s", ast.Store())], value=call),
                    ast.If(test=ast.Compare(ast.Name("_s", ast.Load()), [ast.IsNot()], [ast.Constant(None)]),
                           body=[ast.Expr(ast.Yield(ast.Name("_s", ast.Load())))], orelse=[])]
        self.generic_visit(node)
        return node


TRAMPOLINE = False


def trampoline(gen):
    """Run `gen` and the generators it yields (calls) on an explicit stack; yield the steps."""
    stack = []
    append, pop = stack.append, stack.pop
    current = gen
    send = current.send
    value = None
    error = None
    while True:
        try:
            item = send(value) if error is None else current.throw(error)
        except StopIteration as stop:
            if not stack:
                return stop.value
            current = pop()
            send = current.send
            value, error = stop.value, None
            continue
        except BaseException as exc:
            if not stack:
                raise
            current = pop()
            send = current.send
            value, error = None, exc
            continue
        error = None
        if type(item) is StepInfo:
            value = None
            yield item
        else:
            append(current)
            current = item
            send = current.send
            value = None


def _observe(fn_def):
    """`_enter(_blk, f)` first, `_leave(_blk, f, value)` at each return, `_fail(_blk, f, error)` on an error."""
    class Returns(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            return node  # a nested def keeps its returns

        def visit_Return(self, node):
            value = node.value or ast.Constant(None)
            return [ast.Assign([ast.Name("_r", ast.Store())], value),
                    ast.Expr(ast.Call(ast.Name("_leave", ast.Load()), [ast.Name("_blk", ast.Load()),
                                      ast.Name("f", ast.Load()), ast.Name("_r", ast.Load())], [])),
                    ast.Return(ast.Name("_r", ast.Load()))]
    body = [Returns().visit(stmt) for stmt in fn_def.body]
    flat = []
    for stmt in body:
        flat.extend(stmt if isinstance(stmt, list) else [stmt])
    enter = ast.parse("_enter(_blk, f)").body
    handler = ast.parse("try:\n    pass\nexcept BaseException as _exc:\n    _fail(_blk, f, _exc)\n    raise").body[0]
    handler.body = flat
    fn_def.body = enter + [handler]


def gen_step_run(program, scope, edits=None):
    stepper = Stepper(edits)

    def refuse(info):
        raise RuntimeError("prototype: a step reached the greenlet path")
    stepper.switch = refuse
    program.observer.configure([stepper])
    program.observer.reset()
    try:
        if TRAMPOLINE:
            return (yield from trampoline(program.gen_root(scope)))
        return (yield from program.gen_root(scope))
    finally:
        stepper.ended = True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--trampoline", action="store_true")
    args = parser.parse_args()
    global TRAMPOLINE
    TRAMPOLINE = args.trampoline
    torch.set_num_threads(1)
    model, inputs = tiny_llama(layers=args.layers)
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    program = GenProgram(schema)
    interp = SchemaInterpreter()
    with torch.no_grad():
        old = list(interp.step_run(schema, dict(inputs)))
        old_out = interp.step_outputs
        gen = gen_step_run(program, dict(inputs))
        new = []
        try:
            while True:
                new.append(next(gen))
        except StopIteration as stop:
            new_out = stop.value
    assert len(old) == len(new), (len(old), len(new))
    for a, b in zip(old, new):
        assert (a.step_index, a.block_path, a.instruction, a.frame_depth) == \
            (b.step_index, b.block_path, b.instruction, b.frame_depth), (a, b)
        if isinstance(a.value, torch.Tensor):
            assert torch.equal(a.value, b.value), a.step_index
    assert torch.equal(old_out[0].last_hidden_state, new_out.last_hidden_state)
    print(f"{len(new)} steps identical (index, block path, instruction, depth, values torch.equal)")

    def gen_run():
        for _ in gen_step_run(program, dict(inputs)):
            pass

    def step_run():
        for _ in interp.step_run(schema, dict(inputs)):
            pass
    candidates = {"eager": lambda: model(**inputs), "step_run": step_run, "generator prototype": gen_run}
    load = os.getloadavg()[0]
    with torch.no_grad():
        for fn in candidates.values():
            fn()
        samples: dict = {k: [] for k in candidates}
        for _ in range(args.rounds):
            for key, fn in candidates.items():
                start = time.thread_time()
                for _ in range(3):
                    fn()
                samples[key].append((time.thread_time() - start) / 3)
    print(f"{len(new)} steps, {args.rounds} rounds, load {load:.2f} before / {os.getloadavg()[0]:.2f} after")
    for key, times in samples.items():
        ratios = [t / e for t, e in zip(times, samples["eager"])]
        print(f"  {key:22s} {statistics.median(times) * 1e3:7.2f} ms {statistics.median(ratios):6.3f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
