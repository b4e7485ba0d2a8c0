"""The package's layout rule, checked from the code's own imports.

Each stage subpackage states in its docstring which stages it may import ("May import: ..."); a
stage may name only earlier stages there. These tests fail when a module imports a stage its
docstring does not allow, when a docstring allows a later stage, when the package has an import
circle (module level, inside functions or under `if TYPE_CHECKING:`), when a stage imports the
package root, or when a module grows past the size limit without saying why.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

import nnschemaparser

PACKAGE = Path(nnschemaparser.__file__).parent
STAGES = ("schema", "lowering", "runtime", "parser", "traces", "inspection", "files", "store", "distributed", "widget",
          "validation", "examples")
ROOT_MODULES = {"__init__", "__main__"}
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "static" not in p.parts}


def _enclosing_kinds(tree: ast.AST) -> dict[int, str]:
    """id(import node) -> where it sits: "if TYPE_CHECKING", "in a function" (else: module level)."""
    kinds: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kinds.update({id(n): "in a function" for n in ast.walk(node)})
    for node in ast.walk(tree):  # a TYPE_CHECKING block says more than the function around it
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            kinds.update({id(n): "if TYPE_CHECKING" for child in node.body for n in ast.walk(child)})
    return kinds


def import_sites(name: str, path: Path, modules: dict[str, Path]) -> dict[str, list[str]]:
    """The package modules `name` imports, anywhere in its code, each with where it does it.

    Every import counts: module level, inside functions and under `if TYPE_CHECKING:` (a module
    that needs another one's names only for annotations still depends on it; the circle is real
    even when the interpreter never runs it). Each site reads "line N" plus where it sits.
    """
    tree = ast.parse(path.read_text())
    kinds = _enclosing_kinds(tree)
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.append(module)
            targets.extend(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            targets.extend(alias.name for alias in node.names)
        for target in targets:
            if target in modules and target != name:
                site = f"line {node.lineno}" + (f", {kinds[id(node)]}" if id(node) in kinds else "")
                found.setdefault(target, []).append(site)
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports, anywhere in its code (`if TYPE_CHECKING:` blocks too)."""
    return set(import_sites(name, path, modules))


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in ROOT_MODULES):
        return None  # the root facade
    return parts[1]


def allowed_stages(stage: str) -> set[str]:
    doc = importlib.import_module(f"nnschemaparser.{stage}").__doc__ or ""
    match = re.search(r"May import:\s*(.+?)(?:\n\n|$)", doc, re.S)
    assert match, f"nnschemaparser/{stage}/__init__.py must say which stages it may import ('May import: ...')"
    text = match.group(1)
    earlier = set(STAGES[:STAGES.index(stage)])
    if "every earlier stage" in text:
        return earlier | {stage}
    named = set(re.findall(r"`(\w+)`", text)) & set(STAGES)
    assert named <= earlier, f"{stage} says it may import the later stage(s) {sorted(named - earlier)}"
    return named | {stage}


def test_every_package_module_is_in_a_stage_subpackage():
    top = {p.stem for p in PACKAGE.glob("*.py")} - ROOT_MODULES
    assert not top, f"modules at the package root besides the facade: {sorted(top)}; move them into a stage"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(STAGES)


def test_each_stage_imports_only_the_stages_its_docstring_allows():
    modules = _modules()
    wrong = []
    for name, path in sorted(modules.items()):
        stage = stage_of(name)
        if stage is None:
            continue
        allowed = allowed_stages(stage)
        for target in imports_of(name, path, modules):
            target_stage = stage_of(target)
            if target_stage is None:
                wrong.append(f"{name} imports the package root {target} (import the stage module instead)")
            elif target_stage not in allowed:
                wrong.append(f"{name} ({stage}) imports {target} ({target_stage})")
    assert not wrong, "import rule broken:\n" + "\n".join(wrong)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """module -> the package modules it imports, and (module, target) -> the import sites."""
    modules = _modules()
    graph, sites = {}, {}
    for name, path in modules.items():
        found = import_sites(name, path, modules)
        # a package's __init__ is imported with each of its modules: an edge to it is not a circle of
        # the code (re-exports are checked by the stage rule above)
        graph[name] = {t for t in found if not (name.startswith(t + ".") and modules[t].name == "__init__.py")}
        sites.update({(name, t): found[t] for t in graph[name]})
    return graph, sites


def shortest_loop(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest import path from `start` back to itself inside `within` (a breadth-first walk)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & within):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    return []


def describe_cycles(graph: dict[str, set[str]], sites: dict[tuple[str, str], list[str]]) -> str:
    """Each circle: its modules, the imports between them (line, where) and its shortest loops."""
    cycles = find_cycles(graph)
    out = [f"{len(cycles)} import circle(s); break each by moving what both sides need into one module "
           "(or passing it in), not by hiding an import:"]
    for number, cycle in enumerate(cycles, 1):
        members = set(cycle)
        out.append(f"circle {number}: {len(cycle)} modules: {', '.join(cycle)}")
        for name in cycle:
            for target in sorted(graph[name] & members):
                out.append(f"    {name} -> {target}  ({'; '.join(sites[(name, target)])})")
        loops: list[list[str]] = []
        for name in cycle:
            loop = shortest_loop(graph, name, members)[:-1]
            turn = loop.index(min(loop))
            if loop[turn:] + loop[:turn] not in loops:
                loops.append(loop[turn:] + loop[:turn])
        out.append("  shortest loops:")
        out.extend(f"    {' -> '.join(m.rpartition('.')[2] for m in loop + loop[:1])}" for loop in loops)
    return "\n".join(out)


def test_the_package_has_no_import_circles():
    graph, sites = import_graph()
    if find_cycles(graph):
        pytest.fail(describe_cycles(graph, sites), pytrace=False)


def test_the_cycle_finder_finds_a_circle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_past_the_size_limit_without_a_stated_reason():
    long = []
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and "Longer than" not in doc:
            long.append(f"{name}: {lines} lines")
    assert not long, f"split these or say why in the docstring ('Longer than {MAX_LINES} lines because ...'): {long}"


@pytest.mark.parametrize("old", ["errors", "histograms", "engine", "zoo", "inspector", "intrinsics", "demo"])
def test_old_top_level_module_paths_are_gone(old):
    """The modules live in their stages only: no import hook answers the pre-stage paths any more."""
    assert f"nnschemaparser.{old}" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"nnschemaparser.{old}")
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("nnschemaparser")]


def test_subpackages_that_were_modules_keep_their_names():
    from nnschemaparser.lowering import lower_source
    from nnschemaparser.parser import NNParser, preserved_state
    from nnschemaparser.schema import ModelBlockSchema, OpInstruction
    from nnschemaparser.traces import ActivationTrace, container_id

    assert all((lower_source, NNParser, preserved_state, ModelBlockSchema, OpInstruction, ActivationTrace,
                container_id))


def test_the_import_reader_sees_relative_absolute_and_lazy_imports():
    modules = _modules()
    program = imports_of("nnschemaparser.runtime.program", modules["nnschemaparser.runtime.program"], modules)
    assert {"nnschemaparser.schema.model", "nnschemaparser.runtime.codegen"} <= program
    widget = imports_of("nnschemaparser.widget.inspector", modules["nnschemaparser.widget.inspector"], modules)
    assert "nnschemaparser.widget.static_html" in widget  # imported inside a method


def test_the_import_reader_counts_type_checking_and_function_imports(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("from typing import TYPE_CHECKING\nfrom . import b\n\nif TYPE_CHECKING:\n    from .c import C\n\n\n"
                    "def f():\n    from pkg import d\n    if TYPE_CHECKING:\n        import pkg.e\n")
    modules = {name: tmp_path / f"{name}.py" for name in ("pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e")}
    assert import_sites("pkg.a", path, modules) == {
        "pkg.b": ["line 2"], "pkg.c": ["line 5, if TYPE_CHECKING"], "pkg.d": ["line 9, in a function"],
        "pkg.e": ["line 11, if TYPE_CHECKING"]}


def test_a_circle_is_described_with_its_imports_and_loops():
    graph = {"p.a": {"p.b"}, "p.b": {"p.a", "p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    sites = {("p.a", "p.b"): ["line 1"], ("p.b", "p.a"): ["line 2, if TYPE_CHECKING"], ("p.b", "p.c"): ["line 3"],
             ("p.c", "p.a"): ["line 4, in a function"], ("p.d", "p.a"): ["line 5"]}
    assert describe_cycles(graph, sites).splitlines()[1:] == [
        "circle 1: 3 modules: p.a, p.b, p.c",
        "    p.a -> p.b  (line 1)",
        "    p.b -> p.a  (line 2, if TYPE_CHECKING)",
        "    p.b -> p.c  (line 3)",
        "    p.c -> p.a  (line 4, in a function)",
        "  shortest loops:",
        "    a -> b -> a",
        "    a -> b -> c -> a",
    ]
