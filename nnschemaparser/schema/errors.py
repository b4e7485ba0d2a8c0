"""The exceptions nnschemaparser raises on its own account.

Exceptions raised by the user's model code are never wrapped: they keep their type and get a note
naming the instruction and the forward's file:line. Everything below is about our side:

    NNSchemaError                     base of every error of this package
    ├── UnsupportedSyntaxError        the lowering cannot express a construct (the child is skipped)
    ├── SourceUnavailableError        no source for a forward (C extension, REPL, stripped build)
    ├── ParseError                    parse_model was given inputs it cannot use
    ├── SchemaRunError                the schema cannot run as given (missing input, no live module)
    ├── EditError                     a stepping edit names an unknown variable or changes shape/dtype
    ├── SchemaFormatError             a saved schema or trace file is malformed or unsafe
    ├── GraphExportError (export_flow.py)  torch.export cannot export a model for graph-mode inspection
    └── TargetError (target.py)       a CLI target that cannot be loaded or built
"""

from __future__ import annotations

__all__ = [
    "NNSchemaError",
    "UnsupportedSyntaxError",
    "SourceUnavailableError",
    "ParseError",
    "SchemaRunError",
    "EditError",
    "SchemaFormatError",
]


class NNSchemaError(Exception):
    """Base class of the errors raised by nnschemaparser itself."""


class UnsupportedSyntaxError(NNSchemaError):
    """A construct the lowering cannot express; carries the file:line of the construct."""

    def __init__(self, message: str, filename: str = "", lineno: int = 0):
        self.filename = filename
        self.lineno = lineno
        where = f"{filename}:{lineno}: " if filename else ""
        super().__init__(f"{where}{message}")


class SourceUnavailableError(NNSchemaError):
    """The source of a function could not be read."""


class ParseError(NNSchemaError):
    """parse_model cannot use the inputs it was given."""


class SchemaRunError(NNSchemaError):
    """The schema cannot run as given."""


class EditError(NNSchemaError):
    """A stepping edit that would be invalid; nothing was changed."""


class SchemaFormatError(NNSchemaError):
    """A saved schema or trace file is malformed or unsafe to load."""
