// The same statement in every layer: pick a statement of a repeated block once (the current step's)
// and see what it bound in each layer of the ModuleList, per run, side by side: a row of cells per
// run, each with the value's norm, mean and std and a bar of its norm; a cell opens that value in
// the tensor view. The kernel finds the row's counterpart in each layer (same_statement).

import { h, clear, fmt, shownVar } from "./dom.js";

export class LayersView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onSelect?: (query: { run: string, trace_step: number }) => void, currentNode: () => number }} options
   */
  constructor(container, channel, { onSelect, currentNode }) {
    this.channel = channel;
    this.onSelect = onSelect;
    this.currentNode = currentNode;
    this.node = -1;
    this.variable = "";
    this.message = h("div", { class: "nnsp-note", role: "status" }, "the statement of the current step, in every layer: press the button");
    this.body = h("div", { class: "nnsp-layers-body" });
    container.append(
      h("div", { class: "nnsp-controls" },
        h("button", { class: "nnsp-button nnsp-button-small", type: "button", onclick: () => this.show(this.currentNode()),
          title: "show the current step's statement in every layer of its ModuleList" }, "This statement in every layer")),
      this.message, this.body);
  }

  /** @param {number} node @param {string} [variable] the variable of the statement to show (default: its first) */
  async show(node, variable) {
    if (node === undefined || node < 0) {
      this.message.textContent = "step into a layer first: the current step has no tree row";
      return;
    }
    this.node = node;
    this.variable = variable || "";
    try {
      this.render(await this.channel.request("same_statement", variable ? { node, var: variable } : { node }));
    } catch (err) {
      clear(this.body);
      this.message.textContent = /** @type {Error} */ (err).message;
    }
  }

  refresh() { if (this.node >= 0) this.show(this.node, this.variable); }

  /** @param {Record<string, any>} data */
  render(data) {
    clear(this.body);
    this.message.textContent = `${data.text} · in each layer of ${data.prefix} · per run`;
    const norms = data.runs.flatMap((/** @type {any} */ r) => r.cells.map((/** @type {any} */ c) => c && c.stats ? c.stats.norm : null))
      .filter((/** @type {unknown} */ v) => typeof v === "number");
    const top = norms.length ? Math.max(...norms) : 1;
    const head = h("tr", {}, h("th", { scope: "col" }, "run"),
      ...data.layers.map((/** @type {number} */ k) => h("th", { scope: "col" }, `layer ${k}`)));
    const rows = data.runs.map((/** @type {any} */ run) => h("tr", {}, h("th", { scope: "row" }, run.run + (run.finished ? "" : " (paused)")),
      ...run.cells.map((/** @type {any} */ cell, /** @type {number} */ i) => {
        if (data.nodes[i] < 0) return h("td", { class: "nnsp-note" }, "another forward");
        // a row no run reached: "not run yet" while the run is paused, "never ran" once it finished
        if (!cell) return h("td", { class: "nnsp-note" }, run.finished ? "never ran" : "not run yet");
        if (cell.note) return h("td", { class: "nnsp-note" }, cell.note);
        const stats = cell.stats;
        const share = stats && top ? Math.max(2, Math.round((100 * stats.norm) / top)) : 0;
        return h("td", {}, h("button", { class: "nnsp-layer-cell", type: "button", "data-layer": String(data.layers[i]),
          "aria-label": `${run.run}, layer ${data.layers[i]}: ${shownVar(cell.var, "value")}${stats ? ` norm ${fmt(stats.norm)}` : ""}, open in the tensor view`,
          onclick: () => this.onSelect && this.onSelect({ run: run.run, trace_step: cell.trace_step }) },
          h("span", { class: "nnsp-var" }, shownVar(cell.var, "value")),
          cell.shape ? h("span", { class: "nnsp-shape" }, ` [${cell.shape.join(", ")}]`) : null,
          stats ? h("span", { class: "nnsp-layer-bar", style: `width: ${share}%` }) : null,
          stats ? h("span", { class: "nnsp-num" }, `‖·‖ ${fmt(stats.norm)} μ ${fmt(stats.mean)} σ ${fmt(stats.std)}`) : null));
      })));
    this.body.append(h("div", { class: "nnsp-layers-scroll", role: "region", tabindex: "0", "aria-label": "The statement in every layer" },
      h("table", { class: "nnsp-table nnsp-layers-table" }, h("thead", {}, head), h("tbody", {}, ...rows))));
  }
}
