"""Cost accounting: FLOPs counted by torch's own FlopCounterMode, and parameter counts.

FLOPs are never looked up in a table of ours. `FlopMeter` keeps a `torch.utils.flop_counter.
FlopCounterMode` open across a run and reads its running total, so a listener can take the
difference between two instruction events and charge it to the instruction that ran in between;
the per-op numbers then add up to exactly what the counter reports for the whole run.
`count_forward_flops` runs a model's own eager forward under the same counter, the reference the
schema's numbers are checked against.

Parameters are counted as elements, and a tensor shared by several modules (tied weights) counts
once: once in the model total, once in every block total that reaches it.

Depends on torch and `parser.preserved_state` only; never on the interpreter, listeners or views.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.flop_counter import FlopCounterMode

from ..parser.model_parser import preserved_state

__all__ = ["FlopMeter", "count_forward_flops", "count_parameters", "block_parameter_counts", "format_count"]


class FlopMeter:
    """A FlopCounterMode held open over a region; `total` is the FLOPs counted so far.

    Use as a context manager. Nothing is printed on exit (the counter's table is for humans at a
    REPL; callers here want the number).
    """

    def __init__(self) -> None:
        self._counter = FlopCounterMode(display=False)
        self._open = False

    def __enter__(self) -> "FlopMeter":
        self._counter.__enter__()
        self._open = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        self._counter.__exit__(*exc)

    @property
    def total(self) -> int:
        """FLOPs counted since the meter was entered (they stay readable after it is left)."""
        return int(self._counter.get_total_flops())

    def read(self) -> int:
        """The running total, as a callable for listeners that sample it between events."""
        return int(self._counter.get_total_flops())


def count_forward_flops(model: nn.Module, args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None,
                        *, autograd: bool = False) -> tuple[int, Any]:
    """Run `model(*args, **kwargs)` eagerly under FlopCounterMode; return (FLOPs, what forward returned).

    The run happens under `torch.no_grad()` (autograd enabled with `autograd=True`) with the model's
    parameters, buffers, attributes, training flags and RNG put back afterwards, so counting changes nothing.
    """
    kwargs = dict(kwargs or {})
    with preserved_state(model), torch.set_grad_enabled(autograd), FlopMeter() as meter:
        result = model(*args, **kwargs)
    return meter.total, result


def _elements(tensors: Iterable[torch.Tensor]) -> int:
    # An uninitialized lazy parameter has no shape yet: it holds no elements.
    return sum(0 if is_lazy(t) else int(t.numel()) for t in tensors)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Elements in every parameter reachable from `model`, each tensor once (tied weights once)."""
    return _elements(p for p in model.parameters() if p.requires_grad or not trainable_only)


def block_parameter_counts(model: nn.Module) -> dict[str, int]:
    """For every registered module path ("" for the root): elements of the parameters in its subtree.

    `Module.parameters()` already yields a tensor shared inside one subtree only once, so a weight
    tied between two children counts once in their common parent and once in each child.
    """
    return {path: _elements(module.parameters()) for path, module in model.named_modules()}


def format_count(value: int) -> str:
    """`1234567` -> `1.23M`, `1800000000` -> `1.8G`; below a thousand the number itself (`325`)."""
    for factor, suffix in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return str(int(value))
