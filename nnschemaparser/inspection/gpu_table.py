"""The table the plan reads: common GPUs, their memory, peak FLOP rates by precision, and an hourly price.

| GPU | memory | fp32 TFLOP/s | fp16 | bf16 | $/hour |
|---|---|---|---|---|---|
| T4 | 16 GB | 8.1 | 65 | - | 0.35 |
| V100 | 16 GB | 15.7 | 125 | - | 2.48 |
| L4 | 24 GB | 30.3 | 121 | 121 | 0.80 |
| A10G | 24 GB | 31.2 | 125 | 125 | 1.01 |
| RTX 4090 | 24 GB | 82.6 | 165 | 165 | 0.70 |
| A100 40GB | 40 GB | 19.5 | 312 | 312 | 1.30 |
| A100 80GB | 80 GB | 19.5 | 312 | 312 | 1.80 |
| H100 | 80 GB | 67 | 989 | 989 | 3.00 |
| H200 | 141 GB | 67 | 989 | 989 | 3.80 |

Rates are the vendors' published dense peaks (tensor cores for fp16/bf16, no sparsity; fp32 without
TF32); `-` means the GPU has no native bf16. Prices are illustrative on-demand cloud rates, not
quotes: pass your own with `--gpu-table FILE.json`. Achieved throughput is `UTILIZATION` (0.4) of
the peak, a typical model-FLOPs utilisation for training. Memory sizes are what the card calls "fits"
against, less `HEADROOM` (10%, for the CUDA context, allocator slack and fragmentation).

An override file is JSON: `{"utilization": 0.3, "gpus": {"T4": {"price_per_hour": 0.2},
"MyGPU": {"memory_gb": 48, "tflops": {"fp32": 40, "fp16": 180, "bf16": 180}, "price_per_hour": 1.5}}}`;
a GPU named in it replaces the listed fields of the built-in entry or is added; `{"only": true}`
drops the built-in GPUs not named.

Depends on the standard library and schema.errors only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from ..schema.errors import NNSchemaError

__all__ = ["GPU", "GPUTable", "DEFAULT_GPUS", "UTILIZATION", "HEADROOM", "PRECISIONS", "GPUTableError",
           "default_table", "load_table", "table_from_json"]

PRECISIONS = ("fp32", "fp16", "bf16")
UTILIZATION = 0.4
HEADROOM = 0.10


class GPUTableError(NNSchemaError):
    """A GPU table override that cannot be read; the message names the entry and the field."""


@dataclass(frozen=True)
class GPU:
    """One GPU: memory in GB (10**9 bytes), dense peak TFLOP/s per precision (None: unsupported), $/hour."""

    name: str
    memory_gb: float
    tflops: dict[str, Optional[float]] = field(default_factory=dict)
    price_per_hour: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 10**9)

    def supports(self, precision: str) -> bool:
        return self.tflops.get(precision) is not None


@dataclass(frozen=True)
class GPUTable:
    gpus: tuple[GPU, ...]
    utilization: float = UTILIZATION
    headroom: float = HEADROOM

    def as_json(self) -> dict[str, Any]:
        return {"utilization": self.utilization, "headroom": self.headroom,
                "gpus": {g.name: {"memory_gb": g.memory_gb, "tflops": dict(g.tflops),
                                  "price_per_hour": g.price_per_hour} for g in self.gpus}}


def _gpu(name: str, memory: float, fp32: float, fp16: float, bf16: Optional[float], price: float) -> GPU:
    return GPU(name, memory, {"fp32": fp32, "fp16": fp16, "bf16": bf16}, price)


DEFAULT_GPUS: tuple[GPU, ...] = (
    _gpu("T4", 16, 8.1, 65, None, 0.35),
    _gpu("V100", 16, 15.7, 125, None, 2.48),
    _gpu("L4", 24, 30.3, 121, 121, 0.80),
    _gpu("A10G", 24, 31.2, 125, 125, 1.01),
    _gpu("RTX 4090", 24, 82.6, 165, 165, 0.70),
    _gpu("A100 40GB", 40, 19.5, 312, 312, 1.30),
    _gpu("A100 80GB", 80, 19.5, 312, 312, 1.80),
    _gpu("H100", 80, 67, 989, 989, 3.00),
    _gpu("H200", 141, 67, 989, 989, 3.80),
)


def default_table() -> GPUTable:
    return GPUTable(DEFAULT_GPUS)


def _number(value: Any, where: str, *, allow_none: bool = False, positive: bool = True) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (positive and value <= 0) or value < 0:
        raise GPUTableError(f"{where} must be a {'positive' if positive else 'non-negative'} number"
                            f"{' or null' if allow_none else ''}, got {value!r}")
    return float(value)


def table_from_json(data: Any, base: Optional[GPUTable] = None, where: str = "the GPU table") -> GPUTable:
    """`base` (default: the built-in table) with the overrides of `data` applied (see the module docstring)."""
    base = base or default_table()
    if not isinstance(data, dict):
        raise GPUTableError(f"{where} must be a JSON object with 'gpus' and/or 'utilization'")
    unknown = set(data) - {"gpus", "utilization", "headroom", "only"}
    if unknown:
        raise GPUTableError(f"{where} has unknown keys {sorted(unknown)}; use gpus, utilization, headroom, only")
    utilization = base.utilization
    if "utilization" in data:
        utilization = _number(data["utilization"], f"{where}: utilization")
        if utilization > 1:
            raise GPUTableError(f"{where}: utilization is a fraction of the peak, at most 1, got {utilization}")
    headroom = base.headroom
    if "headroom" in data:
        headroom = _number(data["headroom"], f"{where}: headroom", positive=False)
        if headroom >= 1:
            raise GPUTableError(f"{where}: headroom is a fraction of the memory, below 1, got {headroom}")
    gpus = {g.name: g for g in base.gpus}
    entries = data.get("gpus", {})
    if not isinstance(entries, dict) or len(entries) > 200:
        raise GPUTableError(f"{where}: gpus must be an object of at most 200 GPUs by name")
    for name, entry in entries.items():
        at = f"{where}: gpus[{name!r}]"
        if not isinstance(entry, dict) or set(entry) - {"memory_gb", "tflops", "price_per_hour"}:
            raise GPUTableError(f"{at} must be an object with memory_gb, tflops and price_per_hour")
        old = gpus.get(name)
        if old is None and not {"memory_gb", "tflops"} <= set(entry):
            raise GPUTableError(f"{at} is a new GPU: give its memory_gb and tflops")
        gpu = old or GPU(name, 1.0, {}, 0.0)
        if "memory_gb" in entry:
            gpu = replace(gpu, memory_gb=_number(entry["memory_gb"], f"{at}.memory_gb"))
        if "price_per_hour" in entry:
            gpu = replace(gpu, price_per_hour=_number(entry["price_per_hour"], f"{at}.price_per_hour",
                                                      positive=False))
        if "tflops" in entry:
            rates = entry["tflops"]
            if not isinstance(rates, dict) or set(rates) - set(PRECISIONS):
                raise GPUTableError(f"{at}.tflops must map some of {', '.join(PRECISIONS)} to TFLOP/s (null: none)")
            merged = dict(gpu.tflops)
            merged.update({p: _number(v, f"{at}.tflops.{p}", allow_none=True) for p, v in rates.items()})
            gpu = replace(gpu, tflops=merged)
        gpus[name] = gpu
    if data.get("only"):
        gpus = {name: gpu for name, gpu in gpus.items() if name in entries}
    return GPUTable(tuple(gpus.values()), utilization, headroom)


#: The largest `--gpu-table` file read.
MAX_TABLE_BYTES = 1024 * 1024


def load_table(path: str | Path) -> GPUTable:
    """The built-in table with the overrides of the JSON file at `path`."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:  # bounded: `--gpu-table /dev/zero` is refused, not read forever
            raw = handle.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        raise GPUTableError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TABLE_BYTES:
        raise GPUTableError(f"{path} is larger than {MAX_TABLE_BYTES} bytes, more than a GPU table holds")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise GPUTableError(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise GPUTableError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    return table_from_json(data, where=str(path))
