import { test } from "node:test";
import assert from "node:assert/strict";
import { badgeWords, compareText, filterRows, logicalSummary, rowReadout, shapeText } from "../logical.js";

test("badgeWords spells a placement badge out and names the kind that colours it", () => {
  assert.deepEqual(badgeWords("S(0)@dp"), { text: "Shard(0) over dp", kind: "shard" });
  assert.deepEqual(badgeWords("R"), { text: "Replicate", kind: "replicate" });
  assert.deepEqual(badgeWords("P(sum)@tp"), { text: "Partial(sum) over tp", kind: "partial" });
  assert.deepEqual(badgeWords("S(0)@dp·P(sum)@tp"), { text: "Shard(0) over dp, Partial(sum) over tp", kind: "partial" });
  assert.deepEqual(badgeWords("S(0)@dp·R@tp"), { text: "Shard(0) over dp, Replicate over tp", kind: "shard" });
  assert.deepEqual(badgeWords("?@dp"), { text: "unknown over dp", kind: "unknown" });
  assert.deepEqual(badgeWords(""), { text: "local", kind: "local" });
});

test("compareText: exact, a max abs diff (a sum over shards or unexpected), or nothing", () => {
  assert.deepEqual(compareText({ exact: true, max_abs_diff: 0, reason: "equal" }), { text: "exact", state: "exact" });
  assert.deepEqual(compareText({ exact: false, max_abs_diff: 2.98e-8, reason: "a partial sum; gathered, ..." }),
    { text: "max abs diff 2.980e-8", state: "sum-order" });
  assert.deepEqual(compareText({ exact: false, max_abs_diff: 0.5, reason: "UNEXPECTED: differs" }),
    { text: "max abs diff 0.5", state: "unexpected" });
  assert.deepEqual(compareText({ exact: false, max_abs_diff: null, reason: "shape or dtype differs" }), { text: "differs", state: "unexpected" });
  assert.deepEqual(compareText({ exact: null, max_abs_diff: null, reason: "the reference kept no value" }), { text: "not compared", state: "none" });
  assert.deepEqual(compareText(null), { text: "", state: "none" });
});

const ROWS = [
  { step: 1, var: "input_ids", block: "", badge: "S(0)@dp", placement: "sharded on tensor dim 0 over mesh dim 'dp'",
    local_shape: [1, 6], logical_shape: [2, 6], stats: { mean: 1 }, note: null, compare: { exact: true, max_abs_diff: 0, reason: "equal" } },
  { step: 2, var: "cos", block: "model.rotary_emb", badge: "R", placement: "replicated over mesh dim 'dp'",
    local_shape: [1, 6, 8], logical_shape: [1, 6, 8], stats: { mean: 0.5 }, note: null,
    compare: { exact: false, max_abs_diff: 3e-8, reason: "UNEXPECTED: differs although no sum over shards is involved" } },
  { step: 3, var: "logits", block: "lm", badge: "?@dp", placement: "unknown over mesh dim 'dp'", local_shape: [1, 6, 64],
    logical_shape: null, stats: null, note: "placement unknown (derived): the whole value cannot be gathered", compare: null },
];

test("logicalSummary counts the gathered values and the exact ones of those compared", () => {
  const data = { root: "Llama", mesh: { dims: ["dp"], shape: [2] }, ranks: 2, compared: true, exact: 1, rows: ROWS };
  assert.equal(logicalSummary(data),
    "3 values of Llama on a mesh dp=2 (2 ranks): 2 gathered whole, 1 with an unknown placement or no value; against one process: 1 of 2 exact");
  assert.equal(logicalSummary({ ...data, compared: false, rows: ROWS.slice(0, 2) }), "2 values of Llama on a mesh dp=2 (2 ranks): 2 gathered whole");
});

test("filterRows matches variable, block, badge and its words, case-insensitive", () => {
  assert.deepEqual(filterRows(ROWS, "").map((r) => r.step), [1, 2, 3]);
  assert.deepEqual(filterRows(ROWS, "ROTARY").map((r) => r.step), [2]);
  assert.deepEqual(filterRows(ROWS, "shard(0)").map((r) => r.step), [1]);
  assert.deepEqual(filterRows(ROWS, "replicate").map((r) => r.step), [2]);
  assert.deepEqual(filterRows(ROWS, "unknown").map((r) => r.step), [3]);
});

test("rowReadout says the placement, both shapes, a note and the comparison with its reason", () => {
  assert.equal(rowReadout(ROWS[0], "model"), "input_ids (model, step 1): Shard(0) over dp: sharded on tensor dim 0 over mesh dim 'dp'; " +
    "local [1, 6], whole [2, 6]. Against one process: exact");
  assert.match(rowReadout(ROWS[1]), /Against one process: max abs diff 3.000e-8 \(UNEXPECTED: differs/);
  assert.equal(rowReadout(ROWS[2]), "logits (lm, step 3): unknown over dp: unknown over mesh dim 'dp'; local [1, 6, 64]. " +
    "placement unknown (derived): the whole value cannot be gathered");
  assert.equal(shapeText(null), "");
});
