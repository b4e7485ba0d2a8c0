// The source pane: the forward source of the block holding the current step, with its line (and
// the column range of the current instruction, where Python gives it) highlighted. Sources are
// fetched once per block and cached. A click on a line number sets a breakpoint on that line
// (Shift+click: run to here); beside each line that ran, its inline value (what it bound).

import { h, clear, scrollWithin } from "./dom.js";

export class SourceView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onGutter?: (line: number, file: string, runTo: boolean) => unknown }} [options]
   */
  constructor(container, channel, { onGutter } = {}) {
    this.container = container;
    this.channel = channel;
    this.onGutter = onGutter || null;
    this.file = "";
    /** @type {Set<number>} */
    this.breakLines = new Set();
    this.inlineSerial = 0;
    /** @type {Map<number, Promise<any>>} */
    this.cache = new Map();
    /** @type {number | null} */
    this.block = null;
    this.line = 0;
    this.showSerial = 0;
    /** @type {{ block: number, line: number, col?: number, end_col?: number, end_line?: number } | null} where the run is */
    this.run = null;
    /** @type {{ block: number, line: number } | null} where the user is looking, when elsewhere */
    this.look = null;
    this.header = h("div", { class: "nnsp-source-file" }, "no step yet");
    this.body = h("pre", { class: "nnsp-source-code" });
    container.append(this.header, this.body);
  }

  /** @param {number} block */
  async source(block) {
    if (!this.cache.has(block)) this.cache.set(block, this.channel.request("source", { block }));
    return this.cache.get(block);
  }

  /**
   * Show where the run is: the block of the paused step with its line (and the instruction's
   * column range) highlighted as the current line; any "looking at" line goes.
   * @param {number | null | undefined} block
   * @param {number} line
   * @param {{ col?: number, end_col?: number, end_line?: number }} [range] the instruction's columns
   */
  async show(block, line, range = {}) {
    if (block === null || block === undefined || block < 0) return;
    this.run = { block, line, col: range.col, end_col: range.end_col, end_line: range.end_line };
    this.look = null;
    await this.display(block);
  }

  /**
   * Show a place the user is looking at (a search result, a tree row, a frame, a trace row): its
   * block with `line` marked "looking at"; the run's current line keeps its own mark when it is in
   * the same block.
   * @param {number | null | undefined} block @param {number} line
   */
  async showLook(block, line) {
    if (block === null || block === undefined || block < 0) return;
    this.look = { block, line };
    await this.display(block);
  }

  /** @param {number} block */
  async display(block) {
    // latest wins: an older request answered later (a source not cached yet) must not draw over a newer one
    const serial = ++this.showSerial;
    if (block !== this.block) {
      let source;
      try {
        source = await this.source(block);
      } catch (err) {
        if (serial !== this.showSerial) return;
        this.cache.delete(block);
        clear(this.body).append(h("span", { class: "nnsp-error" }, /** @type {Error} */ (err).message));
        this.block = null;
        return;
      }
      if (serial !== this.showSerial) return;
      this.block = block;
      this.render(source);
    }
    const run = this.run;
    if (run && run.block === this.block) this.mark(run.line, run.col, run.end_col, run.end_line, !this.look);
    else this.mark(0);
    const look = this.look;
    this.container.dataset.looking = look ? "true" : "false";
    this.markLook(look && look.block === this.block ? look.line : 0);
  }

  /** @param {number} line the "looking at" line (0: none) */
  markLook(line) {
    for (const old of this.body.querySelectorAll(".nnsp-line-looking")) old.classList.remove("nnsp-line-looking");
    const el = line ? this.body.querySelector(`.nnsp-line[data-line="${line}"]`) : null;
    if (el) {
      el.classList.add("nnsp-line-looking");
      scrollWithin(this.container, el);
    }
  }

  /** @param {{ file?: string, first: number, text?: string, note?: string }} source */
  render(source) {
    const file = source.file ? source.file.split(/[\\/]/).slice(-2).join("/") : "";
    this.header.textContent = file ? `${file}:${source.first}` : source.note || "no source";
    this.header.title = source.file || "";
    clear(this.body);
    this.file = source.file || "";
    const lines = (source.text || "").split("\n");
    lines.forEach((text, i) => {
      const number = source.first + i;
      const gutter = h("span", { class: "nnsp-lineno", title: "click: breakpoint on this line · Shift+click: run to here",
        onclick: (/** @type {MouseEvent} */ event) => { if (this.onGutter) this.onGutter(number, this.file, event.shiftKey); } },
        String(number));
      this.body.append(h("div", { class: `nnsp-line${this.breakLines.has(number) ? " nnsp-line-bp" : ""}`, "data-line": number },
        gutter, h("span", { class: "nnsp-code", "data-text": text }, text || " "), h("span", { class: "nnsp-inline" })));
    });
    this.line = 0;
  }

  /** @param {number} line @param {number} [col] @param {number} [endCol] @param {number} [endLine] @param {boolean} [scroll] */
  mark(line, col, endCol, endLine, scroll = true) {
    const old = this.body.querySelector(".nnsp-line-current");
    if (old) {
      old.classList.remove("nnsp-line-current");
      const code = /** @type {HTMLElement} */ (old.querySelector(".nnsp-code"));
      code.textContent = code.dataset.text || " ";
    }
    this.line = line;
    const el = this.body.querySelector(`.nnsp-line[data-line="${line}"]`);
    if (el) {
      el.classList.add("nnsp-line-current");
      const code = /** @type {HTMLElement} */ (el.querySelector(".nnsp-code"));
      const [before, piece, after] = columnPieces(code.dataset.text || "", col, endCol, (endLine || line) > line);
      if (piece) clear(code).append(before, h("span", { class: "nnsp-col-current" }, piece), after);
      // a statement over several lines (a call with its arguments below it): show its next lines too,
      // as far as the pane allows with its first line still in view
      const last = endLine && endLine > line ? this.body.querySelector(`.nnsp-line[data-line="${Math.min(endLine, line + 6)}"]`) : null;
      if (last && scroll) scrollWithin(this.container, last);
      if (scroll) scrollWithin(this.container, el);
    }
  }

  // Lines with a breakpoint (of this file) get a dot in the gutter.
  /** @param {{ kind: string, file: string, line: number }[]} items */
  setBreakpoints(items) {
    this.breakLines = new Set(items.filter((b) => b.kind === "line" && (!b.file || b.file === this.file)).map((b) => b.line));
    for (const el of this.body.querySelectorAll(".nnsp-line")) {
      el.classList.toggle("nnsp-line-bp", this.breakLines.has(Number(/** @type {HTMLElement} */ (el).dataset.line)));
    }
  }

  // Inline values of the shown block's lines that ran (a kernel request per call).
  async inline() {
    if (this.block === null || this.block < 0) return;
    const serial = ++this.inlineSerial;
    const block = this.block;
    let data;
    try {
      data = await this.channel.request("inline", { block });
    } catch (err) {
      return;
    }
    if (serial !== this.inlineSerial) return;
    this.applyInline(data);
  }

  /** Show inline values ({block, lines}) from an `inline` request or a stepping command's reply.
   * @param {{ block: number, lines: Record<string, string> }} data */
  applyInline(data) {
    if (data.block !== this.block) return;
    this.inlineSerial += 1;  // a request still in flight is older than these
    for (const el of this.body.querySelectorAll(".nnsp-line")) {
      const line = /** @type {HTMLElement} */ (el).dataset.line || "";
      const slot = /** @type {HTMLElement} */ (el.querySelector(".nnsp-inline"));
      slot.textContent = data.lines[line] || "";
    }
  }
}

// The current line split around the instruction's column range: [before, piece, after]; the piece
// is "" when the range is unknown or does not fit the line. A range that goes on to a later line
// is highlighted to the end of this one.
/**
 * @param {string} text @param {number | undefined} col @param {number | undefined} endCol
 * @param {boolean} multiLine the range ends on a later line
 * @returns {[string, string, string]}
 */
export function columnPieces(text, col, endCol, multiLine) {
  if (col === undefined || col === null || endCol === undefined || endCol === null) return [text, "", ""];
  const end = Math.min(multiLine ? text.length : endCol, text.length);
  if (col < 0 || col >= text.length || end <= col) return [text, "", ""];
  return [text.slice(0, col), text.slice(col, end), text.slice(end)];
}
