// The block tree's state without the DOM: the nodes loaded so far from the kernel's compact rows
// ([id, parent, kind, text, shape, line, nChildren, op, extra]), which of them are open, and the
// rules the view follows (compound statements and branches open by default once their children are
// loaded; a node the user closed stays closed).

/** @typedef {import("./types").TreeRow} TreeRow */
/** @typedef {import("./types").TreeNode} TreeNode */

/** @type {Record<string, string>} */
export const KIND_LABEL = {
  B: "block", o: "op", c: "call", i: "if", f: "for", w: "while", t: "try", W: "with",
  d: "def", r: "return", k: "jump", x: "stmt", b: "",
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
   * Whether the view draws the node open.
   * @param {TreeNode} node
   */
  isOpen(node) {
    return this.open.has(node.id) || (OPEN_BY_DEFAULT.has(node.kind) && this.loaded(node) && !this.closed.has(node.id));
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
   * The ids of the rows shown, in order: the root, then depth first the children of every node that
   * is open and loaded (the view shows "loading…" in place of the children of an open node that is not).
   * @returns {number[]}
   */
  visibleIds() {
    /** @type {number[]} */
    const out = [];
    /** @param {number} id */
    const walk = (id) => {
      const node = this.nodes.get(id);
      if (!node) return;
      out.push(id);
      if (node.count > 0 && this.isOpen(node) && this.loaded(node)) node.children.forEach(walk);
    };
    walk(this.root);
    return out;
  }
}
