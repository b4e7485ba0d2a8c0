// The stepper: the Step / Step over / Step out / Continue / Run to / Reset buttons with their
// keyboard shortcuts, and the card describing the current StepInfo, or the pause before a
// sub-block call ("about to call transformer.h.1.attn(hidden_states, …)") where Step (into) and
// Step over are a choice.

import { h, clear, fmt, shownVar } from "./dom.js";

/** @type {Record<string, string>} */
export const SHORTCUTS = { s: "step", i: "step_into", o: "step_over", u: "step_out", c: "continue", r: "reset" };

/**
 * @param {(command: string, args?: Record<string, unknown>) => unknown} send
 * @param {{ isStatic: boolean, onEscape?: () => void }} options where Escape in the step box sends the focus
 */
export function createToolbar(send, { isStatic, onEscape = () => undefined }) {
  /** @param {string} label @param {string} command @param {string} key @param {Record<string, unknown>} [extra] */
  const button = (label, command, key, extra = {}) => h("button", {
    class: "nnsp-button", type: "button", "aria-label": label, title: `${TITLES[command] || label} (${key})`,
    "data-command": command, disabled: isStatic, onclick: () => send(command), ...extra,
  }, label);
  const runToInput = h("input", {
    class: "nnsp-input nnsp-runto", type: "number", min: "1", step: "1", "aria-label": "Run to step",
    placeholder: "step", disabled: isStatic,
    onfocus: () => runToInput.select(),  // g then digits replaces the old number instead of appending to it
    onkeydown: (/** @type {KeyboardEvent} */ event) => {
      if (event.key === "Enter") { event.stopPropagation(); runTo(); }
      else if (event.key === "Escape") { event.stopPropagation(); event.preventDefault(); onEscape(); }
    },
  });
  const runTo = () => {
    const value = parseInt(runToInput.value, 10);
    if (Number.isFinite(value) && value > 0) send("run_to", { step: value });
  };
  const status = h("span", { class: "nnsp-status", role: "status", "aria-live": "polite" });
  const el = h("div", { class: "nnsp-toolbar", role: "toolbar", "aria-label": "Stepper" },
    button("Step", "step", "s or i"),
    button("Step over", "step_over", "o"),
    button("Step out", "step_out", "u"),
    button("Continue", "continue", "c"),
    h("span", { class: "nnsp-group" }, runToInput,
      h("button", { class: "nnsp-button", type: "button", "aria-label": "Run to", title: "Run to the step number (g to type it)",
        disabled: isStatic, onclick: runTo }, "Run to")),
    button("Reset", "reset", "r"),
    status,
  );
  return {
    el,
    runToInput,
    /** @param {string} state @param {number} [stepIndex] @param {string} [run] @param {string} [callee] paused before its call */
    setStatus(state, stepIndex, run, callee) {
      status.textContent = `${run ? `${run} · ` : ""}${state}${stepIndex ? ` · step ${stepIndex}` : ""}${callee ? ` · before ${callee}` : ""}`;
      status.dataset.state = state;
    },
  };
}

/** @type {Record<string, string>} */
const TITLES = {
  step: "Step into: run one instruction; stops before a sub-block call, and from there enters it",
  step_over: "Step over: run to the next step of this frame; before a call, run the call whole",
  step_out: "Step out: run until the current block has returned",
  continue: "Continue to the next breakpoint, or the end",
  reset: "Reset: start a new run, replaying the queued edits",
};

/** @param {string} name @param {string} value @param {string} [cls] */
function field(name, value, cls = "") {
  return h("div", { class: `nnsp-field ${cls}` }, h("span", { class: "nnsp-key" }, name), h("span", { class: "nnsp-value" }, value));
}

/**
 * @param {HTMLElement} container
 * @param {Record<string, any> | null | undefined} info the StepInfo
 * @param {string} status
 * @param {boolean} [lowered] the tree shows the lowered instructions: the card shows the step's too
 */
export function renderStepInfo(container, info, status, lowered = false) {
  clear(container);
  if (info && info.pause === "call") {
    renderCallPause(container, info);
    return;
  }
  if (!info || !info.index) {
    container.append(h("div", { class: "nnsp-empty" },
      status === "static" ? "static page: the tree and the last run's trace" : "Press Step (s) to run the first instruction."));
    return;
  }
  const shape = info.shape ? `${info.dtype}[${info.shape.join(", ")}]` : info.value !== undefined ? `${info.type} ${info.value}` : info.type;
  container.append(
    h("div", { class: "nnsp-step-title" },
      h("span", { class: "nnsp-run-here", title: "where the run is paused" }, "run is here: "),
      h("span", { class: "nnsp-step-index" }, `step ${info.index}`),
      h("span", { class: `nnsp-badge nnsp-badge-${info.kind}` }, info.kind),
      h("code", { class: "nnsp-step-text" }, info.text || ""),
      info.edited ? h("span", { class: "nnsp-flag nnsp-flag-edited" }, "edited") : null),
    h("div", { class: "nnsp-step-statement", hidden: !lowered || !info.instruction || info.instruction === info.text },
      h("span", { class: "nnsp-key" }, "instruction "), h("code", { class: "nnsp-step-text" }, lowered ? info.instruction || "" : "")),
    h("div", { class: "nnsp-fields" },
      // two columns each: a variable or a block path is not broken mid-word in a side column
      field("var", shownVar(info.var, "—"), "nnsp-field-wide"),
      field("block", info.block || "—", "nnsp-field-wide"),
      field("frame", String(info.depth)),
      field("value", shape, "nnsp-field-wide"),
      ...(info.stats ? ["mean", "std", "min", "max"].map((k) => field(k, fmt(info.stats[k]), "nnsp-num")) : []),
    ),
  );
}

/** @param {Record<string, any>} arg */
function argumentValue(arg) {
  if (arg.shape) return `${arg.dtype}[${arg.shape.join(", ")}]`;
  return arg.value !== undefined ? arg.value : arg.type;
}

// The pause before a sub-block call: what is about to be called, with which arguments, and what
// each of the three steps does from here.
/** @param {HTMLElement} container @param {Record<string, any>} info */
export function renderCallPause(container, info) {
  const args = /** @type {Record<string, any>[]} */ (info.args || []);
  const short = args.map((a) => a.name).slice(0, 3).join(", ") + (args.length > 3 ? ", …" : "");
  container.append(
    h("div", { class: "nnsp-step-title nnsp-pause-title" },
      h("span", { class: "nnsp-step-index" }, info.index ? `after step ${info.index}` : "before step 1"),
      h("span", { class: "nnsp-badge nnsp-badge-pause" }, "paused"),
      h("code", { class: "nnsp-step-text nnsp-pause-text" }, `about to call ${info.callee}(${short})`)),
    h("table", { class: "nnsp-table nnsp-args-table", "aria-label": `Arguments of the call of ${info.callee}` },
      h("tbody", {}, ...args.map((a) => h("tr", {},
        h("td", { class: "nnsp-var-name" }, a.name),
        h("td", {}, argumentValue(a)),
        h("td", { class: "nnsp-num" }, a.stats ? `μ ${fmt(a.stats.mean)} σ ${fmt(a.stats.std)}` : ""))))),
    h("div", { class: "nnsp-note nnsp-pause-help" },
      info.interpreted
        ? `Step (s) enters ${info.callee} · Step over (o) runs it whole · Step out (u) leaves ${info.block || "this block"}`
        : `${info.callee} is not interpreted: Step and Step over both run it as one step · Step out (u) leaves ${info.block || "this block"}`),
  );
}
