import assert from "node:assert/strict";
import { test } from "node:test";
import { cellAt, cellColour, cellHeight, cellSize, colourAt, fullIndex, scaleT } from "../heatmap.js";
import { tokenLabel } from "../attention.js";
import { linePoints } from "../trends.js";

test("the sequential scale runs from the first to the last viridis stop, clamped outside [0, 1]", () => {
  assert.deepEqual(colourAt(0, "sequential"), [68, 1, 84]);
  assert.deepEqual(colourAt(1, "sequential"), [253, 231, 37]);
  assert.deepEqual(colourAt(-3, "sequential"), colourAt(0, "sequential"));
  assert.deepEqual(colourAt(9, "sequential"), colourAt(1, "sequential"));
  assert.deepEqual(colourAt(0.125, "sequential"), [64, 42, 112], "halfway between the first two stops");
});

test("the diverging scale is white at its middle, blue below and red above", () => {
  assert.deepEqual(colourAt(0.5, "diverging"), [247, 247, 247]);
  const [rl, , bl] = colourAt(0, "diverging");
  const [rh, , bh] = colourAt(1, "diverging");
  assert.ok(bl > rl && rh > bh);
});

test("values map into the range; a constant slice sits in the middle; NaN is grey", () => {
  assert.equal(scaleT(5, 0, 10), 0.5);
  assert.equal(scaleT(-2, -2, 2), 0);
  assert.equal(scaleT(0, -2, 2), 0.5, "a symmetric diverging range keeps 0 in the middle");
  assert.equal(scaleT(3, 3, 3), 0.5);
  assert.equal(scaleT("nan", 0, 1), null);
  assert.equal(scaleT(1, null, null), null);
  assert.equal(cellColour("inf", 0, 1, "sequential"), "rgb(128, 128, 128)");
  assert.equal(cellColour(10, 0, 10, "sequential"), "rgb(253, 231, 37)");
});

test("the cell under the pointer follows the drawing's size; outside is none", () => {
  assert.deepEqual(cellAt(0, 0, 100, 50, 5, 10), { r: 0, c: 0 });
  assert.deepEqual(cellAt(99.9, 49.9, 100, 50, 5, 10), { r: 4, c: 9 });
  assert.deepEqual(cellAt(35, 12, 100, 50, 5, 10), { r: 1, c: 3 });
  assert.equal(cellAt(100, 10, 100, 50, 5, 10), null);
  assert.equal(cellAt(-1, 10, 100, 50, 5, 10), null);
});

test("a shown cell's full index puts the original row and column ids into the fixed index", () => {
  const view = { index: [1, null, 2, null], dims: [3, 1], row_ids: [0, 4, 8], col_ids: [0, 2] };
  assert.deepEqual(fullIndex(view, 2, 1), [1, 2, 2, 8]);
  const line = { index: [3, null], dims: [1], row_ids: [0], col_ids: [0, 1, 2] };
  assert.deepEqual(fullIndex(line, 0, 2), [3, 2]);
});

test("cells fit the box, at least 1 and at most 28 pixels", () => {
  assert.equal(cellSize(4, 5, 500, 320), 28);
  assert.equal(cellSize(128, 128, 400, 320), 2);
  assert.equal(cellSize(1000, 1000, 300, 300), 1);
});

test("token labels carry position and id when known", () => {
  assert.equal(tokenLabel(["3", "14"], 1), "1:14");
  assert.equal(tokenLabel(null, 4), "4");
  assert.equal(tokenLabel(["3"], 2), "2");
});

test("line points share a range, skip missing values and keep a padded box", () => {
  const { points, lo, hi } = linePoints([0, 5, null, 10], 100, 20, { pad: 0 });
  assert.deepEqual([lo, hi], [0, 10]);
  assert.deepEqual(points, [[0, 20], [33.33, 10], [100, 0]]);
  const flat = linePoints([2, 2], 50, 10);
  assert.deepEqual(flat.points.map((p) => p[1]), [5, 5], "a constant line sits in the middle");
  const shared = linePoints([1], 50, 10, { lo: 0, hi: 2, pad: 0 });
  assert.deepEqual(shared.points, [[25, 5]]);
});

test("tree focus moves by arrows and Home / End, and stops at either end", async () => {
  const { moveFocus } = await import("../treekeys.js");
  assert.equal(moveFocus("ArrowDown", 0, 3), 1);
  assert.equal(moveFocus("ArrowUp", 1, 3), 0);
  assert.equal(moveFocus("ArrowUp", 0, 3), null);
  assert.equal(moveFocus("ArrowDown", 2, 3), null);
  assert.equal(moveFocus("Home", 2, 3), 0);
  assert.equal(moveFocus("End", 0, 3), 2);
  assert.equal(moveFocus("x", 0, 3), null);
  assert.equal(moveFocus("End", 0, 0), null);
});

test("a slice of few rows gets taller cells, never shorter than wide", () => {
  assert.equal(cellHeight(2, 8, 160), 28);
  assert.equal(cellHeight(10, 8, 160), 16);
  assert.equal(cellHeight(128, 2, 160), 2);
  assert.equal(cellHeight(4, 28, 40), 28);
});

test("tree tints: a divergence of zero is no tint, the largest value is the top of the scale", async () => {
  const { rowTint } = await import("../treecolour.js");
  assert.equal(rowTint(0, 0, 5, true), "");
  assert.equal(rowTint(5, 0, 5, true), "rgba(253, 231, 37, 0.45)");
  assert.equal(rowTint(2, 2, 9, false), "rgba(68, 1, 84, 0.45)");
  assert.equal(rowTint(3, 3, 3, false, 1), "rgba(253, 231, 37, 1)");
});
