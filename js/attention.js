// Attention patterns: one small heatmap per head of a [batch, heads, q, k] attention weight (the
// kernel recognises it, see widget/tensor_views.py), queries down and keys across on a 0..1 scale,
// with token labels when the inputs' ids are known, and hover for head, query, key and weight.

import { h, clear } from "./dom.js";
import { attachHover, cellSize, drawCells, legend } from "./heatmap.js";

/**
 * The label of token `i`: its id (or text) when known, else its position.
 * @param {string[] | null | undefined} tokens
 * @param {number} i
 */
export function tokenLabel(tokens, i) {
  return tokens && i < tokens.length ? `${i}:${tokens[i]}` : String(i);
}

export class AttentionGrid {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.channel = channel;
    this.container = container;
    this.serial = 0;
  }

  /** @param {Record<string, unknown>} query an empty query hides the grid */
  async show(query) {
    const serial = ++this.serial;
    if (!query || query.trace_step === undefined) {
      clear(this.container);
      this.container.hidden = true;
      return;
    }
    let data;
    try {
      data = await this.channel.request("attention", query);
    } catch (err) {
      if (serial !== this.serial) return;
      clear(this.container).append(h("div", { class: "nnsp-note" }, /** @type {Error} */ (err).message));
      this.container.hidden = false;
      return;
    }
    if (serial !== this.serial) return;
    this.render(data);
  }

  /** @param {Record<string, any>} data */
  render(data) {
    clear(this.container);
    this.container.hidden = false;
    if (!data.attention) {
      this.container.append(h("div", { class: "nnsp-note" }, data.note));
      return;
    }
    const tokens = data.tokens;
    const readout = h("div", { class: "nnsp-readout", role: "status", "aria-live": "polite" }, "hover a pattern for query, key and weight");
    const grid = h("div", { class: "nnsp-attn-grid", role: "list", "aria-label": "Attention heads" });
    const size = cellSize(data.q, data.k, 150, 150);
    data.shown_heads.forEach((/** @type {number} */ head, /** @type {number} */ i) => {
      const values = data.patterns[i];
      const canvas = h("canvas", { class: "nnsp-heatmap nnsp-attn", role: "img", "data-head": String(head),
        "aria-label": `Head ${head}: ${data.q} queries x ${data.k} keys` });
      drawCells(canvas, values, data.q, data.k, size, 0, 1, "sequential");
      attachHover(canvas, readout, () => ({ rows: data.q, cols: data.k, values,
        label: (r, c) => `head ${head}, query ${tokenLabel(tokens, r)}, key ${tokenLabel(tokens, c)}` }));
      grid.append(h("figure", { class: "nnsp-attn-head", role: "listitem" }, h("figcaption", {}, `head ${head}`), canvas));
    });
    const labels = tokens ? h("div", { class: "nnsp-attn-tokens" }, `tokens: ${tokens.map((/** @type {string} */ t, /** @type {number} */ i) => tokenLabel(tokens, i)).join(" ")}`) : null;
    this.container.append(
      h("div", { class: "nnsp-subhead" }, `attention · ${data.heads} heads · batch ${data.batch} of ${data.batches}`),
      h("div", { class: "nnsp-note" }, `${data.reason}; queries down, keys across${data.note ? ` · ${data.note}` : ""}`),
      legend(0, 1, "sequential"), ...(labels ? [labels] : []), grid, readout);
  }
}
