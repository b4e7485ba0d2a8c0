// Loading the views bundle (views.js) on demand: the kernel sends its code (the `module` message)
// the first time a tab that needs it opens, so the initial widget state stays small. A bundle that
// has the views built in (the static page's) registers them in `bundled` first.

/** @typedef {typeof import("./views.js")} Views */

/** @type {{ views: Views | null }} */
export const bundled = { views: null };
/** @type {Promise<Views> | null} */
let loading = null;

/**
 * The views module: built in, or fetched from the kernel once and imported from a blob URL.
 * @param {import("./types").Channel} channel
 * @returns {Promise<Views>}
 */
export function loadViews(channel) {
  if (bundled.views) return Promise.resolve(bundled.views);
  if (!loading) {
    loading = (async () => {
      const { code } = /** @type {{ code: string }} */ (await channel.request("module", { name: "views" }));
      const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
      try {
        bundled.views = /** @type {Views} */ (await import(/* @vite-ignore */ url));
        return bundled.views;
      } finally {
        URL.revokeObjectURL(url);
      }
    })();
    loading.catch(() => { loading = null; });  // a failed load may be tried again
  }
  return loading;
}
