// Shapes shared by the modules (JSDoc refers to them as import("./types").Name); no runtime code.

/** The part of anywidget's model the widget uses; the static page's stand-in has the same shape. */
export interface Model {
  get(key: string): any;
  set(key: string, value: unknown): void;
  save_changes(): void;
  on(event: string, callback: (...args: any[]) => void): void;
  off(event: string, callback: (...args: any[]) => void): void;
  send(message: Record<string, unknown>): void;
}

/** A custom message the kernel (or the static stand-in) sends back for a request. */
export interface Reply {
  type: "reply";
  id: string;
  ok: boolean;
  data?: any;
  error?: string;
}

/** Requests to the kernel, each answered by one Reply. */
export interface Channel {
  request(type: string, args?: Record<string, any>): Promise<any>;
  dispose(): void;
}

/** A tree row as the kernel sends it: [id, parent, kind, text, shape, line, nChildren, op, extra]. */
export type TreeRow = [number, number, string, string, string, number, number, string, Record<string, any> | null];

export interface TreeNode {
  id: number;
  parent: number;
  kind: string;
  text: string;
  shape: string;
  line: number;
  count: number;
  op: string;
  extra: Record<string, any>;
  children: number[];
  el: HTMLElement | null;
  open?: boolean;
}

/** Histogram bins from the kernel (traces.histogram_bins), or a note saying why there are none. */
export interface Bins {
  edges: number[];
  counts: number[];
  n_nan?: number;
  n_inf?: number;
  note?: string;
}

export interface TableQuery {
  page?: number;
  size?: number;
  sort?: string;
  desc?: boolean;
  filters?: Record<string, string>;
}

/** One page of a table: the rows as arrays in `columns` order. */
export interface TablePage {
  columns: string[];
  rows: unknown[][];
  total: number;
  page: number;
  pages: number;
  size: number;
}

/** What the static page embeds (static_html.static_payload). */
export interface StaticData {
  traits: Record<string, any> & { tree: { rows: TreeRow[]; total: number; root: number } };
  sources: Record<string, any>;
  trace?: { run: string; columns: string[]; rows: Record<string, unknown>[] } | null;
  hists: Record<string, any>;
  /** Every run's trace, histograms and trends, the stored comparisons and heatmaps (static_html). */
  traces?: Record<string, { run: string; columns: string[]; rows: Record<string, unknown>[] }>;
  run_hists?: Record<string, Record<string, any> | null>;
  compares?: Record<string, { a: string; b: string; summary: any; first: any; first_index: number | null; pairs: number; rows: Record<string, any>[] }>;
  compare_columns?: string[];
  tensors?: Record<string, any>;
  attention?: Record<string, any>;
  trends?: Record<string, any>;
  layers?: Record<string, any>;
  tree_colours?: Record<string, any>;
  sep?: string;
}
