"""`python -m nnschemaparser ...` runs the command-line tool (see cli.py)."""

from .inspection.cli import main

raise SystemExit(main())
