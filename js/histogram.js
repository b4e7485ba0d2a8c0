// Histograms of a step's activation and gradient, drawn as SVG bars from the bins the kernel
// computed with the traces' histogram_bins ({edges, counts, n_nan, n_inf} or {note}).

import { h, clear, fmt, shownVar } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";

/**
 * @param {string} tag
 * @param {Record<string, unknown>} [attrs]
 * @returns {SVGElement}
 */
function svg(tag, attrs = {}) {
  const el = /** @type {SVGElement} */ (document.createElementNS(SVG, tag));
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  return el;
}

/**
 * @typedef {{ i: number, count: number, x: number, y: number, width: number, height: number,
 *   from: number, to: number }} Bar
 * @typedef {{ lo: number, hi: number, n: number, nonfinite: number, peak: number, bars: Bar[] }} HistogramLayout
 */

/**
 * Where the bars of `bins` go in a `width` x `height` chart: bars are scaled to the tallest bin
 * (at least 1 value), an empty bin draws no bar, a non-empty one is at least 1 unit tall and wide.
 * @param {import("./types").Bins} bins
 * @param {number} width
 * @param {number} height
 * @returns {HistogramLayout}
 */
export function histogramLayout(bins, width, height) {
  const lo = bins.edges[0];
  const hi = bins.edges[bins.edges.length - 1];
  const nonfinite = (bins.n_nan || 0) + (bins.n_inf || 0);
  const n = bins.counts.reduce((a, b) => a + b, 0) + nonfinite;
  const peak = Math.max(1, ...bins.counts);
  const barWidth = width / bins.counts.length;
  /** @type {Bar[]} */
  const bars = [];
  bins.counts.forEach((count, i) => {
    if (!count) return;
    const barHeight = Math.max(1, (count / peak) * (height - 4));
    bars.push({ i, count, x: i * barWidth + 0.5, y: height - barHeight, width: Math.max(1, barWidth - 1), height: barHeight,
      from: bins.edges[i], to: bins.edges[i + 1] });
  });
  return { lo, hi, n, nonfinite, peak, bars };
}

/**
 * @param {HTMLElement} container
 * @param {import("./types").Bins | null | undefined} bins
 * @param {string} title
 */
export function drawHistogram(container, bins, title) {
  clear(container);
  container.append(h("div", { class: "nnsp-hist-title" }, title));
  if (!bins || bins.note || !bins.counts) {
    container.append(h("div", { class: "nnsp-note" }, bins && bins.note ? bins.note : "no data"));
    return;
  }
  const width = 260;
  const height = 90;
  const { lo, hi, n, nonfinite, bars } = histogramLayout(bins, width, height);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "nnsp-hist-svg", role: "img",
    "aria-label": `${title}: ${n} values from ${fmt(lo)} to ${fmt(hi)}` });
  for (const { x, y, width: barWidth, height: barHeight, from, to, count } of bars) {
    const bar = svg("rect", { x, y, width: barWidth, height: barHeight, class: "nnsp-bar" });
    const tip = svg("title");
    tip.textContent = `[${fmt(from)}, ${fmt(to)}): ${count}`;
    bar.append(tip);
    chart.append(bar);
  }
  container.append(chart, h("div", { class: "nnsp-hist-axis" },
    h("span", {}, fmt(lo)), h("span", {}, `n=${n}${nonfinite ? ` · ${bins.n_nan} NaN, ${bins.n_inf} inf` : ""}`), h("span", {}, fmt(hi))));
}

export class HistogramPair {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.channel = channel;
    this.caption = h("div", { class: "nnsp-hist-caption" }, "histograms of the selected step");
    this.activation = h("div", { class: "nnsp-hist", "data-role": "activation" });
    this.gradient = h("div", { class: "nnsp-hist", "data-role": "gradient" });
    container.append(this.caption, h("div", { class: "nnsp-hist-pair" }, this.activation, this.gradient));
    this.serial = 0;
    /** the data drawn last, as JSON */
    this.shown = "";
  }

  // query: {run, trace_step} (a trace row) or {run, step_index} (a StepInfo).
  /** @param {Record<string, unknown>} query */
  async show(query) {
    const serial = ++this.serial;
    let data;
    try {
      data = await this.channel.request("hist", query);
    } catch (err) {
      if (serial !== this.serial) return;
      this.shown = "";
      this.caption.textContent = /** @type {Error} */ (err).message;
      clear(this.activation);
      clear(this.gradient);
      return;
    }
    if (serial !== this.serial) return;
    this.render(data);
  }

  // Draw bins the kernel already sent (a stepping command's reply carries them).
  /** @param {Record<string, any>} data */
  render(data) {
    ++this.serial;
    const key = JSON.stringify(data);  // the same bins (a step that binds no new tensor): nothing to redraw
    if (key === this.shown) return;
    this.shown = key;
    const where = data.step_index ? `step ${data.step_index}` : "input";
    this.caption.textContent = `${data.run} · ${where}${data.trace_step ? ` (trace #${data.trace_step})` : ""} · ` +
      `${shownVar(data.var, "(a value of the statement)")} in ${data.block || "—"}`;
    drawHistogram(this.activation, data.activation, "activation");
    drawHistogram(this.gradient, data.gradient, "gradient");
    if (data.activation && data.activation.changed_later) {
      this.activation.append(h("div", { class: "nnsp-note nnsp-changed-later", role: "note" }, data.activation.changed_later));
    }
  }
}
