"""The plan: from a `.neurarch.json` graph alone, will it run, which GPU it fits, what an epoch costs.

    plan = compute_plan(graph, PlanOptions(batch_size=64, precision="fp16"), base=None)
    print(format_plan_card(plan))

Everything is computed from the graph (no model, no weights), so the CLI's local `--plan` and the
`serve` deployment's `POST /api/v1/plan` give the same plan for the same graph and options.

- **Runs**: the graph's own verdict (`runs`: the forward ran when it was traced) plus a verifier:
  the output must be reached from an input, and every layer's hyperparameters must fit its
  recorded input shape (`linear` inFeatures = last dim, `conv*d`/`batchNorm*d` channels = first
  dim, `layerNorm` normalizedShape = trailing dims). Each failure is a *blocker*.
- **Memory** at the batch size, per precision (bytes per element: fp32 4, fp16/bf16 2):
  weights = params x bytes (+ a fp32 master copy of the trainable ones when training in fp16/bf16),
  gradients = trainable x bytes, optimizer state = trainable x 8 (adam, adamw: two fp32 moments),
  x 4 (sgd with momentum) or 0 (none); activations = the run's measured op-output bytes
  (`totals.activationBytes`, all kept for backward) scaled from the traced batch to the batch size
  and from fp32 to the precision; for inference, twice the largest single op output instead
  (its input and output alive at once). Peak = the sum.
- **GPU fit**: a GPU of the table (`gpu_table`) fits when it supports the precision and the peak is
  at most its memory less the headroom; the card names the cheapest that fits, with the largest
  batch that would still fit on it.
- **Time and cost per epoch**: samples x FLOPs per sample (the run's FLOPs / traced batch; x 3 for
  training: forward and backward) / (the GPU's peak at the precision x utilisation), times the
  GPU's hourly price.
- **Warnings** (simple lints): no dropout before the classifier (the last layer is a `linear` and
  the graph, traced without `--depth`, has no dropout), parameters the forward never read, `batchNorm` trained at batch 1,
  modules that run as one opaque piece.

Depends on graph_diff, gpu_table, card (the box) and flops (format_count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..schema.errors import NNSchemaError
from .card import _box, format_bytes
from .flops import format_count
from .gpu_table import PRECISIONS, GPUTable, default_table, table_from_json
from .graph_diff import diff_graphs, diff_summary

__all__ = ["PlanOptions", "PlanError", "compute_plan", "format_plan_card", "memory_estimate", "verify_graph",
           "lint_graph", "options_from_json", "IMAGENET_1K_TRAIN", "OPTIMIZER_STATE_BYTES"]

IMAGENET_1K_TRAIN = 1_281_167
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4, "none": 0}
_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_MODES = ("training", "inference")
_MAX_BATCH = 1 << 20
_MAX_SAMPLES = 10**12


class PlanError(NNSchemaError):
    """Plan options that cannot be used; the message names the option and what it accepts."""


@dataclass(frozen=True)
class PlanOptions:
    """What to plan for: batch size, precision, training or inference, optimizer, epoch size, GPU table."""

    batch_size: int = 32
    precision: str = "fp16"
    mode: str = "training"
    optimizer: str = "adam"
    epoch_samples: int = IMAGENET_1K_TRAIN
    table: GPUTable = field(default_factory=default_table)

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= _MAX_BATCH:
            raise PlanError(f"batch size must be a whole number from 1 to {_MAX_BATCH}, got {self.batch_size!r}")
        if self.precision not in PRECISIONS:
            raise PlanError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.mode not in _MODES:
            raise PlanError(f"mode must be training or inference, got {self.mode!r}")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise PlanError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, got {self.optimizer!r}")
        if isinstance(self.epoch_samples, bool) or not isinstance(self.epoch_samples, int) \
                or not 1 <= self.epoch_samples <= _MAX_SAMPLES:
            raise PlanError(f"epoch samples must be a whole number from 1 to {_MAX_SAMPLES}, "
                            f"got {self.epoch_samples!r}")

    def as_json(self) -> dict[str, Any]:
        return {"batchSize": self.batch_size, "precision": self.precision, "mode": self.mode,
                "optimizer": self.optimizer, "epochSamples": self.epoch_samples, "gpuTable": self.table.as_json()}


def options_from_json(data: Any) -> PlanOptions:
    """PlanOptions from a request's `options` object (camelCase keys of `as_json`; all optional)."""
    if data is None:
        return PlanOptions()
    if not isinstance(data, dict):
        raise PlanError("options must be a JSON object")
    known = {"batchSize", "precision", "mode", "optimizer", "epochSamples", "gpuTable"}
    if set(data) - known:
        raise PlanError(f"unknown options {sorted(set(data) - known)}; use {', '.join(sorted(known))}")
    table = default_table()
    if data.get("gpuTable") is not None:
        table = table_from_json(data["gpuTable"], where="options.gpuTable")
    defaults = PlanOptions()
    return PlanOptions(batch_size=data.get("batchSize", defaults.batch_size),
                       precision=data.get("precision", defaults.precision), mode=data.get("mode", defaults.mode),
                       optimizer=data.get("optimizer", defaults.optimizer),
                       epoch_samples=data.get("epochSamples", defaults.epoch_samples), table=table)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def memory_estimate(graph: dict[str, Any], options: PlanOptions, precision: Optional[str] = None,
                    batch_size: Optional[int] = None) -> dict[str, Optional[int]]:
    """Bytes of weights, gradients, optimizer state, activations and their sum (`peak`); see the module doc."""
    precision = precision or options.precision
    batch = batch_size or options.batch_size
    totals = graph.get("totals", {})
    params, trainable = _int(totals.get("params")) or 0, _int(totals.get("trainableParams"))
    trainable = params if trainable is None else trainable
    width = _BYTES[precision]
    training = options.mode == "training"
    weights = params * width + (trainable * 4 if training and precision != "fp32" else 0)
    gradients = trainable * width if training else 0
    state = trainable * OPTIMIZER_STATE_BYTES[options.optimizer] if training else 0
    traced = _int(graph.get("batchSize")) or 0
    measured = _int(totals.get("activationBytes") if training else totals.get("largestActivationBytes"))
    activations = None
    if measured is not None and traced > 0:
        activations = math.ceil(measured * (1 if training else 2) * batch / traced * width / 4)
    peak = weights + gradients + state + (activations or 0)
    return {"weights": weights, "gradients": gradients, "optimizer": state, "activations": activations,
            "peak": peak}


def _input_text(graph: dict[str, Any]) -> str:
    parts = []
    for node in graph.get("nodes", []):
        if node.get("type") == "input":
            shape = node.get("outputShape") or []
            dtype = (node.get("params") or {}).get("dtype", "")
            text = "x".join(str(d) for d in shape) or "scalar"
            parts.append(text if dtype in ("float32", "") else f"{text} {dtype}")
    return ", ".join(parts) or ", ".join(str(s) for s in graph.get("inputs", [])) or "no input"


def verify_graph(graph: dict[str, Any]) -> list[str]:
    """The blockers of a graph: its own (the forward did not run) and what the verifier finds."""
    blockers = [str(b) for b in graph.get("blockers", [])]
    if not graph.get("runs", False):
        return blockers or ["the graph says the forward does not run"]
    nodes = {n["id"]: n for n in graph["nodes"]}
    inputs = [i for i, n in nodes.items() if n["type"] == "input"]
    outputs = [i for i, n in nodes.items() if n["type"] == "output"]
    succ: dict[str, list[str]] = {}
    for edge in graph["edges"]:
        succ.setdefault(edge["source"], []).append(edge["target"])
    seen, todo = set(inputs), list(inputs)
    while todo:
        for nxt in succ.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    if len(outputs) != 1:
        blockers.append(f"the graph has {len(outputs)} output nodes, not one")
    elif inputs and outputs[0] not in seen:
        blockers.append("the output is not reached from any input")
    for node in graph["nodes"]:
        problem = _contract(node)
        if problem:
            blockers.append(f"{node['id']}: {problem}")
    return blockers


def _contract(node: dict[str, Any]) -> Optional[str]:
    shape, params, kind = node.get("inputShape"), node.get("params") or {}, node.get("type", "")
    if not isinstance(shape, list) or not shape:
        return None
    if kind == "linear" and isinstance(params.get("inFeatures"), int) and shape[-1] != params["inFeatures"]:
        return f"linear expects inFeatures {params['inFeatures']}, its input is {shape}"
    channels = params.get("inChannels") if kind.startswith("conv") else (
        params.get("numFeatures") if kind.startswith("batchNorm") else None)
    if isinstance(channels, int) and shape[0] != channels:
        return f"{kind} expects {channels} channels first, its input is {shape}"
    normalized = params.get("normalizedShape") if kind in ("layerNorm", "rmsNorm") else None
    if isinstance(normalized, list) and normalized and shape[-len(normalized):] != normalized:
        return f"{kind} normalizes {normalized}, its input is {shape}"
    return None


def lint_graph(graph: dict[str, Any], options: PlanOptions) -> list[str]:
    """Warnings of simple design lints (see the module docstring)."""
    warnings = []
    nodes = {n["id"]: n for n in graph.get("nodes", [])}
    into_output = [e["source"] for e in graph.get("edges", []) if nodes.get(e["target"], {}).get("type") == "output"]
    has_dropout = any(str(n.get("type", "")).startswith("dropout") for n in nodes.values())
    # with --depth, a dropout may hide inside a merged module: the lint needs every layer
    if graph.get("depth") is None and not has_dropout and any(
            nodes[s]["type"] == "linear" for s in into_output if s in nodes):
        warnings.append("no dropout before the classifier")
    unused = list(graph.get("unusedParams") or [])
    if unused:
        shown = ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "")
        warnings.append(f"{len(unused)} parameter tensor{'s' if len(unused) != 1 else ''} never used in the "
                        f"forward ({shown})")
    if options.mode == "training" and options.batch_size == 1 and any(
            str(n.get("type", "")).startswith("batchNorm") for n in nodes.values()):
        warnings.append("batchNorm cannot train at batch size 1 (no batch statistics)")
    opaque = graph.get("opaque") or {}
    if opaque:
        warnings.append(f"{len(opaque)} module{'s' if len(opaque) != 1 else ''} traced as one opaque piece "
                        f"({', '.join(list(opaque)[:3])})")
    return warnings


def _fits(peak: int, gpu: Any, table: GPUTable, precision: str) -> bool:
    return gpu.supports(precision) and peak <= gpu.memory_bytes * (1 - table.headroom)


def _max_batch(graph: dict[str, Any], options: PlanOptions, gpu: Any) -> Optional[int]:
    """The largest batch whose peak still fits on `gpu` (memory grows linearly with the batch)."""
    one = memory_estimate(graph, options, batch_size=1)
    if one["activations"] is None:
        return None
    fixed = one["peak"] - one["activations"]
    per = memory_estimate(graph, options, batch_size=2)["activations"] - one["activations"] or one["activations"]
    usable = gpu.memory_bytes * (1 - options.table.headroom) - fixed
    if per <= 0:
        return _MAX_BATCH
    batch = int(usable // per)
    while batch > 0 and memory_estimate(graph, options, batch_size=min(batch, _MAX_BATCH))["peak"] > \
            gpu.memory_bytes * (1 - options.table.headroom):
        batch -= 1  # rounding of the linear estimate
    return min(batch, _MAX_BATCH) if batch > 0 else 0


def compute_plan(graph: dict[str, Any], options: Optional[PlanOptions] = None,
                 base: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The plan of a validated neurarch graph (and its diff against `base`); see the module docstring."""
    options = options or PlanOptions()
    table = options.table
    totals = graph.get("totals", {})
    blockers = verify_graph(graph)
    runs = not blockers
    memory = {p: memory_estimate(graph, options, precision=p) for p in PRECISIONS}
    peak = memory[options.precision]["peak"]
    known = memory[options.precision]["activations"] is not None
    gpus = [{"name": g.name, "memoryGb": g.memory_gb, "pricePerHour": g.price_per_hour,
             "fits": {p: known and _fits(memory[p]["peak"], g, table, p) for p in PRECISIONS}} for g in table.gpus]
    fitting = [g for g in table.gpus if known and _fits(peak, g, table, options.precision)]
    best = min(fitting, key=lambda g: (g.price_per_hour, g.memory_gb), default=None)
    fit = None
    if best is not None:
        fit = {"gpu": best.name, "memoryGb": best.memory_gb, "batchSize": options.batch_size,
               "precision": options.precision, "peakBytes": peak, "maxBatchSize": _max_batch(graph, options, best)}
    epoch = None
    flops, traced = _int(totals.get("flops")), _int(graph.get("batchSize"))
    if best is not None and flops is not None and traced:
        per_sample = flops / traced * (3 if options.mode == "training" else 1)
        rate = best.tflops[options.precision] * 1e12 * table.utilization
        seconds = options.epoch_samples * per_sample / rate
        epoch = {"gpu": best.name, "samples": options.epoch_samples, "flopsPerSample": per_sample,
                 "seconds": seconds, "cost": seconds / 3600 * best.price_per_hour}
    plan = {
        "name": graph.get("name"), "target": graph.get("target"), "input": _input_text(graph),
        "layers": totals.get("layers"), "params": totals.get("params"), "flops": flops,
        "runs": runs, "blockers": blockers, "warnings": lint_graph(graph, options),
        "options": {k: v for k, v in options.as_json().items() if k != "gpuTable"},
        "memory": memory, "gpus": gpus, "fit": fit, "epoch": epoch,
        "diff": diff_graphs(base, graph) if base is not None else None,
    }
    return plan


def _gb(count: int) -> str:
    return f"{count / 10**9:.1f} GB" if count >= 10**8 else format_bytes(count)


def _money(value: float) -> str:
    return f"~${value:,.2f}" if value >= 0.01 else "under $0.01"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_plan_card(plan: dict[str, Any], *, source: Optional[str] = None, width: int = 68) -> str:
    """The boxed plan card (the seed's "one command, one card")."""
    target = plan.get("target") or ""
    source = source if source is not None else target.rpartition(":")[0] if ":" in target else target
    name = plan.get("name") or "model"
    size = f"{format_count(plan['params'] or 0)} params"
    if plan.get("flops") is not None:
        head3 = f"{plan.get('layers') or 0} layers, {size}, {format_count(plan['flops'])} FLOPs at {plan['input']}"
    else:
        head3 = f"{size}, at {plan['input']}"
    options = plan["options"]
    rows = [("Runs", "yes, shapes propagate end to end" if plan["runs"] else "no, see the blockers below")]
    fit = plan.get("fit")
    if fit is not None:
        more = f"; batch up to {fit['maxBatchSize']}" if fit.get("maxBatchSize") else ""
        rows.append(("GPU fit", f"{fit['gpu']} {fit['memoryGb']:g} GB at batch {fit['batchSize']} {fit['precision']} "
                                f"({_gb(fit['peakBytes'])} peak{more})"))
    elif plan["memory"][options["precision"]]["activations"] is None:
        rows.append(("GPU fit", "unknown: no activations were measured"))
    else:
        peak = plan["memory"][options["precision"]]["peak"]
        rows.append(("GPU fit", f"no listed GPU at batch {options['batchSize']} {options['precision']} "
                                f"({_gb(peak)} peak); try a smaller batch"))
    epoch = plan.get("epoch")
    label = "Training cost" if options["mode"] == "training" else "Inference"
    if epoch is not None:
        rows.append((label, f"{_money(epoch['cost'])} per epoch of {format_count(epoch['samples'])} samples on a "
                            f"{epoch['gpu']} ({_duration(epoch['seconds'])})"))
    else:
        rows.append((label, "n/a"))
    if plan["blockers"]:
        rows.extend(("Blockers" if i == 0 else "", b) for i, b in enumerate(plan["blockers"]))
    else:
        rows.append(("Blockers", "none"))
    warnings = plan["warnings"]
    rows.append(("Warnings", f"{len(warnings)}: " + "; ".join(warnings) if warnings else "none"))
    if plan.get("diff") is not None:
        rows.append(("Diff", diff_summary(plan["diff"])))
    return _box([name, source, head3], rows, width, label_width=16)
