"""Where the random decisions of the program grammar come from.

The grammar asks a `Chooser` for integers, options and coin flips. `DrawChooser` takes them from a
Hypothesis `draw` (so Hypothesis can shrink a failing program), `RandomChooser` from a seeded
`random.Random` (fast and reproducible by seed for the long runs). Both shrink or default toward
the first option of a table and toward "no" for a coin flip, so tables list the simplest choice first.

Depends on the standard library and hypothesis only.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")

__all__ = ["Chooser", "RandomChooser", "DrawChooser"]


class Chooser:
    """The decisions of one program; subclasses provide `integer`."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def chance(self, percent: int) -> bool:
        """True with probability `percent`/100 (shrinks to False)."""
        return self.integer(0, 99) >= 100 - percent

    def weighted(self, table: Sequence[tuple[int, T]]) -> T:
        """One entry of `(weight, option)` pairs, drawn by weight (shrinks to the first)."""
        total = sum(weight for weight, _ in table)
        point = self.integer(0, total - 1)
        for weight, option in table:
            if point < weight:
                return option
            point -= weight
        raise AssertionError("unreachable")


class RandomChooser(Chooser):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


class DrawChooser(Chooser):
    def __init__(self, draw: Callable):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))
