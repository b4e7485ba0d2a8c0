// The request/reply protocol over the widget's custom messages, and the stand-in model of the
// static page (to_html), which answers the same requests from data embedded in the page.

/**
 * @param {import("./types").Model} model
 * @returns {import("./types").Channel}
 */
export function createChannel(model) {
  // Every view of a widget receives every reply, so ids carry a per-view prefix.
  const prefix = Math.random().toString(36).slice(2, 10);
  let nextId = 1;
  /** @type {Map<string, { resolve: (data: any) => void, reject: (err: Error) => void }>} */
  const pending = new Map();
  /** @param {import("./types").Reply} message */
  const onMessage = (message) => {
    if (!message || message.type !== "reply" || !pending.has(message.id)) return;
    const { resolve, reject } = /** @type {{ resolve: (data: any) => void, reject: (err: Error) => void }} */ (pending.get(message.id));
    pending.delete(message.id);
    if (message.ok) resolve(message.data);
    else reject(new Error(message.error || "the kernel refused the request"));
  };
  model.on("msg:custom", onMessage);
  return {
    request(type, args = {}) {
      const id = `${prefix}-${nextId++}`;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        model.send({ ...args, type, id });
      });
    },
    dispose() {
      model.off("msg:custom", onMessage);
      for (const { reject } of pending.values()) reject(new Error("the view was closed"));
      pending.clear();
    },
  };
}

/**
 * @param {unknown} value
 * @returns {[number, any]}
 */
function sortKey(value) {
  if (value === null || value === undefined || value === "nan") return [1, 0];
  return [0, value];
}

// Filter (case-insensitive substring per column), sort and page rows given as objects; mirrors
// messages.table_page on the Python side.
/**
 * @param {Record<string, any>[]} rows
 * @param {string[]} columns
 * @param {import("./types").TableQuery} [query]
 * @returns {import("./types").TablePage}
 */
export function tablePage(rows, columns, { page = 0, size = 50, sort = "", desc = false, filters = {} } = {}) {
  let selected = rows;
  for (const [column, needle] of Object.entries(filters || {})) {
    if (!needle) continue;
    const lower = String(needle).toLowerCase();
    selected = selected.filter((row) => String(row[column] ?? "").toLowerCase().includes(lower));
  }
  if (sort) {
    selected = [...selected].sort((a, b) => {
      const [ga, va] = sortKey(a[sort]);
      const [gb, vb] = sortKey(b[sort]);
      if (ga !== gb) return ga - gb;
      const order = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
      return desc ? -order : order;
    });
  }
  const total = selected.length;
  const pages = Math.max(1, Math.ceil(total / size));
  const current = Math.max(0, Math.min(page, pages - 1));
  const chunk = selected.slice(current * size, (current + 1) * size);
  return { columns, rows: chunk.map((row) => columns.map((c) => row[c] ?? null)), total, page: current, pages, size };
}

/**
 * The static page's answer to "compare": a stored comparison of two runs (base vs each fork, and the
 * last pair compared in the notebook), filtered and paged as messages.on_compare does.
 * @param {import("./types").StaticData} data
 * @param {Record<string, any>} message
 * @param {(payload: unknown) => import("./types").Reply} ok
 * @param {(error: string) => import("./types").Reply} fail
 */
export function staticCompare(data, message, ok, fail) {
  const pairs = /** @type {string[][]} */ (data.traits.compare_pairs || []);
  if (!pairs.length || !data.compares) return fail("this page holds no comparison (it was written with one run): comparing runs needs a running kernel");
  const sep = data.sep || "\u0000";
  const a = message.a || pairs[0][0];
  const b = message.b || (pairs.find((p) => p[0] === a) || pairs[pairs.length - 1])[1];
  const stored = data.compares[[a, b].join(sep)];
  if (!stored) return fail(`this page holds the comparisons ${pairs.map((p) => `${p[0]} vs ${p[1]}`).join(", ")}, not ${a} vs ${b}`);
  const only = Boolean(message.only_changed);
  const rows = only ? stored.rows.filter((/** @type {any} */ r) => r.status !== "ok" || r.changed) : stored.rows;
  let firstIndex = stored.first_index;
  if (only && firstIndex !== null && firstIndex !== undefined) firstIndex = 0;
  const size = Math.max(1, Math.min(Number(message.size) || 50, 500));
  let page = Number(message.page) || 0;
  if (message.jump && firstIndex !== null && firstIndex !== undefined) page = Math.floor(firstIndex / size);
  const result = tablePage(rows, data.compare_columns || [], { page, size });
  return ok({ ...result, a: stored.a, b: stored.b, summary: stored.summary, first: stored.first, pairs: stored.pairs, first_index: firstIndex });
}

/**
 * The reply the static page gives to a request, from the data embedded in the page.
 * @param {import("./types").StaticData} data
 * @param {Record<string, any>} message
 * @returns {import("./types").Reply}
 */
export function staticReply(data, message) {
  /** @param {string} error @returns {import("./types").Reply} */
  const fail = (error) => ({ type: "reply", id: message.id, ok: false, error });
  /** @param {unknown} payload @returns {import("./types").Reply} */
  const ok = (payload) => ({ type: "reply", id: message.id, ok: true, data: payload });
  switch (message.type) {
    case "children": {
      const wanted = new Set(message.nodes || []);
      return ok({ rows: data.traits.tree.rows.filter((row) => wanted.has(row[1])) });
    }
    case "source": {
      const source = data.sources[String(message.block)];
      return source ? ok(source) : fail(`no source for block ${message.block} on this page`);
    }
    case "table": {
      const trace = message.run && data.traces ? data.traces[message.run] : data.trace;
      if (!trace) return fail(message.run ? `this page holds no trace of run ${message.run}` : "this page holds no trace");
      const result = tablePage(trace.rows, trace.columns, message);
      return ok({ ...result, run: trace.run });
    }
    case "hist": {
      const byRun = message.run && data.run_hists ? data.run_hists[message.run] : data.hists;
      const hist = message.trace_step && byRun ? byRun[String(message.trace_step)] : null;
      return hist ? ok(hist) : fail("this page holds histograms of the trace steps only (pick a row of the trace)");
    }
    case "compare":
      return staticCompare(data, message, ok, fail);
    case "tensor": {
      const run = message.run || (data.trace ? data.trace.run : "");
      const key = [run, message.trace_step, message.against || ""].join(data.sep || "\u0000");
      const view = data.tensors ? data.tensors[key] : null;
      if (!view) return fail(`this page holds no heatmap of ${run} trace step ${message.trace_step ?? "(current)"}${message.against ? ` minus ${message.against}` : ""}; ` +
        "it keeps the steps looked at in the notebook and a sample (pick another row, or open the notebook)");
      const sameSlice = !message.dims || JSON.stringify(message.dims) === JSON.stringify(view.dims);
      return sameSlice ? ok(view) : fail("this page holds the slice shown in the notebook only; other dims need a running kernel");
    }
    case "attention": {
      const run = message.run || (data.trace ? data.trace.run : "");
      const view = data.attention ? data.attention[[run, message.trace_step].join(data.sep || "\u0000")] : null;
      return view ? ok(view) : fail("this page holds no attention heads of this step");
    }
    case "trends": {
      const run = message.run || (data.trace ? data.trace.run : "");
      const view = data.trends ? data.trends[[run, message.stat || "norm"].join(data.sep || "\u0000")] : null;
      return view ? ok(view) : fail(`this page holds no trends of run ${run}`);
    }
    case "tree_colours": {
      const run = message.run || (data.trace ? data.trace.run : "");
      const against = message.against ? (message.against === "base" && data.traits.compare_pairs && data.traits.compare_pairs.length ? data.traits.compare_pairs[0][0] : message.against) : "";
      const key = [run, against ? "" : (message.stat || "norm"), against].join(data.sep || "\u0000");
      const view = data.tree_colours ? data.tree_colours[key] : null;
      return view ? ok(view) : fail(`this page holds no tree colours of ${run}${against ? ` against ${against}` : ""}`);
    }
    case "layers": {
      const view = data.layers ? data.layers[[message.var, message.stat || "norm"].join(data.sep || "\u0000")] : null;
      return view ? ok(view) : fail(`this page holds a layer chart of hidden_states only, and only when the model has a ModuleList of them`);
    }
    default:
      return fail("this is a static page: stepping, edits and comparisons need a running kernel");
  }
}

/**
 * @param {import("./types").StaticData} data
 * @returns {import("./types").Model}
 */
export function createStaticModel(data) {
  /** @type {Map<string, ((...args: any[]) => void)[]>} */
  const listeners = new Map();
  /** @type {Record<string, any>} */
  const state = { ...data.traits, mode: "static" };
  /** @param {string} event @param {...unknown} args */
  const emit = (event, ...args) => (listeners.get(event) || []).forEach((cb) => cb(...args));
  return {
    get: (key) => state[key],
    set: (key, value) => { state[key] = value; },
    save_changes() {},
    on(event, callback) { listeners.set(event, [...(listeners.get(event) || []), callback]); },
    off(event, callback) { listeners.set(event, (listeners.get(event) || []).filter((cb) => cb !== callback)); },
    send(message) { const reply = staticReply(data, message); setTimeout(() => emit("msg:custom", reply), 0); },
  };
}
