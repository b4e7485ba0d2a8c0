// Builds the inspector's browser files with esbuild: nnschemaparser/widget/static/widget.js (one
// minified ESM file, entry index.js), widget.css (styles.css, minified) and logical.js (the Logical
// view, loaded on demand). The output is a pure
// function of the sources and these options, so the checked-in files can be checked for staleness.
//
//   node build.mjs                 # write ../nnschemaparser/widget/static/widget.{js,css}
//   node build.mjs --dev           # the same plus widget.js.map (not checked in)
//   node build.mjs --outdir DIR    # write into DIR instead (python -m nnschemaparser.widget.build --check)

import * as esbuild from "esbuild";
import { rmSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const dev = args.includes("--dev");
const at = args.indexOf("--outdir");
const outdir = at >= 0 ? path.resolve(args[at + 1]) : path.resolve(here, "../nnschemaparser/widget/static");
const header = "Generated from js/ by `npm run build` (or python -m nnschemaparser.widget.build): edit js/, then rebuild.";

/** @type {import("esbuild").BuildOptions} */
const common = { absWorkingDir: here, bundle: true, minify: true, legalComments: "none", logLevel: "warning" };

await esbuild.build({
  ...common,
  entryPoints: ["index.js"],
  outfile: path.join(outdir, "widget.js"),
  format: "esm",
  target: "es2020",
  // The static page (static_html.py) inlines this file in its own <script type="module"> and boots it
  // through __nnsp.index, which index.js fills in; under anywidget it stays local to the module.
  banner: { js: `// ${header}\nconst __nnsp = {};` },
  sourcemap: dev ? "linked" : false,
});
// The views a first paint does not need (views.js: Compare, Trends, Layers, Routing) apart: the kernel
// sends them when one of their tabs first opens. The static page's bundle has them built in (static.js).
await esbuild.build({
  ...common,
  entryPoints: ["views.js"],
  outfile: path.join(outdir, "views.js"),
  format: "esm",
  target: "es2020",
  banner: { js: `// ${header}` },
});
await esbuild.build({
  ...common,
  entryPoints: ["static_entry.js"],
  outfile: path.join(outdir, "static.js"),
  format: "esm",
  target: "es2020",
  banner: { js: `// ${header}\nconst __nnsp = {};` },
});
// The Logical view (logical.js, with its styles) apart: the kernel sends it when its tab first opens.
await esbuild.build({
  ...common,
  entryPoints: ["logical.js"],
  outfile: path.join(outdir, "logical.js"),
  format: "esm",
  target: "es2020",
  banner: { js: `// ${header}` },
});
// The Patch and Diverge views, the same way.
for (const name of ["patch", "diverge"]) {
  await esbuild.build({ ...common, entryPoints: [`${name}.js`], outfile: path.join(outdir, `${name}.js`), format: "esm",
    target: "es2020", banner: { js: `// ${header}` } });
}
await esbuild.build({
  ...common,
  entryPoints: ["styles.css"],
  outfile: path.join(outdir, "widget.css"),
  banner: { css: `/* ${header} */` },
});
// A dev build's sourcemap would no longer match.
if (!dev) rmSync(path.join(outdir, "widget.js.map"), { force: true });
if (!args.includes("--quiet")) console.log(`wrote ${path.join(outdir, "widget.js")} and widget.css${dev ? " (+ widget.js.map)" : ""}`);
