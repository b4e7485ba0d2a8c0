"""Bundled example models (used by `make demo`, the notebooks and the docs)."""
