"""Tests of the `runtime` stage (nnschemaparser/runtime/)."""
