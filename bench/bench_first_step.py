"""What the first step_run of a schema costs (its programs compiled), through generators and in a greenlet.

    python bench/bench_first_step.py [generators|greenlet]

The 32-layer tiny Llama of bench_step_run.py (bench/models.py, 16 tokens), one torch thread,
torch.no_grad(), process CPU time of the first and the second full `step_run` in this process. With
no argument, each path runs in a fresh process of its own (the first call is what is measured, so the
paths cannot share one). The generator path (runtime/step_generators.py) rewrites each block's code
once per text: a model's layers share it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(path: str) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    from models import tiny_llama

    from nnschemaparser import NNParser, SchemaInterpreter
    from nnschemaparser.runtime import step_generators

    step_generators.GENERATOR_STEPS = path == "generators"
    model, inputs = tiny_llama()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=inputs)
    torch.set_num_threads(1)
    with torch.no_grad():
        times = []
        for _ in range(2):
            start = time.process_time()
            steps = sum(1 for _ in SchemaInterpreter().step_run(schema, dict(inputs)))
            times.append((time.process_time() - start) * 1e3)
    print(f"{path:10} {steps} steps: first step_run {times[0]:7.0f} ms, second {times[1]:6.0f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        for path in ("generators", "greenlet"):
            subprocess.run([sys.executable, __file__, path], check=True)
