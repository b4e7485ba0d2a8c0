"""The tree reads like the source (issue 11, item 3): one row per source statement, its instructions
folded inside, checked against the source files of transformers GPT-2 and Llama forwards."""

from __future__ import annotations

import ast
import io
import sys
import textwrap
import tokenize
from functools import lru_cache

import pytest
import torch

from tests.support.debugger_models import Decorated, parsed, tiny_case
from nnschemaparser.widget import InspectorState
from nnschemaparser.widget.statements import MAX_TEXT, StatementIndex, one_line
from nnschemaparser.widget.tree import BlockTree

ATTENTION = {"gpt2": "transformer.h.0.attn", "llama": "model.layers.0.self_attn"}
COMPOUND = (ast.If, ast.For, ast.While, ast.Try, ast.With, ast.FunctionDef)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def case(request):
    pytest.importorskip("transformers")
    model, inputs, schema = tiny_case(request.param)
    return request.param, model, inputs, schema, BlockTree(schema)


@lru_cache(maxsize=None)
def _file_statements(filename: str) -> dict[int, list[ast.stmt]]:
    """Every statement of a file by its first line, parsed here from the file itself."""
    with open(filename, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    by_line: dict[int, list[ast.stmt]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            by_line.setdefault(node.lineno, []).append(node)
    return by_line


def _squeezed(code: str) -> str:
    """The code's tokens without comments and layout: what a one-line rendering must keep."""
    out = []
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            out.append(token.string)
    return "".join(out)


def _file_text(filename: str, stmt: ast.stmt) -> str:
    """The statement's source from the file (a compound statement: its header), squeezed."""
    with open(filename, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    end_line, end_col = stmt.end_lineno, stmt.end_col_offset
    if isinstance(stmt, COMPOUND):
        end_line, end_col = stmt.body[0].lineno, stmt.body[0].col_offset
    chunk = lines[stmt.lineno - 1:end_line]
    chunk[-1] = chunk[-1][:end_col]
    chunk[0] = chunk[0][stmt.col_offset:]
    code = "\n".join(chunk).rstrip()
    if isinstance(stmt, COMPOUND):  # the header ends at the colon before the body
        code = code[:code.rfind(":") + 1]
    if code.startswith("elif"):  # tokenizes alone as `if`
        return "el" + _squeezed(code[2:] + "\n")
    return _squeezed(code + "\n")


def _for_target(filename: str, stmt: ast.stmt) -> str:
    with open(filename, encoding="utf-8") as handle:
        return _squeezed(ast.get_source_segment(handle.read(), stmt.target) + "\n")


def _statement_rows(tree: BlockTree, block_node: int):
    """(node, text) of every row of a block showing a statement's text: statement rows and rows
    carrying `src` (one-instruction and compound statements), not those of other blocks."""
    out = []
    stack = list(tree.nodes[block_node].children)
    while stack:
        index = stack.pop()
        node = tree.nodes[index]
        if node.kind == "B":
            continue
        if node.kind == "s":
            out.append((index, node.text))
        elif (node.extra or {}).get("src"):
            out.append((index, node.extra["src"]))
        stack.extend(node.children)
    return out


def test_each_statement_row_shows_its_statements_own_text_from_the_source_file(case):
    name, _, _, schema, tree = case
    filename = schema.find(ATTENTION[name]).signature.filename
    rows = _statement_rows(tree, tree.path_nodes[ATTENTION[name]])
    assert len(rows) >= 10
    for index, text in rows:
        candidates = _file_statements(filename)[tree.nodes[index].line]
        wanted = {_file_text(filename, stmt) for stmt in candidates}
        wanted |= {_for_target(filename, stmt) for stmt in candidates if isinstance(stmt, ast.For)}
        if text.endswith("…"):  # elided: the start of the statement, at most MAX_TEXT long
            start = text[:-1].replace(" ", "")
            assert len(text) <= MAX_TEXT and any(w.replace(" ", "").startswith(start) for w in wanted), text
        else:
            assert _squeezed(text + "\n") in wanted, (text, wanted)


def test_every_statement_that_ran_as_instructions_has_exactly_one_row(case):
    name, _, _, schema, tree = case
    block = schema.find(ATTENTION[name])
    index = StatementIndex(block.signature.source, block.signature.firstlineno)
    lines_of_instructions = set()

    def walk(body):
        for instr in body:
            stmt = index.of(instr.location)
            if stmt is not None:
                lines_of_instructions.add(index.span(stmt)[0])
            if hasattr(instr, "condition"):  # a ControlInstruction's test: `prepare`, then its `condition` op
                walk(instr.prepare + [instr.condition])
            for attr in ("body", "else_body", "final_body"):
                walk(getattr(instr, attr, None) or [])
            for handler in getattr(instr, "handler_bodies", None) or []:
                walk(handler)

    walk(block.body)
    rows = _statement_rows(tree, tree.path_nodes[ATTENTION[name]])
    # leave out the row of a `for` target (`i, layer`): it shares its for's line
    row_lines = [tree.nodes[i].line for i, text in rows
                 if tree.nodes[i].line != tree.nodes[tree.nodes[tree.nodes[i].parent].parent].line]
    assert sorted(set(row_lines)) == sorted(lines_of_instructions)
    # one row per statement (a for target row shares its for's line)
    assert len(row_lines) == len(set(row_lines)), sorted(row_lines)


def test_temporaries_and_attribute_fetches_are_folded_inside_statement_rows(case):
    name, _, _, schema, tree = case
    attention = tree.path_nodes[ATTENTION[name]]
    loose = []
    stack = list(tree.nodes[attention].children)
    while stack:
        index = stack.pop()
        node = tree.nodes[index]
        if node.kind in ("B", "s") or (node.extra or {}).get("test"):
            continue  # a statement holds its temporaries; a test branch is folded by the source view
        if node.text.startswith("$t") and node.kind == "o":
            loose.append(node.text)
        stack.extend(node.children)
    assert loose == []
    statements = [n for n in tree.nodes if n.kind == "s" and n.block == attention]
    inside = [tree.nodes[c].text for s in statements for c in s.children]
    assert any("getattr(self" in text for text in inside), "attribute fetches are inside statement rows"


def test_a_statement_rows_instructions_all_come_from_its_lines_and_it_shows_what_it_binds(case):
    name, _, _, schema, tree = case
    attention = tree.path_nodes[ATTENTION[name]]
    for node in tree.nodes:
        if node.kind != "s" or node.block != attention:
            continue
        last = (node.extra or {}).get("end", node.line)
        for child in node.children:
            line = tree.nodes[child].line
            assert node.line <= line <= last, (node.text, tree.nodes[child].text)
            assert tree.statement_nodes[child] == tree.nodes.index(node)
        shapes: dict[str, str] = {}  # what the statement binds, from its instruction rows
        for child in node.children:
            text = tree.nodes[child].text
            target = text.split(" = ")[0] if " = " in text else ""
            if target and not target.startswith("$") and target.isidentifier():
                shapes.pop(target, None)
                shapes[target] = tree.nodes[child].shape
        assert node.shape == ", ".join(shape for shape in shapes.values() if shape), node.text
    shown = [n for n in tree.nodes if n.kind == "s" and n.block == attention and "," in n.shape]
    assert shown, "a statement binding several names shows each one's shape"


def test_a_sub_block_call_inside_a_statement_row_still_leads_to_its_block(case):
    name, _, _, schema, tree = case
    attention = tree.path_nodes[ATTENTION[name]]
    calls = [i for i, n in enumerate(tree.nodes) if n.kind == "c" and n.block == attention
             and tree.nodes[n.parent].kind == "s" and i in tree.call_targets]
    assert calls, "a call folded inside a statement row"
    for call in calls:
        target = tree.call_targets[call]
        assert tree.nodes[target].kind == "B" and tree.row(call)[8]["to"] == target


def test_the_statement_index_maps_tests_targets_and_lambda_bodies_to_their_statement():
    source = textwrap.dedent('''\
        def forward(self, x):
            for i, layer in enumerate(self.layers):  # a comment
                x = layer(x) + (lambda t: t * 2)(i)
            if x.sum() > 0: y = x
            elif (x.sum()
                  < -1):
                y = -x
            return (y +  # the sum
                    1)
        ''')
    index = StatementIndex(source, 10)
    loop = index.statements[0]
    assert index.text(loop) == "for i, layer in enumerate(self.layers):"
    assert index.target_text(loop) == "i, layer"

    class Loc:
        filename = "model.py"

        def __init__(self, lineno, col, end_lineno=1):
            self.lineno, self.col, self.end_lineno = lineno, col, end_lineno

    body = index.of(Loc(12, 36))  # inside the lambda's body: its statement is the assignment
    assert index.text(body) == "x = layer(x) + (lambda t: t * 2)(i)" and index.inside(body, loop)
    assert index.of(Loc(11, 30)) is loop  # the iterable: the for itself
    one_line_if = index.of(Loc(13, 4))
    assert index.text(one_line_if) == "if x.sum() > 0:" and index.text(index.of(Loc(13, 20))) == "y = x"
    elif_ = one_line_if.orelse[0]
    assert index.text(elif_) == "elif (x.sum() < -1):"
    assert index.text(index.of(Loc(17, 11))) == "return (y + 1)"
    assert index.of(Loc(17, 11, 0)) is index.of(Loc(18, 0, 0)), "without columns: by line"
    assert index.of(None) is None

    class FileLoc(Loc):
        filename = "other.py"

    elsewhere = StatementIndex(source, 10, "model.py")
    assert elsewhere.of(FileLoc(12, 36)) is None, "a location in another file is no statement of this one"


def test_one_line_drops_comments_joins_brackets_and_elides_long_statements():
    assert one_line(["x = f(  # why", "    a,", "    b", ")"]) == "x = f(a, b)"
    assert one_line(["s = '#' + t"]) == "s = '#' + t", "a # inside a string is no comment"
    assert one_line(["y = a + \\", "    b"]) == "y = a + b"
    long = one_line(["z = " + " + ".join(f"v{i}" for i in range(60))])
    assert len(long) <= MAX_TEXT and long.endswith("…") and long.startswith("z = v0 + v1")


def test_a_breakpoint_on_a_statement_row_stops_at_its_first_step(case):
    name, _, inputs, schema, tree = case
    state = InspectorState(schema, inputs)
    attention = state.tree.path_nodes[ATTENTION[name]]
    statement = next(i for i, n in enumerate(state.tree.nodes)
                     if n.kind == "s" and n.block == attention and "view" in n.text and state.tree.nodes[i].shape)
    state.break_at(statement)
    state.continue_()
    node = state.view_step()["node"]
    assert state.status == "paused" and statement in state.tree.ancestor_set(node)
    first_child = state.tree.nodes[statement].children[0]
    assert node == first_child, "the statement's first instruction is its first step"
    assert state.current.block_path == ATTENTION[name]


def test_run_to_here_on_a_statement_row_and_search_by_its_source_text():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    state = InspectorState(parsed(Decorated(), x=x), {"x": x})
    results = state.search("shift(h) + self.scaled")
    assert results and results[0]["kind"] == "statement"
    statement = results[0]["node"]
    state.run_to_here(statement)
    assert statement in state.tree.ancestor_set(state.view_step()["node"])
    assert state.view_breakpoints()["items"] == []
    found = state.search("h = self.fc(x)")  # a one-instruction statement: found by its source text
    assert any(r["kind"] == "call" for r in found)


def test_a_block_without_source_keeps_its_lowered_rows():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    schema = parsed(Decorated(), x=x)
    schema.signature.source = ""
    tree = BlockTree(schema)
    assert not any(n.kind == "s" for n in tree.nodes if n.block == 0)
    assert any(n.text.startswith("$t") and tree.nodes[n.parent].kind == "B" for n in tree.nodes if n.block == 0)


def test_the_widget_starts_in_the_source_view_and_show_lowered_is_a_synced_trait():
    pytest.importorskip("anywidget")
    from nnschemaparser.widget.inspector import InspectorWidget

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    widget = InspectorWidget(parsed(Decorated(), x=x), {"x": x}, gradients=False)
    assert widget.show_lowered is False and widget.get_state()["show_lowered"] is False
    assert widget.trait_metadata("show_lowered", "sync") is True
    widget.show_lowered = True
    assert widget.get_state()["show_lowered"] is True
    kinds = {row[2] for row in widget.tree["rows"]}
    assert "s" in kinds, "the rows sent are those of the source view; the browser lowers them itself"
    widget.close()


def test_search_results_and_breakpoint_labels_carry_the_source_text_the_row_shows():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    state = InspectorState(parsed(Decorated(), x=x), {"x": x})
    found = [r for r in state.search("h = self.fc(x)") if r["kind"] == "call"]
    assert found and found[0]["source"] == "h = self.fc(x)"
    assert "CALL" in found[0]["text"]  # the lowered text stays for the lowered view
    state.break_at(found[0]["node"])
    label = state.view_breakpoints()["items"][0]["label"]  # source words and the line, no row number
    assert label == f"h = self.fc(x) (line {found[0]['line']})"
    statement = state.search("shift(h) + self.scaled")[0]
    assert statement["kind"] == "statement" and statement["source"] == statement["text"]


def test_the_current_step_names_the_source_statement_it_belongs_to(case):
    _, _, inputs, schema, _ = case
    state = InspectorState(schema, inputs)
    seen = set()
    for _ in range(40):
        state.step()
        view = state.view_step()
        if view.get("pause"):
            continue
        assert view["statement"] == state.tree.source_text(state.tree.statement_nodes.get(view["node"], view["node"]))
        assert "$t" not in view["text"] and "intrinsics." not in view["text"]  # the card's text: source words
        if view["instruction"].startswith("$t"):  # a temporary: the card reads its statement's own source text
            assert view["statement"] and view["text"] == view["statement"]
            seen.add(view["statement"])
    assert seen
