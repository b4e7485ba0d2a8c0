"""`neurarch-trace` and `python -m neurarch_trace`: the seed's command name for `nnschemaparser`'s trace.

    neurarch-trace models/resnet.py:ResNet18 --input 1,3,224,224 --plan --share
    python -m neurarch_trace my_pkg.model:build_model --input 1,3,224,224 -o out.neurarch.json

The same command as `nnschemaparser TARGET ...` (nnschemaparser/inspection/cli.py; docs/CLI.md),
with its messages prefixed `neurarch-trace:`. `main(argv)` returns the exit status: 0 success,
1 failure or bad usage, 2 with `--fail-on-block` when the card reports a blocker.
"""

from __future__ import annotations

from typing import Optional, Sequence

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `neurarch-trace` with `argv` (default: sys.argv[1:]); returns the exit status."""
    from nnschemaparser.__main__ import main as command

    return command(argv, prog="neurarch-trace")
