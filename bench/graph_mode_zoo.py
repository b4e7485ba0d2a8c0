"""How graph-mode inspection fares on the zoo: exported, equal to eager bit for bit, or refused.

    PYTHONPATH=. python bench/graph_mode_zoo.py [--all] [--limit N]

For each zoo case (the fast subset by default), builds the model (eval mode), inspects it with
`execution_mode="graph"`, and reports one line: `ok` (exported, result torch.equal to eager),
`differs` (exported, the graph computes something else: GraphMismatchWarning), or `export failed`
(GraphExportError) with the first words of the reason. Prints the counts at the end.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch

from nnschemaparser import GraphExportError, GraphMismatchWarning, ModelInspector
from nnschemaparser.validation.zoo import fast_subset, zoo_cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every zoo case, not only the fast subset")
    parser.add_argument("--limit", type=int, default=0, help="stop after N cases")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # torch.export logs the graph of a failed export
    cases = zoo_cases() if args.all else fast_subset()
    if args.limit:
        cases = cases[:args.limit]
    counts: dict[str, int] = {}
    for case in cases:
        torch.manual_seed(0)
        model = case.build().eval()
        inputs = case.make_inputs(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                inspector = ModelInspector(model, example_kwargs=inputs, execution_mode="graph")
                differs = any(issubclass(w.category, GraphMismatchWarning) for w in caught)
                status = "differs" if differs else "ok"
                detail = f"{len(inspector.ops)} ops" + (f"; {inspector.eager_mismatch}" if differs else "")
            except GraphExportError as exc:
                status, detail = "export failed", str(exc).split("(", 1)[-1][:100]
            except Exception as exc:  # a crash of ours: report it, it is a bug
                status, detail = "crash", f"{type(exc).__name__}: {str(exc)[:100]}"
        counts[status] = counts.get(status, 0) + 1
        print(f"{case.name:32s} {status:14s} {detail}", flush=True)
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
