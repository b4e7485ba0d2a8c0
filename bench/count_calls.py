"""Python-level and C-level calls of one plain run against eager, counted with sys.setprofile.

    python bench/count_calls.py [--models llama,resnet]

The models are bench/models.py's (the dispatch-bound suite); each is parsed, run once both ways to
warm up, then run once more both ways under a profiler that counts "call" (Python functions) and
"c_call" (builtins and C methods) events.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import small_resnet, tiny_llama, tiny_mixtral, tiny_vit  # noqa: E402

from nnschemaparser import NNParser, SchemaInterpreter  # noqa: E402

MODELS = {"llama": tiny_llama, "mixtral": tiny_mixtral, "vit": tiny_vit, "resnet": small_resnet}


def count(fn) -> dict:
    counts = {"call": 0, "c_call": 0}

    def profile(frame, event, arg):
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,resnet")
    args = parser.parse_args()
    print(f"{'model':10s} {'eager calls':>12s} {'run calls':>10s} {'eager C calls':>14s} {'run C calls':>12s}")
    for key in args.models.split(","):
        model, inputs = MODELS[key]()
        schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
        interpreter = SchemaInterpreter()
        with torch.no_grad():
            model(**inputs), interpreter.call(schema, **inputs)
            eager = count(lambda: model(**inputs))
            run = count(lambda: interpreter.call(schema, **inputs))
        print(f"{key:10s} {eager['call']:12,d} {run['call']:10,d} {eager['c_call']:14,d} {run['c_call']:12,d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
