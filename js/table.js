// The trace table: one run's trace DataFrame (a row per captured tensor), a page at a time from the
// kernel, sortable by any column and filterable by block, variable and op. Clicking a row selects
// that trace step for the histograms.

import { h, clear, fmt } from "./dom.js";

// [column of the trace frame, header]
// (the stats come before the long description and op, so they are in view at 1280 px). The trace
// step is the frame's `step` column, the "step" the status bar counts is its `step_index`: the
// headers say so on hover (HEADER_TITLES).
const SHOWN = [["step", "trace #"], ["step_index", "step"], ["block_path", "block"], ["out_var", "var"],
  ["shape", "shape"], ["dtype", "dtype"], ["mean", "mean"], ["std", "std"], ["min", "min"], ["max", "max"],
  ["description", "description"], ["op_name", "op"]];
const NUMERIC = new Set(["step", "step_index", "mean", "std", "min", "max"]);
/** @type {Record<string, string>} */
const HEADER_TITLES = {
  step: "trace step: the `step` column of widget.trace() (one per tensor recorded)",
  step_index: "the step the status bar counts: the `step_index` column of widget.trace() (one per instruction run)",
};

/**
 * The text of a trace cell.
 * @param {string} column
 * @param {unknown} value
 * @returns {string}
 */
export function cell(column, value) {
  if (NUMERIC.has(column)) return fmt(value);
  if (column === "shape") return Array.isArray(value) ? `[${value.join(", ")}]` : String(value ?? "");
  if (column === "dtype") return String(value ?? "").replace("torch.", "");
  return String(value ?? "");
}

/**
 * The page label and whether the previous / next buttons are disabled, for a page from the kernel.
 * @param {{ total: number, page: number, pages: number }} data
 * @returns {{ label: string, prevDisabled: boolean, nextDisabled: boolean }}
 */
export function pageStatus(data) {
  return {
    label: `${data.total ? data.page + 1 : 0} / ${data.total ? data.pages : 0} · ${data.total} tensors`,
    prevDisabled: data.page <= 0,
    nextDisabled: data.page >= data.pages - 1,
  };
}

/**
 * The page asked for after moving `delta` pages from `page` (the kernel clamps the upper end).
 * @param {number} page
 * @param {number} delta
 */
export function movePage(page, delta) {
  return Math.max(0, page + delta);
}

/**
 * The sort after a click on the header of `column`: the same column flips the order, another sorts ascending.
 * @param {{ sort: string, desc: boolean }} query
 * @param {string} column
 * @returns {{ sort: string, desc: boolean }}
 */
export function sortAfterClick(query, column) {
  return query.sort === column ? { sort: column, desc: !query.desc } : { sort: column, desc: false };
}

/**
 * Keyboard on a focusable table row: Enter activates it, ArrowUp / ArrowDown / Home / End move the
 * focus between the rows of its table.
 * @param {KeyboardEvent} event
 * @param {HTMLElement} tr
 * @param {() => void} activate
 */
export function rowKeys(event, tr, activate) {
  const rows = /** @type {HTMLElement[]} */ ([...(tr.parentElement ? tr.parentElement.children : [])]);
  const at = rows.indexOf(tr);
  const target = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: rows.length - 1 }[event.key];
  if (event.key === "Enter") {
    event.preventDefault();
    event.stopPropagation();
    activate();
  } else if (target !== undefined && rows[target]) {
    event.preventDefault();
    event.stopPropagation();
    rows[target].focus();
  }
}

/**
 * @typedef {{ run: string, page: number, size: number, sort: string, desc: boolean,
 *   filters: Record<string, string> }} TraceQuery
 */

export class TraceTable {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onSelect?: (query: { run: string, trace_step: number }) => void, pageSize?: number }} [options]
   */
  constructor(container, channel, { onSelect, pageSize = 25 } = {}) {
    this.channel = channel;
    this.onSelect = onSelect;
    /** @type {((stepIndex: number, run: string) => void) | undefined} */
    this.onRun = undefined;
    this.isStatic = false;
    /** @type {TraceQuery} */
    this.query = { run: "", page: 0, size: pageSize, sort: "", desc: false, filters: { block_path: "", out_var: "", op_name: "" } };
    this.runSelect = h("select", { class: "nnsp-input", "aria-label": "Trace of run", onchange: () => { this.query.run = this.runSelect.value; this.query.page = 0; this.refresh(); } });
    /** @param {string} column @param {string} label */
    const filter = (column, label) => h("input", {
      class: "nnsp-input nnsp-filter", type: "search", placeholder: label, "aria-label": `Filter by ${label}`,
      oninput: (/** @type {Event} */ event) => { this.query.filters[column] = /** @type {HTMLInputElement} */ (event.target).value; this.query.page = 0; this.refreshSoon(); },
    });
    this.pageLabel = h("span", { class: "nnsp-page" });
    this.prev = h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": "Previous page", onclick: () => this.go(-1) }, "‹");
    this.next = h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": "Next page", onclick: () => this.go(1) }, "›");
    this.table = h("table", { class: "nnsp-table" });
    this.message = h("div", { class: "nnsp-note" });
    container.append(
      h("div", { class: "nnsp-controls" }, this.runSelect, filter("block_path", "block"), filter("out_var", "variable"), filter("op_name", "op"),
        h("span", { class: "nnsp-spacer" }), this.prev, this.pageLabel, this.next),
      h("div", { class: "nnsp-table-wrap" }, this.table), this.message);
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this.timer = undefined;
  }

  /**
   * @param {{ name: string, finished?: boolean }[]} runs
   * @param {string} [active]
   */
  setRuns(runs, active) {
    const names = runs.map((r) => r.name);
    const keep = names.includes(this.query.run) ? this.query.run : "";
    clear(this.runSelect).append(h("option", { value: "" }, `active run${active ? ` (${active})` : ""}`),
      ...runs.map((r) => h("option", { value: r.name }, `${r.name}${r.finished ? "" : " (running)"}`)));
    this.runSelect.value = keep;
    this.query.run = keep;
  }

  /** @param {number} delta */
  go(delta) {
    this.query.page = movePage(this.query.page, delta);
    this.refresh();
  }

  refreshSoon() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), 120);
  }

  async refresh() {
    let data;
    try {
      data = await this.channel.request("table", this.query);
    } catch (err) {
      this.message.textContent = /** @type {Error} */ (err).message;
      return;
    }
    this.message.textContent = "";
    this.query.page = data.page;
    const status = pageStatus(data);
    this.pageLabel.textContent = status.label;
    this.prev.disabled = status.prevDisabled;
    this.next.disabled = status.nextDisabled;
    this.render(data);
  }

  /** @param {import("./types").TablePage & { run: string }} data */
  render(data) {
    /** @type {Record<string, number>} */
    const index = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    const header = h("tr", {}, ...SHOWN.map(([column, label]) => {
      const sorted = this.query.sort === column;
      return h("th", {
        scope: "col", class: NUMERIC.has(column) ? "nnsp-num" : "", title: HEADER_TITLES[column] || null,
        "aria-sort": sorted ? (this.query.desc ? "descending" : "ascending") : "none",
        onclick: () => {
          Object.assign(this.query, sortAfterClick(this.query, column));
          this.refresh();
        },
      }, label, sorted ? (this.query.desc ? " ▼" : " ▲") : "");
    }));
    const body = data.rows.map((row) => {
      const step = /** @type {number} */ (row[index.step]);
      const tr = h("tr", { class: row[index.edited] ? "nnsp-edited" : "", "data-step": step },
        ...SHOWN.map(([column]) => h("td", { class: NUMERIC.has(column) ? "nnsp-num" : "" }, cell(column, row[index[column]]))));
      tr.addEventListener("click", () => this.onSelect && this.onSelect({ run: data.run, trace_step: step }));
      tr.tabIndex = 0;
      tr.setAttribute("aria-label", `trace step ${step}: ${row[index.out_var] || "(no variable)"} in ${row[index.block_path] || "—"}, ` +
        `${row[index.description] || ""}${this.onRun && !this.isStatic ? "; Enter runs to it" : "; Enter selects it"}`);
      tr.addEventListener("keydown", (event) => rowKeys(event, tr, () => {
        if (this.onSelect) this.onSelect({ run: data.run, trace_step: step });
        const stepIndex = row[index.step_index];
        if (this.onRun && typeof stepIndex === "number" && stepIndex > 0) this.onRun(stepIndex, data.run);
      }));
      return tr;
    });
    clear(this.table).append(h("thead", {}, header), h("tbody", {}, ...body));
  }
}
