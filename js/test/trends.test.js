import { test } from "node:test";
import assert from "node:assert/strict";
import { layerX } from "../trends.js";

test("layerX puts a point at its layer number, not at its index in the series", () => {
  const x = layerX([0, 1, 2, 3, 4, 5, 6, 7], 40, 110);
  // a paused run that returned from layers 0..2 only: its points sit at 0, 1, 2 of the 8-layer axis
  assert.deepEqual([0, 1, 2].map(x), [40, 50, 60]);
  assert.equal(x(7), 110);
  assert.equal(layerX([3], 0, 100)(3), 50);
});
