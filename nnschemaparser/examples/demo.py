"""`make demo`: the quick start on the bundled MLP; writes the schema dump and the text trace.

Usage: python -m nnschemaparser.demo [--out DIR]
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
    print(f"wrote {out / 'schema.txt'} and {out / 'trace.txt'}")
    print(f"schema output equals model(x) bit for bit: {exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
