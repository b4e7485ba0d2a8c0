// The inspector's layout and wiring: header, stepper toolbar, block tree | current step, source
// and histograms, then the Edit / Trace / Compare tabs. The entry point anywidget calls.

import { h, clear, scrollWithin } from "./dom.js";
import { createChannel, createStaticModel } from "./protocol.js";
import { TreeView } from "./tree.js";
import { SourceView } from "./source.js";
import { createToolbar, renderStepInfo, SHORTCUTS } from "./stepper.js";
import { TraceTable } from "./table.js";
import { HistogramPair } from "./histogram.js";
import { EditPanel } from "./edit.js";
import { NavigatorPanel, CallStackPanel, explainError } from "./debugger.js";
import { TensorView } from "./heatmap.js";
import { AttentionGrid } from "./attention.js";
import { attachTreeKeys } from "./treekeys.js";
import { TreeColours } from "./treecolour.js";
import { loadViews } from "./lazy.js";
import { lazyTabs } from "./lazytab.js";

const nextFrame = () => new Promise((/** @type {(value?: unknown) => void} */ resolve) => requestAnimationFrame(() => resolve()));

/** @param {string} title @param {HTMLElement} body @param {Record<string, unknown>} [extra] */
function panel(title, body, extra = {}) {
  return h("section", { class: "nnsp-panel", "aria-label": title, ...extra }, h("h3", { class: "nnsp-panel-title" }, title), body);
}

/**
 * The entry point anywidget calls; returns the clean-up.
 * @param {{ model: import("./types").Model, el: HTMLElement }} props
 * @returns {() => void}
 */
function render({ model, el }) {
  const isStatic = model.get("mode") === "static";
  const channel = createChannel(model);
  const root = h("div", { class: `nnsp-root${isStatic ? " nnsp-static" : ""}`, "data-lm-suppress-shortcuts": "true", tabindex: "0" });
  const errorBar = h("div", { class: "nnsp-errorbar", role: "alert" });
  /** @type {number[]} */
  const timings = [];
  /** @type {Record<string, unknown> | null} */
  let pinned = null;
  /** @type {Promise<unknown>} */
  let viewUpdated = Promise.resolve();

  const STEPPING = new Set(["step", "step_over", "continue", "run_to", "reset"]);
  STEPPING.add("step_into").add("step_out").add("run_to_here").add("run_to_trace").add("run_to_output");
  let stepping = 0;
  /**
   * @param {string} command
   * @param {Record<string, unknown>} [args]
   */
  async function send(command, args = {}) {
    const started = performance.now();
    const isStep = STEPPING.has(command);
    /** @type {Record<string, any> | null} */
    let reply = null;
    if (isStep) {
      pinned = null;
      stepping += 1;
      if (navigator) navigator.clearReason();  // the last stop reason belongs to the last command
    }
    try {
      // one round trip: the reply brings the histograms, the breakpoint view and the call stack
      // ... and the new step's heatmap (with the dims the tensor view keeps), unless a value is pinned
      const extra = isStep ? { with_hist: true, with_debug: true, ...(pinned ? {} : { with_tensor: tensorView.keepArgs() }) } : {};
      const data = await channel.request(command, { ...args, ...extra });
      reply = data;
      if (isStep && data && data.hist && !pinned) hists.render(data.hist);
      if (isStep && data && data.tensor && !pinned) tensorView.apply(data.tensor);
      if (isStep && data && data.breakpoints && navigator) navigator.update(data.breakpoints);
      if (isStep && data && data.call_stack) callStack.show(data.call_stack);
    } catch (err) {
      const explained = explainError(err);
      errorBar.textContent = explained.text;
      if (explained.restarted) root.dataset.kernel = "restarted";
      else if (isStep && navigator) { navigator.refresh(); callStack.refresh(); }  // no reply data to show
    } finally {
      if (isStep) stepping -= 1;
    }
    const replied = performance.now();
    await viewUpdated;  // the source and histograms the new step asked for
    if (reply && reply.inline) source.applyInline(reply.inline);
    const drawn = performance.now();
    await nextFrame();
    timings.push(performance.now() - started);
    if (isStep && navigator) navigator.refreshRan();  // after the paint: "never ran" flags of shown results
    // where the time went: to the kernel's reply, then the view's own requests, then the frame
    root.dataset.phasesMs = [replied - started, drawn - replied, performance.now() - drawn].map((t) => t.toFixed(1)).join(" ");
    root.dataset.roundTripMs = timings[timings.length - 1].toFixed(1);
    root.dataset.commands = String(timings.length);
    return reply;
  }
  /** @type {HTMLElement & { nnspTimings?: number[] }} */ (root).nnspTimings = timings;

  // Escape in a text box gives the focus back to the tree: the current row, else its focusable item.
  const focusTree = () => {
    backToRun();
    const current = treeBox.querySelector(".nnsp-row.nnsp-current")?.closest("[role='treeitem']");
    const item = /** @type {HTMLElement | null} */ (current || treeBox.querySelector("[role='treeitem'][tabindex='0']"));
    if (item) item.focus();
    else root.focus();
  };
  const toolbar = createToolbar(send, { isStatic, onEscape: () => focusTree() });
  const treeBox = h("div", { class: "nnsp-tree", role: "tree", "aria-label": "Block tree" });
  const stepBox = h("div", { class: "nnsp-stepinfo" });
  const sourceBox = h("div", { class: "nnsp-source" });
  const histBox = h("div", { class: "nnsp-hists" });
  const tree = new TreeView(treeBox, channel, {
    // a click on a row moves the view there (the run's current row stays); on the current row, back to the run
    onLook: (node) => (node.id === tree.currentRow ? backToRun()
      : lookAt({ node: node.id, source_block: node.kind === "B" ? node.id : tree.blockOf(node.id), line: node.kind === "B" ? 0 : node.line,
        label: tree.displayText(node) }, false)),
    onRowAction: isStatic ? undefined : (node, action) => (action === "break" ? navigator?.request("break_at", { node })
      : action === "run_to_here" ? send("run_to_here", { node }) : blockView(node, action)),
  });
  /** @type {import("./debugger.js").NavigatorPanel | null} */
  let navigator = null;
  /** @type {SourceView} */
  const source = new SourceView(sourceBox, channel, {
    /** @param {number} line @param {string} file @param {boolean} runTo @returns {unknown} */
    onGutter: (line, file, runTo) => (runTo ? send("run_to_here", { line, file }) : navigator?.request("break_at", { line, file })),
  });
  const detachTreeKeys = attachTreeKeys(treeBox, tree);
  // The source view (one row per statement) or the lowered instructions: a button, the `l` key and
  // the kernel's `show_lowered` trait. The static page's model emits no change: apply it here too.
  const viewToggle = h("button", { class: "nnsp-button nnsp-button-small nnsp-view-toggle", type: "button",
    "aria-pressed": "false", title: "show the lowered instructions ($t temporaries) instead of one row per source statement (l)",
    onclick: () => setLowered(!tree.lowered, true) }, "Lowered");
  /** @param {boolean} lowered @param {boolean} [save] */
  function setLowered(lowered, save = false) {
    tree.setLowered(lowered);
    renderStepInfo(stepBox, model.get("step_info") || {}, isStatic ? "static" : model.get("status"), tree.lowered);
    viewToggle.setAttribute("aria-pressed", String(tree.lowered));
    if (save && Boolean(model.get("show_lowered")) !== tree.lowered) {
      model.set("show_lowered", tree.lowered);
      model.save_changes();
    }
  }
  // a scrolled region must be reachable by keyboard (axe: scrollable-region-focusable)
  sourceBox.tabIndex = 0;
  sourceBox.setAttribute("role", "region");
  sourceBox.setAttribute("aria-label", "Source of the block");
  const hists = new HistogramPair(histBox, channel);
  const tensorBox = h("div", { class: "nnsp-tensor" });
  const attentionBox = h("div", { class: "nnsp-attention", hidden: true });
  const attention = new AttentionGrid(attentionBox, channel);
  const tensorView = new TensorView(tensorBox, channel, { onAttention: (query) => attention.show(query) });
  /** @param {Record<string, unknown>} query */
  const select = (query) => {
    pinned = query;
    hists.show(query);
    runHere.hidden = isStatic || query.trace_step === undefined;
    tensorView.show(query);
    // the tree and the source go to the row that bound it, as "looking at" (the run stays where it is)
    if (!isStatic && query.trace_step !== undefined) {
      channel.request("locate", { run: query.run, trace_step: query.trace_step })
        .then((/** @type {any} */ at) => { if (pinned === query && at && at.node >= 0) lookAt(at, true); }).catch(() => undefined);
    }
  };
  // Run to here from a trace or compare row: the active run goes to the matching step ("h").
  const runHere = h("button", { class: "nnsp-button nnsp-button-small nnsp-run-here", type: "button", hidden: true,
    "aria-label": "Run to this step", title: "run the active run to the step of the selected row (h)",
    onclick: () => { if (pinned && pinned.trace_step !== undefined) send("run_to_trace", pinned); } }, "Run to this step");
  histBox.append(runHere);

  // "Where the run is" and "where I am looking" are two things: the run's step keeps the tree's
  // current row, the source's current line and the step card; a search jump, a row click, a frame,
  // a trace or compare row move only the view ("looking at"), and Escape or the chip come back.
  /** @type {{ node: number, ancestors?: number[] | null, source_block: number, line: number, label?: string } | null} */
  let looking = null;
  const lookChip = h("div", { class: "nnsp-look", role: "status", hidden: true });
  /** @param {{ node: number, ancestors?: number[] | null, source_block: number, line: number, label?: string }} target @param {boolean} into */
  function lookAt(target, into) {
    looking = target;
    root.dataset.looking = "true";
    renderLook();
    return Promise.all([
      target.node >= 0 ? tree.reveal(target.node, target.ancestors || null, { into, look: true }) : null,
      source.showLook(target.source_block, target.line || 0),
    ]);
  }
  function backToRun() {
    if (!looking) return;
    looking = null;
    root.dataset.looking = "false";
    tree.clearLook();
    renderLook();
    const info = model.get("step_info") || {};
    if (info.index || info.pause) source.show(info.source_block, info.line, info);
  }
  function renderLook() {
    clear(lookChip);
    lookChip.hidden = !looking;
    if (!looking) return;
    const info = model.get("step_info") || {};
    const where = info.pause ? `the call of ${info.callee}` : info.index ? `step ${info.index}` : "the start";
    lookChip.append(h("span", { class: "nnsp-look-key" }, "looking at "), h("code", { class: "nnsp-look-text" }, looking.label || ""),
      h("span", { class: "nnsp-note" }, ` · the run is at ${where}`), " ",
      h("button", { class: "nnsp-button nnsp-button-small nnsp-back", type: "button", title: "show where the run is (Escape)",
        onclick: () => focusTree() }, `back to ${where} (Esc)`));
  }

  /** @type {Record<string, { body: HTMLElement, button: HTMLElement }>} */
  const tabs = {};
  const tabBar = h("div", { class: "nnsp-tabs", role: "tablist" });
  const tabBody = h("div", { class: "nnsp-tabpanels" });
  /** @param {string} name */
  const addTab = (name) => {
    const body = h("div", { class: "nnsp-tabpanel", role: "tabpanel", "aria-label": name, hidden: true });
    const button = h("button", { class: "nnsp-tab", type: "button", role: "tab", "aria-selected": "false", onclick: () => showTab(name) }, name);
    tabs[name] = { body, button };
    tabBar.append(button);
    tabBody.append(body);
    return body;
  };
  const editPanel = new EditPanel(addTab("Edit"), channel, { isStatic });
  const table = new TraceTable(addTab("Trace"), channel, { onSelect: select });
  // The Compare, Trends, Layers and Routing tabs: their code (static/views.js) comes from the kernel
  // when one of them first opens (lazy.js); the static page has it built in.
  /** @type {Record<string, (views: import("./lazy.js").Views, body: HTMLElement) => any>} */
  const makeView = {
    Compare: (v, body) => new v.CompareView(body, channel, { onSelect: select, isStatic, offlinePairs: model.get("compare_pairs") || [] }),
    Trends: (v, body) => {
      const view = new v.TrendsView(body, channel, { onSelect: select });
      view.onColourBy = (/** @type {any} */ query) => treeColours.colourBy(query);
      return view;
    },
    Layers: (v, body) => new v.LayersView(body, channel, { onSelect: select,
      currentNode: () => Number((model.get("step_info") || {}).node ?? -1) }),
    Routing: (v, body) => new v.RoutingView(body, channel),
  };
  /** @type {Record<string, any>} the lazy views made so far */
  const lazyViews = {};
  /** @param {string} name */
  async function lazyView(name) {
    if (!lazyViews[name]) {
      const body = tabs[name].body;
      try {
        const views = await loadViews(channel);
        if (!lazyViews[name]) {
          lazyViews[name] = makeView[name](views, body);
          if (lazyViews[name].setRuns) lazyViews[name].setRuns(model.get("runs") || []);
        }
      } catch (err) {
        body.textContent = `the ${name} view could not load: ${/** @type {Error} */ (err).message}`;
        return null;
      }
    }
    return lazyViews[name];
  }
  addTab("Compare");
  addTab("Trends");
  if (!isStatic) addTab("Layers");
  if (!isStatic && model.get("moe")) addTab("Routing");  // MoE models only: the router's choice of experts per token and layer
  table.isStatic = isStatic;
  const treeColours = new TreeColours(treeBox, channel);
  // Enter on a trace row of the active run runs to it (an earlier step replays the run from the start).
  table.onRun = (stepIndex, run) => {
    const active = (model.get("step_info") || {}).run;
    if (!isStatic && (!run || run === active)) send("run_to", { step: stepIndex });
  };
  let activeTab = "";
  // The tabs of the `views` trait (Logical, Patch, Diverge: show_logical, show_patching, report.show()):
  // their code comes from the kernel when each first opens (lazytab.js); `host` is what their views may use.
  const lazy = isStatic ? null : lazyTabs(model, channel, addTab, { active: () => activeTab, compare: () => lazyView("Compare"), showTab });
  /** @param {string} name */
  function showTab(name) {
    activeTab = name;
    for (const [key, tab] of Object.entries(tabs)) {
      tab.body.hidden = key !== name;
      tab.button.setAttribute("aria-selected", String(key === name));
    }
    if (name === "Trace") table.refresh();
    if (makeView[name] && tabs[name]) return lazyView(name).then((view) => (view && name !== "Compare" ? view.refresh() : undefined));
    lazy?.open(name);
  }

  root.append(
    h("div", { class: "nnsp-header" }, h("span", { class: "nnsp-title" }, model.get("title") || "schema"),
      h("span", { class: "nnsp-subtitle" }, isStatic ? "static page" : "nnschemaparser inspector")),
    toolbar.el, errorBar,
    h("div", { class: "nnsp-main" },
      panel("Block tree", treeBox, { class: "nnsp-panel nnsp-panel-tree" }),
      h("div", { class: "nnsp-side" }, panel("Current step", h("div", {}, stepBox, lookChip)), panel("Source", sourceBox), panel("Histograms", histBox))),
    panel("Tensor", h("div", { class: "nnsp-tensor-panel" }, tensorBox, attentionBox), { class: "nnsp-panel nnsp-panel-tensor" }),
    tabBar, tabBody);
  el.append(root);

  // Dark hosts without JupyterLab's --jp-* colours (marimo puts dark-theme on its body): the widget's own
  // dark palette, following the host when it switches.
  const followTheme = () => {
    if (getComputedStyle(root).getPropertyValue("--jp-layout-color1").trim()) { delete root.dataset.theme; return; }
    const dark = [document.body, document.documentElement].some((e) => e && (e.classList.contains("dark") || e.classList.contains("dark-theme")));
    root.dataset.theme = dark ? "dark" : "light";
  };
  // A pane that changes size (the window, a side panel, a wrapped line) keeps the current tree row
  // and source line in view, not left half cut at its edge.
  const keepCurrent = new ResizeObserver(() => {  // the row looked at, when there is one
    scrollWithin(treeBox, treeBox.querySelector(".nnsp-row.nnsp-looking") || treeBox.querySelector(".nnsp-row.nnsp-current"));
    scrollWithin(sourceBox, sourceBox.querySelector(".nnsp-line-looking") || sourceBox.querySelector(".nnsp-line-current"));
  });
  keepCurrent.observe(treeBox);
  keepCurrent.observe(sourceBox);
  const themeWatch = new MutationObserver(followTheme);
  for (const target of [document.body, document.documentElement]) if (target) themeWatch.observe(target, { attributes: true, attributeFilter: ["class"] });
  followTheme();

  // Go anywhere: search and breakpoints above the tree, the call stack beside the source.
  const navBox = h("div", { class: "nnsp-nav" });
  const stackBox = h("div", { class: "nnsp-stack" });
  const nav = new NavigatorPanel(navBox, channel, {
    isStatic, send, lowered: () => tree.lowered, onEscape: () => focusTree(),
    jump: (result) => lookAt({ ...result, label: (!tree.lowered && result.source) || result.text }, true),
    onBlockView: (result, view) => blockView(result.node, view),
    onBreakpoints: (view) => source.setBreakpoints(view.items),
  });
  navigator = nav;
  // "output", "heads", "every layer" of a block: one action, the run goes to the block's return
  /** @param {number} node @param {string} view */
  async function blockView(node, view) {
    const reply = await send("run_to_output", { node });
    const out = reply && reply.output;
    if (!out || !out.trace_step) return;
    const query = { run: out.run, trace_step: out.trace_step };
    pinned = query;
    hists.show(query);
    tensorView.show(query);
    if (view === "heads") {
      await attention.show({ block: out.block });
      attentionBox.scrollIntoView({ block: "nearest" });
    } else if (view === "layers") {
      showTab("Layers");
      const layers = await lazyView("Layers");
      if (layers) await layers.show(out.statement, out.var);
    }
  }
  const callStack = new CallStackPanel(stackBox, channel, {
    // a frame of the run's stack: its block as "looking at" (the current frame: back to the run)
    showFrame: (frame) => (frame.current ? backToRun() : lookAt({ node: frame.node, source_block: frame.node, line: frame.line || 0, label: frame.block || "(root)" }, false)),
  });
  const treePanel = /** @type {HTMLElement} */ (root.querySelector(".nnsp-panel-tree"));
  const leftColumn = h("div", { class: "nnsp-left" });
  treePanel.replaceWith(leftColumn);
  leftColumn.append(panel("Search and breakpoints", navBox, { class: "nnsp-panel nnsp-panel-nav" }), treePanel);
  treePanel.querySelector(".nnsp-panel-title")?.append(viewToggle);
  const sourcePanel = /** @type {HTMLElement} */ (sourceBox.parentElement);
  sourcePanel.after(panel("Call stack", stackBox, { class: "nnsp-panel nnsp-panel-stack" }));
  // one breakpoint request for the trait changes of one kernel command (step_info and the list's version)
  let navPending = false;
  const navRefreshSoon = () => {
    if (navPending) return;
    navPending = true;
    setTimeout(() => { navPending = false; nav.refresh(); }, 0);
  };
  const onDebugStep = () => {
    if (isStatic) return;
    if (!pinned) runHere.hidden = true;
    if (stepping) return;  // the stepping command's reply brings the breakpoint view and the call stack
    navRefreshSoon();
    callStack.refresh();
  };

  let stepSerial = 0;
  function onStep() {
    const info = model.get("step_info") || {};
    const serial = ++stepSerial;
    if (looking) {  // the run moved: the view comes back to it
      looking = null;
      root.dataset.looking = "false";
      tree.clearLook();
      renderLook();
    }
    root.dataset.runStep = String(info.index || 0);
    if (!info.index && !info.pause && !pinned && !isStatic) {  // a new run: no value of an older run stays shown
      tensorView.clearView();
      attention.show({});
    }
    renderStepInfo(stepBox, info, isStatic ? "static" : model.get("status"), tree.lowered);
    toolbar.setStatus(model.get("status"), model.get("step_index"), info.run, info.pause ? info.callee : "");
    editPanel.update(info, model.get("edit_list"));
    stepBox.parentElement?.classList.toggle("nnsp-paused-call", info.pause === "call");
    sourceBox.classList.toggle("nnsp-source-pause", info.pause === "call");
    if (info.index || info.pause) {
      viewUpdated = Promise.all([
        info.node >= 0 ? tree.reveal(info.node, info.ancestors) : null,
        // while a stepping command is in flight its reply brings the inline values
        source.show(info.source_block, info.line, info).then(() => (stepping ? undefined : source.inline())),
        pinned || stepping ? null : hists.show(info.trace_step ? { trace_step: info.trace_step } : { step_index: info.index }),
      ]).catch(() => undefined);
    }
    if (activeTab === "Trace") table.refreshSoon();
    // the tensor view after the step card, tree, source and histograms (its heatmap is the largest reply)
    if ((info.index || info.pause) && !pinned && !stepping && info.trace_step) {
      const query = { trace_step: info.trace_step };
      // only the latest step's: a burst of steps (cells run right after the widget is made) answers out of order
      viewUpdated.then(() => { if (!pinned && serial === stepSerial) tensorView.show(query); });
    }
  }
  function onRuns() {
    const runs = model.get("runs") || [];
    const info = model.get("step_info") || {};
    table.setRuns(runs, info.run);
    tensorView.setRuns(runs);
    for (const view of Object.values(lazyViews)) if (view.setRuns) view.setRuns(runs);
  }
  const onError = () => { if (!root.dataset.kernel) errorBar.textContent = model.get("error") || ""; };
  const onEdits = () => editPanel.update(model.get("step_info"), model.get("edit_list"));
  const onBlocks = () => tree.setBlocks(model.get("blocks"));
  const onLowered = () => setLowered(Boolean(model.get("show_lowered")));
  const onStatus = () => {
    const info = model.get("step_info") || {};
    toolbar.setStatus(model.get("status"), model.get("step_index"), info.run, info.pause ? info.callee : "");
  };

  // The host's command shortcuts (Lumino's registry: b inserts a cell, c copies one in Notebook 7,
  // which listens at the document in the capture phase, before this widget) skip an event whose
  // target, or an element above it below the match, has data-lm-suppress-shortcuts. A notebook's
  // `.jp-mod-commandMode :focus` selector matches the focused element itself, before the walk up
  // reaches the root's attribute: so each element of the widget gets it as it takes the focus.
  root.addEventListener("focusin", (event) => {
    const target = /** @type {Element} */ (event.target);
    if (target instanceof Element && !target.hasAttribute("data-lm-suppress-shortcuts")) target.setAttribute("data-lm-suppress-shortcuts", "true");
  });
  root.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (/** @type {Element} */ (event.target).closest("input, textarea, select")) return;
    if (event.key === "Escape" && looking) {  // the view back to where the run is
      event.preventDefault();
      event.stopPropagation();
      focusTree();
      return;
    }
    if (event.key === "l") {  // the lowered view, also on the static page
      event.preventDefault();
      setLowered(!tree.lowered, true);
      return;
    }
    if (isStatic) return;
    if (event.key === "g") {
      event.preventDefault();
      toolbar.runToInput.focus();
      return;
    }
    if (event.key === "h" && !runHere.hidden) {
      event.preventDefault();
      runHere.click();
      return;
    }
    if (event.key === "/" || event.key === "f") {  // search, as in a browser's or pudb's find
      event.preventDefault();
      nav.input.focus();
      return;
    }
    const command = SHORTCUTS[event.key];
    if (!command) return;
    event.preventDefault();
    event.stopPropagation();
    send(command);
  });

  tree.lowered = Boolean(model.get("show_lowered"));
  viewToggle.setAttribute("aria-pressed", String(tree.lowered));
  tree.init(model.get("tree") || { rows: [] });
  tree.container.dataset.view = tree.lowered ? "lowered" : "source";
  tree.setBlocks(model.get("blocks"));
  onRuns();
  onError();
  onStep();
  showTab("Edit");
  if (lazy?.tabs.Diverge) showTab("Diverge");  // report.show(): the view it opened
  if (isStatic) showTab("Trace");

  const handlers = { "change:step_info": onStep, "change:runs": onRuns, "change:error": onError,
    "change:edit_list": onEdits, "change:blocks": onBlocks, "change:status": onStatus, "change:show_lowered": onLowered,
    "change:views": () => lazy?.sync() };
  for (const [event, handler] of Object.entries(handlers)) model.on(event, handler);
  model.on("change:step_info", onDebugStep);
  // a breakpoint set or removed from Python: listed at once (a stepping command's reply brings its own)
  const onBreakpointsChanged = () => { if (!isStatic && !stepping) navRefreshSoon(); };
  model.on("change:breakpoints_version", onBreakpointsChanged);
  onDebugStep();
  // Hosts that deliver each trait change apart (marimo) may send step_index after step_info and status.
  model.on("change:step_index", onStatus);
  return () => {
    model.off("change:step_info", onDebugStep);
    model.off("change:breakpoints_version", onBreakpointsChanged);
    for (const [event, handler] of Object.entries(handlers)) model.off(event, handler);
    model.off("change:step_index", onStatus);
    channel.dispose();
    themeWatch.disconnect();
    keepCurrent.disconnect();
    detachTreeKeys();
    treeColours.dispose();
  };
}

const widget = { render };

// The static page inlines the bundle in its own <script type="module"> and calls
// __nnsp.index.default.render(...) and __nnsp.index.createStaticModel(...); the bundle's banner
// declares __nnsp (see build.mjs). Loaded unbundled, there is no __nnsp and nothing happens.
if (typeof __nnsp !== "undefined") __nnsp.index = { default: widget, createStaticModel };

export { createStaticModel };
export default widget;
