"""Tests of the `widget` stage (nnschemaparser/widget/)."""
