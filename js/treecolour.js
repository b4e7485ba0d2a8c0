// Colouring the block tree by a number per node (the kernel's tree_colours: a stat of each node's
// last value, or its max |difference| from another run): a tinted band behind each row and the
// number in the row's tooltip. Kept apart from tree.js: it only finds rows by data-node, and
// re-applies itself when the tree renders new rows.

import { colourAt } from "./heatmap.js";
import { fmt } from "./dom.js";

/**
 * The tint of one row: `value` on the sequential scale of [min, max] (a divergence of 0 is no tint),
 * as an rgba() string with `alpha`.
 * @param {number} value
 * @param {number | null} min
 * @param {number | null} max
 * @param {boolean} divergence
 * @param {number} [alpha]
 * @returns {string}
 */
export function rowTint(value, min, max, divergence, alpha = 0.45) {
  if (divergence && value === 0) return "";
  const lo = divergence ? 0 : (min ?? 0);
  const hi = max ?? 1;
  const t = hi === lo ? 1 : (value - lo) / (hi - lo);
  const [r, g, b] = colourAt(t, "sequential");
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}

export class TreeColours {
  /**
   * @param {HTMLElement} container the tree's element
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.container = container;
    this.channel = channel;
    /** @type {Record<string, any> | null} */
    this.data = null;
    this.observer = new MutationObserver(() => this.apply());
    this.observer.observe(container, { childList: true, subtree: true });
  }

  /** @param {Record<string, unknown> | null} query null clears the colours */
  async colourBy(query) {
    this.data = query ? await this.channel.request("tree_colours", query) : null;
    this.apply();
    return this.data;
  }

  apply() {
    const data = this.data;
    const divergence = Boolean(data && String(data.what).startsWith("max |"));
    for (const row of /** @type {NodeListOf<HTMLElement>} */ (this.container.querySelectorAll(".nnsp-row[data-node]"))) {
      const value = data ? data.values[String(row.dataset.node)] : undefined;
      const tint = typeof value === "number" ? rowTint(value, data ? data.min : null, data ? data.max : null, divergence) : "";
      if (row.style.getPropertyValue("--nnsp-tint") !== tint) {
        if (tint) row.style.setProperty("--nnsp-tint", tint);
        else row.style.removeProperty("--nnsp-tint");
      }
      const label = typeof value === "number" && data ? `${data.what} = ${fmt(value)}` : "";
      if ((row.dataset.colourValue || "") !== label) {
        if (label) row.dataset.colourValue = label;
        else delete row.dataset.colourValue;
      }
    }
  }

  dispose() {
    this.observer.disconnect();
  }
}
