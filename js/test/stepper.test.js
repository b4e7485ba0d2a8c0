import { test } from "node:test";
import assert from "node:assert/strict";

import { SHORTCUTS } from "../stepper.js";

test("s and i step into (stopping before a call), o steps over, u steps out; the old keys stay", () => {
  assert.equal(SHORTCUTS.s, "step");
  assert.equal(SHORTCUTS.i, "step_into");
  assert.equal(SHORTCUTS.o, "step_over");
  assert.equal(SHORTCUTS.u, "step_out");
  assert.equal(SHORTCUTS.c, "continue");
  assert.equal(SHORTCUTS.r, "reset");
});
