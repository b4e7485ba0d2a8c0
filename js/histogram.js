// Histograms of a step's activation and gradient, drawn as SVG bars from the bins the kernel
// computed with the traces' histogram_bins ({edges, counts, n_nan, n_inf} or {note}).

import { h, clear, fmt } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  return el;
}

export function drawHistogram(container, bins, title) {
  clear(container);
  container.append(h("div", { class: "nnsp-hist-title" }, title));
  if (!bins || bins.note || !bins.counts) {
    container.append(h("div", { class: "nnsp-note" }, bins && bins.note ? bins.note : "no data"));
    return;
  }
  const lo = bins.edges[0];
  const hi = bins.edges[bins.edges.length - 1];
  const nonfinite = (bins.n_nan || 0) + (bins.n_inf || 0);
  const n = bins.counts.reduce((a, b) => a + b, 0) + nonfinite;
  const width = 260;
  const height = 90;
  const peak = Math.max(1, ...bins.counts);
  const barWidth = width / bins.counts.length;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "nnsp-hist-svg", role: "img",
    "aria-label": `${title}: ${n} values from ${fmt(lo)} to ${fmt(hi)}` });
  bins.counts.forEach((count, i) => {
    if (!count) return;
    const barHeight = Math.max(1, (count / peak) * (height - 4));
    const bar = svg("rect", { x: i * barWidth + 0.5, y: height - barHeight, width: Math.max(1, barWidth - 1), height: barHeight, class: "nnsp-bar" });
    const tip = svg("title");
    tip.textContent = `[${fmt(bins.edges[i])}, ${fmt(bins.edges[i + 1])}): ${count}`;
    bar.append(tip);
    chart.append(bar);
  });
  container.append(chart, h("div", { class: "nnsp-hist-axis" },
    h("span", {}, fmt(lo)), h("span", {}, `n=${n}${nonfinite ? ` · ${bins.n_nan} NaN, ${bins.n_inf} inf` : ""}`), h("span", {}, fmt(hi))));
}

export class HistogramPair {
  constructor(container, channel) {
    this.channel = channel;
    this.caption = h("div", { class: "nnsp-hist-caption" }, "histograms of the selected step");
    this.activation = h("div", { class: "nnsp-hist", "data-role": "activation" });
    this.gradient = h("div", { class: "nnsp-hist", "data-role": "gradient" });
    container.append(this.caption, h("div", { class: "nnsp-hist-pair" }, this.activation, this.gradient));
    this.serial = 0;
  }

  // query: {run, trace_step} (a trace row) or {run, step_index} (a StepInfo).
  async show(query) {
    const serial = ++this.serial;
    let data;
    try {
      data = await this.channel.request("hist", query);
    } catch (err) {
      if (serial !== this.serial) return;
      this.caption.textContent = err.message;
      clear(this.activation);
      clear(this.gradient);
      return;
    }
    if (serial !== this.serial) return;
    this.render(data);
  }

  // Draw bins the kernel already sent (a stepping command's reply carries them).
  render(data) {
    ++this.serial;
    const where = data.step_index ? `step ${data.step_index}` : "input";
    this.caption.textContent = `${data.run} · ${where}${data.trace_step ? ` (trace #${data.trace_step})` : ""} · ` +
      `${data.var || "(no variable)"} in ${data.block || "—"}`;
    drawHistogram(this.activation, data.activation, "activation");
    drawHistogram(this.gradient, data.gradient, "gradient");
  }
}
