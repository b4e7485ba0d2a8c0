"""Bounded, opt-in recording of the tensors that flow into and out of a model's modules.

`capture_model` returns a `ModelCapture`: a context manager that installs instance hooks on the
chosen registered modules while it is active, and turns every tensor they see into a frozen
`TensorSnapshot` (full metadata plus a short, detached prefix of values). The caller runs the
model's ordinary forward inside the context; the hooks never change what the model computes or
returns, and they are removed again however the context is left.

Every cost is bounded by `CaptureLimits`: how many snapshots are kept, how many values one snapshot
copies, how many source bytes all samples together copy, and how far one structured input or output
is walked. `sample_tensor` is the one place that decides which tensors can be sampled and copies
the prefix; the schema interpreter's bounded capture reuses it so both agree on what a sample is.

The quotas and the sampling itself live in `traces.sampling` (shared with the interpreter's bounded
capture). This module depends on torch, the standard library, `traces.sampling` and `metadata` (for
the root path convention); it never imports the parser, schema, interpreter or any view.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..traces.sampling import CaptureLimits, TensorSnapshot, sample_tensor, tensor_shape
from .metadata import ROOT_PATH

__all__ = ["CaptureLimits", "TensorSnapshot", "ModelCapture", "capture_model", "sample_tensor"]


class _QuotaExhausted(Exception):
    """Internal signal: a shared quota ran out; the capture records nothing further."""


class _WalkExhausted(Exception):
    """Internal signal: the current input or output walk reached its node quota."""


class ModelCapture:
    """Context manager that records bounded `TensorSnapshot`s from registered modules.

    Build it with `capture_model`, enter it, run the model as usual, then read `snapshots`.
    Entering installs, on each selected module, a forward pre-hook (inputs, seen after any
    pre-hooks that were already installed, so it observes their changes) and a forward hook
    (outputs). Leaving, normally or through an exception, removes them. An invocation whose forward
    raises has an input sample but no output sample. The object can be entered again; snapshots,
    byte accounting and call indices then keep accumulating. Shared quotas may cut an invocation
    between its input and its output, so the result is a bounded trace, not guaranteed pairs.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        module_paths: Sequence[str] | None = None,
        limits: CaptureLimits | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"ModelCapture expects a torch.nn.Module instance, got "
                f"{type(model).__module__}.{type(model).__qualname__}; pass the constructed model."
            )
        if isinstance(module_paths, str):
            raise TypeError(
                f"module_paths must be a sequence of paths, got the single string {module_paths!r}; "
                f"wrap it in a list: module_paths=[{module_paths!r}]."
            )
        if limits is None:
            limits = CaptureLimits()
        elif not isinstance(limits, CaptureLimits):
            raise TypeError(f"limits must be a CaptureLimits or None, got {type(limits).__qualname__}.")
        self._model = model
        self._requested = None if module_paths is None else tuple(dict.fromkeys(module_paths))
        self._limits = limits
        self._snapshots: list[TensorSnapshot] = []
        self._sampled_bytes = 0
        self._stopped = False
        self._call_counts: dict[str, int] = {}
        self._pending: dict[str, list[int]] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    @property
    def snapshots(self) -> tuple[TensorSnapshot, ...]:
        """Snapshots recorded so far, in the order the hooks saw them."""
        return tuple(self._snapshots)

    @property
    def sampled_bytes(self) -> int:
        """Source-dtype bytes copied into samples so far, across every entrance."""
        return self._sampled_bytes

    @property
    def active(self) -> bool:
        """True while this capture's hooks are installed on the model."""
        return bool(self._handles)

    @property
    def limits(self) -> CaptureLimits:
        """The quotas this capture enforces."""
        return self._limits

    def __enter__(self) -> ModelCapture:
        if self._handles:
            raise RuntimeError("This ModelCapture is already active; leave its context before entering again.")
        targets = self._resolve_targets()
        try:
            for path, module in targets:
                self._handles.append(
                    module.register_forward_pre_hook(self._input_hook(path), with_kwargs=True)
                )
                self._handles.append(module.register_forward_hook(self._output_hook(path)))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove this capture's hooks and forget unfinished calls; calling it again does nothing."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._pending.clear()

    def _resolve_targets(self) -> list[tuple[str, nn.Module]]:
        registered = {(name or ROOT_PATH): module for name, module in self._model.named_modules()}
        if self._requested is None:
            return list(registered.items())
        unknown = [path for path in self._requested if path not in registered]
        if unknown:
            raise ValueError(self._unknown_paths_message(unknown, registered))
        return [(path, registered[path]) for path in self._requested]

    def _unknown_paths_message(self, unknown: list[str], registered: dict[str, nn.Module]) -> str:
        # Aliases of a shared module are not named_modules paths; point at the one that is.
        canonical = {id(module): path for path, module in registered.items()}
        aliases = {
            (name or ROOT_PATH): canonical[id(module)]
            for name, module in self._model.named_modules(remove_duplicate=False)
        }
        hints = []
        for path in unknown:
            if path in aliases:
                hints.append(f"{path!r} is another path to the module registered as {aliases[path]!r}; use that")
                continue
            close = difflib.get_close_matches(path, list(registered), n=3)
            if path == "":
                close = [ROOT_PATH]
            hints.append(f"{path!r} (did you mean {', '.join(map(repr, close))}?)" if close else repr(path))
        return (
            f"Unknown module path(s) for {type(self._model).__qualname__}: {'; '.join(hints)}. "
            f"Use paths from model.named_modules(), with {ROOT_PATH!r} for the model itself."
        )

    def _input_hook(self, path: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            index = self._call_counts.get(path, 0)
            self._call_counts[path] = index + 1
            self._pending.setdefault(path, []).append(index)
            self._record(path, index, "input", _input_roots(args, kwargs))
            return None  # never replace the module's inputs

        return hook

    def _output_hook(self, path: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            stack = self._pending.get(path)
            if not stack:
                return None  # the call started before this entrance; there is no index to pair with
            # Last in, first out: a call that raised and was caught upstream leaves a stale entry
            # below the live ones, and a re-entrant call finishes before its caller.
            index = stack.pop()
            self._record(path, index, "output", (("output", output),))
            return None  # never replace the module's output

        return hook

    def _record(self, path: str, index: int, direction: str, roots: tuple[tuple[str, Any], ...]) -> None:
        if self._stopped:
            return
        try:
            for tensor_path, tensor in _walk(roots, self._limits):
                self._snapshot(path, index, direction, tensor_path, tensor)
        except _WalkExhausted:
            pass  # the node quota restarts with the next walk
        except _QuotaExhausted:
            self._stopped = True

    def _snapshot(self, path: str, index: int, direction: str, tensor_path: str, tensor: torch.Tensor) -> None:
        limits = self._limits
        if len(self._snapshots) >= limits.max_tensors:
            raise _QuotaExhausted
        bytes_left = limits.max_bytes - self._sampled_bytes
        values, nbytes, reason = sample_tensor(tensor, limits.max_samples_per_tensor, bytes_left)
        self._sampled_bytes += nbytes
        self._snapshots.append(
            TensorSnapshot(
                module_path=path,
                call_index=index,
                direction=direction,
                tensor_path=tensor_path,
                shape=tensor_shape(tensor),
                dtype=str(tensor.dtype),
                device=str(tensor.device),
                numel=int(tensor.numel()),
                sampled_bytes=nbytes,
                values=values,
                sample_omission_reason=reason,
            )
        )
        wanted = min(int(tensor.numel()), limits.max_samples_per_tensor)
        cut_short = reason is None and len(values) < wanted
        # The byte quota is spent once nothing is left or it could not cover a whole sample; the
        # snapshot that hit it is kept with full metadata, and recording stops after it.
        if cut_short or self._sampled_bytes >= limits.max_bytes or len(self._snapshots) >= limits.max_tensors:
            raise _QuotaExhausted


def _input_roots(args: tuple, kwargs: dict | None) -> tuple[tuple[str, Any], ...]:
    return (("args", args), ("kwargs", kwargs or {}))


def _walk(roots: tuple[tuple[str, Any], ...], limits: CaptureLimits) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(tensor_path, tensor)`` depth-first through tuples, lists and mappings.

    Every visited value costs one node; the walk raises `_WalkExhausted` when the next value would
    exceed ``max_traversal_nodes``. Children deeper than ``max_container_depth`` edges from their
    root are skipped, their siblings still visited.
    """
    visited = 0
    # Explicit stack instead of recursion: depth is user-controlled and may exceed Python's limit.
    stack: list[tuple[str, Any, int]] = [(name, value, 0) for name, value in reversed(roots)]
    while stack:
        path, value, depth = stack.pop()
        visited += 1
        if visited > limits.max_traversal_nodes:
            raise _WalkExhausted
        if isinstance(value, torch.Tensor):
            yield path, value
            continue
        children = _children(path, value)
        if children is None or depth >= limits.max_container_depth:
            continue
        stack.extend((child_path, child, depth + 1) for child_path, child in reversed(children))


def _children(path: str, value: Any) -> list[tuple[str, Any]] | None:
    if isinstance(value, (tuple, list)):
        return [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        return [(f"{path}[{key!r}]", item) for key, item in value.items()]
    return None


def capture_model(
    model: nn.Module,
    *,
    module_paths: Sequence[str] | None = None,
    limits: CaptureLimits | None = None,
) -> ModelCapture:
    """Create a bounded capture for `model`; nothing is hooked until the result is entered.

    Dense strided real, integer and boolean tensors get value samples; complex, meta, non-strided
    (sparse, jagged) and quantized tensors are recorded as metadata only, with the reason, and are
    never converted. Every snapshot, metadata-only and empty ones included, counts toward
    ``max_tensors``. When the tensor or byte quota runs out, the capture records nothing more; when a
    walk's node quota runs out, that walk ends and the next one starts afresh.

    Args:
        model: The constructed model whose registered modules will be observed.
        module_paths: Exact ``named_modules`` paths to hook (``"<root>"`` for the model), or None
            for all of them. Unknown paths are rejected with a ValueError when the context is
            entered.
        limits: Quotas, or None for the `CaptureLimits` defaults.

    Returns:
        A reusable `ModelCapture`. Each entrance installs hooks and each exit removes them, even if
        the forward raised; snapshots, byte accounting and call indices accumulate across entrances.
    """
    return ModelCapture(model, module_paths=module_paths, limits=limits)
