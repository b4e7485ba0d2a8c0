"""Tests of the `lowering` stage (nnschemaparser/lowering/)."""
