"""Tests of the `traces` stage (nnschemaparser/traces/)."""
