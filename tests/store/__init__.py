"""Tests of the `store` stage (nnschemaparser/store/): capture_dataset, TraceStore, reductions, ranks."""
