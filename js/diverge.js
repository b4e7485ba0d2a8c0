// The Diverge view (report.show() of nnschemaparser.diverge): side b's statements block by block
// in run order, each line with its local error as a bar on a log scale (the bound marked by a tick,
// a flagged line's bar in the error colour), its status (inserted / deleted / untaken / edited) as a
// badge, the first culprit highlighted and scrolled to. A click or Enter on a line (arrow keys move
// between lines) steps both runs to it (the kernel's `diverge_step`, diverge_view.py): b is the
// inspector's own run (its tree, source and step card follow), a the reference; the panel shows
// both sides' values there (dtype, shape, statistics) with the carried and local error.
// Not in the main bundle: build.mjs makes static/diverge.js, sent when the tab first opens.

import { h, clear, fmt, scrollWithin } from "./dom.js";

/** The view's styles, added to the page once (they are not in widget.css). */
export const DIVERGE_STYLE = `
.nnsp-dv-sides { font-size: 0.9em; color: var(--nnsp-muted); margin: 2px 0 6px; }
.nnsp-dv-layout { display: flex; gap: 12px; align-items: flex-start; flex-wrap: wrap; }
.nnsp-dv-lines { flex: 3 1 520px; min-width: 0; max-height: 460px; overflow: auto; border: 1px solid var(--nnsp-border); }
.nnsp-dv-detail { flex: 1 1 260px; min-width: 240px; font-size: 0.9em; }
.nnsp-dv-block { margin: 0; padding: 3px 6px; font-size: 0.9em; font-weight: 600; background: var(--nnsp-bg2); color: var(--nnsp-fg);
  border-bottom: 1px solid var(--nnsp-border);
  position: sticky; top: 0; z-index: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nnsp-dv-line { display: grid; grid-template-columns: 3.2em 5.2em minmax(0, 1fr) clamp(48px, 20%, 130px); gap: 6px; align-items: center;
  padding: 1px 6px; cursor: pointer; font-family: var(--nnsp-mono); font-size: 0.85em; border-left: 3px solid transparent; }
.nnsp-dv-plain .nnsp-dv-line { grid-template-columns: 3.2em minmax(0, 1fr) clamp(48px, 20%, 130px); }
.nnsp-dv-plain .nnsp-dv-status { display: none; }
.nnsp-dv-line:hover { background: var(--nnsp-bg2); }
.nnsp-dv-line:focus { outline: 2px solid var(--nnsp-accent); outline-offset: -2px; }
.nnsp-dv-line[data-flagged="true"] { border-left-color: var(--nnsp-error); }
.nnsp-dv-line[data-flagged="true"] .nnsp-dv-no { color: var(--nnsp-error); font-weight: 600; }
.nnsp-dv-line.nnsp-dv-first { background: var(--nnsp-highlight); }
.nnsp-dv-line[aria-selected="true"] { box-shadow: inset 0 0 0 1px var(--nnsp-accent); }
.nnsp-dv-no { color: var(--nnsp-muted); text-align: right; }
.nnsp-dv-text { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.nnsp-dv-var { color: var(--nnsp-muted); }
.nnsp-dv-status { font-family: var(--nnsp-font); font-size: 0.85em; border-radius: 6px; padding: 0 4px; text-align: center; border: 1px solid transparent; }
.nnsp-dv-status[data-status="matched"] { color: var(--nnsp-muted); }
.nnsp-dv-status[data-status="edited"] { border-color: var(--nnsp-accent); color: var(--nnsp-accent); }
.nnsp-dv-status[data-status="inserted"] { border-color: var(--nnsp-ok); color: var(--nnsp-ok-text); }
.nnsp-dv-status[data-status="deleted"] { border-color: var(--nnsp-error); color: var(--nnsp-error); text-decoration: line-through; }
.nnsp-dv-status[data-status="untaken"] { border: 1px dashed var(--nnsp-muted); color: var(--nnsp-muted); }
.nnsp-dv-bar { position: relative; height: 10px; background: var(--nnsp-bg3); border-radius: 2px; }
.nnsp-dv-fill { position: absolute; left: 0; top: 0; bottom: 0; background: var(--nnsp-accent); border-radius: 2px; }
.nnsp-dv-line[data-flagged="true"] .nnsp-dv-fill { background: var(--nnsp-error); }
.nnsp-dv-tick { position: absolute; top: -2px; bottom: -2px; width: 2px; background: var(--nnsp-fg); }
.nnsp-dv-detail table { border-collapse: collapse; width: 100%; }
.nnsp-dv-detail th, .nnsp-dv-detail td { text-align: left; padding: 1px 4px; border-bottom: 1px solid var(--nnsp-border); font-family: var(--nnsp-mono); font-size: 0.9em; }
.nnsp-dv-detail th { color: var(--nnsp-muted); font-weight: normal; font-family: var(--nnsp-font); }
.nnsp-dv-region { margin: 4px 0; font-family: var(--nnsp-mono); overflow-wrap: anywhere; }
.nnsp-dv-key { font-family: var(--nnsp-font); color: var(--nnsp-muted); }
.nnsp-dv-detail pre { white-space: pre-wrap; margin: 4px 0; font-family: var(--nnsp-mono); font-size: 0.9em; }
`;

/**
 * Where a value sits on the bar's log scale, as a fraction of its width (0 for zero or no value).
 * @param {number | null | undefined} value @param {number[]} range [low decade, high decade]
 */
export function logPosition(value, range) {
  if (value === null || value === undefined || !(value > 0)) return 0;
  const [low, high] = range;
  return Math.max(0, Math.min(1, (Math.log10(value) - low) / (high - low)));
}

/** @param {Record<string, any>} row */
export function lineLabel(row) {
  const local = row.local === null ? "no local error" : `local error ${fmt(row.local)}`;
  const bound = row.bound === null ? "" : `, bound ${fmt(row.bound)}${row.flagged ? ", above the bound" : ""}`;
  const region = row.region_text ? `, compiled: ${row.region_text}` : "";
  return `line ${row.line} ${row.status}: ${row.text} [${row.var}] ${local}${bound}${region}`;
}

export class DivergeView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.channel = channel;
    this.loaded = false;
    if (!document.getElementById("nnsp-diverge-style")) document.head.append(h("style", { id: "nnsp-diverge-style" }, DIVERGE_STYLE));
    /** @type {Record<string, any> | null} */
    this.data = null;
    this.summary = h("div", { class: "nnsp-note nnsp-dv-summary", role: "status" });
    this.sides = h("div", { class: "nnsp-dv-sides" });
    this.lines = h("div", { class: "nnsp-dv-lines", role: "listbox", "aria-label": "Statements of side b with their local error" });
    this.detail = h("div", { class: "nnsp-dv-detail", role: "region", "aria-live": "polite", "aria-label": "Both runs at the line" },
      "click a line (or Enter) to step both runs to it");
    container.append(this.summary, this.sides, h("div", { class: "nnsp-dv-layout" }, this.lines, this.detail));
    /** @type {HTMLElement[]} */
    this.items = [];
  }

  async refresh(force = false) {
    if (this.loaded && !force) return;
    this.loaded = true;
    try {
      this.render(await this.channel.request("diverge", {}));
    } catch (err) {
      this.loaded = false;
      this.summary.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** @param {Record<string, any>} data */
  render(data) {
    this.data = data;
    const [first] = String(data.summary || "").split("\n");
    this.summary.textContent = `${first}. Bars: local error, log scale 1e${data.log_range[0]} .. 1e${data.log_range[1]}; tick: the bound.`;
    clear(this.sides).append(h("div", { "data-side": "a" }, `a (reference): ${data.sides.a}`),
      h("div", { "data-side": "b" }, `b (under test, the inspector's run): ${data.sides.b}`));
    clear(this.lines);
    // a status that every line shares (a compiled b's lines are all matched) is said once, in the summary
    this.lines.classList.toggle("nnsp-dv-plain", data.blocks.every((/** @type {any} */ b) => b.rows.every((/** @type {any} */ r) => r.status === "matched")));
    this.items = [];
    for (const block of data.blocks) {
      this.lines.append(h("div", { class: "nnsp-dv-block", title: block.file }, `${block.block || "(root)"} · ${String(block.file).split("/").pop()}`));
      for (const row of block.rows) this.lines.append(this.line(data, row));
    }
    const culprit = data.first === null ? null : this.items.find((el) => Number(el.dataset.index) === data.first);
    const start = culprit || this.items[0];
    if (start) start.tabIndex = 0;
    if (culprit) requestAnimationFrame(() => scrollWithin(this.lines, culprit));
  }

  /** @param {Record<string, any>} data @param {Record<string, any>} row */
  line(data, row) {
    const fill = h("div", { class: "nnsp-dv-fill" });
    fill.style.width = `${(100 * logPosition(row.local, data.log_range)).toFixed(1)}%`;
    const compiled = row.region_text ? ` · compiled: ${row.region_text}` : "";
    const bar = h("div", { class: "nnsp-dv-bar", title: `local ${fmt(row.local)} · carried ${fmt(row.carried)} · bound ${fmt(row.bound)}${compiled}` }, fill);
    if (row.bound !== null) {
      const tick = h("div", { class: "nnsp-dv-tick" });
      tick.style.left = `calc(${(100 * logPosition(row.bound, data.log_range)).toFixed(1)}% - 1px)`;
      bar.append(tick);
    }
    const el = h("div", { class: `nnsp-dv-line${row.index === data.first ? " nnsp-dv-first" : ""}`, role: "option", tabindex: "-1",
      "aria-selected": String(row.index === data.selected), "data-index": String(row.index), "data-line": String(row.line),
      "data-status": row.status, "data-flagged": String(row.flagged), "data-local": row.local === null ? "" : String(row.local),
      ...(row.region ? { "data-region": row.region } : {}), "aria-label": lineLabel(row), onclick: () => this.step(row, el) },
      h("span", { class: "nnsp-dv-no" }, String(row.line)), h("span", { class: "nnsp-dv-status", "data-status": row.status }, row.status),
      h("span", { class: "nnsp-dv-text", title: row.source }, row.text, h("span", { class: "nnsp-dv-var" }, `  [${row.var}${row.occurrence ? ` #${row.occurrence}` : ""}]`)),
      bar);
    el.addEventListener("keydown", (event) => this.key(event, row, el));
    this.items.push(el);
    return el;
  }

  /** @param {KeyboardEvent} event @param {Record<string, any>} row @param {HTMLElement} el */
  key(event, row, el) {
    const at = this.items.indexOf(el);
    /** @type {Record<string, number>} */
    const moves = { ArrowUp: at - 1, ArrowDown: at + 1, Home: 0, End: this.items.length - 1, PageUp: at - 10, PageDown: at + 10 };
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      event.stopPropagation();
      this.step(row, el);
      return;
    }
    if (!(event.key in moves)) return;
    event.preventDefault();
    event.stopPropagation();  // not the inspector's stepping keys
    const next = this.items[Math.max(0, Math.min(this.items.length - 1, moves[event.key]))];
    el.tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
    scrollWithin(this.lines, next);
  }

  /** @param {Record<string, any>} row @param {HTMLElement} el */
  async step(row, el) {
    for (const item of this.items) item.setAttribute("aria-selected", "false");
    el.setAttribute("aria-selected", "true");
    clear(this.detail).append(`stepping both runs to line ${row.line} ...`);
    let reply;
    try {
      reply = await this.channel.request("diverge_step", { row: row.index });
    } catch (err) {
      clear(this.detail).append(/** @type {Error} */ (err).message);
      return;
    }
    this.showDetail(reply);
  }

  /** @param {Record<string, any>} reply */
  showDetail(reply) {
    const row = reply.row;
    /** @param {Record<string, any>} side */
    const cell = (side) => side.step === null ? side.note : `step ${side.step} (${side.run})`;
    /** @param {Record<string, any>} side @param {string} key */
    const stat = (side, key) => (side.stats ? fmt(side.stats[key]) : "");
    const rows = [
      ["", "a (reference)", "b (under test)"],
      ["step", cell(reply.a), cell(reply.b)],
      ["variable", reply.a.var ?? "", reply.b.var ?? ""],
      ["line", reply.a.line ?? "", reply.b.line ?? ""],
      ["dtype", reply.a.dtype ?? "", reply.b.dtype ?? ""],
      ["shape", reply.a.shape ? `[${reply.a.shape.join(", ")}]` : "", reply.b.shape ? `[${reply.b.shape.join(", ")}]` : ""],
      ...["mean", "std", "min", "max", "l2"].map((k) => [k, stat(reply.a, k), stat(reply.b, k)]),
    ];
    const table = h("table", { class: "nnsp-dv-values" }, ...rows.map((r, i) => h("tr", {}, ...r.map((v, j) =>
      (i === 0 || j === 0) ? h("th", { scope: i === 0 ? "col" : "row" }, String(v)) : h("td", { "data-side": j === 1 ? "a" : "b", "data-key": String(r[0]) }, String(v))))));
    clear(this.detail).append(
      h("div", {}, h("strong", {}, `line ${row.line} · ${row.status}${row.flagged ? " · flagged" : ""}`)),
      h("pre", {}, row.source),
      row.source_a ? h("pre", { title: "side a's statement" }, `a: ${row.source_a}`) : "",
      h("div", { class: "nnsp-dv-errors" }, `local error ${fmt(row.local)} · carried error ${fmt(row.carried)} · bound ${fmt(row.bound)}`),
      // a compiled b: its run here is its code without the compiler; the row's compiled region says what compiling adds
      row.region_text ? h("div", { class: "nnsp-dv-region" }, h("span", { class: "nnsp-dv-key" }, "compiled region "), row.region_text) : "",
      reply.b.compiled ? h("div", { class: "nnsp-note nnsp-dv-compiled" }, reply.b.note) : "",
      table);
  }
}

/**
 * What the lazy tab loader (lazytab.js) calls: the view, fetching its data again when the kernel
 * showed it anew (`shown` changed).
 * @param {HTMLElement} body @param {import("./types").Channel} channel @param {Record<string, any>} host
 */
export function mount(body, channel, host) {
  const view = new DivergeView(body, channel);
  let seen = -1;
  return { refresh: (/** @type {number} */ shown) => {
    if (shown !== seen) view.loaded = false;
    seen = shown;
    return view.refresh();
  } };
}
