"""Stage 3, runtime: executes a schema by re-dispatching every instruction to the real callables.

`program` is the execution core (`Program`: instructions compiled once into closures over a frame
dict), assembled from `operands` (operand getters, argument builders), `functions` (interpreted
functions, closures, lazy generators, method units), `compile_calls` (ops and sub-block calls),
`compile_control` (if/for/while/try/with/raise/return...), `module_hooks` (forward hooks as
`Module._call_impl` runs them) and `observer` (the hooks that listeners, captures and stepping use).
`argument_binding` and `unbound_reads` reproduce CPython's binding and unbound-name errors;
`listeners` turns observer calls into events; `interpreter` is the public driver
(`SchemaInterpreter.run / call / step_run`, `StepInfo`, `CallPause`, edits).

May import: `schema` only. It never imports the lowering: a schema runs without its source.
"""
