// Tabs whose view lives in its own bundle (static/logical.js, patch.js, diverge.js), asked of the
// kernel (the `module` request: messages.py) when the tab first opens, so that the inspector's
// initial state does not grow. The kernel's `views` trait, {tab name: times shown}, says which tabs
// there are (show_logical, show_patching, report.show()). Each module exports
// `mount(body, channel, host)`, which returns the view: `refresh(shown)` is called each time its tab
// opens, with the count, so that a view shown again (show_patching twice) fetches its data anew.

/**
 * @param {import("./types").Model} model
 * @param {import("./types").Channel} channel
 * @param {(name: string) => HTMLElement} addTab
 * @param {{ active: () => string } & Record<string, any>} host what a view may use of the inspector
 */
export function lazyTabs(model, channel, addTab, host) {
  /** @type {Record<string, { body: HTMLElement, view?: { refresh: (shown: number) => Promise<void> } }>} */
  const tabs = {};
  /** @param {string} name */
  const open = async (name) => {
    const tab = tabs[name];
    if (tab) try {  // the module's blob URL stays (one per tab and view): revoking it costs bytes of the initial state
      if (!tab.view) {  // fetched once; a second open while it loads mounts nothing more
        const { code } = await channel.request("module", { name });
        tab.view ||= (await import(/* @vite-ignore */ URL.createObjectURL(new Blob([code], { type: "text/javascript" })))).mount(tab.body, channel, host);
      }
      await tab.view?.refresh(model.get("views")[name]);
    } catch (err) {
      tab.body.textContent = String(err);
    }
  };
  const sync = () => Object.keys(model.get("views") || {}).forEach((name) => {
    tabs[name] ||= { body: addTab(name) };
    if (host.active() === name) open(name);
  });
  sync();
  return { open, tabs, sync };
}
