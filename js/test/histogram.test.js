import assert from "node:assert/strict";
import { test } from "node:test";
import { histogramLayout } from "../histogram.js";

test("bars are scaled to the tallest bin and placed by bin", () => {
  const layout = histogramLayout({ edges: [-1, 0, 1, 2, 3], counts: [2, 0, 8, 4] }, 100, 54);
  assert.deepEqual([layout.lo, layout.hi, layout.n, layout.peak, layout.nonfinite], [-1, 3, 14, 8, 0]);
  assert.deepEqual(layout.bars.map((b) => b.i), [0, 2, 3], "an empty bin draws no bar");
  const [first, tallest, last] = layout.bars;
  assert.deepEqual(tallest, { i: 2, count: 8, x: 50.5, y: 4, width: 24, height: 50, from: 1, to: 2 });
  assert.equal(first.height, 12.5);
  assert.equal(first.y, 41.5);
  assert.equal(last.height, 25);
  assert.deepEqual([last.from, last.to], [2, 3]);
  for (const bar of layout.bars) assert.equal(bar.y + bar.height, 54, "bars stand on the bottom edge");
});

test("empty data: all bins zero draws no bars and counts no values", () => {
  const layout = histogramLayout({ edges: [0, 1, 2], counts: [0, 0] }, 260, 90);
  assert.deepEqual(layout.bars, []);
  assert.equal(layout.n, 0);
  assert.equal(layout.peak, 1, "the scale never divides by zero");
});

test("constant data: one bin holds every value and is drawn full height and width", () => {
  const layout = histogramLayout({ edges: [0.5, 0.5], counts: [10] }, 260, 90);
  assert.deepEqual([layout.lo, layout.hi, layout.n], [0.5, 0.5, 10]);
  assert.deepEqual(layout.bars, [{ i: 0, count: 10, x: 0.5, y: 4, width: 259, height: 86, from: 0.5, to: 0.5 }]);
});

test("non-finite values count in n but draw no bar", () => {
  const layout = histogramLayout({ edges: [0, 1], counts: [3], n_nan: 2, n_inf: 1 }, 10, 10);
  assert.deepEqual([layout.n, layout.nonfinite, layout.bars.length], [6, 3, 1]);
  assert.equal(histogramLayout({ edges: [0, 1], counts: [0], n_nan: 4 }, 10, 10).n, 4);
});

test("a tiny bin is at least 1 unit tall and a narrow one at least 1 unit wide", () => {
  const counts = Array.from({ length: 500 }, (_, i) => (i === 0 ? 100000 : i === 1 ? 1 : 0));
  const edges = Array.from({ length: 501 }, (_, i) => i);
  const layout = histogramLayout({ edges, counts }, 260, 90);
  assert.equal(layout.bars[1].height, 1);
  assert.equal(layout.bars[1].width, 1);
  assert.ok(layout.bars[1].x > layout.bars[0].x);
});
