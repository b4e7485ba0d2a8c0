"""`keep="call=**"` (`**` crosses dots: every block call at any depth) on real transformers models: every block call's result a full capture holds, with its
number, container id, depth and value, observing only the blocks that make calls (the leaves run counted)."""

from __future__ import annotations

import warnings

import pytest
import torch

from nnschemaparser import KeepMissedWarning, NNParser, capture_run
from nnschemaparser.traces.selection import is_block_call, keep_selector
from nnschemaparser.validation.zoo import get_case

CASES = ["bert", "gpt2", "llama", "mixtral", "whisper", "vit"]


@pytest.mark.parametrize("name", CASES)
def test_every_block_call_result_is_kept_as_the_full_capture_holds_it(name):
    case = get_case(name)
    model = case.build().eval()
    schema = NNParser.parse_model(model=model, inputs_tensors_values=dict(case.make_inputs(model)))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", KeepMissedWarning)
        full = capture_run(schema, dict(case.make_inputs(model)))
        kept = capture_run(schema, dict(case.make_inputs(model)), keep="call=**")
    expected = [s for s in full.trace if s.slot_type == "activation" and is_block_call(s.description)]
    assert expected and len(kept.trace) == len(expected) < len(full.trace)
    for a, b in zip(kept.trace, expected):
        assert (a.step, a.container_id, a.frame_depth, a.op_name) == (b.step, b.container_id, b.frame_depth, b.op_name)
        assert torch.equal(a.value, b.value)
    observed = keep_selector("call=**").blocks_to_observe(schema)
    linears = [b for b in schema.iter_blocks() if b.module_type == "torch.nn.modules.linear.Linear"]
    assert linears and not any(id(b) in observed for b in linears)  # a block that calls no block runs counted
