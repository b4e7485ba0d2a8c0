"""Stage 3, runtime: executes a schema by re-dispatching every instruction to the real callables.

Its modules, each a noun:

- `codegen`: the code generator. Each function of a schema becomes one real Python function, with
  one `emit_<Instruction>` per instruction kind saying how it runs (plain and observed); the code
  carries the user's file and line numbers.
  Its parts live in modules of their own: `statements` (every instruction that is not a call),
  `reads` (a name read where the source reads it, the guard at the top), `reporting` (what the code
  tells as it runs: the observer's calls, a counted run's counts, a logged run's log) and
  `static_calls` (a child named by path).
- `instructions`: what the generator reads off instructions before it writes (fused method calls,
  literals, whether a plain run can keep fast locals, source positions).
- `functions`: interpreted closures (`InterpretedFunction`), decorators re-applied around a schema,
  and what happens when a generated function fails (the note naming the source text; CPython's
  errors for unbound reads).
- `caching`: caching decorators around a schema: the user's `functools.lru_cache` decides hits and
  keeps results, and a miss runs the schema (a trampoline `__code__` for the length of the call).
- `program`: `Program`, the cache of compiled functions of one schema and mode, the invokers that
  run a block as `module(*args, **kwargs)` would, and dispatch of module values. Generated code
  reads each global and closure name where the source reads it (`codegen.CodeGenerator.bound_const`)
  and checks at each call that its forward is still its class's and a dispatching decorator's choice
  still holds (`functions.stale_method`, `stale_dispatch`).
- `coverage`: the live-call detector (what ran outside the schema, found from the code objects of
  the model's own forwards) and its `LiveCall` records.
- `backward_watch`: a live-call detector armed on a run's outputs, for what autograd runs in backward.
- `reached`: where a module that is no sub-module came from (the words of a live call's reason).
- `lending`: schema forwards (and methods) lent to the instances live code reaches during a run.
- `binding`: CPython's argument binding and its errors, for frame-dict functions.
- `hooks`: module forward hooks around an interpreted forward, as `Module._call_impl` runs them.
- `listeners`: the `Observer` interface the generated code calls, `EventObserver` turning it into
  events, and `TraceListener`.
- `partial`: partly observed runs (observed and counted plain programs for one set of blocks).
- `step_log`: logged runs, plain code appending each tensor result to a per-run log (a capture of
  everything, its records built when read), or only what a `log_plan.LogPlan` keeps (a `keep=`
  selector compiled per instruction: the rest counted); `log_plan`: that plan's interface.
- `interventions`: what `interventions=` plugs into a run (the listener the traces stage builds from
  selectors, handed over once by `use_interventions`), so the runtime reads no selector.
- `reuse`: a patched run's block calls and Python function calls answered from a recorded clean
  run's (`CallReuse`, the programs that wrap their invokers and function calls, `run_reusing`), for
  activation patching; `reuse_values`: what those calls' arguments and results are compared by.
- `stepping`: what a stepped run yields (`StepInfo`, `CallPause`), edits (`apply_edit`), and what
  pauses it (`Stepper`; `SteppingObserver`, whose `after` builds each step where the generated code
  reports the instruction, from the instruction's site and the value the code hands it).
- `interpreter`: the public driver (`SchemaInterpreter.run / call / step_run`: the stepped run's
  greenlet and generator, `source_code`).
- `native_build`: a C source of the package built with the system compiler on first use into the
  user's cache and loaded with ctypes (the store's statistics kernel, diverge's per-row errors).

May import: `schema` only. It never imports the lowering: a schema runs without its source.
"""
