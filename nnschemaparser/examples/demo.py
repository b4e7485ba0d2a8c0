"""`make demo`: the quick start on the bundled MLP; writes the schema dump, the text trace and the
static inspector (`inspector.html`: a base run and a fork that zeroes `hidden`, Compare working with
no kernel), then says how to open it and the notebooks.

Usage: python -m nnschemaparser.examples.demo [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..parser import NNParser
from ..runtime.interpreter import SchemaInterpreter
from ..schema.dump import dump_schema
from ..traces.text_trace import TraceRecorder
from .mlp import MLP


def write_inspector_page(schema, x: torch.Tensor, path: Path) -> Path:
    """The static inspector of `schema` on `x` with two runs: base, and a fork with `hidden` zeroed at
    the step that binds it; the tensor view of that step is kept (with its difference from base)."""
    from ..widget import InspectorState
    from ..widget.static_html import write_static_html

    state = InspectorState(schema, {"x": x}, None)
    state.continue_()
    state.reset()
    # Step stops before each sub-block call too (no step yet before the first one): step on
    # until the step that binds `hidden`.
    while state.step() is not None and getattr(state.current, "out_var", None) != "hidden":
        pass
    state.edit("zero")
    fork_step = state.current.step_index
    state.continue_()
    state.tensor_view(fork_step, "fork 1")
    state.compare("base", "fork 1")
    try:
        return write_static_html(state, path, title="MLP: base run and a fork with hidden zeroed")
    finally:
        state.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for schema.txt and trace.txt (default: here)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(2, 784)

    schema = NNParser.parse_model(
        model=model,
        inputs_tensors_shapes={"x": (2, 784)},
        inputs_tensors_dtypes={"x": "torch.float32"},
        inputs_tensors_values={"x": x},
    )
    dump_schema(schema=schema, path=out / "schema.txt")

    tracer = TraceRecorder()
    outputs = SchemaInterpreter(capture_values=True, listeners=[tracer]).run(block=schema, scope={"x": x.clone()})
    tracer.save(out / "trace.txt")
    reference = model(x)
    exact = torch.equal(outputs[0], reference)

    print((out / "schema.txt").read_text().split("\n\n")[0])
    print()
    print("\n".join(tracer.lines[:7]))
    print()
    page = write_inspector_page(schema, x.clone(), out / "inspector.html")
    print(f"wrote {out / 'schema.txt'}, {out / 'trace.txt'} and {page}")
    print(f"schema output equals model(x) bit for bit: {exact}")
    print()
    print("open the static inspector (no kernel needed; Compare base vs fork 1 works offline):")
    print(f"    {page.resolve().as_uri()}")
    print("open the notebooks in JupyterLab:  make lab   (notebooks/quickstart.ipynb; the others beside it:")
    print("    stepping_and_editing.ipynb, comparing_runs.ipynb, transformers_moe.ipynb)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
