"""Tests of the `validation` stage (nnschemaparser/validation/)."""
