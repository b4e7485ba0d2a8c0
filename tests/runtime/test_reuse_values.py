"""What a reused call's arguments are compared by (runtime/reuse_values.py): tensors by object and
version or by bits, numbers by type and bits, objects by identity and their attributes."""

from __future__ import annotations

import types

import pytest
import torch

from nnschemaparser.runtime.reuse_values import freeze, same


def test_a_tensor_is_the_same_object_at_its_version_or_one_with_the_same_bits_and_strides():
    t = torch.arange(6.0).reshape(2, 3)
    frozen = freeze(t)
    assert same(frozen, t, {}) and same(frozen, t.clone(), {})
    assert not same(frozen, t.t().contiguous().t(), {})  # same values, other strides
    assert not same(frozen, t.to(torch.float64), {})
    t.add_(0.0)  # the recorded tensor changed in place since: it no longer holds what was passed
    assert not same(frozen, t, {})


def test_numbers_are_compared_by_type_and_bits():
    assert same(freeze(0.0), 0.0, {}) and not same(freeze(0.0), -0.0, {})
    assert not same(freeze(1), 1.0, {}) and not same(freeze(True), 1, {})


def test_an_object_is_the_same_object_with_the_same_attributes_however_deep():
    config = types.SimpleNamespace(heads=4, sizes=[1, 2], inner=types.SimpleNamespace(eps=1e-5))
    frozen = freeze(config)
    assert same(frozen, config, {}) and not same(frozen, types.SimpleNamespace(**vars(config)), {})
    config.sizes.append(3)  # a container held by it changed
    assert not same(frozen, config, {})
    config.sizes.pop()
    assert same(frozen, config, {})
    config.inner.eps = 1e-6  # an object inside it changed
    assert not same(frozen, config, {})
    config.inner.eps = 1e-5
    config.heads = 8  # an attribute rebound
    assert not same(frozen, config, {})


def test_what_cannot_be_compared_is_refused():
    with pytest.raises(TypeError):
        freeze((i for i in range(3)))
    with pytest.raises(TypeError):
        freeze({1, 2})
