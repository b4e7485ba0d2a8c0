// The block tree's state without the DOM: the nodes loaded so far from the kernel's compact rows
// ([id, parent, kind, text, shape, line, nChildren, op, extra]), which of them are open, and the
// rules the view follows (compound statements and branches open by default once their children are
// loaded; a node the user closed stays closed).
//
// Two views of one tree. The source view (the default) reads like the code: a row shows its
// statement's text (`extra.src`, or a statement row's own text), statement rows ("s") and the test
// branch of an if/for/while (`extra.test`) stay folded until opened, and the row showing a step is
// the folded statement holding it. The lowered view (`lowered`) shows each instruction's own text
// and lets statement rows through: their children are drawn in their place, as before statements
// were grouped. Node ids are the same in both.

/** @typedef {import("./types").TreeRow} TreeRow */
/** @typedef {import("./types").TreeNode} TreeNode */

/** @type {Record<string, string>} */
export const KIND_LABEL = {
  B: "block", o: "op", c: "call", i: "if", f: "for", w: "while", t: "try", W: "with",
  d: "def", r: "return", k: "jump", x: "stmt", b: "", s: "",
};
export const OPEN_BY_DEFAULT = new Set(["i", "f", "w", "t", "W", "b"]);

/**
 * @param {TreeRow} row
 * @returns {TreeNode}
 */
export function nodeFromRow(row) {
  const [id, parent, kind, text, shape, line, count, op, extra] = row;
  return { id, parent, kind, text, shape, line, count, op, extra: extra || {}, children: [], el: null };
}

/**
 * "hidden = CALL fc1(x)" -> the bound variable set apart from the right-hand side.
 * @param {string} text
 * @returns {[string | null, string]}
 */
export function textParts(text) {
  const cut = text.indexOf(" = ");
  if (cut <= 0 || /[\[\(]/.test(text.slice(0, cut))) return [null, text];
  return [text.slice(0, cut), text.slice(cut + 3)];
}

export class TreeModel {
  constructor() {
    /** @type {Map<number, TreeNode>} */
    this.nodes = new Map();
    /** @type {Set<number>} opened by the user (or by reveal) */
    this.open = new Set();
    /** @type {Set<number>} closed by the user */
    this.closed = new Set();
    this.root = 0;
    /** the lowered view: instruction text, statement rows let through */
    this.lowered = false;
  }

  /**
   * Whether the view draws the node's children in its place (a statement row in the lowered view).
   * @param {TreeNode} node
   */
  isFlat(node) {
    return this.lowered && node.kind === "s";
  }

  /**
   * Whether the source view folds the node until it is opened: a statement row, an if/for/while test.
   * @param {TreeNode} node
   */
  isFold(node) {
    return !this.lowered && (node.kind === "s" || (node.kind === "b" && Boolean(node.extra.test)));
  }

  /**
   * The text a row shows: its statement's source in the source view, its instruction in the lowered one.
   * @param {TreeNode} node
   * @returns {string}
   */
  displayText(node) {
    return this.lowered ? node.text : (node.extra.src ?? node.text);
  }

  /**
   * The row that shows node `id` (a step's instruction) as things stand: in the source view the
   * outermost folded statement holding it that is not open (a folded test shows as its compound
   * row), else the node itself.
   * @param {number} id
   * @param {number[] | null} [chain] its ancestors, the root first (default: those known)
   * @returns {number}
   */
  rowOf(id, chain = null) {
    if (this.lowered) return id;
    for (const ancestor of chain || this.ancestors(id)) {
      const node = this.nodes.get(ancestor);
      if (node && this.isFold(node) && !this.isOpen(node)) return node.kind === "s" ? ancestor : node.parent;
    }
    return id;
  }

  /**
   * What revealing node `id` opens, and the row it then highlights. A step (`into` false) opens
   * the blocks, compound rows and branches above it but not a folded statement: the statement row
   * is highlighted. A search result (`into` true) opens every ancestor, folds included.
   * @param {number} id
   * @param {number[]} chain its ancestors, the root first
   * @param {boolean} into
   * @returns {{ open: number[], row: number }}
   */
  revealPlan(id, chain, into) {
    /** @type {number[]} */
    const open = [];
    for (const ancestor of chain) {
      const node = this.nodes.get(ancestor);
      if (!node || this.isFlat(node)) continue;
      if (!into && this.isFold(node) && !this.isOpen(node)) return { open, row: node.kind === "s" ? ancestor : node.parent };
      open.push(ancestor);
    }
    return { open, row: id };
  }

  /**
   * Add rows not seen yet, attaching each to its parent when that is loaded.
   * @param {TreeRow[]} rows
   */
  load(rows) {
    for (const row of rows) {
      if (this.nodes.has(row[0])) continue;
      const node = nodeFromRow(row);
      this.nodes.set(node.id, node);
      const parent = this.nodes.get(node.parent);
      if (parent && !parent.children.includes(node.id)) parent.children.push(node.id);
    }
  }

  /**
   * Whether all of the node's children are loaded.
   * @param {TreeNode} node
   */
  loaded(node) {
    return node.children.length >= node.count;
  }

  /**
   * Whether the view draws the node open. Compound statements and branches are open by default,
   * loaded or not: the first payload holds the top levels only, so drawing an open one fetches its
   * children (one request), as the user would expect of a row shown open.
   * @param {TreeNode} node
   */
  isOpen(node) {
    if (this.isFlat(node) || this.open.has(node.id)) return true;
    return OPEN_BY_DEFAULT.has(node.kind) && !this.isFold(node) && !this.closed.has(node.id);
  }

  /**
   * Record that the user opened or closed node `id`.
   * @param {number} id
   * @param {boolean} open
   */
  markOpen(id, open) {
    if (open) { this.open.add(id); this.closed.delete(id); } else { this.open.delete(id); this.closed.add(id); }
  }

  /**
   * Of `ids`, the loaded nodes whose children are not all loaded (what must be fetched).
   * @param {number[]} ids
   * @returns {number[]}
   */
  missing(ids) {
    return ids.filter((id) => {
      const node = this.nodes.get(id);
      return node !== undefined && !this.loaded(node);
    });
  }

  /**
   * Of a chain of ancestors (root first), the ones whose children must be fetched to reach its end:
   * those not all loaded, and those not even known yet (the first payload holds the top levels
   * only; the kernel knows every node, so their children come in the same one request).
   * @param {number[]} chain
   * @returns {number[]}
   */
  unfetched(chain) {
    return chain.filter((id) => {
      const node = this.nodes.get(id);
      return node === undefined || !this.loaded(node);
    });
  }

  /**
   * The ancestors of node `id` known so far, the root first.
   * @param {number} id
   * @returns {number[]}
   */
  ancestors(id) {
    const chain = [];
    let node = this.nodes.get(id);
    while (node && node.parent >= 0) { chain.unshift(node.parent); node = this.nodes.get(node.parent); }
    return chain;
  }

  /**
   * Of node `id`'s children, the let-through (flat) ones whose children are not all loaded: what the
   * lowered view must fetch before it can draw the node's children.
   * @param {number} id
   * @returns {number[]}
   */
  flatMissing(id) {
    const node = this.nodes.get(id);
    if (!node) return [];
    return this.missing(node.children.filter((child) => {
      const c = this.nodes.get(child);
      return c !== undefined && this.isFlat(c);
    }));
  }

  /**
   * The ids of the rows shown, in order: the root, then depth first the children of every node that
   * is open and loaded (the view shows "loading…" in place of the children of an open node that is
   * not); a flat node is no row, its children are shown in its place.
   * @returns {number[]}
   */
  visibleIds() {
    /** @type {number[]} */
    const out = [];
    /** @param {number} id */
    const walk = (id) => {
      const node = this.nodes.get(id);
      if (!node) return;
      if (!this.isFlat(node)) out.push(id);
      if (node.count > 0 && this.isOpen(node) && this.loaded(node)) node.children.forEach(walk);
    };
    walk(this.root);
    return out;
  }
}
