// Keyboard for the block tree, after the ARIA treeview pattern: one tree item in the tab order
// (roving tabindex), ArrowDown / ArrowUp to the next / previous visible item, ArrowRight opens a
// closed item or goes to its first child, ArrowLeft closes an open item or goes to its parent,
// Home / End to the first / last visible item, Enter activates the item (as a click on its row),
// `*` opens every sibling of the focused item, Shift+O / Shift+H / Shift+L a block row's output,
// heads and every-layer views. Kept apart from tree.js: it reads the TreeView's
// nodes and calls its setOpen, nothing else.

/**
 * The index of the item to focus after `key` among `count` visible items, from `at`; null for a
 * key that does not move the focus (or a move past either end).
 * @param {string} key
 * @param {number} at
 * @param {number} count
 * @returns {number | null}
 */
export function moveFocus(key, at, count) {
  if (count <= 0) return null;
  const target = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: count - 1 }[key];
  if (target === undefined || target < 0 || target >= count) return null;
  return target;
}

/** @type {Record<string, string>} the keys of a focused block row's views */
export const BLOCK_VIEW_KEYS = { O: "output", H: "heads", L: "layers" };

/**
 * @param {HTMLElement} container the element with role="tree"
 * @param {import("./tree.js").TreeView} tree
 */
export function attachTreeKeys(container, tree) {
  /** @returns {HTMLElement[]} the tree items shown (not inside a closed or hidden group) */
  const visible = () => /** @type {HTMLElement[]} */ ([...container.querySelectorAll("[role='treeitem']")])
    .filter((item) => item.offsetParent !== null || item.getClientRects().length > 0);
  /** @param {HTMLElement} item */
  const nodeOf = (item) => tree.nodes.get(Number(item.dataset.node));
  /** @param {HTMLElement} item */
  const rowOf = (item) => /** @type {HTMLElement | null} */ (item.querySelector(":scope > .nnsp-row"));

  /** @param {HTMLElement | null | undefined} item */
  function focus(item) {
    if (!item) return;
    for (const other of container.querySelectorAll("[role='treeitem'][tabindex='0']")) other.setAttribute("tabindex", "-1");
    item.setAttribute("tabindex", "0");
    item.focus();
    const row = rowOf(item);
    if (row) row.scrollIntoView({ block: "nearest" });
  }

  // Every item gets tabindex -1 and one keeps tabindex 0. (An item's name is its row's text: the
  // browser leaves the nested group out of it.)
  function label() {
    const items = /** @type {HTMLElement[]} */ ([...container.querySelectorAll("[role='treeitem']")]);
    for (const item of items) {
      if (!item.hasAttribute("tabindex")) item.setAttribute("tabindex", "-1");
    }
    if (items.length && !container.querySelector("[role='treeitem'][tabindex='0']")) items[0].setAttribute("tabindex", "0");
  }
  const observer = new MutationObserver(label);
  observer.observe(container, { childList: true, subtree: true });
  label();

  container.addEventListener("focusin", (event) => {
    const item = /** @type {HTMLElement} */ (event.target).closest("[role='treeitem']");
    if (item instanceof HTMLElement && item.getAttribute("tabindex") !== "0") {
      for (const other of container.querySelectorAll("[role='treeitem'][tabindex='0']")) other.setAttribute("tabindex", "-1");
      item.setAttribute("tabindex", "0");
    }
  });

  container.addEventListener("keydown", (event) => {
    const item = /** @type {HTMLElement} */ (event.target).closest("[role='treeitem']");
    if (!(item instanceof HTMLElement) || event.ctrlKey || event.metaKey || event.altKey) return;
    const node = nodeOf(item);
    const items = visible();
    const at = items.indexOf(item);
    let handled = true;
    const expandable = node && node.count > 0;
    if (event.key === "ArrowRight") {
      if (expandable && node && !node.open) tree.setOpen(node, true);
      // the first item below (the first child of a let-through statement of the lowered view too)
      else if (expandable) focus(/** @type {HTMLElement | null} */ (item.querySelector(":scope > .nnsp-children [role='treeitem']")));
    } else if (event.key === "ArrowLeft") {
      if (expandable && node && node.open) tree.setOpen(node, false);
      else focus(/** @type {HTMLElement | null} */ (item.parentElement ? item.parentElement.closest("[role='treeitem']") : null));
    } else if (event.key === "Enter") {
      const row = rowOf(item);
      const text = row ? row.querySelector(".nnsp-text") : null;
      (text instanceof HTMLElement ? text : row)?.click();
    } else if (BLOCK_VIEW_KEYS[event.key] && node && node.kind === "B") {
      // a block row's views: Shift+O its output, Shift+H its heads, Shift+L every layer (as the row's buttons)
      const button = rowOf(item)?.querySelector(`.nnsp-row-view[data-view="${BLOCK_VIEW_KEYS[event.key]}"]`);
      if (button instanceof HTMLElement) button.click();
      else handled = false;
    } else if (event.key === "*") {
      const group = item.parentElement;
      for (const sibling of group ? group.children : []) {
        const other = sibling instanceof HTMLElement ? nodeOf(sibling) : undefined;
        if (other && other.count > 0 && !other.open) tree.setOpen(other, true);
      }
    } else {
      const target = moveFocus(event.key, at, items.length);
      if (target === null) handled = ["ArrowDown", "ArrowUp", "Home", "End"].includes(event.key);
      else focus(items[target]);
    }
    if (handled) {
      event.preventDefault();
      event.stopPropagation();
    }
  });
  return () => observer.disconnect();
}
