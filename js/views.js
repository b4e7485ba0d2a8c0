// The views a first paint does not need, in a bundle of their own (static/views.js): the Compare,
// Trends, Layers and Routing tabs. The widget asks the kernel for it when one of those tabs first
// opens (lazy.js); the static page's bundle (static_entry.js) has them built in.

export { CompareView } from "./compare.js";
export { TrendsView } from "./trends.js";
export { LayersView } from "./layers.js";
export { RoutingView } from "./routing.js";
