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

test("compound statements and branches open by default once loaded; blocks, calls and ops do not", () => {
  const tree = new TreeModel();
  tree.load(ROWS.slice(0, 4));
  const open = (/** @type {number} */ id) => tree.isOpen(/** @type {import("../types").TreeNode} */ (tree.nodes.get(id)));
  assert.equal(open(1), true);
  assert.equal(open(2), false, "a branch whose child is not loaded yet stays closed");
  assert.equal(open(0), false);
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
