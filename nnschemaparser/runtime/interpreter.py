"""SchemaInterpreter: the public drivers of the runtime — plain runs, observed runs and stepping.

`run` and `call` execute a schema with the plain compiled program when there is nothing to observe,
and with an observed program otherwise. `step_run` runs the observed program inside a greenlet and
pauses it after each leaf instruction, yielding a `StepInfo` (not on the instructions of an `if` test
or of a `while` re-evaluation, as spec 000 says; traces still record those); edits apply to the paused frames and
are reported to the listeners (`TraceListener.on_edit`). With `pause_before_calls=True` it also
pauses before each sub-block call, yielding a `CallPause` (the callee, the call site, its
arguments): a pause is not a step, so step indices (edits, forks, traces) are the same with or
without them. The execution rules are the code generator's, written once; this module only drives them.

Observed programs are compiled once per schema and lent to one run at a time, with that run's
listeners plugged into their observer; a one-call capture therefore costs no compilation.

`interventions=` of `run`, `call` and `step_run` adds the listener of `runtime/interventions.py`,
which writes new values into frames with `apply_edit`, as edits do.

What a stepped run yields and the listener that pauses it live in `stepping`; this module runs
the greenlet and the generator around them.

Depends on `program`, `binding`, `listeners`, `stepping`, `interventions` and the schema.
"""

from __future__ import annotations

import threading
from typing import Any, Generator, Optional, Sequence

import greenlet

from .binding import live_signature
from .interventions import InterventionListener, intervention_listener
from .partial import give_back_partial, partial_programs
from . import step_generators
from .program import Program, programs_for
from .step_generators import GeneratorProgram, generator_steps_possible, pause_in_worker
from ..schema.errors import EditError, SchemaRunError
from .listeners import EventObserver, StepAbandoned, Observer, TraceListener
from .stepping import CallPause, StepInfo, Stepper, SteppingObserver, apply_edit, checked_edits
from ..schema.model import ModelBlockSchema

__all__ = ["SchemaInterpreter", "StepInfo", "CallPause", "apply_edit", "outputs_list", "source_code"]

def _programs(block: ModelBlockSchema) -> dict:
    """The compiled programs of the schema `block` (they live and die with it: `programs_for`)."""
    return programs_for(block)


def _plain_program(block: ModelBlockSchema) -> Program:
    cache = _programs(block)
    program = cache["plain"]
    if program is None:
        program = cache["plain"] = Program(block)
    return program


def outputs_list(result: Any) -> list:
    """The spec's `outputs`: a tuple result as a list of its items, anything else as a one-item list."""
    return list(result) if isinstance(result, tuple) else [result]


def _check_scope(scope: Any) -> None:
    if not isinstance(scope, dict):
        raise SchemaRunError(f"scope must be a dict of input name -> value, got {type(scope).__name__}")


def _check_block(block: Any) -> None:
    if not isinstance(block, ModelBlockSchema):
        raise SchemaRunError(f"block must be a ModelBlockSchema (from NNParser.parse_model), got {type(block).__name__}")
    # A sub-module replaced after parsing (`model.fc2 = nn.Linear(...)`, a LoRA or quantisation
    # wrapper) needs no check here: every static child call reads the live child and runs the one
    # the model holds now (program.Program.static_call), as eager does.



class SchemaInterpreter:
    """Runs a schema by re-dispatching every instruction to the real torch callables.

    `capture_values=True` fills each executed instruction's `resolved` with a detached snapshot;
    `listeners` receive events (TraceRecorder, ActivationRecorder, your own TraceListener).
    """

    def __init__(self, capture_values: bool = False, listeners: Optional[Sequence[TraceListener]] = None,
                 observe: Optional[frozenset] = None):
        self.capture_values = capture_values
        self.listeners = list(listeners or [])
        self.step_outputs: Optional[list] = None
        # `observe`: ids of the blocks whose runs the listeners see (the root always); the others
        # run plain code that counts their tensor results (runtime/partial.py). None: all of them.
        if observe is not None and not isinstance(observe, frozenset):
            raise SchemaRunError(f"observe must be a frozenset of block ids or None, got {type(observe).__name__}")
        self.observe = observe

    def _execute(self, block: ModelBlockSchema, scope: dict, call: Optional[tuple] = None,
                 interventions: Any = None) -> Any:
        """Run with `scope`, or, with `call=(args, kwargs)`, as that call (`scope` then names them)."""
        _check_block(block)
        _check_scope(scope)
        listeners, observe = self.listeners, self.observe
        intervening = None
        if interventions is not None:
            intervening = intervention_listener(block, interventions, listeners)
            # the run's own listeners decide what they need; the interventions add the blocks they can touch
            wanted = observe if listeners or self.capture_values else frozenset()
            observe = None if wanted is None or intervening.observe is None else wanted | intervening.observe
            listeners = [*listeners, intervening]
        if not listeners and not self.capture_values:
            program = _plain_program(block)
            return program.run_root(scope) if call is None else program.call_root(*call)
        if observe is not None and _tensor_results(listeners, self.capture_values):
            result = self._execute_partly(block, scope, call, listeners, observe)
        else:
            program, observer = _borrow(block, listeners, self.capture_values)
            try:
                for listener in listeners:
                    listener.on_run_start(block, scope)
                result = program.run_root(scope) if call is None else program.call_root(*call)
                for listener in listeners:
                    listener.on_run_end(result)
            finally:
                _give_back(block, program, observer)
        if intervening is not None:
            intervening.finish()
        return result

    def _execute_partly(self, block: ModelBlockSchema, scope: dict, call: Optional[tuple],
                        listeners: Sequence[TraceListener], observe: frozenset) -> Any:
        """`_execute` observing only the blocks of `observe` (and the root)."""
        pair = partial_programs(block, observe | {id(block)})
        try:
            pair.observer.configure(listeners)
            hooks = [hook for hook in (listener.unobserved_call_hook() for listener in listeners)
                     if hook is not None]
            if hooks:
                pair.counted.watch = hooks[0] if len(hooks) == 1 else lambda module: [hook(module) for hook in hooks]
            for listener in listeners:
                listener.on_unobserved_counter(pair.counter)
                listener.on_run_start(block, scope)
            program = pair.observed
            result = program.run_root(scope) if call is None else program.call_root(*call)
            for listener in listeners:
                listener.on_run_end(result)
        finally:
            give_back_partial(pair)
        return result

    def run(self, block: ModelBlockSchema, scope: dict, interventions: Any = None) -> list:
        """Run `block` with inputs `scope` ({name: value}); returns the outputs as a list.

        The inputs are passed as `model(x, ...)` would get them: positionally in the signature's
        order while each is given, the rest by keyword. A forward's `*args` extras are given under
        its name as a tuple or list (`{"x": x, "args": (y, z)}` runs `model(x, y, z)`); names
        forward does not have go to its `**kwargs`.

        `interventions` ({selector: fn or tensor}, traces/interventions.py) replaces the values
        the selectors name before the rest of the forward reads them; None runs the plain program.
        """
        return outputs_list(self._execute(block, scope, interventions=interventions))

    def call(self, block: ModelBlockSchema, *args: Any, interventions: Any = None, **kwargs: Any) -> Any:
        """Run `block` like `module(*args, **kwargs)`, with the arguments passed exactly as given
        (positional extras go to forward's `*args`); returns exactly what forward returns.
        `interventions` is `run`'s, read by `call` itself (never passed to forward)."""
        _check_block(block)
        sig = block.signature
        if sig is None and block.module is not None:
            sig = live_signature(block.module.forward)
        names = list(sig.params) if sig is not None else []
        if len(args) > len(names) and (sig is None or sig.vararg is None):
            raise SchemaRunError(f"{block.name}.forward takes {len(names)} positional inputs, got {len(args)}")
        twice = [name for name in names[:len(args)] if name in kwargs]
        if twice:
            raise SchemaRunError(f"{block.name}.forward got {twice[0]!r} both positionally and by keyword")
        scope = {**dict(zip(names, args)), **kwargs}  # what listeners are told the inputs are
        if len(args) > len(names):
            scope[sig.vararg] = tuple(args[len(names):])
        return self._execute(block, scope, (args, kwargs), interventions)

    def step_run(self, block: ModelBlockSchema, scope: dict, edits: Optional[dict[int, list[dict]]] = None,
                 pause_before_calls: bool = False, interventions: Any = None) -> Generator[StepInfo, None, list]:
        """Yield one StepInfo per executed instruction; return (and store in step_outputs) the outputs.

        `pause_before_calls=True` also yields a `CallPause` before each sub-block call (a child's
        forward, a method schema, a module value with a block): not a step, so the StepInfo
        indices are the same as without it.

        The instructions of an `if` test, and of a `while` test after its first evaluation, are not
        steps (condition expressions of if/while re-evaluations are not stepped); captures and
        traces of the same run still record them.

        `edits` maps a step_index to edit keyword dicts applied when that step is reached, so a run
        can be forked from a previous one at a given step. Bad arguments raise here, before the
        first step. Closing or dropping the generator early unwinds the paused run.

        `interventions` is `run`'s: a step shows the value an intervention made (applied before
        the step's `edits`). Every block is observed in a stepped run.
        """
        _check_block(block)
        _check_scope(scope)
        if edits is not None:
            edits = checked_edits(edits)
        intervening = intervention_listener(block, interventions, self.listeners) if interventions is not None else None
        self.step_outputs = None
        return self._steps(block, scope, edits, bool(pause_before_calls), intervening)

    def _steps(self, block: ModelBlockSchema, scope: dict, edits: Optional[dict[int, list[dict]]],
               pause_before_calls: bool = False,
               intervening: Optional[InterventionListener] = None) -> Generator[StepInfo, None, list]:
        """The steps of a run: a chain of generators where it can be (runtime/step_generators.py),
        else a run in a greenlet that switches to the consumer at each step."""
        if step_generators.GENERATOR_STEPS and not pause_before_calls and intervening is None and \
                not self.capture_values and generator_steps_possible(block, _programs(block)):
            return self._generator_steps(block, scope, edits)
        return self._greenlet_steps(block, scope, edits, pause_before_calls, intervening)

    def _greenlet_steps(self, block: ModelBlockSchema, scope: dict, edits: Optional[dict[int, list[dict]]],
                        pause_before_calls: bool = False,
                        intervening: Optional[InterventionListener] = None) -> Generator[StepInfo, None, list]:
        stepper = Stepper(edits, self.listeners, pause_before_calls)
        listeners = [*self.listeners, stepper]
        if intervening is not None:  # before the stepper, so a step shows the new value
            intervening.step_of = lambda: stepper.index + 1
            listeners.insert(-1, intervening)
        program, observer = _borrow(block, listeners, self.capture_values, pause_before_calls, stepping=True)
        outcome: list = []

        def run() -> object:
            outcome.append(program.run_root(scope))
            return _FINISHED

        runner = greenlet.greenlet(run)
        owner = threading.get_ident()
        finished = False
        try:
            for listener in listeners[:-1]:  # the stepper needs no start
                listener.on_run_start(block, scope)
            current_greenlet = greenlet.getcurrent
            consumer = current_greenlet()
            stepper.attach(consumer)
            resume = runner.switch
            item = resume()
            # Once per step: the loop is written for that (two calls: which greenlet, and the switch).
            while item is not _FINISHED:
                yield item
                current = current_greenlet()
                if current is not consumer:  # resumed from another greenlet than the last time
                    if threading.get_ident() != owner:
                        raise SchemaRunError("a stepped run can only be advanced from the thread that started it; "
                                             "call next() on it from that thread (or start a step_run per thread)")
                    consumer = current
                    stepper.attach(current)
                    _adopt(runner)
                item = resume()
            item = outcome[0]
            finished = True
        finally:
            stepper.ended = True
            if not finished and not runner.dead and threading.get_ident() == owner:
                try:
                    _adopt(runner)
                    runner.throw(StepAbandoned())
                except StepAbandoned:
                    pass
            if runner.dead:
                _give_back(block, program, observer, pause_before_calls, stepping=True)
        return self._finish(listeners, stepper, item, intervening)

    def _finish(self, listeners: list, stepper: Stepper, item: Any,
                intervening: Optional[InterventionListener]) -> list:
        """The end of a stepped run that returned `item`: listeners told, outputs stored, edits checked."""
        for listener in listeners[:-1]:
            listener.on_run_end(item)
        self.step_outputs = outputs_list(item)
        missed = sorted(step for step in stepper.edits if step > stepper.index)
        if missed:
            raise EditError(f"edits for step{'s' if len(missed) > 1 else ''} {', '.join(map(str, missed))} never "
                            f"applied: the run ended after {stepper.index} steps (its outputs are in step_outputs)")
        if intervening is not None:
            intervening.finish()
        return self.step_outputs


    def _generator_steps(self, block: ModelBlockSchema, scope: dict,
                         edits: Optional[dict[int, list[dict]]]) -> Generator[StepInfo, None, list]:
        """`_steps` as a chain of generators (runtime/step_generators.py): no greenlet switch a step."""
        stepper = Stepper(edits, self.listeners)
        listeners = [*self.listeners, stepper]
        program, observer = _borrow_generators(block, listeners)
        if observer._stepper is None or not program.stays_generated():  # another instruction listener, or lending
            _give_back_generators(block, program)
            return (yield from self._greenlet_steps(block, scope, edits))
        stepper.switch = pause_in_worker
        outcome: list = []
        chain = program.steps(scope, outcome)
        owner = threading.get_ident()
        get_ident = threading.get_ident
        finished = False
        try:
            for listener in listeners[:-1]:  # the stepper needs no start
                listener.on_run_start(block, scope)
            # Once per step: a `for` over the chain (its result waits in `outcome`), the thread asked.
            for item in chain:
                yield item
                if get_ident() != owner:
                    raise SchemaRunError("a stepped run can only be advanced from the thread that started it; "
                                         "call next() on it from that thread (or start a step_run per thread)")
            item = outcome[0]
            finished = True
        finally:
            stepper.ended = True
            if not finished and chain.gi_frame is not None and chain.gi_frame.f_lasti >= 0 and get_ident() == owner:
                try:
                    chain.throw(StepAbandoned())
                except (StepAbandoned, StopIteration):
                    pass
            if chain.gi_frame is None:
                _give_back_generators(block, program)
        return self._finish(listeners, stepper, item, None)

def _adopt(runner: greenlet.greenlet) -> None:
    """Make the current greenlet the one the run's end (or its error) goes to."""
    current = greenlet.getcurrent()
    if runner.parent is not current:
        try:
            runner.parent = current
        except ValueError:  # the current greenlet runs inside the run: its end goes where it went
            pass


# What a stepped run's greenlet returns once the run is over (its result waits in a list): told
# apart from a step by identity, the cheapest test the step loop can make.
_FINISHED = object()


# Observed programs, compiled once per block and lent to one run at a time. A run that is still in
# progress (a paused step_run, a run nested in another) simply gets a freshly compiled one.
# Programs that announce sub-block calls (for pauses before calls) are kept apart ("idle_calls"):
# the others are compiled without those announcements. A stepped run's programs report to a
# SteppingObserver, whose `after` is the step itself; they are kept apart too ("idle_step").
def _borrow(block: ModelBlockSchema, listeners: Sequence[TraceListener], capture_values: bool,
            calls: bool = False, stepping: bool = False) -> tuple[Program, EventObserver]:
    tensors = _tensor_results(listeners, capture_values)
    idle = _programs(block).setdefault(_idle_key(calls, tensors, stepping), [])
    try:
        program, observer = idle.pop() if idle else _compile_observed(block, calls, tensors, stepping)
    except IndexError:  # another thread took the last one
        program, observer = _compile_observed(block, calls, tensors, stepping)
    observer.configure(listeners, capture_values)
    return program, observer


def _borrow_generators(block: ModelBlockSchema, listeners: Sequence[TraceListener]) -> tuple:
    """A GeneratorProgram of `block` (and its observer), configured for `listeners`."""
    idle = _programs(block).setdefault("idle_generators", [])
    try:
        program = idle.pop() if idle else GeneratorProgram(block, SteppingObserver())
    except IndexError:  # another thread took the last one
        program = GeneratorProgram(block, SteppingObserver())
    program.observer.configure(listeners, False)
    return program, program.observer


def _give_back_generators(block: ModelBlockSchema, program: GeneratorProgram) -> None:
    program.observer.reset()
    program.observer.configure(())
    idle = _programs(block).setdefault("idle_generators", [])
    if len(idle) < 4:
        idle.append(program)


def _idle_key(calls: bool, tensors: bool, stepping: bool = False) -> str:
    """Which pool of idle programs: stepped or not, with or without call announcements, every result
    or tensors only."""
    return "idle" + ("_step" if stepping else "") + ("_calls" if calls else "") + ("_tensors" if tensors else "")


def _tensor_results(listeners: Sequence[TraceListener], capture_values: bool) -> bool:
    """Whether every listener wants tensor results only (`every_instruction = False`)."""
    return not capture_values and not any(getattr(listener, "every_instruction", True) for listener in listeners)


def _compile_observed(block: ModelBlockSchema, calls: bool = False, tensors: bool = False,
                      stepping: bool = False) -> tuple[Program, EventObserver]:
    observer = SteppingObserver() if stepping else EventObserver()
    return Program(block, observer, calls=calls, tensor_results=tensors), observer


def _give_back(block: ModelBlockSchema, program: Program, observer: EventObserver, calls: bool = False,
               stepping: bool = False) -> None:
    observer.reset()
    observer.configure(())
    idle = _programs(block).setdefault(_idle_key(calls, program.tensor_results, stepping), [])
    if len(idle) < 4:
        idle.append((program, observer))


def source_code(block: ModelBlockSchema, observed: bool = False) -> str:
    """The Python source the runtime generated for `block`'s forward (or method): what a plain run
    executes (`observed=True`: what a capture or stepped run executes, over the frame dict `f`).

    Names are the source's; temporaries `$t3` are `_t3`; calls of children are written as calls
    of their invokers (`_fc1((x,), {})`), registered weights read live (`weight = _params[...]`)."""
    if not isinstance(block, ModelBlockSchema):
        raise SchemaRunError(f"source_code takes a ModelBlockSchema, got {type(block).__name__}")
    if block.signature is None or block.skip_reason is not None:
        raise SchemaRunError(f"block {block.path or block.name!r} is not interpreted "
                             f"({block.skip_reason or 'no lowered forward'}): it has no generated code")
    program = Program(block, Observer() if observed else None)
    return program.unit(block).source
