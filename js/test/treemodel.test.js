import assert from "node:assert/strict";
import { test } from "node:test";
import { TreeModel, nodeFromRow, textParts } from "../treemodel.js";

/**
 * @param {number} id @param {number} parent @param {string} kind @param {number} count @param {string} [text]
 * @returns {import("../types").TreeRow}
 */
const row = (id, parent, kind, count, text = `n${id}`) => [id, parent, kind, text, "", id, count, "", null];

// 0 block
// ├─ 1 if (2 children)       open by default
// │  ├─ 2 branch "body"     open by default, 1 child
// │  │  └─ 4 op
// │  └─ 3 branch "else"     open by default, 0 children
// └─ 5 call
const ROWS = [row(0, -1, "B", 2), row(1, 0, "i", 2), row(2, 1, "b", 1), row(3, 1, "b", 0), row(4, 2, "o", 0), row(5, 0, "c", 0)];

test("nodeFromRow names the row's fields and defaults extra to {}", () => {
  assert.deepEqual(nodeFromRow([7, 3, "c", "y = CALL f(x)", "float32[2]", 12, 1, "f", null]),
    { id: 7, parent: 3, kind: "c", text: "y = CALL f(x)", shape: "float32[2]", line: 12, count: 1, op: "f", extra: {}, children: [], el: null });
  assert.deepEqual(nodeFromRow([1, 0, "B", "b", "", 0, 0, "", { path: "fc1" }]).extra, { path: "fc1" });
});

test("textParts splits a binding, not an indexed or attribute target or a bare expression", () => {
  assert.deepEqual(textParts("hidden = CALL fc1(x)"), ["hidden", "CALL fc1(x)"]);
  assert.deepEqual(textParts("a, b = f(x)"), ["a, b", "f(x)"]);
  assert.deepEqual(textParts("x[0] = y"), [null, "x[0] = y"]);
  assert.deepEqual(textParts("f(a = 1)"), [null, "f(a = 1)"]);
  assert.deepEqual(textParts(" = y"), [null, " = y"]);
  assert.deepEqual(textParts("return x"), [null, "return x"]);
});

test("load attaches children to their parents in row order, once", () => {
  const tree = new TreeModel();
  tree.load(ROWS);
  tree.load([ROWS[2], ROWS[4]]);
  assert.deepEqual(tree.nodes.get(0)?.children, [1, 5]);
  assert.deepEqual(tree.nodes.get(1)?.children, [2, 3]);
  assert.equal(tree.nodes.size, 6);
});

test("a node is loaded when all of its children are", () => {
  const tree = new TreeModel();
  tree.load(ROWS.slice(0, 4));
  const node = (/** @type {number} */ id) => /** @type {import("../types").TreeNode} */ (tree.nodes.get(id));
  assert.equal(tree.loaded(node(1)), true);
  assert.equal(tree.loaded(node(0)), false);
  assert.equal(tree.loaded(node(2)), false);
  assert.deepEqual(tree.missing([0, 1, 2, 99]), [0, 2]);
  tree.load([ROWS[4], ROWS[5]]);
  assert.deepEqual(tree.missing([0, 1, 2]), []);
});

test("compound statements and branches open by default, loaded or not; blocks, calls and ops do not", () => {
  const tree = new TreeModel();
  tree.load(ROWS.slice(0, 4));
  const open = (/** @type {number} */ id) => tree.isOpen(/** @type {import("../types").TreeNode} */ (tree.nodes.get(id)));
  assert.equal(open(1), true);
  // a branch whose child is not loaded yet (the tree is sent lazily) is drawn open: drawing it fetches the child
  assert.equal(open(2), true);
  assert.deepEqual(tree.visibleIds(), [0], "a closed block shows no children");
  assert.equal(open(0), false);
  tree.open.add(0);
  assert.deepEqual(tree.visibleIds(), [0], "an open node not loaded yet shows none of its children (loading…)");
  tree.load([ROWS[5]]);
  assert.deepEqual(tree.visibleIds(), [0, 1, 2, 3, 5], "the open branch 2 is a row; its child 4 is still to come");
  tree.load([ROWS[4]]);
  assert.equal(open(2), true);
});

test("collapse overrides the default, expand overrides it back", () => {
  const tree = new TreeModel();
  tree.load(ROWS);
  tree.open.add(0);
  const open = (/** @type {number} */ id) => tree.isOpen(/** @type {import("../types").TreeNode} */ (tree.nodes.get(id)));
  tree.markOpen(1, false);
  assert.equal(open(1), false);
  assert.deepEqual(tree.visibleIds(), [0, 1, 5]);
  tree.markOpen(1, true);
  assert.equal(open(1), true);
  assert.ok(!tree.closed.has(1));
  tree.markOpen(5, true);
  assert.equal(open(5), true, "a node the user opened is open whatever its kind");
});

test("visible rows: the root, then the children of open loaded nodes, depth first", () => {
  const tree = new TreeModel();
  tree.load(ROWS);
  assert.deepEqual(tree.visibleIds(), [0], "the root block starts closed until init opens it");
  tree.markOpen(0, true);
  assert.deepEqual(tree.visibleIds(), [0, 1, 2, 4, 3, 5]);
  tree.markOpen(2, false);
  assert.deepEqual(tree.visibleIds(), [0, 1, 2, 3, 5]);
  tree.markOpen(0, false);
  assert.deepEqual(tree.visibleIds(), [0]);
});

test("an open node whose children are not loaded shows none of them", () => {
  const tree = new TreeModel();
  tree.load(ROWS.slice(0, 2));
  tree.markOpen(0, true);
  assert.deepEqual(tree.visibleIds(), [0], "block 0 has 1 of its 2 children loaded");
  tree.load([ROWS[5]]);
  assert.deepEqual(tree.visibleIds(), [0, 1, 5], "the if is not loaded, so it is closed by default");
});

test("ancestors run from the root down to the parent, as far as they are loaded", () => {
  const tree = new TreeModel();
  tree.load(ROWS);
  assert.deepEqual(tree.ancestors(4), [0, 1, 2]);
  assert.deepEqual(tree.ancestors(0), []);
  assert.deepEqual(tree.ancestors(42), []);
  const partial = new TreeModel();
  partial.load([row(4, 2, "o", 0)]);
  assert.deepEqual(partial.ancestors(4), [2]);
});

test("an empty tree shows nothing", () => {
  assert.deepEqual(new TreeModel().visibleIds(), []);
});

// The source view and the lowered view of one tree (issue 11: reads like the source).
// 0 block
// ├─ 1 stmt "h = self.fc(x).relu()"          (2 instructions)
// │  ├─ 2 call "$t1 = CALL fc(x)"  extra.to
// │  └─ 3 op   "h = $t1.relu()"
// ├─ 4 if "IF $t2:"  src "if h.sum() > 0:"
// │  ├─ 5 branch "condition" (test)
// │  │  └─ 6 op "$t2 = h.sum() > 0"
// │  └─ 7 branch "then"
// │     └─ 8 op "h = h * 2"  src "h = h * 2"
// └─ 9 return "RETURN h"  src "return h"
/** @returns {import("../types").TreeRow[]} */
const statementRows = () => [
  [0, -1, "B", "Net", "", 1, 3, "", { path: "" }],
  [1, 0, "s", "h = self.fc(x).relu()", "float32[2]", 2, 2, "", null],
  [2, 1, "c", "$t1 = CALL fc(x)", "float32[2]", 2, 0, "fc", { to: 10 }],
  [3, 1, "o", "h = $t1.relu()", "float32[2]", 2, 0, "torch.relu", null],
  [4, 0, "i", "IF $t2:", "", 3, 2, "", { src: "if h.sum() > 0:" }],
  [5, 4, "b", "condition", "", 0, 1, "", { test: 1 }],
  [6, 5, "o", "$t2 = h.sum() > 0", "bool", 3, 0, "operator.gt", null],
  [7, 4, "b", "then", "", 0, 1, "", null],
  [8, 7, "o", "h = h * 2", "float32[2]", 4, 0, "operator.mul", { src: "h = h * 2" }],
  [9, 0, "r", "RETURN h", "", 5, 0, "", { src: "return h" }],
];

/** @param {boolean} lowered */
function statementTree(lowered) {
  const tree = new TreeModel();
  tree.load(statementRows());
  tree.open.add(0);
  tree.lowered = lowered;
  return tree;
}

test("the source view shows one row per statement with its source text, statements and tests folded", () => {
  const tree = statementTree(false);
  assert.deepEqual(tree.visibleIds(), [0, 1, 4, 5, 7, 8, 9], "the test branch's row is there, folded");
  const text = (/** @type {number} */ id) => tree.displayText(/** @type {import("../types").TreeNode} */ (tree.nodes.get(id)));
  assert.deepEqual([1, 4, 8, 9].map(text), ["h = self.fc(x).relu()", "if h.sum() > 0:", "h = h * 2", "return h"]);
});

test("the lowered view shows every instruction's own text and no statement rows", () => {
  const tree = statementTree(true);
  assert.deepEqual(tree.visibleIds(), [0, 2, 3, 4, 5, 6, 7, 8, 9]);
  const text = (/** @type {number} */ id) => tree.displayText(/** @type {import("../types").TreeNode} */ (tree.nodes.get(id)));
  assert.deepEqual([2, 4, 9].map(text), ["$t1 = CALL fc(x)", "IF $t2:", "RETURN h"]);
  assert.ok(tree.visibleIds().every((id) => tree.nodes.get(id)?.kind !== "s"));
});

test("a statement the user opened shows its instructions in the source view, and the toggle keeps it", () => {
  const tree = statementTree(false);
  tree.markOpen(1, true);
  assert.deepEqual(tree.visibleIds(), [0, 1, 2, 3, 4, 5, 7, 8, 9]);
  tree.lowered = true;
  assert.deepEqual(tree.visibleIds(), [0, 2, 3, 4, 5, 6, 7, 8, 9]);
  tree.lowered = false;
  tree.markOpen(1, false);
  assert.deepEqual(tree.visibleIds(), [0, 1, 4, 5, 7, 8, 9]);
});

test("a step inside a folded statement highlights the statement row; in a folded test, the if row", () => {
  const tree = statementTree(false);
  assert.equal(tree.rowOf(3), 1);
  assert.equal(tree.rowOf(6), 4, "the test of an if shows as the if row");
  assert.equal(tree.rowOf(8), 8, "a one-instruction statement is its own row");
  tree.markOpen(1, true);
  assert.equal(tree.rowOf(3), 3, "an opened statement shows the step's own row");
  tree.lowered = true;
  assert.equal(tree.rowOf(6), 6);
});

test("revealing a step opens compound rows but not folded statements; a search result opens them too", () => {
  const tree = statementTree(false);
  assert.deepEqual(tree.revealPlan(3, [0, 1], false), { open: [0], row: 1 });
  assert.deepEqual(tree.revealPlan(8, [0, 4, 7], false), { open: [0, 4, 7], row: 8 });
  assert.deepEqual(tree.revealPlan(6, [0, 4, 5], false), { open: [0, 4], row: 4 });
  assert.deepEqual(tree.revealPlan(3, [0, 1], true), { open: [0, 1], row: 3 });
  tree.lowered = true;
  assert.deepEqual(tree.revealPlan(3, [0, 1], false), { open: [0], row: 3 }, "a let-through statement is not opened");
});

test("the lowered view fetches the children of let-through statements before drawing a node's children", () => {
  const tree = new TreeModel();
  tree.load(statementRows().filter((r) => r[0] !== 2 && r[0] !== 3));
  tree.open.add(0);
  assert.deepEqual(tree.flatMissing(0), [], "the source view draws a folded statement without its children");
  tree.lowered = true;
  assert.deepEqual(tree.flatMissing(0), [1]);
  assert.deepEqual(tree.visibleIds(), [0, 4, 5, 6, 7, 8, 9], "nothing drawn for it until they arrive");
});

test("unfetched asks for the children of every ancestor not loaded, also of those not known yet", () => {
  const model = new TreeModel();
  model.load([row(0, -1, "B", 2), row(1, 0, "i", 2), row(5, 0, "c", 0)]);  // the first payload: the top level only
  // the chain to node 4 is 0 > 1 > 2; 2 is not known yet, and 1's children are not loaded
  assert.deepEqual(model.unfetched([0, 1, 2]), [1, 2]);
  assert.deepEqual(model.missing([0, 1, 2]), [1]);  // what expanding asks for: known nodes only
  model.load([row(2, 1, "b", 1), row(3, 1, "b", 0), row(4, 2, "o", 0)]);
  assert.deepEqual(model.unfetched([0, 1, 2]), []);
});
