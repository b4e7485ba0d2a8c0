"""Stage 2, lowering: a Python function's source read with `ast` and turned into schema instructions.

`source` reads a function's text (notebook cells too) and refuses text that no longer matches the
code; `context` holds what one lowering may look at; `ops` builds the OpInstructions every part
emits; `expressions` lowers expressions (one `expr_<Node>` each), with calls in `calls` and
comprehensions, generator expressions, lambdas and `yield` in `comprehensions`; `statements` lowers
statements (one `visit_<Stmt>` each) and is the entry point (`lower_function`, `lower_source`), with
nested `def`, `nonlocal` and imports in `definitions` and the names a body binds found by `scope`;
`container_loops` finds the loops over module container entries and the variable holding each called
entry's index or key; `definite_assignment` finds locals that may be unbound; `intrinsics` are the
small runtime helpers the lowering emits into instructions.

May import: `schema` only (plus torch and the standard library).
"""

from .context import LoweringContext, MethodRequest
from .statements import lower_function, lower_source  # the old `nnschemaparser.lowering` names

__all__ = ["MethodRequest", "LoweringContext", "lower_function", "lower_source"]
