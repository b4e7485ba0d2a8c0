"""Crash fuzzing of the lowering: arbitrary valid Python, as a forward body, must lower or be refused.

hypothesmith writes syntactically valid modules (never executed here); each becomes the body of
`def forward(self, x):` and goes to `lower_source`, which must return a FunctionSchema or raise the
documented `UnsupportedSyntaxError`. Any other exception is an internal error of the lowering.

Depends on hypothesmith, hypothesis and nnschemaparser.lowering.
"""

from __future__ import annotations

import ast
import collections
import textwrap
import traceback
import warnings
from typing import Optional

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from nnschemaparser.schema.errors import UnsupportedSyntaxError
from nnschemaparser.lowering.statements import lower_source

__all__ = ["python_sources", "forward_source", "lower_outcome", "crash_fuzz"]


def python_sources() -> st.SearchStrategy[str]:
    """Valid Python modules: from the grammar (odd layouts) and from libcst nodes (plausible code)."""
    import hypothesmith  # the `test` extra; only the crash fuzzing needs it

    return st.one_of(hypothesmith.from_grammar(), hypothesmith.from_node())


def _compiles(source: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<fuzz>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def forward_source(module_source: str) -> Optional[str]:
    """`module_source` as the body of a forward, or None when no such function is valid Python.

    The text is indented as it is (keeping its odd layout); when that does not compile (a
    continuation line, a tab), the parsed statements are re-rendered inside the function instead.
    """
    indented = textwrap.indent(module_source, "    ")
    source = "def forward(self, x):\n" + indented + "\n    pass\n"
    if _compiles(source):
        return source
    try:
        body = ast.parse(module_source).body
    except (SyntaxError, ValueError):
        return None
    function = ast.FunctionDef(name="forward", args=ast.arguments(
        posonlyargs=[], args=[ast.arg("self"), ast.arg("x")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body or [ast.Pass()], decorator_list=[], returns=None, type_comment=None)
    try:
        source = ast.unparse(ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[])))
    except (ValueError, RecursionError):
        return None
    return source if _compiles(source) else None


def lower_outcome(source: str) -> tuple[str, str]:
    """("lowered" | "refused" | "internal_error", detail) for one forward source."""
    try:
        lower_source(source, filename="<hypothesmith>")
    except UnsupportedSyntaxError as exc:
        return "refused", str(exc)
    except Exception:  # anything else is a bug of the lowering
        return "internal_error", traceback.format_exc(limit=-4)
    return "lowered", ""


def crash_fuzz(count: int, seed_value: int = 0, *, keep: int = 5) -> collections.Counter:
    """Run `count` hypothesmith sources through the lowering; counts, plus the first internal errors."""
    counts: collections.Counter = collections.Counter()
    examples: list[str] = []

    @seed(seed_value)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(python_sources())
    def one(module_source: str) -> None:
        source = forward_source(module_source)
        if source is None:
            counts["not_a_body"] += 1
            return
        counts["sources"] += 1
        verdict, detail = lower_outcome(source)
        counts[verdict] += 1
        if verdict == "internal_error" and len(examples) < keep:
            examples.append(f"{source}\n{detail}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hypothesmith compiles what it writes: SyntaxWarnings
        one()
    for example in examples:
        print(f"--- lowering internal error ---\n{example}")
    return counts
