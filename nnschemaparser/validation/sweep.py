"""The validation sweep: every zoo model parsed, interpreted and compared bit for bit with eager.

    python -m nnschemaparser.validation.sweep [--subset fast|all|local] [--only NAME ...] [--csv PATH] [--markdown PATH]

For each case: build the model, parse it from its example inputs, then in eval mode and in train mode
(dropout under one fixed seed) compare every output with `torch.equal` and, after the same backward
pass, every parameter gradient. A case is `exact`, `wrong` (any difference: the sweep exits 1) or
`refused` (it cannot be built here, or its eager forward fails) with the reason. One failing case
never stops the sweep. The "skipped children" column counts the children (and methods) that run as
the real module because of the project's limits, with those skipped by design (TorchScript,
torch.compile, a forward replaced on the instance) in brackets. Depends on the public API, equality and zoo; a view, nothing imports it.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch

from ..parser.equality import first_mismatch, max_abs_diff, tensors_of
from ..runtime.interpreter import SchemaInterpreter
from ..parser.model_parser import NNParser, opaque_reason
from ..schema.model import ControlInstruction, FunctionInstruction, Instruction, ModelBlockSchema, TryInstruction, \
    WithInstruction, condition_instructions

__all__ = ["SweepRow", "run_case", "run_sweep", "count_instructions", "main"]


@dataclass
class SweepRow:
    """One case of the sweep, as the CSV and the markdown table report it."""

    name: str
    family: str
    status: str = "refused"
    params: int = 0
    instructions: int = 0
    blocks: int = 0
    parsed_blocks: int = 0
    skipped: str = ""
    skipped_children: int = 0
    skipped_by_design: int = 0
    live_calls: int = 0  # module forwards that ran outside the schema on the parse run (coverage())
    live: str = ""
    output_maxdiff: float = math.nan
    grad_maxdiff: float = math.nan
    train_maxdiff: float = math.nan
    parse_s: float = math.nan
    run_ratio: float = math.nan
    detail: str = ""
    skipped_reasons: dict = field(default_factory=dict, repr=False)


def count_instructions(body: Iterable[Instruction]) -> int:
    total = 0
    for instr in body:
        total += 1
        if isinstance(instr, ControlInstruction):
            total += count_instructions(condition_instructions(instr)) + count_instructions(instr.body) + \
                count_instructions(instr.else_body)
        elif isinstance(instr, TryInstruction):
            total += count_instructions(instr.body) + count_instructions(instr.else_body) + \
                count_instructions(instr.final_body) + sum(count_instructions(b) for b in instr.handler_bodies)
        elif isinstance(instr, WithInstruction):
            total += count_instructions(instr.body)
        elif isinstance(instr, FunctionInstruction) and instr.function is not None:
            total += count_instructions(instr.function.body)
    return total


def count_skipped_children(schema: ModelBlockSchema) -> tuple[int, int]:
    """(children and methods skipped by the project's limits, children skipped by design).

    By design: a child that has no Python forward to interpret (TorchScript, a torch.compile wrapper,
    a forward replaced on the instance without calling the class's; `opaque_reason`). Everything else
    that runs as the real module is a limit of the project, and the sweep's goal is 0.
    """
    by_project = by_design = 0
    for block in schema.iter_blocks():
        if block is schema or block.skip_reason is None:
            continue
        if block.method_name is None and block.module is not None and opaque_reason(block.module) is not None:
            by_design += 1
        else:
            by_project += 1
    return by_project, by_design


def _skipped_cell(row: SweepRow) -> str:
    return f"{row.skipped_children}" + (f" (+{row.skipped_by_design} by design)" if row.skipped_by_design else "")


def _live_text(row: Any) -> str:
    """One live region, short: what ran, where the schema called it, why in a few words."""
    what = row.module if row.module is not None else f"a {row.module_type} that is no sub-module"
    where = Path(row.location).name if row.location else "?"
    why = f"via {'.'.join(row.via.split('.')[-2:])}" if row.via else row.reason.split(":")[0]
    return f"{what} called in {row.block or '?'} at {where} ({why}, {row.calls}x)"


def _clone(inputs: dict) -> dict:
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in inputs.items()}


def _loss(result: Any) -> Optional[torch.Tensor]:
    leaves = [t for t in tensors_of(result) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        return None
    return sum(t.float().sum() for t in leaves)


def _compare_run(model: torch.nn.Module, twin: torch.nn.Module, schema: ModelBlockSchema, inputs: dict,
                 train: bool, seed: int = 0) -> tuple[Optional[str], float, float]:
    """(mismatch or None, output maxdiff, gradient maxdiff) for one mode."""
    model.train(train)
    twin.train(train)
    model.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    expected = twin(**_clone(inputs))
    torch.manual_seed(seed)
    actual = SchemaInterpreter().call(schema, **_clone(inputs))
    mismatch = first_mismatch(expected, actual)
    out_diff = max_abs_diff(expected, actual)
    if mismatch is not None:
        return f"{'train' if train else 'eval'} {mismatch}", out_diff, math.nan
    grad_diff = 0.0
    loss_e, loss_a = _loss(expected), _loss(actual)
    if loss_e is not None and loss_a is not None:
        loss_e.backward()
        loss_a.backward()
        for (name, p_e), (_, p_a) in zip(twin.named_parameters(), model.named_parameters()):
            if (p_e.grad is None) != (p_a.grad is None):
                return f"{'train' if train else 'eval'} gradient of {name}: present in one run only", out_diff, math.inf
            if p_e.grad is not None:
                if not torch.equal(p_e.grad, p_a.grad):
                    diff = max_abs_diff(p_e.grad, p_a.grad)
                    return f"{'train' if train else 'eval'} gradient of {name} differs ({diff:.3g})", out_diff, diff
    return None, out_diff, grad_diff


def _time_ratio(model: torch.nn.Module, schema: ModelBlockSchema, inputs: dict, repeats: int = 3) -> float:
    model.eval()
    interpreter = SchemaInterpreter()
    with torch.no_grad():
        model(**_clone(inputs))
        interpreter.call(schema, **_clone(inputs))
        eager, interp = [], []
        for _ in range(repeats):
            args = _clone(inputs)  # inputs such as a KV cache change in place during a run
            start = time.perf_counter()
            model(**args)
            eager.append(time.perf_counter() - start)
            args = _clone(inputs)
            start = time.perf_counter()
            interpreter.call(schema, **args)
            interp.append(time.perf_counter() - start)
    return min(interp) / max(min(eager), 1e-9)


def run_case(name: str, family: str, build: Callable[[], torch.nn.Module],
             make_inputs: Callable[[torch.nn.Module], dict]) -> SweepRow:
    row = SweepRow(name=name, family=family)
    try:
        model = build()
        inputs = make_inputs(model)
    except Exception as exc:  # the case cannot be built here
        row.detail = f"cannot build: {type(exc).__name__}: {exc}"[:300]
        return row
    row.params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    twin = copy.deepcopy(model)
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            twin.eval()(**_clone(inputs))
    except Exception as exc:
        row.detail = f"eager forward fails: {type(exc).__name__}: {exc}"[:300]
        return row
    try:
        start = time.perf_counter()
        schema = NNParser.parse_model(model=model.eval(), inputs_tensors_values=_clone(inputs))
        row.parse_s = time.perf_counter() - start
    except Exception as exc:
        row.status = "wrong"
        row.detail = f"parse failed: {type(exc).__name__}: {exc}"[:300]
        return row
    blocks = [b for b in schema.iter_blocks() if b.method_name is None]
    row.blocks = len(blocks)
    row.parsed_blocks = sum(1 for b in blocks if b.skip_reason is None)
    row.instructions = sum(count_instructions(b.body) for b in schema.iter_blocks())
    row.skipped_reasons = dict(schema.skipped)
    if schema.skip_reason is not None:
        row.skipped_reasons["<root>"] = schema.skip_reason
    row.skipped = "; ".join(f"{k}: {v[:80]}" for k, v in row.skipped_reasons.items())
    row.skipped_children, row.skipped_by_design = count_skipped_children(schema)
    live = schema.coverage()
    row.live_calls = int(live["calls"].sum()) if len(live) else 0
    row.live = "; ".join(_live_text(r) for r in live.itertuples())[:400]
    try:
        problem, row.output_maxdiff, row.grad_maxdiff = _compare_run(model, twin, schema, inputs, train=False)
        if problem is None:
            problem, row.train_maxdiff, _ = _compare_run(model, twin, schema, inputs, train=True)
        model.eval()
        row.run_ratio = _time_ratio(model, schema, inputs)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
        if os.environ.get("NNSCHEMA_SWEEP_TRACEBACK"):
            traceback.print_exc()
    row.status = "exact" if problem is None else "wrong"
    row.detail = (problem or "")[:300]
    return row


def _cases(subset: str, only: Optional[list[str]]) -> list[tuple[str, str, Callable, Callable]]:
    cases: list[tuple[str, str, Callable, Callable]] = []
    if subset in ("all", "local"):
        cases.extend(_local_cases())
    if subset in ("all", "fast"):
        from . import zoo

        zoo_cases = zoo.zoo_cases() if subset == "all" else zoo.fast_subset()
        cases.extend((c.name, c.family, c.build, c.make_inputs) for c in zoo_cases)
    if only:
        cases = [c for c in cases if c[0] in only]
    return cases


def _local_cases() -> list[tuple[str, str, Callable, Callable]]:
    """The ten local fixture architectures (tests/support/fixture_models.py), when the tests are present."""
    root = Path(__file__).resolve().parents[2] / "tests" / "support"  # the checkout: validation/ is two down
    if not (root / "fixture_models.py").exists():
        return []
    sys.path.insert(0, str(root))
    try:
        import fixture_models  # type: ignore
    finally:
        sys.path.remove(str(root))
    cases = []
    for name, factory in fixture_models.FIXTURES.items():
        made: dict = {}

        def build(factory=factory, made=made):
            model, inputs = factory()
            made["inputs"] = inputs
            return model

        cases.append((f"local:{name}", "local", build, lambda model, made=made: made["inputs"]))
    return cases


def refused_cases(subset: str) -> list[SweepRow]:
    if subset not in ("all", "fast"):
        return []
    from . import zoo

    return [SweepRow(name=name, family="?", detail=f"refused: {reason}")
            for name, reason in getattr(zoo, "REFUSED", {}).items()]


def run_sweep(subset: str = "all", only: Optional[list[str]] = None, progress: bool = True) -> list[SweepRow]:
    cases = _cases(subset, only)
    rows = refused_cases(subset) if not only else []
    try:
        from tqdm import tqdm
        iterator = tqdm(cases, desc="sweep", unit="model", file=sys.stderr, disable=not progress)
    except ImportError:
        iterator = cases
    for name, family, build, make_inputs in iterator:
        if hasattr(iterator, "set_postfix_str"):
            iterator.set_postfix_str(name)
        rows.append(run_case(name, family, build, make_inputs))
    return rows


def summary(rows: list[SweepRow]) -> dict[str, Any]:
    counted = [r for r in rows if r.status != "refused"]
    blocks = sum(r.blocks for r in counted)
    parsed = sum(r.parsed_blocks for r in counted)
    return {
        "cases": len(rows),
        "exact": sum(r.status == "exact" for r in rows),
        "wrong": sum(r.status == "wrong" for r in rows),
        "refused": sum(r.status == "refused" for r in rows),
        "architectures_exact": sum(r.status == "exact" and not r.name.startswith("local:") for r in rows),
        "blocks": blocks,
        "parsed_blocks": parsed,
        "parsed_fraction": parsed / blocks if blocks else 0.0,
        "skipped_children": sum(r.skipped_children for r in counted),
        "skipped_by_design": sum(r.skipped_by_design for r in counted),
        "live_calls": sum(r.live_calls for r in counted),
        "live_cases": sum(1 for r in counted if r.live_calls),
    }


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_csv(rows: list[SweepRow], path: Path) -> None:
    fields = [f for f in asdict(rows[0]).keys() if f != "skipped_reasons"] if rows else []
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            data = asdict(row)
            data.pop("skipped_reasons")
            writer.writerow(data)


def markdown_table(rows: list[SweepRow]) -> str:
    head = ("| architecture | family | status | params | instructions | blocks | skipped | skipped children | "
            "live calls | output maxdiff | grad maxdiff | train maxdiff | parse s | run / eager | detail |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        skipped = str(len(r.skipped_reasons)) if r.skipped_reasons else "0"
        lines.append(f"| {r.name} | {r.family} | {r.status} | {r.params:,} | {r.instructions} | {r.blocks} | "
                     f"{skipped} | {_skipped_cell(r)} | {r.live_calls} | {_fmt(r.output_maxdiff)} | {_fmt(r.grad_maxdiff)} | {_fmt(r.train_maxdiff)} | "
                     f"{_fmt(r.parse_s)} | {_fmt(r.run_ratio)} | {r.detail.replace('|', '/')[:120]} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nnschemaparser.validation.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--subset", choices=["fast", "all", "local"], default="all")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--csv", default="sweep.csv")
    parser.add_argument("--markdown", default="sweep.md")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = run_sweep(args.subset, args.only, progress=not args.no_progress)
    info = summary(rows)
    if rows:
        write_csv(rows, Path(args.csv))
    table = markdown_table(rows)
    skipped_lines = [f"- {r.name}: {k}: {v}" for r in rows for k, v in r.skipped_reasons.items()]
    live_lines = [f"- {r.name}: {r.live}" for r in rows if r.live]
    Path(args.markdown).write_text(
        f"{table}\n\n**{info['exact']} exact, {info['wrong']} wrong, {info['refused']} refused** of {info['cases']} "
        f"cases ({info['architectures_exact']} transformers architectures exact); blocks parsed "
        f"{info['parsed_blocks']}/{info['blocks']} = {100 * info['parsed_fraction']:.1f}%; skipped children "
        f"{info['skipped_children']} by the project's limits, {info['skipped_by_design']} by design (TorchScript, "
        f"torch.compile, a forward replaced on the instance); live calls {info['live_calls']} in "
        f"{info['live_cases']} cases (module forwards that ran outside the schema, `schema.coverage()`)\n\n"
        + ("Skipped children:\n" + "\n".join(skipped_lines) + "\n" if skipped_lines else "No skipped children.\n")
        + ("\nLive calls:\n" + "\n".join(live_lines) + "\n" if live_lines else "\nNo live calls.\n"))
    for r in rows:
        if r.status != "exact":
            print(f"{r.status.upper():8s} {r.name}: {r.detail}")
    print(f"{info['exact']} exact, {info['wrong']} wrong, {info['refused']} refused of {info['cases']} cases; "
          f"{info['architectures_exact']} transformers architectures exact; blocks parsed "
          f"{info['parsed_blocks']}/{info['blocks']} ({100 * info['parsed_fraction']:.1f}%)")
    print(f"wrote {args.csv} and {args.markdown}")
    return 1 if info["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
