// The trace table: one run's trace DataFrame (a row per captured tensor), a page at a time from the
// kernel, sortable by any column and filterable by block, variable and op. Clicking a row selects
// that trace step for the histograms.

import { h, clear, fmt } from "./dom.js";

// [column of the trace frame, header]
const SHOWN = [["step", "#"], ["step_index", "step"], ["block_path", "block"], ["out_var", "var"],
  ["description", "description"], ["op_name", "op"], ["shape", "shape"], ["dtype", "dtype"],
  ["mean", "mean"], ["std", "std"], ["min", "min"], ["max", "max"]];
const NUMERIC = new Set(["step", "step_index", "mean", "std", "min", "max"]);

function cell(column, value) {
  if (NUMERIC.has(column)) return fmt(value);
  if (column === "shape") return Array.isArray(value) ? `[${value.join(", ")}]` : String(value ?? "");
  if (column === "dtype") return String(value ?? "").replace("torch.", "");
  return String(value ?? "");
}

export class TraceTable {
  constructor(container, channel, { onSelect, pageSize = 25 } = {}) {
    this.channel = channel;
    this.onSelect = onSelect;
    this.query = { run: "", page: 0, size: pageSize, sort: "", desc: false, filters: { block_path: "", out_var: "", op_name: "" } };
    this.runSelect = h("select", { class: "nnsp-input", "aria-label": "Trace of run", onchange: () => { this.query.run = this.runSelect.value; this.query.page = 0; this.refresh(); } });
    const filter = (column, label) => h("input", {
      class: "nnsp-input nnsp-filter", type: "search", placeholder: label, "aria-label": `Filter by ${label}`,
      oninput: (event) => { this.query.filters[column] = event.target.value; this.query.page = 0; this.refreshSoon(); },
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
    this.timer = null;
  }

  setRuns(runs, active) {
    const names = runs.map((r) => r.name);
    const keep = names.includes(this.query.run) ? this.query.run : "";
    clear(this.runSelect).append(h("option", { value: "" }, `active run${active ? ` (${active})` : ""}`),
      ...runs.map((r) => h("option", { value: r.name }, `${r.name}${r.finished ? "" : " (running)"}`)));
    this.runSelect.value = keep;
    this.query.run = keep;
  }

  go(delta) {
    this.query.page = Math.max(0, this.query.page + delta);
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
      this.message.textContent = err.message;
      return;
    }
    this.message.textContent = "";
    this.query.page = data.page;
    this.pageLabel.textContent = `${data.total ? data.page + 1 : 0} / ${data.total ? data.pages : 0} · ${data.total} tensors`;
    this.prev.disabled = data.page <= 0;
    this.next.disabled = data.page >= data.pages - 1;
    this.render(data);
  }

  render(data) {
    const index = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    const header = h("tr", {}, ...SHOWN.map(([column, label]) => {
      const sorted = this.query.sort === column;
      return h("th", {
        scope: "col", class: NUMERIC.has(column) ? "nnsp-num" : "",
        "aria-sort": sorted ? (this.query.desc ? "descending" : "ascending") : "none",
        onclick: () => {
          if (this.query.sort === column) this.query.desc = !this.query.desc;
          else { this.query.sort = column; this.query.desc = false; }
          this.refresh();
        },
      }, label, sorted ? (this.query.desc ? " ▼" : " ▲") : "");
    }));
    const body = data.rows.map((row) => {
      const tr = h("tr", { class: row[index.edited] ? "nnsp-edited" : "", "data-step": row[index.step] },
        ...SHOWN.map(([column]) => h("td", { class: NUMERIC.has(column) ? "nnsp-num" : "" }, cell(column, row[index[column]]))));
      tr.addEventListener("click", () => this.onSelect && this.onSelect({ run: data.run, trace_step: row[index.step] }));
      return tr;
    });
    clear(this.table).append(h("thead", {}, header), h("tbody", {}, ...body));
  }
}
