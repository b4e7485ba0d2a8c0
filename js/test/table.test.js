import assert from "node:assert/strict";
import { test } from "node:test";
import { cell, movePage, pageStatus, sortAfterClick } from "../table.js";

test("an empty table shows 0 / 0 with both buttons disabled", () => {
  assert.deepEqual(pageStatus({ total: 0, page: 0, pages: 1 }), { label: "0 / 0 · 0 tensors", prevDisabled: true, nextDisabled: true });
});

test("a single page disables both buttons", () => {
  assert.deepEqual(pageStatus({ total: 7, page: 0, pages: 1 }), { label: "1 / 1 · 7 tensors", prevDisabled: true, nextDisabled: true });
});

test("the first, a middle and the last of several pages", () => {
  assert.deepEqual(pageStatus({ total: 60, page: 0, pages: 3 }), { label: "1 / 3 · 60 tensors", prevDisabled: true, nextDisabled: false });
  assert.deepEqual(pageStatus({ total: 60, page: 1, pages: 3 }), { label: "2 / 3 · 60 tensors", prevDisabled: false, nextDisabled: false });
  assert.deepEqual(pageStatus({ total: 60, page: 2, pages: 3 }), { label: "3 / 3 · 60 tensors", prevDisabled: false, nextDisabled: true });
});

test("moving pages never goes below the first", () => {
  assert.equal(movePage(0, -1), 0);
  assert.equal(movePage(3, -1), 2);
  assert.equal(movePage(3, 1), 4);
  assert.equal(movePage(1, -5), 0);
});

test("clicking a header sorts by it ascending, clicking again flips the order", () => {
  assert.deepEqual(sortAfterClick({ sort: "", desc: false }, "mean"), { sort: "mean", desc: false });
  assert.deepEqual(sortAfterClick({ sort: "mean", desc: false }, "mean"), { sort: "mean", desc: true });
  assert.deepEqual(sortAfterClick({ sort: "mean", desc: true }, "mean"), { sort: "mean", desc: false });
  assert.deepEqual(sortAfterClick({ sort: "mean", desc: true }, "std"), { sort: "std", desc: false });
});

test("cells: numbers formatted, shapes bracketed, dtypes without torch., missing values empty", () => {
  assert.equal(cell("mean", 0.123456), "0.1235");
  assert.equal(cell("step", 12), "12");
  assert.equal(cell("std", null), "");
  assert.equal(cell("shape", [2, 256]), "[2, 256]");
  assert.equal(cell("shape", []), "[]");
  assert.equal(cell("shape", null), "");
  assert.equal(cell("dtype", "torch.float32"), "float32");
  assert.equal(cell("out_var", undefined), "");
  assert.equal(cell("op_name", "linear"), "linear");
});
