import { test } from "node:test";
import assert from "node:assert/strict";
import { routingCells } from "../routing.js";

test("routingCells flattens the token x expert matrix row-major and finds its largest weight", () => {
  const layer = { weights: [[0, 0.25, 0.75], [0.5, 0, 0.5]] };
  assert.deepEqual(routingCells(layer), { rows: 2, cols: 3, values: [0, 0.25, 0.75, 0.5, 0, 0.5], max: 0.75, min: 0.25 });
  assert.deepEqual(routingCells({ weights: [] }), { rows: 0, cols: 0, values: [], max: 0, min: 0 });
});
