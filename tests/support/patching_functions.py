"""Module-level functions a model's forward calls, for the reuse of function calls in activation
patching (tests/traces/test_patching_reuse.py): one pure, one that writes this module's state, one
that draws random numbers, one that changes its argument in place. They live apart from the models that call them, so that only
the check around each function call (not the model's own state watch) can see what they write."""

from __future__ import annotations

import contextlib
import inspect
import sys

import torch

LOG: list = []  # what `logged_bias` appends to


def causal_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """A pure function: an additive causal mask [n, n] for h's length."""
    n = h.shape[1]
    return torch.triu(torch.full((n, n), -scale, dtype=h.dtype), 1)


def logged_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Writes Python state (appends to this module's LOG) and returns the causal mask."""
    LOG.append(h.shape[1])
    return causal_bias(h, scale)


def noisy_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Draws random numbers (a jitter of the mask) and returns the causal mask."""
    return causal_bias(h, scale) + torch.rand(h.shape[1], h.shape[1], dtype=h.dtype)


def bumped_bias(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Changes its argument in place (the same values, a new version) and returns the causal mask."""
    h.add_(0.0)
    return causal_bias(h, scale)


@contextlib.contextmanager
def counting(function):
    """Counts the calls of `function` (frames of its code) while the `with` block runs, by a profile
    function (so the function itself is not changed: wrapping it would make it write state)."""
    count = [0]
    code = inspect.unwrap(function).__code__  # a decorator's wrapper code is shared by every function it wraps
    before = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(before)
