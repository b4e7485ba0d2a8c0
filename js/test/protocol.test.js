import assert from "node:assert/strict";
import { test } from "node:test";
import { createChannel, createStaticModel, staticReply, tablePage } from "../protocol.js";

const COLUMNS = ["step", "name", "mean"];
const ROWS = [
  { step: 1, name: "Alpha", mean: 0.5 },
  { step: 2, name: "beta", mean: null },
  { step: 3, name: "GAMMA", mean: -1 },
  { step: 4, name: "alphabet", mean: 2 },
  { step: 5, name: "delta", mean: "nan" },
];

test("tablePage pages with the last page partial and clamps out-of-range pages", () => {
  assert.deepEqual(tablePage(ROWS, COLUMNS, { size: 2 }).rows, [[1, "Alpha", 0.5], [2, "beta", null]]);
  const last = tablePage(ROWS, COLUMNS, { page: 2, size: 2 });
  assert.deepEqual([last.page, last.pages, last.total, last.rows], [2, 3, 5, [[5, "delta", "nan"]]]);
  assert.equal(tablePage(ROWS, COLUMNS, { page: 99, size: 2 }).page, 2);
  assert.equal(tablePage(ROWS, COLUMNS, { page: -3, size: 2 }).page, 0);
  const exact = tablePage(ROWS.slice(0, 4), COLUMNS, { page: 1, size: 2 });
  assert.deepEqual([exact.pages, exact.rows.length], [2, 2]);
});

test("tablePage of no rows is one empty page", () => {
  assert.deepEqual(tablePage([], COLUMNS, { page: 3 }), { columns: COLUMNS, rows: [], total: 0, page: 0, pages: 1, size: 50 });
});

test("tablePage filters case-insensitively per column and ignores empty filters", () => {
  const page = tablePage(ROWS, COLUMNS, { filters: { name: "ALPHA", step: "" } });
  assert.deepEqual(page.rows.map((r) => r[0]), [1, 4]);
  assert.equal(page.total, 2);
  assert.equal(tablePage(ROWS, COLUMNS, { filters: { name: "zzz" } }).total, 0);
});

test("tablePage sorts numbers numerically and puts null and nan last in both orders", () => {
  assert.deepEqual(tablePage(ROWS, COLUMNS, { sort: "mean" }).rows.map((r) => r[0]), [3, 1, 4, 2, 5]);
  assert.deepEqual(tablePage(ROWS, COLUMNS, { sort: "mean", desc: true }).rows.map((r) => r[0]), [4, 1, 3, 2, 5]);
  assert.deepEqual(tablePage(ROWS, COLUMNS, { sort: "name" }).rows.map((r) => r[1]),
    ["Alpha", "alphabet", "beta", "delta", "GAMMA"]);
  assert.deepEqual(ROWS.map((r) => r.step), [1, 2, 3, 4, 5], "the input rows are not reordered");
});

test("tablePage projects the columns asked for, missing values as null", () => {
  assert.deepEqual(tablePage(ROWS, ["name", "nope"], { size: 1 }).rows, [["Alpha", null]]);
});

function fakeModel() {
  /** @type {Record<string, unknown>[]} */
  const sent = [];
  /** @type {Map<string, ((...args: any[]) => void)[]>} */
  const handlers = new Map();
  const model = {
    get: () => undefined,
    set() {},
    save_changes() {},
    /** @param {string} event @param {(...args: any[]) => void} cb */
    on(event, cb) { handlers.set(event, [...(handlers.get(event) || []), cb]); },
    /** @param {string} event @param {(...args: any[]) => void} cb */
    off(event, cb) { handlers.set(event, (handlers.get(event) || []).filter((h) => h !== cb)); },
    /** @param {Record<string, unknown>} message */
    send(message) { sent.push(message); },
  };
  /** @param {unknown} message */
  const deliver = (message) => (handlers.get("msg:custom") || []).forEach((cb) => cb(message));
  return { model, sent, handlers, deliver };
}

test("a channel request sends its type, arguments and a unique id, and resolves with the reply's data", async () => {
  const { model, sent, deliver } = fakeModel();
  const channel = createChannel(model);
  const first = channel.request("table", { page: 2 });
  const second = channel.request("source");
  assert.equal(sent.length, 2);
  assert.deepEqual({ ...sent[0], id: undefined }, { page: 2, type: "table", id: undefined });
  assert.equal(sent[1].type, "source");
  assert.notEqual(sent[0].id, sent[1].id);
  assert.match(String(sent[0].id), /^[a-z0-9]+-1$/);
  deliver({ type: "reply", id: sent[1].id, ok: true, data: "second" });
  deliver({ type: "reply", id: sent[0].id, ok: true, data: { rows: [] } });
  assert.deepEqual(await first, { rows: [] });
  assert.equal(await second, "second");
});

test("a refused request rejects with the kernel's error; strangers' replies and other messages are ignored", async () => {
  const { model, sent, deliver } = fakeModel();
  const channel = createChannel(model);
  const refused = channel.request("edit");
  deliver({ type: "reply", id: "someone-else-1", ok: true, data: 1 });
  deliver({ type: "state", id: sent[0].id });
  deliver(null);
  deliver({ type: "reply", id: sent[0].id, ok: false, error: "bad edit" });
  await assert.rejects(refused, /bad edit/);
  const bare = channel.request("edit");
  deliver({ type: "reply", id: sent[1].id, ok: false });
  await assert.rejects(bare, /the kernel refused the request/);
});

test("disposing a channel unsubscribes and rejects what is pending", async () => {
  const { model, handlers } = fakeModel();
  const channel = createChannel(model);
  const pending = channel.request("step");
  assert.equal(handlers.get("msg:custom")?.length, 1);
  channel.dispose();
  assert.equal(handlers.get("msg:custom")?.length, 0);
  await assert.rejects(pending, /the view was closed/);
});

/** @returns {import("../types").StaticData} */
function staticData() {
  return {
    traits: { title: "t", status: "static", tree: { rows: [[0, -1, "B", "root", "", 0, 1, "", null], [1, 0, "o", "x", "", 3, 0, "add", null]], total: 2, root: 0 } },
    sources: { 0: { text: "def forward(x):", first: 1 } },
    trace: { run: "base", columns: ["step", "out_var"], rows: [{ step: 1, out_var: "x" }, { step: 2, out_var: "y" }] },
    hists: { 2: { activation: { edges: [0, 1], counts: [3] } } },
  };
}

test("the static page answers children (the rows under the nodes asked for), source, table and hist from its data", () => {
  const data = staticData();
  assert.deepEqual(staticReply(data, { type: "children", id: "a", nodes: [0, 7] }),
    { type: "reply", id: "a", ok: true, data: { rows: [data.traits.tree.rows[1]] } });
  assert.deepEqual(staticReply(data, { type: "source", id: "b", block: 0 }).data, { text: "def forward(x):", first: 1 });
  const source = staticReply(data, { type: "source", id: "c", block: 5 });
  assert.deepEqual([source.ok, source.error], [false, "no source for block 5 on this page"]);
  const table = staticReply(data, { type: "table", id: "d", size: 1, page: 1 });
  assert.deepEqual(table.data, { columns: ["step", "out_var"], rows: [[2, "y"]], total: 2, page: 1, pages: 2, size: 1, run: "base" });
  assert.equal(staticReply(data, { type: "hist", id: "e", trace_step: 2 }).data.activation.counts[0], 3);
  assert.equal(staticReply(data, { type: "hist", id: "f", step_index: 2 }).ok, false);
  assert.equal(staticReply({ ...data, trace: null }, { type: "table", id: "g" }).error, "this page holds no trace");
});

test("the static page refuses what needs a kernel", () => {
  for (const type of ["step", "continue", "edit", "compare"]) {
    const reply = staticReply(staticData(), { type, id: "x" });
    assert.equal(reply.ok, false);
    assert.match(String(reply.error), /needs? a running kernel/);
  }
});

test("the static model holds the traits in static mode and replies asynchronously through msg:custom", async () => {
  const model = createStaticModel(staticData());
  assert.equal(model.get("mode"), "static");
  assert.equal(model.get("title"), "t");
  model.set("title", "u");
  assert.equal(model.get("title"), "u");
  /** @type {unknown[]} */
  const got = [];
  /** @param {unknown} message */
  const listener = (message) => got.push(message);
  model.on("msg:custom", listener);
  model.send({ type: "source", id: "q", block: 0 });
  assert.equal(got.length, 0, "the reply comes after send returns");
  await new Promise((resolve) => setTimeout(resolve, 5));
  assert.deepEqual(got, [{ type: "reply", id: "q", ok: true, data: { text: "def forward(x):", first: 1 } }]);
  model.off("msg:custom", listener);
  model.send({ type: "source", id: "r", block: 0 });
  await new Promise((resolve) => setTimeout(resolve, 5));
  assert.equal(got.length, 1);
});

test("a channel over the static model gets its replies", async () => {
  const channel = createChannel(createStaticModel(staticData()));
  assert.equal((await channel.request("table", { size: 10 })).total, 2);
  await assert.rejects(channel.request("step"), /running kernel/);
});

/** @returns {import("../types").StaticData} */
function twoRunData() {
  const sep = "\u0000";
  const row = (/** @type {string} */ v, /** @type {boolean} */ changed) => ({ container_id: v, status: "ok", changed, out_var: v, step_a: 1, step_b: 1 });
  return {
    ...staticData(),
    traits: { ...staticData().traits, compare_pairs: [["base", "fork 1"]] },
    traces: { base: staticData().trace || { run: "base", columns: [], rows: [] }, "fork 1": { run: "fork 1", columns: ["step", "out_var"], rows: [{ step: 1, out_var: "z" }] } },
    run_hists: { "fork 1": { 1: { run: "fork 1" } } },
    compares: { [`base${sep}fork 1`]: { a: "base", b: "fork 1", summary: { total: 3 }, first: row("b", true), first_index: 1, pairs: 3,
      rows: [row("a", false), row("b", true), row("c", true)] } },
    compare_columns: ["container_id", "status", "changed", "out_var", "step_a", "step_b"],
    tensors: { [`fork 1${sep}1${sep}`]: { dims: [0, 1], values: [1, 2] }, [`fork 1${sep}1${sep}base`]: { dims: [0, 1], values: [0, 1], scale: "diverging" } },
    sep,
  };
}

test("a static page with two runs compares them offline: paging, only differences and the jump to the first divergence", () => {
  const data = twoRunData();
  const all = staticReply(data, { type: "compare", id: "c1", size: 2 });
  assert.equal(all.ok, true);
  assert.deepEqual([all.data.a, all.data.b, all.data.total, all.data.pages, all.data.first_index], ["base", "fork 1", 3, 2, 1]);
  const only = staticReply(data, { type: "compare", id: "c2", only_changed: true, size: 50 });
  assert.deepEqual(only.data.rows.map((/** @type {unknown[]} */ r) => r[0]), ["b", "c"]);
  assert.equal(only.data.first_index, 0);
  const jump = staticReply(data, { type: "compare", id: "c3", size: 1, jump: true });
  assert.deepEqual([jump.data.page, jump.data.rows[0][0]], [1, "b"]);
  const other = staticReply(data, { type: "compare", id: "c4", a: "fork 1", b: "base" });
  assert.match(String(other.error), /holds the comparisons base vs fork 1, not fork 1 vs base/);
});

test("a static page serves each run's trace, histograms and stored heatmaps, and names what it does not hold", () => {
  const data = twoRunData();
  assert.equal(staticReply(data, { type: "table", id: "t", run: "fork 1" }).data.rows[0][1], "z");
  assert.equal(staticReply(data, { type: "hist", id: "h", run: "fork 1", trace_step: 1 }).data.run, "fork 1");
  assert.deepEqual(staticReply(data, { type: "tensor", id: "v", run: "fork 1", trace_step: 1 }).data.values, [1, 2]);
  assert.equal(staticReply(data, { type: "tensor", id: "d", run: "fork 1", trace_step: 1, against: "base" }).data.scale, "diverging");
  assert.match(String(staticReply(data, { type: "tensor", id: "m", run: "fork 1", trace_step: 9 }).error), /no heatmap of fork 1 trace step 9/);
  assert.match(String(staticReply(data, { type: "tensor", id: "s", run: "fork 1", trace_step: 1, dims: [1, 0] }).error), /other dims need a running kernel/);
});
