// Go anywhere in one action: the search box and its results, the breakpoint list with its hits,
// and the call stack panel. Every action is a kernel request (search, break_at, run_to_here,
// clear_breakpoints, remove_breakpoint, call_stack); the views only draw the replies.

import { h, clear, fmt } from "./dom.js";

const RESTARTED = /cannot send|comm .*(closed|not open)|kernel .*(dead|restart)|no comm/i;

// The message to show for a failed request: a kernel that restarted under the widget says so.
/** @param {unknown} err @returns {{ text: string, restarted: boolean }} */
export function explainError(err) {
  const text = err instanceof Error ? err.message : String(err);
  if (RESTARTED.test(text)) return { text: "kernel restarted: re-run the cell to inspect again", restarted: true };
  return { text, restarted: false };
}

/**
 * @typedef {{ node: number, kind: string, text: string, source?: string, op: string, shape: string, line: number,
 *   block: string, path: string, ancestors: number[], source_block: number, ran?: boolean }} SearchResult
 * @typedef {{ kind: string, node: number, file: string, line: number, block: string, label: string,
 *   hits: number, enabled: boolean }} BreakpointItem
 * @typedef {{ items: BreakpointItem[], hits: Record<string, any>[], reason: string }} BreakpointView
 */

// Keyboard moves in a result list: the index after ArrowDown/ArrowUp/Home/End, else null.
/** @param {string} key @param {number} index @param {number} count @returns {number | null} */
export function moveSelection(key, index, count) {
  if (count <= 0) return null;
  if (key === "ArrowDown") return Math.min(count - 1, index + 1);
  if (key === "ArrowUp") return Math.max(0, index - 1);
  if (key === "Home") return 0;
  if (key === "End") return count - 1;
  return null;
}

// The line under the breakpoints: why the last command stopped, or that its target never came.
/** @param {string} reason @returns {string} */
export function reasonText(reason) {
  if (!reason) return "";
  return reason.startsWith("target not reached") ? reason : `stopped: ${reason}`;
}

export class NavigatorPanel {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ jump: (result: SearchResult) => unknown, send: (command: string, args?: Record<string, unknown>) => Promise<unknown>,
   *   onBreakpoints?: (view: BreakpointView) => void, isStatic: boolean, lowered?: () => boolean, onEscape?: () => void,
   *   onBlockView?: (result: SearchResult, view: string) => unknown }} options
   */
  constructor(container, channel, { jump, send, onBreakpoints, isStatic, lowered, onEscape, onBlockView }) {
    /** a block result's views: "output" (the tensor it returns), "heads", "layers" (every layer) */
    this.onBlockView = onBlockView;
    this.channel = channel;
    /** where Escape sends the focus (the tree) */
    this.onEscape = onEscape || (() => undefined);
    /** whether the tree shows the lowered instructions (results then show theirs, not the source text) */
    this.isLowered = lowered || (() => false);
    this.jump = jump;
    this.send = send;
    this.onBreakpoints = onBreakpoints || (() => undefined);
    /** @type {SearchResult[]} */
    this.results = [];
    /** whether some run has finished (then a row not run "never ran"; before, it is "not run yet") */
    this.finished = false;
    /** the breakpoints and hits listed last, as JSON */
    this.listed = "";
    this.selected = -1;
    this.query = "";
    this.input = h("input", { class: "nnsp-input nnsp-search", type: "search", "aria-label": "Search the schema",
      placeholder: "search: h.1.attn, key_states, softmax…  (Enter)", disabled: isStatic,
      onkeydown: (/** @type {KeyboardEvent} */ event) => this.onKey(event),
      onfocus: () => this.input.select() });  // typing replaces the old query
    this.count = h("span", { class: "nnsp-note nnsp-search-count", role: "status", "aria-live": "polite" });
    this.list = h("ul", { class: "nnsp-results", "aria-label": "Search results" });
    this.reason = h("div", { class: "nnsp-stop-reason", role: "status", "aria-live": "polite" });
    this.bpList = h("ul", { class: "nnsp-bps", "aria-label": "Breakpoints" });
    this.hitList = h("ol", { class: "nnsp-hits", "aria-label": "Breakpoint hits" });
    const button = (/** @type {string} */ label, /** @type {() => unknown} */ action, /** @type {string} */ title) =>
      h("button", { class: "nnsp-button nnsp-button-small", type: "button", "aria-label": label, title, disabled: isStatic, onclick: action }, label);
    container.append(
      h("div", { class: "nnsp-search-row" }, this.input, this.count),
      this.list,
      h("div", { class: "nnsp-bp-bar" },
        h("span", { class: "nnsp-key" }, "breakpoints"),
        button("Break on NaN/Inf", () => this.request("break_at", { nonfinite: true }), "stop at the first value with a NaN or an Inf"),
        button("Clear breakpoints", () => this.request("clear_breakpoints"), "remove every breakpoint")),
      this.bpList, this.reason, this.hitList);
  }

  /** @param {KeyboardEvent} event */
  onKey(event) {
    event.stopPropagation();  // typing in the box is not a stepper shortcut
    if (event.key === "ArrowDown" && this.results.length) {  // into the results: one tab stop each
      event.preventDefault();
      this.focusResult(Math.max(0, this.selected));
      return;
    }
    if (event.key === "Enter") {
      event.preventDefault();
      const query = this.input.value.trim();
      if (query && query !== this.query) this.search(query).then(() => this.open(0));
      else if (this.results.length) this.open(Math.max(0, this.selected));
    } else if (event.key === "Escape") {
      event.preventDefault();
      this.input.value = "";
      this.query = "";  // the same search typed again searches again (Enter did nothing before)
      this.show([], "");
      this.onEscape();
    }
  }

  /** Keys on a focused result: arrows move, Enter opens, b breaks there, h runs to it, Escape goes back.
   * @param {KeyboardEvent} event @param {number} index */
  onResultKey(event, index) {
    event.stopPropagation();
    const moved = moveSelection(event.key, index, this.results.length);
    if (moved !== null) {
      event.preventDefault();
      if (event.key === "ArrowUp" && index === 0) this.input.focus();
      else this.focusResult(moved);
      return;
    }
    const result = this.results[index];
    if (event.key === "Enter" || event.key === " ") { event.preventDefault(); this.open(index); }
    else if (event.key === "b") { event.preventDefault(); this.request("break_at", { node: result.node }); }
    else if (event.key === "h") { event.preventDefault(); this.send("run_to_here", { node: result.node }); }
    else if (event.key === "Escape") { event.preventDefault(); this.onEscape(); }
  }

  /** @param {number} index */
  focusResult(index) {
    this.select(index);
    const button = /** @type {HTMLElement | null} */ (this.list.children[index]?.querySelector(".nnsp-result-open"));
    button?.focus();
  }

  /** @param {string} query */
  async search(query) {
    this.query = query;
    try {
      const data = await this.channel.request("search", { query, lowered: this.isLowered() });
      this.finished = Boolean(data.finished);
      if (query === this.query) this.show(data.results, query);
    } catch (err) {
      this.show([], query);
      this.count.textContent = /** @type {Error} */ (err).message;
    }
  }

  /** After the run moved: rows flagged "never ran" may have run now; ask again and redraw the
   * results in place (the selection and the focus stay). */
  async refreshRan() {
    if (!this.query || !this.results.some((r) => r.ran === false)) return;
    const query = this.query;
    const selected = this.selected;
    const home = /** @type {Document | ShadowRoot} */ (this.list.getRootNode());  // marimo: a shadow root
    const focused = this.list.contains(home.activeElement || document.activeElement);
    let data;
    try {
      data = await this.channel.request("search", { query, lowered: this.isLowered() });
    } catch (err) {
      return;
    }
    if (query !== this.query) return;
    this.finished = Boolean(data.finished);
    this.show(data.results, query);
    if (selected >= 0 && selected < this.results.length) {
      if (focused) this.focusResult(selected);
      else this.select(selected);
    }
  }

  /** @param {SearchResult[]} results @param {string} query */
  show(results, query) {
    this.results = results;
    this.selected = results.length ? 0 : -1;
    clear(this.list);
    const never = results.filter((r) => r.ran === false).length;
    // "never ran" only once a run has finished without running it; before that, "not run yet"
    const notRun = this.finished ? "never ran" : "not run yet";
    this.count.textContent = query ? `${results.length}${results.length >= 200 ? "+" : ""} match${results.length === 1 ? "" : "es"}` +
      (never ? ` · ${never} ${notRun}` : "") : "";
    results.forEach((result, index) => {
      const where = result.path || result.block || "root";
      // The source view shows a row's source text; the lowered view its instruction.
      const text = (!this.isLowered() && result.source) || result.text;
      const ran = result.ran === false ? h("span", { class: "nnsp-flag nnsp-flag-never",
        title: this.finished ? "no run so far ran this row" : "the run has not reached this row yet" }, notRun) : null;
      // One tab stop per result (the row's button); ● and ▶ are for the mouse, b and h their keys.
      const item = h("li", { class: `nnsp-result${result.ran === false ? " nnsp-result-never" : ""}`, "data-selected": String(index === 0),
        "data-node": result.node, "data-ran": String(result.ran !== false) },
        h("button", { class: "nnsp-result-open", type: "button", title: `${result.text}\nEnter: go there · b: break here · h: run to here`,
          onclick: () => this.open(index), onkeydown: (/** @type {KeyboardEvent} */ e) => this.onResultKey(e, index) },
          h("span", { class: `nnsp-badge nnsp-badge-${result.kind}` }, result.kind),
          h("code", { class: "nnsp-result-text" }, text),
          h("span", { class: "nnsp-result-where", title: where }, h("span", {}, where)), ran),
        h("button", { class: "nnsp-icon", type: "button", tabindex: "-1", title: "break here (b)", "aria-label": `Break at ${text}`,
          onclick: (/** @type {Event} */ e) => { e.stopPropagation(); this.request("break_at", { node: result.node }); } }, "●"),
        h("button", { class: "nnsp-icon", type: "button", tabindex: "-1", title: "run to here (h)", "aria-label": `Run to ${text}`,
          onclick: (/** @type {Event} */ e) => { e.stopPropagation(); this.send("run_to_here", { node: result.node }); } }, "▶"));
      if (result.kind === "block" && this.onBlockView) item.append(blockViews(result, this.onBlockView));
      this.list.append(item);
    });
  }

  /** @param {number} index */
  select(index) {
    this.selected = index;
    this.list.querySelectorAll(".nnsp-result").forEach((el, i) => el.setAttribute("data-selected", String(i === index)));
    const el = this.list.children[index];
    if (el) /** @type {HTMLElement} */ (el).scrollIntoView({ block: "nearest" });
  }

  /** @param {number} index */
  open(index) {
    const result = this.results[index];
    if (!result) return;
    this.select(index);
    this.jump(result);
  }

  /** @param {string} type @param {Record<string, unknown>} [args] */
  async request(type, args = {}) {
    try {
      this.update(await this.channel.request(type, args));
    } catch (err) {
      this.reason.textContent = explainError(err).text;
    }
  }

  clearReason() {
    this.reason.textContent = "";
    this.reason.dataset.kind = "";
  }

  async refresh() {
    try {
      this.update(await this.channel.request("breakpoints"));
    } catch (err) {
      /* a closed or restarted kernel: the error bar says so */
    }
  }

  /** @param {BreakpointView} view */
  update(view) {
    this.reason.textContent = reasonText(view.reason);
    this.reason.dataset.kind = view.reason.startsWith("target not reached") ? "not-reached" : view.reason ? "stopped" : "";
    const key = JSON.stringify([view.items, view.hits.slice(-5)]);
    if (key === this.listed) {  // the same breakpoints and hits (most steps): the lists stay
      this.onBreakpoints(view);
      return;
    }
    this.listed = key;
    clear(this.bpList);
    for (const [index, bp] of view.items.entries()) {
      this.bpList.append(h("li", { class: "nnsp-bp", "data-kind": bp.kind },
        h("span", { class: "nnsp-bp-dot" }, "●"), h("span", { class: "nnsp-bp-label" }, bp.label),
        h("span", { class: "nnsp-note" }, bp.hits ? `${bp.hits} hit${bp.hits === 1 ? "" : "s"}` : ""),
        h("button", { class: "nnsp-icon", type: "button", title: "remove", "aria-label": `Remove breakpoint ${bp.label}`,
          onclick: () => this.request("remove_breakpoint", { index }) }, "×")));
    }
    if (!view.items.length) this.bpList.append(h("li", { class: "nnsp-note" }, "none: ● on a search result, a click on a source line number, or break_at(...)"));
    clear(this.hitList);
    for (const hit of view.hits.slice(-5).reverse()) {  // the active run's own hits
      this.hitList.append(h("li", {}, `${hit.run ? `${hit.run} · ` : ""}step ${hit.step} · ${hit.reason}${hit.line ? ` · line ${hit.line}` : ""}`));
    }
    this.onBreakpoints(view);
  }
}

// A block result's views one click away: its output (run to the tensor it returns), its attention
// heads (an attention block), the same output in every layer (a block inside a layer of a ModuleList).
/** @param {SearchResult} result @param {(result: SearchResult, view: string) => unknown} act */
function blockViews(result, act) {
  const path = result.path || result.block || "";
  /** @param {string} label @param {string} view @param {string} title */
  const button = (label, view, title) => h("button", { class: "nnsp-button nnsp-button-small nnsp-block-view", type: "button",
    tabindex: "-1", title, "aria-label": `${label} of ${path}`, "data-view": view,
    onclick: (/** @type {Event} */ e) => { e.stopPropagation(); act(result, view); } }, label);
  return h("span", { class: "nnsp-block-views" },
    button("output", "output", "run to the tensor this block returns and show it"),
    /attention/i.test(result.text) ? button("heads", "heads", "run to this block's output and show its attention heads") : null,
    /\.\d+(\.|$)/.test(path) ? button("every layer", "layers", "this block's output in every layer (the Layers tab)") : null);
}

export class CallStackPanel {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ showFrame: (frame: Record<string, any>) => unknown }} options
   */
  constructor(container, channel, { showFrame }) {
    this.channel = channel;
    this.showFrame = showFrame;
    this.frames = h("ol", { class: "nnsp-frames", "aria-label": "Call stack frames" });
    // a scrolled region is reachable by keyboard (axe: scrollable-region-focusable)
    this.vars = h("div", { class: "nnsp-frame-vars", tabindex: "0", role: "region", "aria-label": "Variables of the selected frame" });
    container.append(this.frames, this.vars);
    this.serial = 0;
    /** @type {Record<string, any>[]} */
    this.data = [];
    /** the frames drawn last, as JSON, and the index of the frame selected */
    this.shown = "";
    this.selected = -1;
  }

  async refresh() {
    const serial = ++this.serial;
    let frames;
    try {
      frames = (await this.channel.request("call_stack")).frames;
    } catch (err) {
      return;
    }
    if (serial !== this.serial) return;
    this.show(frames);
  }

  /** The frames of the paused step (from a call_stack request, or a stepping command's reply).
   * @param {Record<string, any>[]} frames */
  show(frames) {
    this.serial += 1;  // a request still in flight is older than these
    const key = JSON.stringify(frames);
    const current = frames.findIndex((/** @type {Record<string, any>} */ f) => f.current);
    const chosen = current >= 0 ? current : frames.length - 1;
    // the same frames and values, the run's frame selected: nothing to redraw
    if (key === this.shown && this.selected === chosen) return;
    this.shown = key;
    this.data = frames;
    clear(this.frames);
    if (!frames.length) {
      this.selected = -1;
      this.frames.append(h("li", { class: "nnsp-note" }, "no paused step"));
      clear(this.vars);
      return;
    }
    frames.forEach((/** @type {Record<string, any>} */ frame, /** @type {number} */ index) => {
      const pending = Boolean(frame.pending);  // the callee of a pause before a call: not entered yet
      this.frames.append(h("li", {},
        h("button", { class: `nnsp-frame${frame.current ? " nnsp-frame-current" : ""}${pending ? " nnsp-frame-pending" : ""}`, type: "button",
          "aria-label": `Frame ${index}: ${frame.block || "root"}${pending ? " (about to be called)" : ""}`, onclick: () => this.select(index) },
        pending ? `→ ${frame.block} (about to be called)` : `${frame.block || "(root)"}`)));
    });
    this.select(chosen, false);
  }

  /** @param {number} index @param {boolean} [show] */
  select(index, show = true) {
    const frame = this.data[index];
    if (!frame) return;
    this.selected = index;
    this.frames.querySelectorAll(".nnsp-frame").forEach((el, i) => el.setAttribute("aria-pressed", String(i === index)));
    clear(this.vars);
    const rows = frame.vars.map((/** @type {Record<string, any>} */ v) => h("tr", {},
      h("td", { class: "nnsp-var-name" }, v.name),
      h("td", {}, v.shape ? `${v.dtype}[${v.shape.join(", ")}]` : `${v.type}${v.value !== undefined ? ` ${v.value}` : ""}`),
      h("td", { class: "nnsp-num" }, v.stats ? `μ ${fmt(v.stats.mean)} σ ${fmt(v.stats.std)} [${fmt(v.stats.min)}, ${fmt(v.stats.max)}]` : "")));
    this.vars.append(h("table", { class: "nnsp-table nnsp-vars-table", "aria-label": `Variables of ${frame.block || "root"}` },
      h("tbody", {}, ...rows)));
    if (show && frame.node >= 0) this.showFrame(frame);
  }
}
