// Compare: two runs step by step (base vs fork, or any two), with each pair's status and
// max/mean abs diff, a summary, and a jump to the first divergence.

import { h, clear, fmt } from "./dom.js";
import { rowKeys } from "./table.js";

// [column of the comparison rows, header]
// (status and the differences come before the long description, so they are in view at 1280 px)
const COLUMNS = [["step_index_a", "step A"], ["step_index_b", "step B"], ["block_path", "block"], ["out_var", "var"],
  ["status", "status"], ["max_abs_diff", "max |Δ|"], ["mean_abs_diff", "mean |Δ|"], ["description", "description"]];

export class CompareView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onSelect?: (query: { run: string, trace_step: number }) => void, pageSize?: number, isStatic?: boolean,
   *   offlinePairs?: string[][] }} [options]
   */
  constructor(container, channel, { onSelect, pageSize = 25, isStatic = false, offlinePairs = [] } = {}) {
    // A static page with stored comparisons answers Compare itself; one without has nothing to compare.
    const noCompare = isStatic && !(offlinePairs && offlinePairs.length);
    this.channel = channel;
    this.onSelect = onSelect;
    this.query = { a: "", b: "", page: 0, size: pageSize, only_changed: false };
    this.selectA = h("select", { class: "nnsp-input", "aria-label": "Run A" });
    this.selectB = h("select", { class: "nnsp-input", "aria-label": "Run B" });
    const only = h("input", { type: "checkbox", "aria-label": "Only differences",
      onchange: (/** @type {Event} */ event) => { this.query.only_changed = /** @type {HTMLInputElement} */ (event.target).checked; this.query.page = 0; this.run(); } });
    this.summary = h("div", { class: "nnsp-summary", role: "status" }, noCompare ? "comparisons need a running kernel (this page holds one run)" :
      isStatic ? `stored comparisons: ${offlinePairs.map((p) => `${p[0]} vs ${p[1]}`).join(", ")}; press Compare` : "pick two runs and press Compare");
    this.table = h("table", { class: "nnsp-table" });
    this.pageLabel = h("span", { class: "nnsp-page" });
    this.prev = h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": "Previous comparison page", onclick: () => this.go(-1) }, "‹");
    this.next = h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": "Next comparison page", onclick: () => this.go(1) }, "›");
    container.append(
      h("div", { class: "nnsp-controls" },
        h("label", { class: "nnsp-label" }, "A ", this.selectA), h("label", { class: "nnsp-label" }, "B ", this.selectB),
        h("button", { class: "nnsp-button", type: "button", "aria-label": "Compare runs", disabled: noCompare,
          onclick: () => { this.query.page = 0; this.run(); } }, "Compare"),
        h("button", { class: "nnsp-button", type: "button", "aria-label": "Jump to first divergence", disabled: noCompare,
          onclick: () => this.run(true) }, "First divergence"),
        h("label", { class: "nnsp-label" }, only, " only differences"),
        h("span", { class: "nnsp-spacer" }), this.prev, this.pageLabel, this.next),
      this.summary, h("div", { class: "nnsp-table-wrap" }, this.table));
  }

  /** @param {{ name: string }[]} runs */
  setRuns(runs) {
    /** @param {HTMLSelectElement} select @param {string} fallback */
    const fill = (select, fallback) => {
      const keep = select.value;
      clear(select).append(h("option", { value: "" }, fallback), ...runs.map((r) => h("option", { value: r.name }, r.name)));
      if (runs.some((r) => r.name === keep)) select.value = keep;
    };
    fill(this.selectA, "base (default)");
    fill(this.selectB, "active run (default)");
  }

  /** @param {number} delta */
  go(delta) {
    this.query.page = Math.max(0, this.query.page + delta);
    this.run();
  }

  async run(jump = false) {
    this.query.a = this.selectA.value;
    this.query.b = this.selectB.value;
    let data;
    try {
      data = await this.channel.request("compare", { ...this.query, jump });
    } catch (err) {
      this.summary.textContent = /** @type {Error} */ (err).message;
      this.summary.classList.add("nnsp-error");
      return;
    }
    this.summary.classList.remove("nnsp-error");
    this.query.page = data.page;
    const s = data.summary;
    const first = data.first;
    const firstStep = first ? (first.step_index_b ?? first.step_index_a) : null;
    this.summary.textContent = `${data.a} vs ${data.b}: ${s.total} tensors · ${s.changed} changed · ${s.shape_changed} shape changed · ` +
      `${s.only_in_a} only in A · ${s.only_in_b} only in B · ` +
      (first ? `first divergence: step ${firstStep} (${first.out_var || "?"} in ${first.block_path})` : "no divergence");
    this.summary.dataset.first = first ? String(firstStep) : "";
    this.pageLabel.textContent = `${data.page + 1} / ${data.pages}`;
    this.prev.disabled = data.page <= 0;
    this.next.disabled = data.page >= data.pages - 1;
    this.render(data, jump);
    if (jump && first && this.onSelect) {
      this.onSelect(first.step_b !== null ? { run: data.b, trace_step: first.step_b } : { run: data.a, trace_step: first.step_a });
    }
  }

  /**
   * @param {import("./types").TablePage & Record<string, any>} data
   * @param {boolean} jump
   */
  render(data, jump) {
    /** @type {Record<string, number>} */
    const index = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    const firstKey = data.first ? `${data.first.container_id}/${data.first.step_a}/${data.first.step_b}` : "";
    const rows = data.rows.map((/** @type {any[]} */ row) => {
      const status = row[index.status];
      const changed = row[index.changed];
      const label = status === "ok" ? (changed ? "changed" : "same") : status.replaceAll("_", " ");
      const key = `${row[index.container_id]}/${row[index.step_a]}/${row[index.step_b]}`;
      const tr = h("tr", { class: `nnsp-diff-${status === "ok" ? (changed ? "changed" : "same") : "path"}${key === firstKey ? " nnsp-first" : ""}` },
        ...COLUMNS.map(([column]) => {
          if (column === "status") return h("td", {}, h("span", { class: "nnsp-status-pill" }, label));
          const value = row[index[column]];
          return h("td", { class: column.includes("diff") || column.startsWith("step") ? "nnsp-num" : "" },
            column.includes("diff") ? fmt(value) : String(value ?? "—"));
        }));
      const choose = () => {
        if (!this.onSelect) return;
        const stepB = row[index.step_b];
        this.onSelect(stepB !== null ? { run: data.b, trace_step: stepB } : { run: data.a, trace_step: row[index.step_a] });
      };
      tr.addEventListener("click", choose);
      tr.tabIndex = 0;
      tr.setAttribute("aria-label", `${row[index.out_var] || "(no variable)"} in ${row[index.block_path] || "—"}: ${label}, ` +
        `max |Δ| ${fmt(row[index.max_abs_diff])}; Enter selects it`);
      tr.addEventListener("keydown", (event) => rowKeys(event, tr, choose));
      return tr;
    });
    clear(this.table).append(h("thead", {}, h("tr", {}, ...COLUMNS.map(([, label]) => h("th", { scope: "col" }, label)))), h("tbody", {}, ...rows));
    if (jump) {
      const first = this.table.querySelector(".nnsp-first");
      if (first) first.scrollIntoView({ block: "nearest" });
    }
  }
}
