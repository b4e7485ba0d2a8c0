"""Differential fuzzing of the lowering and the runtime against eager PyTorch.

`choices` says where random decisions come from (a Hypothesis draw or a seeded RNG); `grammar`
(expressions), `statements` and `compound` (statement bodies) and `programs` (whole modules) write
random nn.Module programs; `oracle` imports each one from a real file and compares eager against
the schema (outputs, exceptions, buffers); `minimizer` shrinks a failing program statement by
statement; `lowering_crash` feeds arbitrary valid Python (hypothesmith) to the lowering; `run_fuzz`
is the long-run CLI behind `make fuzz`.

Nothing in nnschemaparser may import from here.
"""
