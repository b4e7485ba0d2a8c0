"""Stage 7, files: safe save and load of schemas and traces (versioned JSON and safetensors).

`file_format` (strict JSON, limits, the memory budget of a load, typed errors), `bounded_json` (the
JSON decoder that charges what it builds to that budget: compact, interned documents), `allowlist` (the
exact names a file may refer to), `value_codec` (tagged values), `schema_codec` (schema <-> JSON),
`verification` (the rule of a bound load: the file must equal the model's own fresh lowering, which
is what then runs), `schema_file` (`save_schema` / `load_schema`), `trace_file` (`save_trace` /
`load_trace`).

May import: `schema`, `lowering` (the intrinsics a file may name), `runtime`, `parser` (to re-lower
a bound model), `traces`.
"""
