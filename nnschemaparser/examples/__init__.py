"""Bundled example models and the quick start `make demo` runs (`python -m nnschemaparser.examples.demo`).

Stage 10, the last. May import: every earlier stage.
"""
