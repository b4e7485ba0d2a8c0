// The Patch view (widget.show_patching(table, attribution)): activation patching's effect as a
// heatmap, layers (or sites) down, positions (or heads) across, coloured on a scale diverging around
// 0 (blue below, red above; the colour's strength is |value| over the largest |value|), and the
// attribution estimate's heatmap beside it on its own scale. Hovering a cell (or focusing it) reads
// out site, layer, position or head, effect and the estimate. The cells form a grid: arrow keys
// move, Home/End go to a row's ends, Enter or a click opens the row's patched run as the
// inspector's active run stepped to its first divergence from the clean run (the kernel's
// `patch_open`, patch_view.py); the host then shows the pair in the Compare tab.
// Not in the main bundle: build.mjs makes static/patch.js, sent when the tab first opens.

import { h, clear, fmt } from "./dom.js";

/** The view's styles, added to the page once (they are not in widget.css). */
export const PATCH_STYLE = `
.nnsp-pt-maps { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.nnsp-pt-map { min-width: 0; max-width: 100%; overflow-x: auto; }
.nnsp-pt-map h4 { margin: 2px 0 4px; font-size: 0.95em; font-weight: 600; }
.nnsp-pt-grid { border-collapse: collapse; font-family: var(--nnsp-mono); font-size: 0.85em; }
.nnsp-pt-grid th { font-weight: normal; color: var(--nnsp-muted); padding: 1px 4px; white-space: nowrap; }
.nnsp-pt-grid th[scope="row"] { text-align: right; max-width: 16em; overflow: hidden; text-overflow: ellipsis; }
.nnsp-pt-cell { width: 26px; min-width: 26px; height: 22px; padding: 0; border: 1px solid var(--nnsp-border); cursor: pointer;
  text-align: center; color: var(--nnsp-fg); }
.nnsp-pt-cell:focus { outline: 2px solid var(--nnsp-accent); outline-offset: -2px; }
.nnsp-pt-cell[data-open="true"] { box-shadow: inset 0 0 0 2px var(--nnsp-fg); }
.nnsp-pt-legend { display: flex; align-items: center; gap: 6px; margin-top: 4px; font-size: 0.85em; color: var(--nnsp-muted); }
.nnsp-pt-ramp { width: 120px; height: 10px; border: 1px solid var(--nnsp-border);
  background: linear-gradient(to right, rgb(33, 102, 172), transparent, rgb(178, 24, 43)); }
.nnsp-pt-readout { min-height: 1.4em; margin: 6px 0; font-family: var(--nnsp-mono); font-size: 0.9em; }
.nnsp-pt-controls { display: flex; gap: 8px; align-items: center; margin: 4px 0; flex-wrap: wrap; }
`;

/**
 * The background of a value on a scale diverging around 0: transparent at 0, full blue at -scale,
 * full red at +scale.
 * @param {number | null | undefined} value @param {number} scale
 */
export function divergingColour(value, scale) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "repeating-linear-gradient(45deg, transparent 0 3px, rgba(128,128,128,0.35) 3px 5px)";
  const alpha = scale > 0 ? Math.min(1, Math.abs(value) / scale) : 0;
  const [r, g, b] = value < 0 ? [33, 102, 172] : [178, 24, 43];
  return `rgba(${r}, ${g}, ${b}, ${alpha.toFixed(3)})`;
}

/**
 * What hovering or focusing a cell reads out.
 * @param {Record<string, any>} data @param {Record<string, any>} cell
 */
export function cellText(data, cell) {
  const row = data.rows[cell.row];
  let text = `${row.site}`;
  if (row.layer !== null && row.layer !== undefined) text += ` · layer ${row.layer}`;
  if (data.col_axis !== "value") text += ` · ${data.col_axis} ${data.cols[cell.col]}`;
  text += ` · effect ${fmt(cell.effect)}`;
  if (data.attribution) text += ` · attribution ${fmt(cell.attribution)}`;
  return text;
}

export class PatchView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onOpened?: (reply: Record<string, any>) => void }} [options]
   */
  constructor(container, channel, { onOpened } = {}) {
    this.channel = channel;
    this.onOpened = onOpened;
    this.loaded = false;
    if (!document.getElementById("nnsp-patch-style")) document.head.append(h("style", { id: "nnsp-patch-style" }, PATCH_STYLE));
    /** @type {Record<string, any> | null} */
    this.data = null;
    this.summary = h("div", { class: "nnsp-note nnsp-pt-summary", role: "status" });
    this.maps = h("div", { class: "nnsp-pt-maps" });
    this.readout = h("div", { class: "nnsp-pt-readout", role: "status", "aria-live": "polite" });
    this.back = h("button", { class: "nnsp-button nnsp-button-small nnsp-pt-back", type: "button", hidden: true,
      title: "drop the patch and start a run on the inspector's own inputs", onclick: () => this.close() }, "Back to the inspector's inputs");
    container.append(this.summary, h("div", { class: "nnsp-pt-controls" }, this.back), this.maps, this.readout);
    /** @type {HTMLElement[][][]} one grid of cells per heatmap */
    this.grid = [];
  }

  /** Asks the kernel once per show_patching. */
  async refresh(force = false) {
    if (this.loaded && !force) return;
    this.loaded = true;
    try {
      this.render(await this.channel.request("patch", {}));
    } catch (err) {
      this.loaded = false;
      this.summary.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {Record<string, any>} data */
  render(data) {
    this.data = data;
    const n = data.cells.length;
    let text = `${n} patched runs: ${data.rows.length} ${data.row_axis === "layer" ? "layers" : "sites"}` +
      (data.col_axis === "value" ? "" : ` × ${data.cols.length} ${data.col_axis}s`);
    if (data.clean_metric !== null) text += ` · clean metric ${fmt(data.clean_metric)}, corrupted ${fmt(data.corrupted_metric)}`;
    this.summary.textContent = `${text}. Click a cell (or Enter) to open its patched run.`;
    clear(this.maps);
    this.grid = [];
    this.maps.append(this.map(data, "effect", "Activation patching (exact effect)"));
    if (data.attribution) this.maps.append(this.map(data, "attribution", "Attribution patching (estimate)"));
    this.back.hidden = data.opened === null || data.opened === undefined;
  }

  /**
   * One heatmap: a table with role grid, one focusable cell at a time (roving tabindex).
   * @param {Record<string, any>} data @param {"effect" | "attribution"} key @param {string} title
   */
  map(data, key, title) {
    const scale = data.scale[key] || 0;
    const by = new Map(data.cells.map((/** @type {any} */ c) => [`${c.row}/${c.col}`, c]));
    const gridIndex = this.grid.length;
    /** @type {HTMLElement[][]} */
    const cells = [];
    const head = h("tr", {}, h("th", { scope: "col" }, `${data.row_axis} \\ ${data.col_axis}`),
      ...(data.col_axis === "value" ? [h("th", { scope: "col" }, "")] : data.cols.map((/** @type {number} */ c) => h("th", { scope: "col" }, String(c)))));
    const body = data.rows.map((/** @type {any} */ row, /** @type {number} */ r) => {
      cells.push([]);
      const tds = data.cols.map((/** @type {number} */ _c, /** @type {number} */ c) => {
        const cell = by.get(`${r}/${c}`);
        if (!cell) { const empty = h("td", { class: "nnsp-pt-cell nnsp-pt-empty", role: "gridcell", "aria-label": "not patched", tabindex: "-1" }); cells[r].push(empty); return empty; }
        const value = cell[key];
        const td = h("td", { class: "nnsp-pt-cell", role: "gridcell", tabindex: "-1", "data-kind": key, "data-index": String(cell.index),
          "data-value": value === null || value === undefined ? "" : String(value), "data-open": String(data.opened === cell.index),
          "aria-label": `${cellText(data, cell)}; Enter opens the patched run`,
          onmouseenter: () => this.say(cell), onfocus: () => this.say(cell), onclick: () => this.open(cell, td) });
        td.style.background = divergingColour(value, scale);
        td.addEventListener("keydown", (event) => this.key(event, gridIndex, r, c, cell, td));
        cells[r].push(td);
        return td;
      });
      return h("tr", {}, h("th", { scope: "row", title: row.site }, row.label), ...tds);
    });
    this.grid.push(cells);
    const first = cells[0] && cells[0][0];
    if (first) first.tabIndex = 0;
    const table = h("table", { class: "nnsp-pt-grid", role: "grid", "data-kind": key, "aria-label": `${title}: arrow keys move, Enter opens` },
      h("thead", {}, head), h("tbody", {}, ...body));
    const legend = h("div", { class: "nnsp-pt-legend" }, h("span", {}, fmt(-scale)), h("span", { class: "nnsp-pt-ramp", "aria-hidden": "true" }),
      h("span", {}, fmt(scale)), h("span", {}, "(0: no colour)"));
    return h("div", { class: "nnsp-pt-map" }, h("h4", {}, title), table, legend);
  }

  /** @param {Record<string, any>} cell */
  say(cell) {
    if (this.data) this.readout.textContent = cellText(this.data, cell);
  }

  /**
   * @param {KeyboardEvent} event @param {number} g @param {number} r @param {number} c
   * @param {Record<string, any>} cell @param {HTMLElement} td
   */
  key(event, g, r, c, cell, td) {
    const cells = this.grid[g];
    const moves = /** @type {Record<string, [number, number]>} */ ({ ArrowUp: [r - 1, c], ArrowDown: [r + 1, c], ArrowLeft: [r, c - 1],
      ArrowRight: [r, c + 1], Home: [r, 0], End: [r, cells[r].length - 1] });
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      event.stopPropagation();
      this.open(cell, td);
      return;
    }
    const to = moves[event.key];
    if (!to) return;
    event.preventDefault();
    event.stopPropagation();  // the inspector's own keys (stepping) do not fire from the grid
    const [nr, nc] = to;
    const next = cells[nr] && cells[nr][nc];
    if (!next) return;
    td.tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
  }

  /** @param {Record<string, any>} cell @param {HTMLElement} td */
  async open(cell, td) {
    this.readout.textContent = `opening the patched run of ${cellText(/** @type {any} */ (this.data), cell)} ...`;
    let reply;
    try {
      reply = await this.channel.request("patch_open", { row: cell.index });
    } catch (err) {
      this.readout.textContent = /** @type {Error} */ (err).message;
      return;
    }
    for (const other of this.maps.querySelectorAll(".nnsp-pt-cell[data-open='true']")) other.setAttribute("data-open", "false");
    for (const same of this.maps.querySelectorAll(`.nnsp-pt-cell[data-index='${cell.index}']`)) same.setAttribute("data-open", "true");
    if (this.data) this.data.opened = cell.index;
    this.back.hidden = false;
    const first = reply.first;
    this.readout.textContent = `opened run "${reply.fork}" against "${reply.clean}": ` + (first
      ? `first divergence at step ${reply.step_index} (${first.out_var || "?"} in ${first.block_path || "(root)"}), max |Δ| ${fmt(first.max_abs_diff)}`
      : reply.note);
    td.focus();
    if (this.onOpened) this.onOpened(reply);
  }

  async close() {
    try {
      await this.channel.request("patch_close", {});
    } catch (err) {
      this.readout.textContent = /** @type {Error} */ (err).message;
      return;
    }
    for (const other of this.maps.querySelectorAll(".nnsp-pt-cell[data-open='true']")) other.setAttribute("data-open", "false");
    if (this.data) this.data.opened = null;
    this.back.hidden = true;
    this.readout.textContent = "back to the inspector's own inputs (a new run, no patch)";
  }
}

/**
 * What the lazy tab loader (lazytab.js) calls: the view, fetching its data again when the kernel
 * showed it anew (`shown` changed). An opened patched run is shown in the Compare tab (clean as A, the fork as B), its first divergence selected.
 * @param {HTMLElement} body @param {import("./types").Channel} channel @param {Record<string, any>} host
 */
export function mount(body, channel, host) {
  const view = new PatchView(body, channel, { onOpened: async (reply) => {
    await host.showTab("Compare");
    const compare = await host.compare();  // the Compare tab's view (loaded on demand)
    if (!compare) return;
    compare.selectA.value = reply.clean;
    compare.selectB.value = reply.fork;
    compare.run(true);
  } });
  let seen = -1;
  return { refresh: (/** @type {number} */ shown) => {
    if (shown !== seen) view.loaded = false;
    seen = shown;
    return view.refresh();
  } };
}
