"""`python -m nnschemaparser ...` and the `nnschemaparser` console script.

`nnschemaparser serve ...` runs the plan and share server (widget/share_server.py); anything else
is the inspection command (inspection/cli.py), given the encoder of the schema `--share` uploads
(widget/shared_page.py). The dispatch lives at the root because the server and the schema file
encoder (later stages) may not be imported by the inspection stage.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None, prog: str = "nnschemaparser") -> int:
    """Run `nnschemaparser` with `argv` (default: sys.argv[1:]); returns the exit status. `prog` is the
    name the command's messages use (`neurarch-trace` from the neurarch_trace entry points)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from .widget.share_server import main as serve

        return serve(argv[1:])
    from .inspection.cli import main as inspect

    return inspect(argv, share_schema=_share_document, prog=prog)


def _share_document(schema):
    """The schema document `--share` uploads (widget/shared_page.py), imported only when sharing."""
    from .widget.shared_page import share_document

    return share_document(schema)


if __name__ == "__main__":
    raise SystemExit(main())
