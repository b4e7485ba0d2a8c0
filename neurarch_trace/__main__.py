"""`python -m neurarch_trace ...`: the `neurarch-trace` command (see neurarch_trace/__init__.py)."""

from __future__ import annotations

from neurarch_trace import main

if __name__ == "__main__":
    raise SystemExit(main())
