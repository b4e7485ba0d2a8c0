import assert from "node:assert/strict";
import { test } from "node:test";
import { fmt } from "../dom.js";

test("fmt: 4 significant digits, integers as they are, exponents for the very large and small", () => {
  assert.equal(fmt(3.14159265), "3.142");
  assert.equal(fmt(42), "42");
  assert.equal(fmt(-999999), "-999999");
  assert.equal(fmt(1234567), "1.235e+6");
  assert.equal(fmt(123456.7), "1.235e+5");
  assert.equal(fmt(0.0001234), "1.234e-4");
  assert.equal(fmt(0.001), "0.001");
  assert.equal(fmt(0), "0");
  assert.equal(fmt(0.5), "0.5");
});

test("fmt: strings, booleans, non-finite and missing values", () => {
  assert.equal(fmt("nan"), "nan");
  assert.equal(fmt(true), "yes");
  assert.equal(fmt(false), "");
  assert.equal(fmt(Infinity), "Infinity");
  assert.equal(fmt(NaN), "NaN");
  assert.equal(fmt(null), "");
  assert.equal(fmt(undefined), "");
  assert.equal(fmt(""), "");
});
