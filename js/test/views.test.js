import { test } from "node:test";
import assert from "node:assert/strict";
import { cellText, divergingColour } from "../patch.js";
import { lineLabel, logPosition } from "../diverge.js";

test("divergingColour: red above 0, blue below, no colour at 0, strength |value| / scale", () => {
  assert.equal(divergingColour(0.5, 1), "rgba(178, 24, 43, 0.500)");
  assert.equal(divergingColour(-1, 1), "rgba(33, 102, 172, 1.000)");
  assert.equal(divergingColour(-3, 1), "rgba(33, 102, 172, 1.000)");  // clipped at the scale
  assert.equal(divergingColour(0, 1), "rgba(178, 24, 43, 0.000)");
  assert.equal(divergingColour(0.2, 0), "rgba(178, 24, 43, 0.000)");  // a sweep of zeros
  assert.match(divergingColour(null, 1), /repeating-linear-gradient/);  // no value: hatched, not a colour
});

test("cellText reads a cell out: site, layer, position, effect and the estimate", () => {
  const data = { rows: [{ site: "transformer.h.1:output", layer: 1 }], cols: [0, 5], col_axis: "position", attribution: true };
  assert.equal(cellText(data, { row: 0, col: 1, effect: 0.02072, attribution: 0.02003 }),
    "transformer.h.1:output · layer 1 · position 5 · effect 0.02072 · attribution 0.02003");
  const whole = { rows: [{ site: "MLP:hidden", layer: null }], cols: [0], col_axis: "value", attribution: false };
  assert.equal(cellText(whole, { row: 0, col: 0, effect: -1.5 }), "MLP:hidden · effect -1.5");
});

test("logPosition places an error on the bar's log scale; zero and missing errors are empty", () => {
  assert.equal(logPosition(1e-5, [-7, -3]), 0.5);
  assert.equal(logPosition(1e-9, [-7, -3]), 0);
  assert.equal(logPosition(1, [-7, -3]), 1);
  assert.equal(logPosition(0, [-7, -3]), 0);
  assert.equal(logPosition(null, [-7, -3]), 0);
});

test("lineLabel says the line, status, statement, variable, error and whether it is above the bound", () => {
  const row = { line: 310, status: "edited", text: "h = r + f.to(torch.bfloat16).float()", var: "h", local: 5.66e-4, bound: 9.537e-7, flagged: true };
  assert.equal(lineLabel(row), "line 310 edited: h = r + f.to(torch.bfloat16).float() [h] local error 5.660e-4, bound 9.537e-7, above the bound");
  assert.equal(lineLabel({ ...row, local: null, bound: null, flagged: false, status: "deleted" }),
    "line 310 deleted: h = r + f.to(torch.bfloat16).float() [h] no local error");
  // a compiled b's line names the region compiled to measure it
  assert.equal(lineLabel({ ...row, status: "matched", region_text: "block h.0.mlp.act" }),
    "line 310 matched: h = r + f.to(torch.bfloat16).float() [h] local error 5.660e-4, bound 9.537e-7, above the bound, compiled: block h.0.mlp.act");
});
