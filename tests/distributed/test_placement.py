"""Placements and the errors of a logical capture, in one process (no group needed)."""

from __future__ import annotations

import pytest
import torch

from nnschemaparser import NNParser, capture_run
from nnschemaparser.distributed import DimPlacement, Layout, LogicalCaptureError, capture_logical, compare_logical
from tests.support.distributed_models import MLP


def test_layout_badges_name_each_mesh_dim():
    layout = Layout((DimPlacement("shard", 0), DimPlacement("partial")), ("dp", "tp"))
    assert layout.badge() == "S(0)@dp·P(sum)@tp" and layout.partial and layout.known
    assert Layout((DimPlacement("replicate"),) * 2, ("dp", "tp")).badge() == "R"
    unknown = Layout((DimPlacement("unknown"),), ("tp",))
    assert not unknown.known and unknown.badge() == "?@tp" and "unknown over mesh dim 'tp'" in unknown.describe()


def test_capture_logical_without_a_process_group_says_what_to_do():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(2, 32)
    schema = NNParser.parse_model(model, inputs_tensors_values={"x": x})
    with pytest.raises(LogicalCaptureError, match="init_process_group"):
        capture_logical(schema, {"x": x})


def test_compare_logical_refuses_a_trace_of_one_process():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(2, 32)
    record = capture_run(NNParser.parse_model(model, inputs_tensors_values={"x": x}), {"x": x})
    with pytest.raises(TypeError, match="capture_logical"):
        compare_logical(record.trace, record.trace)
