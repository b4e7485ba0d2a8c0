"""Stage 9, validation: the zoo of `transformers` models built from configs and the exactness sweep.

`zoo_common` (the case record, tiny configs, input builders), `zoo_cases_text` and
`zoo_cases_media` (the cases), `zoo` (the registry and `check_case`), `sweep`
(`python -m nnschemaparser.validation.sweep`, `make sweep`).

May import: every earlier stage; nothing imports it.
"""
