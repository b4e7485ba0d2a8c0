"""Tests of the `parser` stage (nnschemaparser/parser/)."""
