import { test } from "node:test";
import assert from "node:assert/strict";

import { explainError, moveSelection } from "../debugger.js";
import { columnPieces } from "../source.js";

test("a send on a restarted kernel reads as a restart, other errors pass through", () => {
  assert.deepEqual(explainError(new Error("Cannot send")), { text: "kernel restarted: re-run the cell to inspect again", restarted: true });
  assert.deepEqual(explainError(new Error("no block at 'h.9'")), { text: "no block at 'h.9'", restarted: false });
});

test("arrow keys move the search selection within the results", () => {
  assert.equal(moveSelection("ArrowDown", 0, 3), 1);
  assert.equal(moveSelection("ArrowDown", 2, 3), 2);
  assert.equal(moveSelection("ArrowUp", 0, 3), 0);
  assert.equal(moveSelection("End", 0, 3), 2);
  assert.equal(moveSelection("Home", 2, 3), 0);
  assert.equal(moveSelection("Enter", 1, 3), null);
  assert.equal(moveSelection("ArrowDown", -1, 0), null);
});

test("the column range splits the current line around the instruction", () => {
  const line = "        h = self.fc(x)";
  assert.deepEqual(columnPieces(line, 12, 22, false), ["        h = ", "self.fc(x)", ""]);
  assert.deepEqual(columnPieces(line, 12, 3, true), ["        h = ", "self.fc(x)", ""]);  // goes on to a later line
  assert.deepEqual(columnPieces(line, undefined, undefined, false), [line, "", ""]);
  assert.deepEqual(columnPieces(line, 40, 50, false), [line, "", ""]);
});
