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
    /** @type {Record<string, any> | null} */
    this.data = null;
    /** @type {HTMLElement | null} */
    this.large = null;
  }

  /** @param {Record<string, unknown>} query an empty query hides the grid */
  async show(query) {
    const serial = ++this.serial;
    if (!query || (query.trace_step === undefined && query.block === undefined)) {
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
    this.data = data;
    const tokens = data.tokens;
    const readout = h("div", { class: "nnsp-readout", role: "status", "aria-live": "polite" }, "hover a pattern for query, key and weight");
    const grid = h("div", { class: "nnsp-attn-grid", role: "list", "aria-label": "Attention heads" });
    this.large = h("div", { class: "nnsp-attn-large", hidden: true });
    const size = cellSize(data.q, data.k, 96, 96);
    data.shown_heads.forEach((/** @type {number} */ head, /** @type {number} */ i) => {
      const values = data.patterns[i];
      const canvas = h("canvas", { class: "nnsp-heatmap nnsp-attn", "data-head": String(head) });
      drawCells(canvas, values, data.q, data.k, size, 0, 1, "sequential");
      attachHover(canvas, readout, () => ({ rows: data.q, cols: data.k, values,
        label: (r, c) => `head ${head}, query ${tokenLabel(tokens, r)}, key ${tokenLabel(tokens, c)}` }));
      // a head is a button: Enter or a click enlarges it, with its tokens on the axes
      const open = h("button", { class: "nnsp-attn-open", type: "button", "aria-label": `Head ${head}: ${data.q} queries x ${data.k} keys, enlarge`,
        "aria-pressed": "false", onclick: () => this.enlarge(i, readout) }, canvas);
      grid.append(h("figure", { class: "nnsp-attn-head", role: "listitem" }, h("figcaption", {}, `head ${head}`), open));
    });
    const what = data.recomputed && data.fused ? `${data.reason} (a fused kernel never forms these weights)` : data.reason;
    this.container.append(
      h("div", { class: "nnsp-subhead" }, `attention${data.recomputed ? " (recomputed)" : ""} · ${data.block || ""} · ${data.heads} heads · batch ${data.batch} of ${data.batches}`),
      h("div", { class: "nnsp-note" }, `${what}; queries down, keys across${data.note ? ` · ${data.note}` : ""}`),
      legend(0, 1, "sequential"), grid, this.large, readout);
  }

  /** One head drawn large, query tokens down the left and key tokens along the top.
   * @param {number} i @param {HTMLElement} readout */
  enlarge(i, readout) {
    const data = this.data;
    if (!data || !this.large) return;
    const buttons = this.container.querySelectorAll(".nnsp-attn-open");
    const already = buttons[i]?.getAttribute("aria-pressed") === "true";
    buttons.forEach((b, k) => b.setAttribute("aria-pressed", String(!already && k === i)));
    clear(this.large);
    this.large.hidden = already;
    if (already) return;
    const head = data.shown_heads[i];
    const values = data.patterns[i];
    const tokens = data.tokens;
    const size = cellSize(data.q, data.k, 360, 360);
    const canvas = h("canvas", { class: "nnsp-heatmap nnsp-attn nnsp-attn-big", role: "img", "data-head": String(head),
      "aria-label": `Head ${head} enlarged: ${data.q} queries x ${data.k} keys` });
    drawCells(canvas, values, data.q, data.k, size, 0, 1, "sequential");
    attachHover(canvas, readout, () => ({ rows: data.q, cols: data.k, values,
      label: (r, c) => `head ${head}, query ${tokenLabel(tokens, r)}, key ${tokenLabel(tokens, c)}` }));
    const label = (/** @type {number} */ k) => tokenLabel(tokens, k);
    const keys = h("div", { class: "nnsp-attn-keys", style: `grid-template-columns: repeat(${data.k}, ${size}px)`, "aria-hidden": "true" },
      ...Array.from({ length: data.k }, (_, k) => h("span", { class: "nnsp-attn-tick nnsp-attn-tick-x", title: label(k) }, label(k))));
    const queries = h("div", { class: "nnsp-attn-queries", style: `grid-template-rows: repeat(${data.q}, ${size}px)`, "aria-hidden": "true" },
      ...Array.from({ length: data.q }, (_, k) => h("span", { class: "nnsp-attn-tick", title: label(k) }, label(k))));
    this.large.append(h("div", { class: "nnsp-subhead" }, `head ${head} · keys (tokens) across, queries (tokens) down`),
      h("div", { class: "nnsp-attn-axes" }, h("span", {}), keys, queries, canvas));
  }
}
