// Trends: a sparkline per variable across the run's trace steps (mean, std, norm or fraction of
// zeros, computed by the kernel), and a "by layer" chart of one variable across the layers of a
// ModuleList (hidden_states per decoder layer), one line per run, overlaid.

import { h, clear, fmt } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const STATS = ["norm", "mean", "std", "frac_zeros"];

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
 * The points of a line through `values` in a `width` x `height` box (`pad` inside each edge),
 * sharing the range [lo, hi] (default: the values' own); missing values (null) are skipped.
 * @param {(number | null | string)[]} values
 * @param {number} width
 * @param {number} height
 * @param {{ lo?: number, hi?: number, pad?: number }} [range]
 * @returns {{ points: [number, number][], lo: number, hi: number }}
 */
export function linePoints(values, width, height, range = {}) {
  const finite = values.filter((v) => typeof v === "number" && Number.isFinite(v)).map(Number);
  const lo = range.lo ?? (finite.length ? Math.min(...finite) : 0);
  const hi = range.hi ?? (finite.length ? Math.max(...finite) : 1);
  const pad = range.pad ?? 2;
  const span = hi - lo || 1;
  const step = values.length > 1 ? (width - 2 * pad) / (values.length - 1) : 0;
  /** @type {[number, number][]} */
  const points = [];
  values.forEach((v, i) => {
    if (typeof v !== "number" || !Number.isFinite(v)) return;
    const x = values.length > 1 ? pad + i * step : width / 2;
    const y = hi === lo ? height / 2 : height - pad - ((v - lo) / span) * (height - 2 * pad);
    points.push([Math.round(x * 100) / 100, Math.round(y * 100) / 100]);
  });
  return { points, lo, hi };
}

/**
 * @param {(number | null)[]} values
 * @param {string} label
 */
export function sparkline(values, label) {
  const { points, lo, hi } = linePoints(values, 120, 24);
  const chart = svg("svg", { viewBox: "0 0 120 24", class: "nnsp-spark", role: "img",
    "aria-label": `${label}: ${values.length} values from ${fmt(lo)} to ${fmt(hi)}` });
  chart.append(svg("polyline", { points: points.map((p) => p.join(",")).join(" "), class: "nnsp-spark-line" }));
  if (points.length === 1) chart.append(svg("circle", { cx: points[0][0], cy: points[0][1], r: 2, class: "nnsp-spark-dot" }));
  return chart;
}

export class TrendsView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onSelect?: (query: { run: string, trace_step: number }) => void }} [options]
   */
  constructor(container, channel, { onSelect } = {}) {
    this.channel = channel;
    this.onSelect = onSelect;
    /** @type {((query: Record<string, unknown> | null) => Promise<unknown>) | undefined} */
    this.onColourBy = undefined;
    this.colourSelect = h("select", { class: "nnsp-input", "aria-label": "Colour the tree by", onchange: () => this.colour() },
      h("option", { value: "" }, "nothing"), ...STATS.map((s) => h("option", { value: s }, s)),
      h("option", { value: "divergence" }, "divergence from base"));
    this.colourNote = h("span", { class: "nnsp-note", role: "status" });
    this.stat = h("select", { class: "nnsp-input", "aria-label": "Trend statistic", onchange: () => this.refresh() },
      ...STATS.map((s) => h("option", { value: s }, s)));
    this.runSelect = h("select", { class: "nnsp-input", "aria-label": "Trends of run", onchange: () => this.refresh() });
    this.layerVar = h("input", { class: "nnsp-input nnsp-filter", type: "text", value: "hidden_states", "aria-label": "Variable charted by layer",
      onchange: () => this.refresh() });
    this.layerChart = h("div", { class: "nnsp-layer-chart" });
    this.list = h("div", { class: "nnsp-trend-list", role: "list", "aria-label": "Trends per variable" });
    this.message = h("div", { class: "nnsp-note" });
    container.append(
      h("div", { class: "nnsp-controls" }, h("label", { class: "nnsp-label" }, "stat ", this.stat),
        h("label", { class: "nnsp-label" }, "run ", this.runSelect),
        h("label", { class: "nnsp-label" }, "by layer ", this.layerVar),
        h("label", { class: "nnsp-label" }, "colour tree by ", this.colourSelect), this.colourNote),
      this.layerChart, this.message, this.list);
  }

  async colour() {
    if (!this.onColourBy) return;
    const choice = this.colourSelect.value;
    const run = this.runSelect.value;
    /** @type {Record<string, unknown> | null} */
    const query = !choice ? null : choice === "divergence" ? { run, against: "base" } : { run, stat: choice };
    try {
      const data = /** @type {Record<string, any> | null} */ (await this.onColourBy(query));
      this.colourNote.textContent = data ? `${data.what}: ${fmt(data.min)} … ${fmt(data.max)} (${Object.keys(data.values).length} nodes)` : "";
    } catch (err) {
      this.colourNote.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {{ name: string }[]} runs */
  setRuns(runs) {
    const keep = this.runSelect.value;
    clear(this.runSelect).append(h("option", { value: "" }, "active run"), ...runs.map((r) => h("option", { value: r.name }, r.name)));
    if (runs.some((r) => r.name === keep)) this.runSelect.value = keep;
  }

  async refresh() {
    const stat = this.stat.value;
    const [trends, layers] = await Promise.allSettled([
      this.channel.request("trends", { run: this.runSelect.value, stat }),
      this.channel.request("layers", { var: this.layerVar.value, stat }),
    ]);
    if (trends.status === "fulfilled") {
      this.message.textContent = "";
      this.renderTrends(trends.value);
    } else {
      this.message.textContent = trends.reason.message;
    }
    if (layers.status === "fulfilled") this.renderLayers(layers.value);
    else clear(this.layerChart).append(h("div", { class: "nnsp-note" }, layers.reason.message));
  }

  /** @param {Record<string, any>} data */
  renderTrends(data) {
    clear(this.list);
    for (const series of data.series) {
      const last = series.values[series.values.length - 1];
      const row = h("div", { class: "nnsp-trend", role: "listitem", tabindex: "0", "data-var": series.var,
        "aria-label": `${series.var} in ${series.block}: ${series.values.length} steps, last ${data.stat} ${fmt(last)}`,
        onclick: () => this.onSelect && this.onSelect({ run: data.run, trace_step: series.steps[series.steps.length - 1] }),
        onkeydown: (/** @type {KeyboardEvent} */ event) => {
          if (event.key === "Enter" && this.onSelect) this.onSelect({ run: data.run, trace_step: series.steps[series.steps.length - 1] });
        } },
      h("span", { class: "nnsp-trend-name" }, h("span", { class: "nnsp-var" }, series.var), " ", h("span", { class: "nnsp-op" }, series.block)),
      sparkline(series.values, `${series.var} ${data.stat}`),
      h("span", { class: "nnsp-num nnsp-trend-last" }, fmt(last)));
      this.list.append(row);
    }
  }

  /** @param {Record<string, any>} data */
  renderLayers(data) {
    clear(this.layerChart);
    const width = 380;
    const height = 140;
    const box = { left: 44, right: 8, top: 8, bottom: 22 };
    const all = data.series.flatMap((/** @type {any} */ s) => s.values).filter((/** @type {unknown} */ v) => typeof v === "number");
    const lo = all.length ? Math.min(...all) : 0;
    const hi = all.length ? Math.max(...all) : 1;
    const axis = /** @type {number[]} */ (data.axis && data.axis.length ? data.axis : [...new Set(data.series.flatMap((/** @type {any} */ s) => s.layers))].sort((a, b) => a - b));
    const x = layerX(axis, box.left, width - box.right);
    const span = hi - lo || 1;
    const y = (/** @type {number} */ v) => (hi === lo ? (box.top + height - box.bottom) / 2 : height - box.bottom - ((v - lo) / span) * (height - box.top - box.bottom));
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "nnsp-layer-svg", role: "img",
      "aria-label": `${data.var} ${data.stat} by layer, ${data.series.length} runs, layers ${axis[0] ?? ""} to ${axis[axis.length - 1] ?? ""}, from ${fmt(lo)} to ${fmt(hi)}` });
    // y ticks: the range's ends and its middle; x ticks: every layer number (every k-th when many)
    for (const v of hi === lo ? [lo] : [lo, (lo + hi) / 2, hi]) {
      const at = Math.round(y(v) * 100) / 100;
      chart.append(svg("line", { x1: box.left, x2: width - box.right, y1: at, y2: at, class: "nnsp-layer-grid" }));
      const label = svg("text", { x: box.left - 4, y: at + 3, class: "nnsp-layer-tick", "text-anchor": "end" });
      label.textContent = fmt(v);
      chart.append(label);
    }
    const every = Math.max(1, Math.ceil(axis.length / 16));
    axis.forEach((layer, i) => {
      if (i % every && i !== axis.length - 1) return;
      const label = svg("text", { x: x(layer), y: height - 6, class: "nnsp-layer-tick", "text-anchor": "middle" });
      label.textContent = String(layer);
      chart.append(label);
    });
    const legendBox = h("div", { class: "nnsp-layer-legend" });
    data.series.forEach((/** @type {any} */ series, /** @type {number} */ i) => {
      /** @type {[number, number][]} */
      const points = [];
      series.values.forEach((/** @type {unknown} */ v, /** @type {number} */ k) => {
        if (typeof v === "number" && Number.isFinite(v)) points.push([x(series.layers[k]), Math.round(y(v) * 100) / 100]);
      });
      chart.append(svg("polyline", { points: points.map((p) => p.join(",")).join(" "), class: `nnsp-layer-line nnsp-series-${i % 4}` }));
      let p = 0;
      series.values.forEach((/** @type {unknown} */ v, /** @type {number} */ k) => {
        if (typeof v !== "number" || !Number.isFinite(v)) return;
        const [cx, cy] = points[p++];
        const dot = svg("circle", { cx, cy, r: 3, class: `nnsp-layer-dot nnsp-series-${i % 4}`, "data-layer": series.layers[k],
          "data-value": String(v) });
        const tip = svg("title");
        tip.textContent = `${series.run} · ${series.prefix}.${series.layers[k]} · ${data.var} ${data.stat} = ${fmt(v)}`;
        dot.append(tip);
        chart.append(dot);
      });
      legendBox.append(h("span", { class: `nnsp-layer-key nnsp-series-${i % 4}` },
        `${series.run}${series.finished === false ? ` (paused: layers ${series.layers.length ? `${series.layers[0]}–${series.layers[series.layers.length - 1]}` : "none"} returned)` : ""}`));
    });
    const first = data.series[0];
    this.layerChart.append(
      h("div", { class: "nnsp-subhead" }, `${data.var} ${data.stat} by layer of ${first ? first.prefix : "—"}`),
      chart,
      h("div", { class: "nnsp-layer-axis" }, h("span", {}, `x: layer number · y: ${data.stat}`)),
      legendBox);
  }
}

/**
 * The x of each layer number on an axis of every layer (so a run that returned from some layers
 * only puts its points at their own numbers, not spread by their index).
 * @param {number[]} axis the layer numbers, sorted
 * @param {number} left
 * @param {number} right
 * @returns {(layer: number) => number}
 */
export function layerX(axis, left, right) {
  const first = axis.length ? axis[0] : 0;
  const last = axis.length ? axis[axis.length - 1] : 0;
  const span = last - first;
  return (layer) => Math.round((span ? left + ((layer - first) / span) * (right - left) : (left + right) / 2) * 100) / 100;
}
