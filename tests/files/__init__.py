"""Tests of the `files` stage (nnschemaparser/files/)."""
