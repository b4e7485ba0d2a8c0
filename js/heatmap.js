// The tensor view: a heatmap of a 2-D slice of the selected step's value (the kernel cuts it, see
// widget/tensor_views.py), the other dims chosen by sliders, a colour scale with its range, hover
// for index and value, and the difference of two runs at the step on a diverging scale. Drawn on a
// canvas, one rectangle per cell.

import { h, clear, fmt, shownVar } from "./dom.js";

// Sequential: viridis stops; diverging: blue, white, red (negative, zero, positive).
/** @type {[number, number, number][]} */
const SEQUENTIAL = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
/** @type {[number, number, number][]} */
const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];

/**
 * The colour of `t` in [0, 1] on a scale (linear between its stops); t outside is clamped.
 * @param {number} t
 * @param {"sequential" | "diverging"} scale
 * @returns {[number, number, number]}
 */
export function colourAt(t, scale) {
  const stops = scale === "diverging" ? DIVERGING : SEQUENTIAL;
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [stops[i], stops[i + 1]];
  /** @param {number} k */
  const mix = (k) => Math.round(a[k] + (b[k] - a[k]) * f);
  return [mix(0), mix(1), mix(2)];
}

/**
 * Where `value` falls in [min, max] as t in [0, 1]; a constant slice (min == max) sits in the middle;
 * a diverging scale keeps 0 in the middle (its range is symmetric). Non-finite values give null.
 * @param {unknown} value
 * @param {number | null} min
 * @param {number | null} max
 * @returns {number | null}
 */
export function scaleT(value, min, max) {
  if (typeof value !== "number" || !Number.isFinite(value) || min === null || max === null) return null;
  if (max === min) return 0.5;
  return (value - min) / (max - min);
}

/**
 * The CSS colour of one cell; NaN / inf are grey.
 * @param {unknown} value
 * @param {number | null} min
 * @param {number | null} max
 * @param {"sequential" | "diverging"} scale
 */
export function cellColour(value, min, max, scale) {
  const t = scaleT(value, min, max);
  if (t === null) return "rgb(128, 128, 128)";
  const [r, g, b] = colourAt(t, scale);
  return `rgb(${r}, ${g}, ${b})`;
}

/**
 * The cell under (x, y) of a `width` x `height` drawing of rows x cols cells, or null outside.
 * @param {number} x
 * @param {number} y
 * @param {number} width
 * @param {number} height
 * @param {number} rows
 * @param {number} cols
 * @returns {{ r: number, c: number } | null}
 */
export function cellAt(x, y, width, height, rows, cols) {
  if (x < 0 || y < 0 || x >= width || y >= height || rows <= 0 || cols <= 0) return null;
  return { r: Math.min(rows - 1, Math.floor((y / height) * rows)), c: Math.min(cols - 1, Math.floor((x / width) * cols)) };
}

/**
 * The full index of a shown cell: the fixed dims' indices, and the original row / column indices.
 * @param {{ index: (number | null)[], dims: number[], row_ids: number[], col_ids: number[] }} view
 * @param {number} r
 * @param {number} c
 * @returns {number[]}
 */
export function fullIndex(view, r, c) {
  const index = view.index.map((i) => (i === null ? 0 : i));
  if (view.dims.length === 1) {
    index[view.dims[0]] = view.col_ids[c];
  } else {
    index[view.dims[0]] = view.row_ids[r];
    index[view.dims[1]] = view.col_ids[c];
  }
  return index;
}

/**
 * The cell size (CSS pixels) that fits rows x cols into at most `maxWidth` x `maxHeight`, at least 1 and at most 28.
 * @param {number} rows
 * @param {number} cols
 * @param {number} maxWidth
 * @param {number} maxHeight
 */
export function cellSize(rows, cols, maxWidth, maxHeight) {
  return Math.max(1, Math.min(28, Math.floor(maxWidth / Math.max(1, cols)), Math.floor(maxHeight / Math.max(1, rows))));
}

/**
 * Draw `values` (row-major rows x cols) into `canvas` at `size` pixels per cell.
 * @param {HTMLCanvasElement} canvas
 * @param {unknown[]} values
 * @param {number} rows
 * @param {number} cols
 * @param {number} size
 * @param {number | null} min
 * @param {number | null} max
 * @param {"sequential" | "diverging"} scale
 * @param {number} [height] the cell height (default: square cells)
 */
export function drawCells(canvas, values, rows, cols, size, min, max, scale, height = size) {
  canvas.width = cols * size;
  canvas.height = rows * height;
  canvas.style.width = `${cols * size}px`;
  canvas.style.height = `${rows * height}px`;
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      ctx.fillStyle = cellColour(values[r * cols + c], min, max, scale);
      ctx.fillRect(c * size, r * height, size, height);
    }
  }
}

/**
 * The cell height: square cells, but a slice of few rows gets taller ones (up to 28 px, at most
 * `maxHeight` in all) so that a [2, 256] slice is not a 16-pixel strip.
 * @param {number} rows
 * @param {number} size the cell width
 * @param {number} maxHeight
 */
export function cellHeight(rows, size, maxHeight) {
  return Math.max(size, Math.min(28, Math.floor(maxHeight / Math.max(1, rows))));
}

/**
 * A colour bar with the range's ends (and 0 in the middle of a diverging one).
 * @param {number | null} min
 * @param {number | null} max
 * @param {"sequential" | "diverging"} scale
 */
export function legend(min, max, scale) {
  const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => {
    const [r, g, b] = colourAt(t, scale);
    return `rgb(${r}, ${g}, ${b}) ${t * 100}%`;
  });
  return h("div", { class: "nnsp-legend", "aria-label": `colour scale from ${fmt(min)} to ${fmt(max)}` },
    h("span", { class: "nnsp-legend-end" }, fmt(min)),
    h("span", { class: "nnsp-legend-bar", style: `background: linear-gradient(to right, ${stops.join(", ")})` }),
    scale === "diverging" ? h("span", { class: "nnsp-legend-mid" }, "0 in the middle") : null,
    h("span", { class: "nnsp-legend-end" }, fmt(max)));
}

/**
 * Hover readout for a canvas of cells: sets `readout` to "[i, j, ...] = value" and its data-index / data-value.
 * @param {HTMLCanvasElement} canvas
 * @param {HTMLElement} readout
 * @param {() => { rows: number, cols: number, values: unknown[], label: (r: number, c: number) => string } | null} current
 */
export function attachHover(canvas, readout, current) {
  canvas.addEventListener("mousemove", (event) => {
    const view = current();
    if (!view) return;
    const box = canvas.getBoundingClientRect();
    const cell = cellAt(event.clientX - box.left, event.clientY - box.top, box.width, box.height, view.rows, view.cols);
    if (!cell) return;
    const value = view.values[cell.r * view.cols + cell.c];
    const label = view.label(cell.r, cell.c);
    readout.textContent = `${label} = ${fmt(value)}`;
    readout.dataset.index = label;
    readout.dataset.value = String(value);
  });
}

export class TensorView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onAttention?: (query: Record<string, unknown>) => void }} [options]
   */
  constructor(container, channel, { onAttention } = {}) {
    this.channel = channel;
    this.onAttention = onAttention;
    /** @type {Record<string, any>} */
    this.query = {};
    /** @type {Record<string, any> | null} */
    this.view = null;
    this.serial = 0;
    this.caption = h("div", { class: "nnsp-tensor-caption" }, "the value of the selected step");
    this.rowSelect = h("select", { class: "nnsp-input", "aria-label": "Dim shown as rows", onchange: () => this.reslice() });
    this.colSelect = h("select", { class: "nnsp-input", "aria-label": "Dim shown as columns", onchange: () => this.reslice() });
    this.against = h("select", { class: "nnsp-input", "aria-label": "Difference with run", onchange: () => this.reslice() });
    this.sliders = h("div", { class: "nnsp-sliders" });
    this.canvas = h("canvas", { class: "nnsp-heatmap", role: "img", "aria-label": "Heatmap of the slice" });
    this.readout = h("div", { class: "nnsp-readout", role: "status", "aria-live": "polite" }, "hover a cell for its index and value");
    this.legendBox = h("div", { class: "nnsp-legend-box" });
    this.note = h("div", { class: "nnsp-note" });
    this.box = h("div", { class: "nnsp-heatmap-box", tabindex: "0", role: "region", "aria-label": "Heatmap (scrolls)" }, this.canvas);
    container.append(this.caption,
      h("div", { class: "nnsp-controls" },
        h("label", { class: "nnsp-label" }, "rows ", this.rowSelect), h("label", { class: "nnsp-label" }, "cols ", this.colSelect),
        h("label", { class: "nnsp-label" }, "diff with ", this.against)),
      this.sliders, this.legendBox, this.box, this.readout, this.note);
    // nothing to draw until a step with a tensor is shown: no empty selects, no blank 300 x 150 canvas
    this.panel = container;
    container.classList.add("nnsp-tensor-empty");
    attachHover(this.canvas, this.readout, () => {
      const view = this.view;
      if (!view) return null;
      const rows = view.dims.length === 1 ? 1 : view.row_ids.length;
      return { rows, cols: view.col_ids.length, values: view.values, label: (r, c) => `[${fullIndex(/** @type {any} */ (view), r, c).join(", ")}]` };
    });
    this.setRuns([]);
  }

  /** @param {{ name: string }[]} runs */
  setRuns(runs) {
    const keep = this.against.value;
    clear(this.against).append(h("option", { value: "" }, "none (the value)"), ...runs.map((r) => h("option", { value: r.name }, r.name)));
    if (runs.some((r) => r.name === keep)) this.against.value = keep;
  }

  /** Nothing shown (a new run has no step yet): the value of a run gone is not left on screen. */
  clearView() {
    this.serial += 1;
    this.view = null;
    this.caption.textContent = "the value of the selected step";  // not the caption of a value gone
    this.panel.classList.add("nnsp-tensor-empty");
    this.note.textContent = "";
    clear(this.legendBox);
    this.canvas.width = 0;
    this.canvas.style.width = "0px";
    this.canvas.style.height = "0px";
  }

  // query: {run, trace_step} or {step_index}; the dims and indices are kept while the shape is the same.
  /** @param {Record<string, unknown>} query */
  async show(query) {
    this.query = { ...query };
    const keep = this.view && this.view.shape ? this.view : null;
    /** @type {Record<string, unknown>} */
    const args = { ...this.query };
    if (this.against.value) args.against = this.against.value;
    if (keep && this.lastShape === JSON.stringify(keep.shape)) { args.dims = keep.dims; args.index = keep.index; }
    await this.fetch(args, true);
  }

  /** What a stepping command sends so that its reply brings the new step's heatmap (`with_tensor`). */
  keepArgs() {
    const keep = this.view && this.view.shape ? this.view : null;
    /** @type {Record<string, unknown>} */
    const args = {};
    if (this.against.value) args.against = this.against.value;
    if (keep) { args.dims = keep.dims; args.index = keep.index; }
    return args;
  }

  /**
   * The heatmap a stepping command's reply brought: drawn as a `show` answer would be (an older
   * request answered later does not draw over it).
   * @param {{ query: Record<string, unknown>, view?: Record<string, any>, error?: string }} reply
   */
  apply(reply) {
    this.serial += 1;
    this.query = { ...reply.query };
    if (reply.view) { this.render(reply.view); return; }
    this.view = null;
    this.panel.classList.add("nnsp-tensor-empty");
    this.note.textContent = reply.error || "";
    clear(this.legendBox);
    this.canvas.width = 0;
    this.canvas.style.width = "0px";
    this.canvas.style.height = "0px";
  }

  reslice() {
    if (!this.view) return;
    const dims = [Number(this.rowSelect.value), Number(this.colSelect.value)].filter((d) => d >= 0);
    const unique = dims.length === 2 && dims[0] === dims[1] ? [dims[1]] : dims;
    /** @type {(number | null)[]} */
    const index = this.view.shape.map((/** @type {number} */ _, /** @type {number} */ d) => {
      const slider = /** @type {HTMLInputElement | null} */ (this.sliders.querySelector(`[data-dim="${d}"]`));
      return unique.includes(d) ? null : (slider ? Number(slider.value) : 0);
    });
    /** @type {Record<string, unknown>} */
    const args = { ...this.query, dims: unique, index };
    if (this.against.value) args.against = this.against.value;
    return this.fetch(args, false);
  }

  /**
   * @param {Record<string, unknown>} args
   * @param {boolean} fresh
   * @returns {Promise<void>}
   */
  async fetch(args, fresh) {
    const serial = ++this.serial;
    let data;
    try {
      data = await this.channel.request("tensor", args);
    } catch (err) {
      if (serial !== this.serial) return;
      if (fresh && args.dims) {  // the kept dims do not fit this value: start from its defaults
        const { dims: _d, index: _i, ...rest } = args;
        return this.fetch(rest, fresh);
      }
      this.view = null;
      this.panel.classList.add("nnsp-tensor-empty");
      this.note.textContent = /** @type {Error} */ (err).message;
      clear(this.legendBox);
      this.canvas.width = 0;
      this.canvas.style.width = "0px";
      this.canvas.style.height = "0px";
      return;
    }
    if (serial !== this.serial) return;
    this.render(data);
  }

  /** @param {Record<string, any>} view */
  render(view) {
    this.view = view;
    this.panel.classList.remove("nnsp-tensor-empty");
    this.lastShape = JSON.stringify(view.shape);
    const where = view.step_index ? `step ${view.step_index}` : "input";
    this.caption.textContent = `${view.run} · ${where} (trace #${view.trace_step}) · ${shownVar(view.var, "(a value of the statement)")} ` +
      `[${view.shape.join(", ")}]${view.against ? ` − ${view.against}` : ""}`;
    const ndim = view.shape.length;
    /** @param {HTMLSelectElement} select @param {number} chosen @param {boolean} allowNone */
    const fill = (select, chosen, allowNone) => {
      clear(select).append(...(allowNone ? [h("option", { value: "-1" }, "—")] : []),
        ...view.shape.map((/** @type {number} */ n, /** @type {number} */ d) => h("option", { value: String(d) }, `dim ${d} (${n})`)));
      select.value = String(chosen);
    };
    fill(this.rowSelect, view.dims.length === 2 ? view.dims[0] : -1, true);
    fill(this.colSelect, view.dims[view.dims.length - 1], false);
    this.rowSelect.disabled = ndim < 2;
    clear(this.sliders);
    view.shape.forEach((/** @type {number} */ n, /** @type {number} */ d) => {
      if (view.index[d] === null) return;
      const out = h("output", { class: "nnsp-slider-value" }, `${view.index[d]}`);
      const slider = h("input", { type: "range", min: "0", max: String(n - 1), value: String(view.index[d]), "data-dim": String(d),
        class: "nnsp-slider", "aria-label": `Index of dim ${d}`,
        oninput: () => { out.textContent = slider.value; },
        onchange: () => this.reslice() });
      this.sliders.append(h("label", { class: "nnsp-label" }, `dim ${d} `, slider, out, ` / ${n - 1}`));
    });
    const rows = view.dims.length === 1 ? 1 : view.row_ids.length;
    const cols = view.col_ids.length;
    const width = Math.max(160, (this.box.clientWidth || 320) - 4);
    const size = cellSize(rows, cols, width, 320);
    // a signed slice is coloured on a diverging scale over [-m, m]: white is 0, whatever the ends
    const [lo, hi] = Array.isArray(view.range) ? view.range : [view.min, view.max];
    drawCells(this.canvas, view.values, rows, cols, size, lo, hi, view.scale, cellHeight(rows, size, 160));
    this.canvas.setAttribute("aria-label", `Heatmap of ${shownVar(view.var, "the value")}: ${rows} x ${cols} cells from ${fmt(view.min)} to ${fmt(view.max)}`);
    clear(this.legendBox).append(legend(lo, hi, view.scale));
    if (view.scale === "diverging" && (view.min !== lo || view.max !== hi)) {
      this.legendBox.append(h("span", { class: "nnsp-note" }, ` values from ${fmt(view.min)} to ${fmt(view.max)}`));
    }
    this.note.textContent = [view.note, view.attention ? `attention weights (${view.attention}): every head in the attention view` : ""].filter(Boolean).join(" · ");
    if (view.attention_block) this.note.textContent += `${this.note.textContent ? " · " : ""}a fused attention call in ${view.attention_block}: its heads, recomputed, in the attention view`;
    if (this.onAttention) {
      this.onAttention(view.attention ? { run: view.run, trace_step: view.trace_step }
        : view.attention_block ? { run: view.run, block: view.attention_block } : {});
    }
  }
}
