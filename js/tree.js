// The block tree: blocks, statements, instructions and branches as a collapsible tree, built lazily
// from the compact rows the kernel sends ([id, parent, kind, text, shape, line, nChildren, op, extra]);
// children missing from the first payload are fetched when a node is expanded. `setLowered` switches
// between the source view and the lowered one (see treemodel.js) and redraws.

import { h, clear, scrollWithin } from "./dom.js";
import { KIND_LABEL, TreeModel, textParts } from "./treemodel.js";

/** @typedef {import("./types").TreeNode} TreeNode */

export class TreeView extends TreeModel {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ onLook?: (node: TreeNode) => void, onRowAction?: (node: number, action: string) => void }} [options]
   */
  constructor(container, channel, { onLook, onRowAction } = {}) {
    super();
    this.container = container;
    this.channel = channel;
    /** a click on a row: the view goes there (the run's current row stays) */
    this.onLook = onLook;
    this.onRowAction = onRowAction;
    this.current = -1;
    /** the row highlighted for `current`: it, or the folded statement holding it */
    this.currentRow = -1;
    /** the row the user is looking at (a search result, a clicked row), apart from the run's: -1 when none */
    this.looking = -1;
    this.revealSerial = 0;
    this.lookSerial = 0;
    /** @type {{ never: number[], live: number[], untaken?: number[], known?: boolean }} */
    this.blocks = { never: [], live: [], untaken: [], known: false };
  }

  /** @param {{ rows?: import("./types").TreeRow[], root?: number }} tree */
  init(tree) {
    this.load(tree.rows || []);
    this.root = tree.root ?? 0;
    this.open.add(this.root);
    clear(this.container);
    const rootNode = this.nodes.get(this.root);
    if (rootNode) this.container.append(this.renderNode(rootNode));
  }

  /** @param {number[]} ids */
  async fetchChildren(ids) {
    const missing = this.missing(ids);
    if (!missing.length) return;
    const data = await this.channel.request("children", { nodes: missing });
    this.load(data.rows);
  }

  /**
   * Switch between the source view (false) and the lowered view (true), redrawing the tree with the
   * same nodes open and the current step's row highlighted.
   * @param {boolean} lowered
   */
  setLowered(lowered) {
    if (Boolean(lowered) === this.lowered && this.container.firstChild) return;
    this.lowered = Boolean(lowered);
    this.container.classList.toggle("nnsp-tree-lowered", this.lowered);
    this.container.dataset.view = this.lowered ? "lowered" : "source";
    clear(this.container);
    const rootNode = this.nodes.get(this.root);
    if (rootNode) this.container.append(this.renderNode(rootNode));
    if (this.current >= 0) this.reveal(this.current).catch(() => undefined);
  }

  /**
   * A let-through statement (lowered view): no row, its children drawn in its place.
   * @param {TreeNode} node
   * @returns {HTMLElement}
   */
  renderFlat(node) {
    const children = h("div", { class: "nnsp-children", role: "none" });
    const el = h("div", { class: "nnsp-node nnsp-flat", role: "none", "data-node": node.id }, children);
    node.el = el;
    node.open = true;
    this.fillChildren(node);
    return el;
  }

  /**
   * @param {TreeNode} node
   * @returns {HTMLElement}
   */
  renderNode(node) {
    if (this.isFlat(node)) return this.renderFlat(node);
    const hasChildren = node.count > 0;
    const isOpen = this.isOpen(node);
    const label = KIND_LABEL[node.kind] ?? node.kind;
    const shown = this.displayText(node);
    const [bound, rhs] = node.kind === "B" || node.kind === "b" ? [null, shown] : textParts(shown);
    const source = !this.lowered && (node.kind === "s" || node.extra.src !== undefined);
    const lines = node.extra.end ? `lines ${node.line}–${node.extra.end}` : node.line ? `line ${node.line}` : "";
    const where = node.kind === "s" ? `${node.count} instructions · ${lines} (expand to see them)`
      : node.op ? `${node.op}${lines ? ` · ${lines}` : ""}` : "";
    const title = source ? `${shown}${node.shape ? `  → ${node.shape}` : ""}\n${where}` : where;
    const toggle = h("button", {
      class: "nnsp-toggle", type: "button", tabindex: "-1",
      "aria-label": isOpen ? "Collapse" : "Expand", disabled: !hasChildren,
    }, hasChildren ? (isOpen ? "▾" : "▸") : "");
    // The source view gives a statement's row no op badge (the code says what it does); a call
    // keeps its badge, a compound row its if/for/while.
    const badge = source && (node.kind === "s" || node.kind === "o" || node.kind === "r" || node.kind === "x") ? "" : label;
    const row = h("div", { class: `nnsp-row${source ? " nnsp-row-source" : ""}`, "data-node": node.id, title },
      toggle,
      badge ? h("span", { class: `nnsp-badge nnsp-badge-${badge}` }, badge) : null,
      h("span", { class: "nnsp-text" }, bound ? h("span", { class: "nnsp-var" }, bound) : null, bound ? " = " : null, rhs),
      node.shape ? h("span", { class: "nnsp-shape" }, node.shape) : null,
      node.kind === "o" && node.op && !source ? h("span", { class: "nnsp-op" }, node.op) : null,
      node.extra.skip ? h("span", { class: "nnsp-flag nnsp-flag-skip", title: node.extra.skip }, "skipped") : null,
      node.extra.skip ? h("span", { class: "nnsp-reason" }, node.extra.skip) : null,
      h("span", { class: "nnsp-flag nnsp-flag-run", hidden: true }),
      this.onRowAction && node.kind !== "b" ? rowActions(node, shown, this.onRowAction) : null,
    );
    const children = h("div", { class: "nnsp-children", role: "group" });
    const el = h("div", {
      class: `nnsp-node nnsp-kind-${node.kind === "B" ? "block" : node.kind}${this.isFold(node) ? " nnsp-fold" : ""}`, role: "treeitem",
      "data-node": node.id, "aria-expanded": hasChildren ? String(isOpen) : null,
    }, row, children);
    node.el = el;
    node.open = isOpen;
    row.addEventListener("click", (event) => {
      event.stopPropagation();
      if (node.extra.to !== undefined && /** @type {Element} */ (event.target).classList.contains("nnsp-text")) {
        const target = this.nodes.get(node.extra.to) || /** @type {TreeNode} */ ({ id: node.extra.to, parent: -1, kind: "B", text: node.text,
          shape: "", line: 0, count: 0, op: "", extra: {}, children: [], el: null });
        if (this.onLook) this.onLook(target);
        return;
      }
      if (this.onLook && !/** @type {Element} */ (event.target).closest(".nnsp-toggle")) this.onLook(node);
      if (hasChildren) this.toggle(node);
    });
    if (isOpen) this.fillChildren(node);
    this.markRun(node);
    if (node.id === this.currentRow) row.classList.add("nnsp-current");
    if (node.id === this.looking) row.classList.add("nnsp-looking");
    return el;
  }

  /** @param {TreeNode} node */
  fillChildren(node) {
    const box = /** @type {HTMLElement} */ (/** @type {HTMLElement} */ (node.el).querySelector(":scope > .nnsp-children"));
    clear(box);
    // The lowered view draws let-through statements' children here too: fetch them all at once.
    const wanted = this.loaded(node) ? this.flatMissing(node.id) : [node.id];
    if (wanted.length) {
      box.append(h("div", { class: "nnsp-loading" }, "loading…"));
      this.fetchChildren(wanted).then(() => this.fillChildren(node)).catch((err) => {
        clear(box).append(h("div", { class: "nnsp-error" }, err.message));
      });
      return;
    }
    for (const id of node.children) box.append(this.renderNode(/** @type {TreeNode} */ (this.nodes.get(id))));
  }

  /**
   * @param {TreeNode} node
   * @param {boolean} open
   */
  setOpen(node, open) {
    node.open = open;
    this.markOpen(node.id, open);
    if (!node.el) return;
    node.el.setAttribute("aria-expanded", String(open));
    const toggle = /** @type {HTMLElement} */ (node.el.querySelector(":scope > .nnsp-row > .nnsp-toggle"));
    toggle.textContent = open ? "▾" : "▸";
    toggle.setAttribute("aria-label", open ? "Collapse" : "Expand");
    const box = /** @type {HTMLElement} */ (node.el.querySelector(":scope > .nnsp-children"));
    if (open) this.fillChildren(node); else clear(box);
    // Opening the folded statement that shows the current step moves the highlight to the step's
    // own row (once drawn); closing it moves the highlight back up.
    if (this.current >= 0 && this.rowOf(this.current) !== this.currentRow) this.highlight(this.current, false);
  }

  /** The block row holding node `id` (itself for a block), -1 when its chain is not loaded.
   * @param {number} id */
  blockOf(id) {
    let node = this.nodes.get(id);
    while (node && node.kind !== "B") node = this.nodes.get(node.parent);
    return node ? node.id : -1;
  }

  /** @param {TreeNode} node */
  toggle(node) {
    this.setOpen(node, !node.open);
  }

  // Expand the ancestors of `id` (fetching what is missing), then highlight and show it: a step
  // (the default) stops at a folded statement and highlights that as the run's current row; a
  // search result (`into`) opens the statement too; `look` marks the row "looking at" and leaves
  // the run's current row where it is.
  /**
   * @param {number} id
   * @param {number[] | null} [ancestors]
   * @param {{ into?: boolean, look?: boolean }} [options]
   */
  async reveal(id, ancestors = null, { into = false, look = false } = {}) {
    // latest wins: a reveal whose children came late must not draw over a newer one
    const serial = look ? ++this.lookSerial : ++this.revealSerial;
    if (look) this.looking = id; else this.current = id;
    const chain = ancestors || this.ancestors(id);
    const wanted = this.unfetched(chain);
    if (wanted.length) this.load((await this.channel.request("children", { nodes: wanted })).rows);
    if (serial !== (look ? this.lookSerial : this.revealSerial)) return;
    const plan = this.revealPlan(id, chain, into);
    for (const ancestor of plan.open) {
      const node = this.nodes.get(ancestor);
      if (node && !node.open) {
        if (node.el) this.setOpen(node, true);
        else this.markOpen(node.id, true);
      }
    }
    if (look) this.highlightLook(id);
    else this.highlight(id, this.looking < 0);
  }

  /**
   * Mark the row of node `id` "looking at" (-1: none), apart from the run's current row.
   * @param {number} id
   */
  highlightLook(id) {
    for (const old of this.container.querySelectorAll(".nnsp-row.nnsp-looking")) old.classList.remove("nnsp-looking");
    this.looking = id;
    if (id < 0) return;
    const node = this.nodes.get(id);
    const row = node && node.el ? /** @type {HTMLElement | null} */ (node.el.querySelector(":scope > .nnsp-row")) : null;
    if (!row) return;
    row.classList.add("nnsp-looking");
    scrollWithin(this.container, row);
  }

  /** Back to where the run is: no "looking at" row, the current row in view. */
  clearLook() {
    this.lookSerial += 1;
    this.highlightLook(-1);
    const node = this.nodes.get(this.currentRow);
    const row = node && node.el ? node.el.querySelector(":scope > .nnsp-row") : null;
    if (row) scrollWithin(this.container, /** @type {HTMLElement} */ (row));
  }

  /**
   * Highlight the row showing node `id` (it, or the folded statement holding it).
   * @param {number} id
   * @param {boolean} [scroll]
   */
  highlight(id, scroll = true) {
    const previous = this.nodes.get(this.currentRow);
    if (previous && previous.el) previous.el.querySelector(":scope > .nnsp-row")?.classList.remove("nnsp-current");
    this.current = id;
    this.currentRow = this.rowOf(id);
    const node = this.nodes.get(this.currentRow);
    if (!node || !node.el) return;
    const row = /** @type {HTMLElement | null} */ (node.el.querySelector(":scope > .nnsp-row"));
    if (!row) return;
    row.classList.add("nnsp-current");
    if (scroll) scrollWithin(this.container, row);
  }

  /** @param {TreeNode} node */
  markRun(node) {
    if (node.kind === "b" && node.el) node.el.classList.toggle("nnsp-untaken", (this.blocks.untaken || []).includes(node.id));
    if (node.kind !== "B" || !node.el) return;
    const flag = /** @type {HTMLElement} */ (node.el.querySelector(":scope > .nnsp-row > .nnsp-flag-run"));
    const never = this.blocks.never.includes(node.id);
    const live = this.blocks.live.includes(node.id);
    flag.hidden = !(never || live);
    flag.textContent = never ? "never executed" : live ? "ran as module" : "";
    flag.classList.toggle("nnsp-flag-never", never);
    node.el.classList.toggle("nnsp-never", never);  // dimmed, not hidden
    flag.title = never ? "no run so far entered this block" : live ? "called, but ran as the real module (outside the schema)" : "";
  }

  /** @param {{ never?: number[], live?: number[] } | null | undefined} blocks */
  setBlocks(blocks) {
    this.blocks = { never: [], live: [], ...(blocks || {}) };
    for (const node of this.nodes.values()) if (node.kind === "B" || node.kind === "b") this.markRun(node);
  }
}

// A row's debugger actions: a breakpoint (on entry for a block) and run to here. A block row also
// has its views, shown on the hovered, focused or current row only (the other rows keep their
// width for their text): "out" (run to the tensor it returns, Shift+O), "heads" (an attention
// block, Shift+H) and "layers" (the same output in every layer of its ModuleList, Shift+L).
/** @param {TreeNode} node @param {string} text @param {(node: number, action: string) => void} act */
function rowActions(node, text, act) {
  /** @param {string} symbol @param {string} action @param {string} label @param {string} [cls] */
  const button = (symbol, action, label, cls = "nnsp-icon nnsp-row-action") => h("button", { class: cls, type: "button", tabindex: "-1",
    title: label, "aria-label": `${label}: ${text}`, "data-view": action,
    onclick: (/** @type {Event} */ event) => { event.stopPropagation(); act(node.id, action); } }, symbol);
  const path = node.kind === "B" ? String(node.extra.path || "") : "";
  const view = "nnsp-button nnsp-button-small nnsp-block-view nnsp-row-view";
  const views = node.kind === "B" && path ? h("span", { class: "nnsp-row-views" },
    button("out", "output", "Output: run to the tensor this block returns and show it (Shift+O)", view),
    /attention|attn/i.test(`${path} ${text}`) ? button("heads", "heads", "Heads: run to this block's output and show its attention heads (Shift+H)", view) : null,
    /\.\d+(\.|$)/.test(path) ? button("layers", "layers", "Every layer: this block's output in every layer, the Layers tab (Shift+L)", view) : null) : null;
  return h("span", { class: "nnsp-row-actions" }, views, button("●", "break", "Breakpoint"), button("▶", "run_to_here", "Run to here"));
}
