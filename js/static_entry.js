// The static page's bundle (static/static.js): the widget with the views of views.js built in (a
// static page has no kernel to send them, and its Content-Security-Policy allows one inline script).

import * as views from "./views.js";
import { bundled } from "./lazy.js";
import widget, { createStaticModel } from "./index.js";

bundled.views = views;

export { createStaticModel };
export default widget;
