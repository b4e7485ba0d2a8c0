// Small DOM helpers shared by every view: element creation, number formatting, scrolling inside a pane.

/** @typedef {Node | string | number | boolean | null | undefined} Child */

/**
 * An element with attributes ("class", "text", on<event> handlers, others as attributes; null,
 * undefined and false are left out) and children (strings become text nodes).
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any> | null} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/**
 * A variable as user text: the lowering's temporaries ($t12) are no source words, so they read as
 * `fallback` instead.
 * @param {string | null | undefined} name @param {string} fallback
 */
export function shownVar(name, fallback) {
  return name && !/^\$t\d+$/.test(name) ? name : fallback;
}

/**
 * @template {Element} E
 * @param {E} el
 * @returns {E}
 */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// 4 significant digits, exponent form for very large or small magnitudes; "nan"/"inf" pass through.
/**
 * @param {unknown} value
 * @returns {string}
 */
export function fmt(value) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value === "string") return value;
  if (typeof value === "boolean") return value ? "yes" : "";
  const number = /** @type {number} */ (value);
  if (!Number.isFinite(number)) return String(number);
  if (Number.isInteger(number) && Math.abs(number) < 1e6) return String(number);
  const magnitude = Math.abs(number);
  if (magnitude !== 0 && (magnitude >= 1e5 || magnitude < 1e-3)) return number.toExponential(3);
  return String(Number(number.toPrecision(4)));
}

// Scroll `container` (not the page) so that `child` is visible.
/**
 * @param {Element | null | undefined} container
 * @param {Element | null | undefined} child
 */
export function scrollWithin(container, child) {
  if (!container || !child) return;
  const box = container.getBoundingClientRect();
  const item = child.getBoundingClientRect();
  // the visible part of the box: its client area (a horizontal scrollbar is not room to show a row in)
  const top = box.top + container.clientTop;
  const bottom = top + (container.clientHeight || box.height);
  const margin = Math.min(item.height * 1.5, (bottom - top) / 3);
  if (item.top >= top + margin && item.bottom <= bottom - margin) return;
  // out of view or at an edge: bring it to the middle, so it is never half cut at the pane's edge
  container.scrollTop += item.top - top - Math.max(0, (bottom - top - item.height) / 2);
}
