"""Models and helpers shared by the tests of several stages (and by bench/ and the sweep).

Nothing here is a test: `fixture_models` (the ten fixture architectures, also the sweep's `local:*`
rows), `exactness` (schema-versus-eager comparison), `trace_models`, `widget_models`,
`debugger_models`, `inspection_models`, `seed_inspector_model`, `schema_file_models`,
`fidelity_models` and `fidelity_distributed` (the worker of the gloo-group tests), and the hostile
file corpus (`hostile_corpus`, `hostile_bombs`, `hostile_traces`, `hostile_attacks`,
`hostile_memory`, also a script: `python tests/support/hostile_memory.py`).
Import them as `from tests.support.<module> import ...`.
"""
