"""The op-description table: common torch ops by name, in-place variants, sub-block calls, the default."""

import pytest

from nnschemaparser.traces.descriptions import OP_DESCRIPTIONS, describe_block_call, describe_op
from nnschemaparser.schema.model import ModelBlockSchema


@pytest.mark.parametrize("name, text", [
    ("linear", "Linear projection"), ("relu", "ReLU activation"), ("mul", "Tensor multiplication"),
    ("matmul", "Matrix multiplication"), ("softmax", "Softmax normalization"), ("layer_norm", "Layer normalization"),
    ("conv2d", "Convolution"), ("embedding", "Embedding lookup"), ("getitem", "Indexing / slicing"),
    ("view", "Reshape"), ("cat", "Concatenation"), ("gelu", "GELU activation"), ("dropout", "Dropout"),
    ("scaled_dot_product_attention", "Scaled dot-product attention"), ("add", "Tensor addition"),
])
def test_common_ops_have_human_descriptions(name, text):
    assert describe_op(name) == text


def test_in_place_variants_share_the_phrase_and_say_so():
    assert describe_op("relu_") == "ReLU activation (in place)"
    assert describe_op("iadd") == "Tensor addition (in place)"
    assert describe_op("__add__") == "Tensor addition"


def test_unknown_ops_get_a_default_naming_them():
    assert describe_op("frobnicate") == "Result of frobnicate"
    assert describe_op("") == "Result of a call"


def test_sub_block_calls_name_the_path_and_the_class():
    block = ModelBlockSchema(name="Linear", path="fc1")
    assert describe_block_call("fc1", block) == "Call to sub-block fc1 (Linear)"
    assert describe_block_call("encoder", ModelBlockSchema(name="Enc"), "embed") == \
        "Call to method embed of encoder (Enc)"
    assert describe_block_call("", ModelBlockSchema(name="Net")) == "Call to self (Net)"


def test_the_table_covers_the_common_op_families():
    assert len(OP_DESCRIPTIONS) > 200
