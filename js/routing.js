// MoE routing: which tokens the router sent to which expert, and with what weight. One heatmap per
// experts call (a layer of a decoder): tokens down, experts across, the router's weight as colour
// (0 where the token did not go to the expert) on one scale shared by every layer; hover or focus
// and Enter for the numbers. The kernel reads the routing (widget/routing_view.py).

import { h, clear, fmt } from "./dom.js";
import { attachHover, cellSize, drawCells, legend } from "./heatmap.js";
import { tokenLabel } from "./attention.js";

/**
 * The row-major cells of one layer's token x expert matrix and the largest weight in it.
 * @param {{ weights: number[][] }} layer
 * @returns {{ rows: number, cols: number, values: number[], max: number }}
 */
export function routingCells(layer) {
  const rows = layer.weights.length;
  const cols = rows ? layer.weights[0].length : 0;
  const values = layer.weights.flat();
  const max = values.reduce((m, v) => (v > m ? v : m), 0);
  return { rows, cols, values, max };
}

/**
 * What one token's routing reads as: the experts it went to, highest weight first.
 * @param {{ weights: number[][], experts: number[] }} layer
 * @param {number} token
 */
export function tokenRoute(layer, token) {
  return layer.weights[token]
    .map((w, c) => ({ expert: layer.experts[c], weight: w }))
    .filter((e) => e.weight !== 0)
    .sort((a, b) => b.weight - a.weight)
    .map((e) => `expert ${e.expert} (${fmt(e.weight)})`).join(", ");
}

/** @param {Record<string, any>} layer */
function layerName(layer) {
  return layer.layer === null || layer.layer === undefined ? layer.block : `layer ${layer.layer}`;
}

export class RoutingView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.channel = channel;
    this.serial = 0;
    this.loaded = false;
    this.message = h("div", { class: "nnsp-note", role: "status" }, "the router's choice of experts per token, per layer");
    this.body = h("div", { class: "nnsp-routing-body" });
    container.append(this.message, this.body);
  }

  /** Ask the kernel once (the routing of the inputs does not change with stepping). */
  refresh() { if (!this.loaded) this.show(); }

  async show() {
    const serial = ++this.serial;
    this.message.textContent = "reading the routing...";
    try {
      const data = await this.channel.request("routing", {});
      if (serial !== this.serial) return;
      this.loaded = true;
      this.render(data);
    } catch (err) {
      if (serial !== this.serial) return;
      clear(this.body);
      this.message.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {Record<string, any>} data */
  render(data) {
    clear(this.body);
    const top = Math.max(0, ...data.layers.map((/** @type {any} */ l) => routingCells(l).max)) || 1;
    this.message.textContent = `${data.layers.length} experts calls · tokens down, experts across · colour: the router's weight (0: not routed)${data.note ? ` · ${data.note}` : ""}`;
    const readout = h("div", { class: "nnsp-readout", role: "status", "aria-live": "polite" }, "hover a cell, or focus a layer and press Enter");
    const grid = h("div", { class: "nnsp-routing-grid", role: "list", "aria-label": "Routing per layer" });
    for (const layer of data.layers) {
      const { rows, cols, values } = routingCells(layer);
      const size = Math.max(12, cellSize(rows, cols, 200, 420));
      const name = layerName(layer);
      const label = (/** @type {number} */ r) => tokenLabel(layer.tokens, r);
      const canvas = h("canvas", { class: "nnsp-heatmap nnsp-routing-map", "data-layer": String(layer.layer ?? ""), "aria-hidden": "true" });
      drawCells(canvas, values, rows, cols, size, 0, top, "sequential");
      attachHover(canvas, readout, () => ({ rows, cols, values,
        label: (r, c) => `${name}, token ${label(r)}, expert ${layer.experts[c]}` }));
      const experts = h("div", { class: "nnsp-routing-experts", style: `grid-template-columns: repeat(${cols}, ${size}px)`, "aria-hidden": "true" },
        ...layer.experts.map((/** @type {number} */ e) => h("span", { class: "nnsp-routing-tick" }, String(e))));
      const tokens = h("div", { class: "nnsp-attn-queries", style: `grid-template-rows: repeat(${rows}, ${size}px)`, "aria-hidden": "true" },
        ...Array.from({ length: rows }, (_, r) => h("span", { class: "nnsp-attn-tick nnsp-routing-token", title: label(r) }, label(r))));
      const summary = () => Array.from({ length: rows }, (_, r) => `token ${label(r)}: ${tokenRoute(layer, r)}`).join("; ");
      const map = h("div", { class: "nnsp-routing-map-box", role: "img", tabindex: "0",
        "aria-label": `${name} routing: ${rows} tokens x ${cols} experts, top ${layer.top_k}; press Enter to read it`,
        onkeydown: (/** @type {KeyboardEvent} */ event) => {
          if (event.key !== "Enter") return;
          event.preventDefault();
          readout.textContent = `${name}: ${summary()}`;
        } },
        h("div", { class: "nnsp-attn-axes" },
          h("span", { class: "nnsp-routing-axis" }, "token ↓ / expert →"), experts, tokens, canvas));
      grid.append(h("figure", { class: "nnsp-routing-layer", role: "listitem", "data-block": layer.block },
        h("figcaption", {}, `${name} · ${layer.block}${layer.n_tokens > rows ? ` · first ${rows} of ${layer.n_tokens} tokens` : ""}`), map));
    }
    this.body.append(h("div", { class: "nnsp-routing-legend" }, h("span", { class: "nnsp-note" }, "router weight"), legend(0, top, "sequential")),
      grid, readout);
  }
}
