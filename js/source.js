// The source pane: the forward source of the block holding the current step, with its line
// highlighted. Sources are fetched once per block and cached.

import { h, clear, scrollWithin } from "./dom.js";

export class SourceView {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   */
  constructor(container, channel) {
    this.container = container;
    this.channel = channel;
    /** @type {Map<number, Promise<any>>} */
    this.cache = new Map();
    /** @type {number | null} */
    this.block = null;
    this.line = 0;
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
   * @param {number | null | undefined} block
   * @param {number} line
   */
  async show(block, line) {
    if (block === null || block === undefined || block < 0) return;
    if (block !== this.block) {
      let source;
      try {
        source = await this.source(block);
      } catch (err) {
        this.cache.delete(block);
        clear(this.body).append(h("span", { class: "nnsp-error" }, /** @type {Error} */ (err).message));
        return;
      }
      this.block = block;
      this.render(source);
    }
    this.mark(line);
  }

  /** @param {{ file?: string, first: number, text?: string, note?: string }} source */
  render(source) {
    const file = source.file ? source.file.split(/[\\/]/).slice(-2).join("/") : "";
    this.header.textContent = file ? `${file}:${source.first}` : source.note || "no source";
    this.header.title = source.file || "";
    clear(this.body);
    const lines = (source.text || "").split("\n");
    lines.forEach((text, i) => {
      const number = source.first + i;
      this.body.append(h("div", { class: "nnsp-line", "data-line": number },
        h("span", { class: "nnsp-lineno" }, String(number)), h("span", { class: "nnsp-code" }, text || " ")));
    });
    this.line = 0;
  }

  /** @param {number} line */
  mark(line) {
    const old = this.body.querySelector(".nnsp-line-current");
    if (old) old.classList.remove("nnsp-line-current");
    this.line = line;
    const el = this.body.querySelector(`.nnsp-line[data-line="${line}"]`);
    if (el) {
      el.classList.add("nnsp-line-current");
      scrollWithin(this.container, el);
    }
  }
}
