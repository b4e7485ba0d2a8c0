// Edit: zero, scale, add noise to, or set from a Python expression the current step's value. The
// kernel checks the edit; a bad one shows its error here and changes nothing. Queued edits are
// listed (they are replayed at their step by the next run) and can be removed.

import { h, clear, shownVar } from "./dom.js";

/** @type {Record<string, string>} */
const PLACEHOLDER = { zero: "", scale: "factor, e.g. 0.5", noise: "standard deviation, e.g. 0.1", expression: "Python, e.g. value.clamp(min=0)" };

export class EditPanel {
  /**
   * @param {HTMLElement} container
   * @param {import("./types").Channel} channel
   * @param {{ isStatic?: boolean }} [options]
   */
  constructor(container, channel, { isStatic = false } = {}) {
    this.channel = channel;
    this.isStatic = isStatic;
    this.target = h("div", { class: "nnsp-edit-target" }, "no step to edit yet");
    this.action = h("select", { class: "nnsp-input", "aria-label": "Edit action", disabled: isStatic,
      onchange: () => this.syncArgument() },
      ...Object.keys(PLACEHOLDER).map((a) => h("option", { value: a }, a)));
    this.argument = h("input", { class: "nnsp-input nnsp-edit-argument", type: "text", "aria-label": "Edit argument",
      disabled: isStatic, onkeydown: (/** @type {KeyboardEvent} */ event) => { if (event.key === "Enter") { event.stopPropagation(); this.apply(); } } });
    this.applyButton = h("button", { class: "nnsp-button nnsp-primary", type: "button", "aria-label": "Apply edit",
      disabled: isStatic, onclick: () => this.apply() }, "Apply");
    this.error = h("div", { class: "nnsp-error", role: "alert" });
    this.list = h("ol", { class: "nnsp-edit-list", "aria-label": "Queued edits" });
    this.clearButton = h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": "Clear edits",
      disabled: isStatic, onclick: () => this.send("clear_edits") }, "Clear edits");
    container.append(this.target,
      h("div", { class: "nnsp-controls" }, this.action, this.argument, this.applyButton),
      this.error,
      h("div", { class: "nnsp-subhead" }, h("span", {}, "Queued edits"), this.clearButton),
      this.list,
      h("div", { class: "nnsp-note" }, "An edit changes the paused value now and is queued at its step: Reset replays the run with every queued edit, as a fork of the base run."));
    this.syncArgument();
  }

  syncArgument() {
    const action = this.action.value;
    this.argument.placeholder = PLACEHOLDER[action];
    this.argument.disabled = action === "zero" || this.action.disabled;
  }

  /**
   * @param {string} type
   * @param {Record<string, unknown>} [args]
   */
  async send(type, args = {}) {
    try {
      await this.channel.request(type, args);
      this.error.textContent = "";
    } catch (err) {
      this.error.textContent = /** @type {Error} */ (err).message;
    }
  }

  async apply() {
    await this.send("edit", { action: this.action.value, argument: this.argument.value });
  }

  /**
   * @param {Record<string, any> | null | undefined} info the StepInfo
   * @param {{ text: string }[] | null | undefined} edits
   * @param {string} [error]
   */
  update(info, edits, error) {
    this.applyButton.disabled = this.isStatic || Boolean(info && info.pause);
    if (info && info.pause === "call") {
      this.target.textContent = `paused before the call of ${info.callee}: nothing to edit here (Step into it, or edit the step that bound an argument)`;
    } else if (info && info.index) {
      const shape = info.shape ? `${info.dtype}[${info.shape.join(", ")}]` : info.type;
      this.target.textContent = `edit step ${info.index}: ${shownVar(info.var, info.var ? "a value of the statement" : "(binds nothing)")} · ${shape}`;
    } else this.target.textContent = "no step to edit yet";
    clear(this.list);
    (edits || []).forEach((edit, index) => this.list.append(h("li", {},
      h("span", {}, edit.text),
      h("button", { class: "nnsp-button nnsp-small", type: "button", "aria-label": `Remove edit ${index + 1}`,
        onclick: () => this.send("remove_edit", { index }) }, "×"))));
    if (!edits || !edits.length) this.list.append(h("li", { class: "nnsp-note" }, "none"));
    if (error !== undefined) this.error.textContent = error;
  }
}
