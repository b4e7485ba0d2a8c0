// Logical values of a sharded run (widget.show_logical after distributed.capture_logical): one row
// per value with its placement as a badge ("Shard(0) over dp", "Replicate", "Partial(sum) over tp"),
// the local and the whole (gathered) shape, the whole tensor's statistics and, when the kernel was
// given a one-process reference, whether the gathered value is exact or its max abs diff. Each badge
// is a button: focus it (Tab) and press Enter, or click it, to read the placement and comparison out.
// The kernel makes the data (widget/logical_view.py); this file only lays it out. It is not in the
// main bundle (the initial widget state stays under its budget): build.mjs makes static/logical.js
// of it, which index.js asks the kernel for (`logical_module`) when the Logical tab first opens.

import { h, clear, fmt } from "./dom.js";

/** The view's styles, added to the page once (they are not in widget.css). */
export const LOGICAL_STYLE = `
.nnsp-lg-controls { margin: 4px 0; }
.nnsp-lg-filter { width: min(360px, 100%); }
.nnsp-lg-wrap { max-height: 420px; }
.nnsp-lg-badge { font: inherit; font-size: 0.95em; padding: 0 6px; border-radius: 8px; cursor: pointer; white-space: nowrap;
  border: 1px solid var(--nnsp-border); background: transparent; color: var(--nnsp-fg); }
.nnsp-lg-badge:focus-visible { outline: 2px solid var(--nnsp-accent); outline-offset: 1px; }
.nnsp-lg-badge[data-kind="shard"] { border-color: var(--nnsp-accent); color: var(--nnsp-accent); }
.nnsp-lg-badge[data-kind="partial"] { border-color: var(--nnsp-warn); color: var(--nnsp-warn-text); }
.nnsp-lg-badge[data-kind="replicate"] { border-color: var(--nnsp-ok); color: var(--nnsp-ok-text); }
.nnsp-lg-badge[data-kind="unknown"] { border-style: dashed; color: var(--nnsp-muted); }
.nnsp-lg-table td.nnsp-lg-note { color: var(--nnsp-muted); max-width: 26em; overflow: hidden; text-overflow: ellipsis; font-family: inherit; }
.nnsp-lg-compare[data-state="exact"] { color: var(--nnsp-ok-text); }
.nnsp-lg-compare[data-state="sum-order"] { color: var(--nnsp-warn-text); }
.nnsp-lg-compare[data-state="unexpected"] { color: var(--nnsp-error); font-weight: 600; }
.nnsp-lg-table .nnsp-lg-block { color: var(--nnsp-muted); }
`;

const WORDS = { S: "Shard", P: "Partial", R: "Replicate", "?": "unknown" };

/**
 * The words of a placement badge (`S(0)@dp·P(sum)@tp`, `R`, `?@dp`) and the kind that colours it.
 * @param {string} badge
 * @returns {{ text: string, kind: string }}
 */
export function badgeWords(badge) {
  if (!badge) return { text: "local", kind: "local" };
  if (badge === "R") return { text: "Replicate", kind: "replicate" };
  const kinds = new Set();
  const parts = badge.split("·").map((part) => {
    const [placement, dim] = part.split("@");
    const letter = placement[0];
    const arg = placement.slice(1);  // "(0)", "(sum)" or ""
    kinds.add(letter);
    const name = `${WORDS[/** @type {keyof typeof WORDS} */ (letter)] ?? placement}${arg}`;
    return dim ? `${name} over ${dim}` : name;
  });
  const kind = kinds.has("?") ? "unknown" : kinds.has("P") ? "partial" : kinds.has("S") ? "shard" : "replicate";
  return { text: parts.join(", "), kind };
}

/** @param {unknown} shape */
export function shapeText(shape) {
  return Array.isArray(shape) ? `[${shape.join(", ")}]` : "";
}

/**
 * The comparison cell: "exact", "max abs diff 3e-8", or "" when the value was not compared.
 * @param {{ exact: boolean | null, max_abs_diff: number | null, reason: string } | null | undefined} compare
 * @returns {{ text: string, state: string }}
 */
export function compareText(compare) {
  if (!compare) return { text: "", state: "none" };
  if (compare.exact) return { text: "exact", state: "exact" };
  if (compare.exact === false && compare.max_abs_diff !== null) {
    const unexpected = compare.reason.startsWith("UNEXPECTED");
    return { text: `max abs diff ${fmt(compare.max_abs_diff)}`, state: unexpected ? "unexpected" : "sum-order" };
  }
  if (compare.exact === false) return { text: "differs", state: "unexpected" };
  return { text: "not compared", state: "none" };
}

/**
 * The summary line of the view.
 * @param {Record<string, any>} data
 */
export function logicalSummary(data) {
  const rows = data.rows || [];
  const known = rows.filter((/** @type {any} */ r) => r.logical_shape).length;
  const mesh = (data.mesh.dims || []).map((/** @type {string} */ d, /** @type {number} */ i) => `${d}=${data.mesh.shape[i]}`).join(" × ");
  let text = `${rows.length} values of ${data.root} on a mesh ${mesh} (${data.ranks ?? "?"} ranks): ${known} gathered whole`;
  if (rows.length > known) text += `, ${rows.length - known} with an unknown placement or no value`;
  if (data.compared) {
    const compared = rows.filter((/** @type {any} */ r) => r.compare && r.compare.exact !== null).length;
    text += `; against one process: ${data.exact} of ${compared} exact`;
  }
  return text;
}

/**
 * The rows whose variable, block or placement contain `filter` (case-insensitive).
 * @param {any[]} rows @param {string} filter
 */
export function filterRows(rows, filter) {
  const needle = filter.trim().toLowerCase();
  if (!needle) return rows;
  return rows.filter((r) => [r.var, r.block, r.badge, badgeWords(r.badge).text].some((t) => String(t ?? "").toLowerCase().includes(needle)));
}

/**
 * What Enter on a badge reads out (`root`: the block of the model's own inputs, whose block path is "").
 * @param {Record<string, any>} row @param {string} [root]
 */
export function rowReadout(row, root = "") {
  const words = badgeWords(row.badge).text;
  let text = `${row.var} (${row.block || root}, step ${row.step}): ${words}: ${row.placement}; local ${shapeText(row.local_shape)}`;
  if (row.logical_shape) text += `, whole ${shapeText(row.logical_shape)}`;
  if (row.note) text += `. ${row.note}`;
  if (row.compare) text += `. Against one process: ${compareText(row.compare).text}${row.compare.exact ? "" : ` (${row.compare.reason})`}`;
  return text;
}

// The placement, the whole shape and the comparison first (in view at 900 px), the block path last.
const COLUMNS = ["#", "var", "placement", "whole shape", "vs 1 process", "mean", "std", "min", "max", "local shape", "block"];

export class LogicalView {
  /** @param {HTMLElement} container @param {import("./types").Channel} channel */
  constructor(container, channel) {
    this.channel = channel;
    this.loaded = false;
    if (!document.getElementById("nnsp-logical-style")) {
      document.head.append(h("style", { id: "nnsp-logical-style" }, LOGICAL_STYLE));
    }
    /** @type {Record<string, any> | null} */
    this.data = null;
    this.message = h("div", { class: "nnsp-note nnsp-lg-summary", role: "status" });
    this.filter = h("input", { class: "nnsp-input nnsp-lg-filter", type: "search", placeholder: "filter: variable, block or placement",
      "aria-label": "Filter logical values by variable, block or placement", oninput: () => this.renderRows() });
    this.readout = h("div", { class: "nnsp-readout nnsp-lg-readout", role: "status", "aria-live": "polite" });
    this.body = h("tbody", {});
    this.head = h("thead", {});
    this.table = h("table", { class: "nnsp-table nnsp-lg-table" }, this.head, this.body);
    this.wrap = h("div", { class: "nnsp-table-wrap nnsp-lg-wrap", role: "region", tabindex: "0", "aria-label": "Logical values" }, this.table);
    container.append(this.message, h("div", { class: "nnsp-lg-controls" }, this.filter), this.wrap, this.readout);
  }

  /** Asks the kernel once per show_logical: the view does not change with stepping. */
  async refresh(force = false) {
    if (this.loaded && !force) return;
    this.loaded = true;
    try {
      this.render(await this.channel.request("logical", {}));
    } catch (err) {
      this.loaded = false;
      this.message.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {Record<string, any>} data */
  render(data) {
    this.data = data;
    this.message.textContent = logicalSummary(data);
    clear(this.head);
    const columns = data.compared ? COLUMNS : COLUMNS.filter((c) => c !== "vs 1 process");
    this.head.append(h("tr", {}, ...columns.map((c) => h("th", { scope: "col" }, c))));
    this.renderRows();
  }

  renderRows() {
    if (!this.data) return;
    clear(this.body);
    const rows = filterRows(this.data.rows, this.filter.value);
    const root = this.data.root;
    for (const row of rows) {
      const words = badgeWords(row.badge);
      const badge = h("button", { class: "nnsp-lg-badge", type: "button", "data-kind": words.kind, title: row.placement,
        "aria-label": `${row.var} placement: ${words.text}`, onclick: () => { this.readout.textContent = rowReadout(row, root); } }, words.text);
      const stats = row.stats || {};
      const cells = [h("td", { class: "nnsp-num" }, String(row.step)), h("td", { class: "nnsp-var" }, row.var), h("td", {}, badge),
        h("td", {}, shapeText(row.logical_shape))];
      if (this.data.compared) {
        const compared = compareText(row.compare);
        cells.push(h("td", { class: "nnsp-lg-compare", "data-state": compared.state, title: row.compare ? row.compare.reason : "" }, compared.text));
      }
      if (row.stats) for (const key of ["mean", "std", "min", "max"]) cells.push(h("td", { class: "nnsp-num" }, fmt(stats[key])));
      else cells.push(h("td", { class: "nnsp-lg-note", colspan: "4", title: row.note || "" }, row.note || ""));
      cells.push(h("td", { class: "nnsp-lg-local" }, shapeText(row.local_shape)), h("td", { class: "nnsp-lg-block" }, row.block || root));
      this.body.append(h("tr", { "data-kind": words.kind }, ...cells));
    }
    if (!rows.length) this.body.append(h("tr", {}, h("td", { colspan: "11" }, "no value matches the filter")));
  }
}

/**
 * What the lazy tab loader (lazytab.js) calls: the view, fetching its data again when the kernel
 * showed it anew (`shown` changed).
 * @param {HTMLElement} body @param {import("./types").Channel} channel @param {Record<string, any>} host
 */
export function mount(body, channel, host) {
  const view = new LogicalView(body, channel);
  let seen = -1;
  return { refresh: (/** @type {number} */ shown) => {
    if (shown !== seen) view.loaded = false;
    seen = shown;
    return view.refresh();
  } };
}
