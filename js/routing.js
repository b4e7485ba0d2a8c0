// MoE routing: one heatmap per experts call (a decoder layer), tokens down, experts across, the
// router's weight as colour (0: not routed) on a scale shared by all layers; hover, or focus and
// Enter, reads it out. The kernel makes the data and the texts (widget/routing_view.py).

import { h, clear } from "./dom.js";
import { attachHover, cellSize, drawCells, legend } from "./heatmap.js";

/**
 * The row-major cells of one layer's token x expert matrix, the largest weight in it and the
 * smallest chosen one (a weight above 0: the colour scale spans the chosen weights only).
 * @param {{ weights: number[][] }} layer
 */
export function routingCells(layer) {
  const rows = layer.weights.length;
  const cols = rows ? layer.weights[0].length : 0;
  const values = layer.weights.flat();
  const chosen = values.filter((v) => v > 0);
  return { rows, cols, values, max: values.reduce((m, v) => (v > m ? v : m), 0), min: chosen.length ? Math.min(...chosen) : 0 };
}

export class RoutingView {
  /** @param {HTMLElement} container @param {import("./types").Channel} channel */
  constructor(container, channel) {
    this.channel = channel;
    this.loaded = false;
    this.message = h("div", { class: "nnsp-note", role: "status" });
    this.body = h("div", {});
    container.append(this.message, this.body);
  }

  /** Asks the kernel once: the routing of the inputs does not change with stepping. */
  async refresh() {
    if (this.loaded) return;
    this.loaded = true;
    try {
      this.render(await this.channel.request("routing", {}));
    } catch (err) {
      this.loaded = false;
      this.message.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {Record<string, any>} data */
  render(data) {
    clear(this.body);
    const top = Math.max(0, ...data.layers.map((/** @type {any} */ l) => routingCells(l).max)) || 1;
    // the scale spans the chosen weights of every layer (grey: not routed), so the chosen experts differ
    const lows = data.layers.map((/** @type {any} */ l) => routingCells(l).min).filter((/** @type {number} */ v) => v > 0);
    const low = lows.length && Math.min(...lows) < top ? Math.min(...lows) : 0;
    this.message.textContent = data.summary;
    const readout = h("div", { class: "nnsp-readout", role: "status", "aria-live": "polite" });
    const grid = h("div", { class: "nnsp-attn-grid", role: "list", "aria-label": "Routing per layer" });
    for (const layer of data.layers) {
      const { rows, cols, values } = routingCells(layer);
      const size = Math.max(12, cellSize(rows, cols, 200, 420));
      const canvas = h("canvas", { class: "nnsp-heatmap nnsp-rt-map", "aria-hidden": "true" });
      drawCells(canvas, values.map((v) => (v > 0 ? v : NaN)), rows, cols, size, low, top, "sequential");
      attachHover(canvas, readout, () => ({ rows, cols, values,
        label: (r, c) => `${layer.name}, token ${layer.tokens[r]}, expert ${layer.experts[c]}` }));
      /** @param {string} cls @param {string} css @param {any[]} texts */
      const ticks = (cls, css, texts) => h("div", { class: cls, style: css, "aria-hidden": "true" },
        ...texts.map((t) => h("span", { class: "nnsp-attn-tick" }, String(t))));
      const map = h("div", { class: "nnsp-rt-box", role: "img", tabindex: "0", "aria-label": layer.label,
        onkeydown: (/** @type {KeyboardEvent} */ e) => {
          if (e.key === "Enter") readout.textContent = `${layer.name}: ${layer.routes.join("; ")}`;
        } },
        h("div", { class: "nnsp-attn-axes" }, h("span", { class: "nnsp-attn-tick" }, "token ↓ expert →"),
          ticks("nnsp-rt-x", `grid-template-columns: repeat(${cols}, ${size}px)`, layer.experts),
          ticks("nnsp-attn-queries", `grid-template-rows: repeat(${rows}, ${size}px)`, layer.tokens), canvas,
          h("span", { class: "nnsp-attn-tick nnsp-rt-count-key" }, "tokens"),
          ticks("nnsp-rt-counts", `grid-template-columns: repeat(${cols}, ${size}px)`, layer.counts || [])));
      grid.append(h("figure", { class: "nnsp-attn-head", role: "listitem" }, h("figcaption", {}, layer.caption), map));
    }
    this.body.append(h("div", { class: "nnsp-rt-legend" }, "router weight (chosen experts)", legend(low, top, "sequential"),
      h("span", { class: "nnsp-rt-unrouted" }, "grey: not routed")), grid, readout);
  }
}
