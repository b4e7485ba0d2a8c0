"""Human descriptions and op names of trace steps: "Linear projection", "Call to sub-block fc1 (Linear)".

One table maps the bare name of a callable (`linear`, `relu`, `mul`, `softmax`, ...) to a short
phrase; in-place variants (`relu_`, `iadd`) share their out-of-place phrase. Names the table does
not know get a generic phrase built from the name itself, so every step has a description.

A pure function of the schema objects and the callee seen at run time: depends on schema only,
never on the interpreter, the listeners or any view.
"""

from __future__ import annotations

from typing import Any, Optional

from ..schema.model import BlockInstruction, Instruction, ModelBlockSchema, OpInstruction, VarRef

__all__ = ["OP_DESCRIPTIONS", "describe_op", "describe_block_call", "callee_name", "op_name_of", "lower_first"]

_TABLE: dict[str, tuple[str, ...]] = {
    # dense layers and products
    "Linear projection": ("linear", "addmm"),
    "Bilinear projection": ("bilinear",),
    "Matrix multiplication": ("matmul", "mm", "bmm", "mv", "dot", "__matmul__", "__rmatmul__"),
    "Batched matrix multiply-add": ("baddbmm", "addbmm"),
    "Einstein summation": ("einsum",),
    # convolutions and pooling
    "Convolution": ("conv1d", "conv2d", "conv3d", "_conv_forward", "convolution"),
    "Transposed convolution": ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
    "Max pooling": ("max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
                    "max_pool1d_with_indices", "max_pool2d_with_indices"),
    "Average pooling": ("avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
                        "adaptive_avg_pool3d"),
    "Upsampling": ("interpolate", "upsample", "pixel_shuffle"),
    # activations
    "ReLU activation": ("relu", "relu6", "threshold"),
    "Leaky ReLU activation": ("leaky_relu", "prelu", "rrelu"),
    "GELU activation": ("gelu", "gelu_new", "gelu_fast", "quick_gelu"),
    "SiLU activation": ("silu", "swish"),
    "ELU activation": ("elu", "selu", "celu"),
    "Mish activation": ("mish",),
    "Sigmoid activation": ("sigmoid", "hardsigmoid", "logsigmoid"),
    "Tanh activation": ("tanh", "hardtanh"),
    "Softplus activation": ("softplus",),
    "GLU activation": ("glu",),
    "Softmax normalization": ("softmax", "_softmax"),
    "Log-softmax normalization": ("log_softmax",),
    # normalization and regularization
    "Layer normalization": ("layer_norm",),
    "RMS normalization": ("rms_norm",),
    "Batch normalization": ("batch_norm",),
    "Group normalization": ("group_norm",),
    "Instance normalization": ("instance_norm",),
    "Vector normalization": ("normalize", "norm"),
    "Dropout": ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"),
    # attention and embeddings
    "Scaled dot-product attention": ("scaled_dot_product_attention",),
    "Embedding lookup": ("embedding", "embedding_bag"),
    "One-hot encoding": ("one_hot",),
    # arithmetic
    "Tensor addition": ("add", "__add__", "__radd__", "__iadd__"),
    "Tensor subtraction": ("sub", "subtract", "rsub", "__sub__", "__rsub__", "__isub__"),
    "Tensor multiplication": ("mul", "multiply", "__mul__", "__rmul__", "__imul__"),
    "Tensor division": ("truediv", "div", "divide", "true_divide", "__truediv__", "__rtruediv__",
                        "__itruediv__"),
    "Floor division": ("floordiv", "floor_divide", "__floordiv__"),
    "Remainder": ("mod", "remainder", "fmod", "__mod__"),
    "Power": ("pow", "__pow__", "__rpow__", "square"),
    "Negation": ("neg", "negative", "__neg__"),
    "Absolute value": ("abs", "absolute"),
    "Exponential": ("exp", "exp2", "expm1"),
    "Logarithm": ("log", "log2", "log10", "log1p"),
    "Square root": ("sqrt",),
    "Reciprocal square root": ("rsqrt",),
    "Reciprocal": ("reciprocal",),
    "Sine / cosine": ("sin", "cos"),
    "Clamp": ("clamp", "clip", "clamp_min", "clamp_max"),
    "Rounding": ("round", "floor", "ceil", "trunc"),
    "Sign": ("sign",),
    "Elementwise maximum": ("maximum", "fmax"),
    "Elementwise minimum": ("minimum", "fmin"),
    "Linear interpolation": ("lerp",),
    # comparisons and logic
    "Elementwise comparison": ("eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__",
                               "__gt__", "__ge__", "isclose"),
    "Logical operation": ("and_", "or_", "xor", "invert", "logical_and", "logical_or",
                          "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not",
                          "__and__", "__or__", "__invert__"),
    "Conditional select": ("where",),
    "Masked fill": ("masked_fill",),
    "NaN / Inf test": ("isnan", "isinf", "isfinite"),
    # reductions
    "Sum reduction": ("sum", "nansum"),
    "Mean reduction": ("mean", "nanmean"),
    "Maximum reduction": ("max", "amax", "argmax"),
    "Minimum reduction": ("min", "amin", "argmin"),
    "Product reduction": ("prod",),
    "Variance / standard deviation": ("var", "std", "var_mean", "std_mean"),
    "Cumulative sum": ("cumsum", "cumprod"),
    "Log-sum-exp": ("logsumexp",),
    "Top-k selection": ("topk",),
    "Sort": ("sort", "argsort"),
    "Any / all test": ("any", "all"),
    # shape and layout
    "Reshape": ("view", "reshape", "view_as", "reshape_as", "unflatten"),
    "Flatten": ("flatten", "ravel"),
    "Transpose": ("transpose", "t", "swapaxes", "swapdims", "mT"),
    "Permute dimensions": ("permute", "movedim", "moveaxis"),
    "Add a dimension": ("unsqueeze",),
    "Remove a dimension": ("squeeze",),
    "Expand / broadcast": ("expand", "expand_as", "broadcast_to"),
    "Repeat": ("repeat", "repeat_interleave", "tile"),
    "Make contiguous": ("contiguous",),
    "Concatenation": ("cat", "concat", "concatenate", "hstack", "vstack"),
    "Stack": ("stack",),
    "Split": ("split", "chunk", "tensor_split", "unbind"),
    "Indexing / slicing": ("getitem", "__getitem__", "narrow", "select", "index_select", "take"),
    "Gather": ("gather", "take_along_dim"),
    "Scatter": ("scatter", "scatter_add", "index_add", "index_copy", "index_put"),
    "Padding": ("pad",),
    "Roll / flip": ("roll", "flip"),
    "Triangular mask": ("tril", "triu"),
    # dtype, device, copies
    "Dtype / device conversion": ("to", "type", "float", "double", "half", "bfloat16", "int", "long", "bool",
                                  "cpu", "cuda", "type_as"),
    "Copy": ("clone", "copy_", "detach"),
    "Tensor creation": ("zeros", "ones", "full", "empty", "arange", "linspace", "tensor", "as_tensor",
                        "zeros_like", "ones_like", "full_like", "empty_like", "rand", "randn", "randint",
                        "rand_like", "randn_like", "eye", "new_zeros", "new_ones", "new_full", "new_empty",
                        "new_tensor"),
    "Assignment": ("assign",),
}

OP_DESCRIPTIONS: dict[str, str] = {name: phrase for phrase, names in _TABLE.items() for name in names}
"""Bare callable name -> description. Look names up through `describe_op`, which also folds `relu_`."""


# operator's in-place functions (`x += y` lowers to operator.iadd) and their out-of-place twins.
_INPLACE_OPERATORS = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "truediv", "ifloordiv": "floordiv",
                      "imod": "mod", "ipow": "pow", "imatmul": "matmul", "iand": "and_", "ior": "or_", "ixor": "xor",
                      "ilshift": "lshift", "irshift": "rshift"}


def describe_op(name: str) -> str:
    """The description of a callable's bare name; unknown names get `Result of <name>`."""
    if name in _INPLACE_OPERATORS:
        return f"{describe_op(_INPLACE_OPERATORS[name])} (in place)"
    phrase = OP_DESCRIPTIONS.get(name)
    if phrase is None and name.endswith("_") and not name.endswith("__"):
        phrase = OP_DESCRIPTIONS.get(name[:-1])
        if phrase is not None:
            return f"{phrase} (in place)"
    if phrase is not None:
        return phrase
    return f"Result of {name}" if name else "Result of a call"


def describe_block_call(path: str, block: Optional[ModelBlockSchema], method: Optional[str] = None) -> str:
    """`Call to sub-block fc1 (Linear)`, `Call to method encode of encoder (Encoder)`, `Call to self`,
    `Call to cached function freqs` (a cached global)."""
    kind = f" ({block.name})" if block is not None and block.name else ""
    body = block.methods.get(method) if block is not None and method else None
    if body is not None and body.read_from is not None:  # a cached global called by its name
        return f"Call to cached function {method}"
    if method:
        where = f" of {path}" if path else " of self"
        return f"Call to method {method}{where}{kind}"
    if not path:
        return f"Call to self{kind}"
    return f"Call to sub-block {path}{kind}"


def callee_name(instr: OpInstruction, frame: dict) -> str:
    """The bare name of what an OpInstruction called: `linear`, `relu` (for `hidden.relu()`), `mul`."""
    target = instr.target
    if isinstance(target, VarRef):
        target = frame.get(target.name)
        if target is None:
            return instr.display_name.rsplit(".", 1)[-1]
    name = getattr(target, "__name__", None)
    if not isinstance(name, str):
        name = type(target).__name__
    return name


def op_name_of(instr: Instruction, frame: dict) -> str:
    """The importable name of the op (`torch._C._nn.linear`), `Tensor.relu` for a method call."""
    if isinstance(instr, BlockInstruction):
        return instr.block_ref.path
    if not isinstance(instr, OpInstruction):
        return ""
    target = instr.target
    if isinstance(target, VarRef):
        callee: Any = frame.get(target.name)
        owner = getattr(callee, "__self__", None)
        name = getattr(callee, "__name__", None)
        if owner is not None and isinstance(name, str):
            return f"{type(owner).__name__}.{name}"
        if isinstance(name, str):
            return name
        return instr.display_name
    return instr.qualified_name or instr.display_name


def lower_first(text: str) -> str:
    """`Linear projection` -> `linear projection`; acronyms such as `ReLU` or `GELU` stay."""
    word = text.split(" ", 1)[0]
    if word[:1].isupper() and not any(c.isupper() for c in word[1:]):
        return text[0].lower() + text[1:]
    return text
