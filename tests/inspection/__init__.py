"""Tests of the `inspection` stage (nnschemaparser/inspection/)."""
