import { test } from "node:test";
import assert from "node:assert/strict";
import { routingCells, tokenRoute } from "../routing.js";

const layer = { experts: [0, 1, 2], weights: [[0, 0.25, 0.75], [0.5, 0, 0.5]] };

test("routingCells flattens the token x expert matrix row-major and finds its largest weight", () => {
  assert.deepEqual(routingCells(layer), { rows: 2, cols: 3, values: [0, 0.25, 0.75, 0.5, 0, 0.5], max: 0.75 });
  assert.deepEqual(routingCells({ weights: [] }), { rows: 0, cols: 0, values: [], max: 0 });
});

test("tokenRoute lists the experts a token went to, highest weight first, and leaves out the others", () => {
  assert.match(tokenRoute(layer, 0), /^expert 2 \(0\.75\d*\), expert 1 \(0\.25\d*\)$/);
  assert.doesNotMatch(tokenRoute(layer, 1), /expert 1/);
});
