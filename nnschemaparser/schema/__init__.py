"""Stage 1, the data model: what a schema is, how it is written as text, and the package's errors.

`model` holds the dataclasses (`ModelBlockSchema`, `FunctionSchema`, the closed instruction set,
operands, `TensorRepr*`), `errors` the exception hierarchy, `notation` one line of text per operand
and instruction, `dump` the text view of a whole block tree (`dump_schema`).

May import: torch and the standard library only. Every later stage imports this one.
"""

from .model import *  # noqa: F401,F403  (`nnschemaparser.schema` was the data model's module: keep its names)
from .model import __all__  # noqa: F401
