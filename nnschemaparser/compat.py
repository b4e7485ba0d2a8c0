"""Old module paths keep working: `nnschemaparser.errors` is `nnschemaparser.schema.errors`, and so on.

Until the stage subpackages, every module lived at the package's top level, and notebooks and user
code import from there (`from nnschemaparser.errors import EditError`). `install()` (called by the
package root) adds a finder that answers each old name in `MOVED` with the module at its new place:
the same module object, so classes and state are shared, never duplicated. Old names that are now
subpackages (`schema`, `lowering`, `parser`, `traces`) re-export the old module's names themselves.
`python -m` entry points moved too: use the new paths (`python -m nnschemaparser.validation.sweep`).

Depends on the standard library only; imports a moved module only when its old name is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any, Optional

__all__ = ["MOVED", "install"]

MOVED = {
    "errors": "schema.errors", "notation": "schema.notation", "dump": "schema.dump",
    "source": "lowering.source", "expressions": "lowering.expressions",
    "definite_assignment": "lowering.definite_assignment", "intrinsics": "lowering.intrinsics",
    "engine": "runtime.program", "argument_binding": "runtime.argument_binding",
    "unbound_reads": "runtime.unbound_reads", "listeners": "runtime.listeners", "interpreter": "runtime.interpreter",
    "equality": "parser.equality",
    "text_trace": "traces.text_trace", "descriptions": "traces.descriptions", "recorder": "traces.recorder",
    "record": "traces.record", "compare": "traces.compare", "frames": "traces.frames",
    "histograms": "traces.histograms",
    "capture": "inspection.capture", "metadata": "inspection.metadata", "dataflow": "inspection.dataflow",
    "call_log": "inspection.call_log", "connectivity": "inspection.connectivity", "summary": "inspection.summary",
    "inspector": "inspection.inspector", "flops": "inspection.flops", "graph_export": "inspection.graph_export",
    "card": "inspection.card", "target": "inspection.target", "cli": "inspection.cli",
    "file_format": "files.file_format", "allowlist": "files.allowlist", "value_codec": "files.value_codec",
    "schema_codec": "files.schema_codec", "schema_file": "files.schema_file", "trace_file": "files.trace_file",
    "zoo": "validation.zoo", "zoo_cases_text": "validation.zoo_cases_text",
    "zoo_cases_media": "validation.zoo_cases_media", "sweep": "validation.sweep", "demo": "examples.demo",
}
_PACKAGE = __name__.rpartition(".")[0]


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        """The module ran at its new place already; keep its own spec (the import machinery set ours)."""
        module.__spec__ = self.real_spec


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(f"{_PACKAGE}.{MOVED[name]}"))


def install() -> None:
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
