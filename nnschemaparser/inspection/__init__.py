"""Stage 6, inspection and export of a model: ops, modules, FLOPs, metadata, bounded capture, graph, CLI.

`metadata` (`inspect_model`, no forward pass), `capture` (hook-based bounded capture), `dataflow`
and `call_log` (op records, the aten call log), `connectivity` (producers and consumers),
`summary`, `inspector` (`ModelInspector` and its queries), `export_flow` (graph mode via
torch.export), `op_filter` (`compressor=`), `config_spec` (`inspect_config`), `flops`,
`graph_export` (the nnsp JSON graph), `neurarch_types` and `neurarch_graph` (the `.neurarch.json`
graph), `graph_diff`, `gpu_table` and `plan` (the plan card), `plan_client` (asking a deployment),
`card`, `target` (CLI targets) and `cli` (the `nnschemaparser` command).

May import: `schema`, `lowering`, `runtime`, `parser`, `traces`.
"""
