"""The mapping table from torch modules to the Neurarch node vocabulary, with each type's parameter keys.

    neurarch_type(nn.Conv2d(3, 8, 3))    -> "conv2d"
    neurarch_params(nn.Conv2d(3, 8, 3))  -> {"inChannels": 3, "outChannels": 8, "kernelSize": [3, 3], ...}

A module is looked up by its class and then by the classes it derives from, but only as long as
those are torch's own (`torch.nn...`): a user class deriving from `nn.Linear` may change what
forward does, so it is not guessed to be a `linear`. A module the table does not know is a
`customModule` whose params are `className` and `paramCount` (elements of its parameters).
Parameter keys are camelCase, one per constructor argument that shapes the layer; values are plain
JSON (tuples become lists).

The table mirrors the vocabulary of the neurarch-trace seed (conv2d, linear, layerNorm,
multiHeadAttention, ...): extend `NEURARCH_TYPES` (and `_PARAM_KEYS` for its keys) to add a module.

Depends on torch only.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .flops import count_parameters

__all__ = ["NEURARCH_TYPES", "CUSTOM_MODULE", "neurarch_type", "neurarch_params", "is_mapped"]

CUSTOM_MODULE = "customModule"

#: torch module class -> Neurarch node type.
NEURARCH_TYPES: dict[type, str] = {
    nn.Linear: "linear", nn.Bilinear: "bilinear", nn.Identity: "identity",
    nn.Conv1d: "conv1d", nn.Conv2d: "conv2d", nn.Conv3d: "conv3d",
    nn.ConvTranspose1d: "convTranspose1d", nn.ConvTranspose2d: "convTranspose2d",
    nn.ConvTranspose3d: "convTranspose3d",
    nn.BatchNorm1d: "batchNorm1d", nn.BatchNorm2d: "batchNorm2d", nn.BatchNorm3d: "batchNorm3d",
    nn.LayerNorm: "layerNorm", nn.GroupNorm: "groupNorm", nn.InstanceNorm1d: "instanceNorm1d",
    nn.InstanceNorm2d: "instanceNorm2d", nn.RMSNorm: "rmsNorm", nn.LocalResponseNorm: "localResponseNorm",
    nn.Dropout: "dropout", nn.Dropout1d: "dropout", nn.Dropout2d: "dropout2d", nn.Dropout3d: "dropout3d",
    nn.AlphaDropout: "dropout",
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.LeakyReLU: "leakyRelu", nn.PReLU: "prelu", nn.ELU: "elu",
    nn.SELU: "selu", nn.CELU: "celu", nn.GELU: "gelu", nn.SiLU: "silu", nn.Mish: "mish", nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh", nn.Softmax: "softmax", nn.LogSoftmax: "logSoftmax", nn.Softplus: "softplus",
    nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid", nn.Hardtanh: "hardtanh", nn.GLU: "glu",
    nn.MaxPool1d: "maxPool1d", nn.MaxPool2d: "maxPool2d", nn.MaxPool3d: "maxPool3d",
    nn.AvgPool1d: "avgPool1d", nn.AvgPool2d: "avgPool2d", nn.AvgPool3d: "avgPool3d",
    nn.AdaptiveAvgPool1d: "adaptiveAvgPool1d", nn.AdaptiveAvgPool2d: "adaptiveAvgPool2d",
    nn.AdaptiveAvgPool3d: "adaptiveAvgPool3d", nn.AdaptiveMaxPool1d: "adaptiveMaxPool1d",
    nn.AdaptiveMaxPool2d: "adaptiveMaxPool2d",
    nn.Flatten: "flatten", nn.Unflatten: "unflatten", nn.Upsample: "upsample", nn.PixelShuffle: "pixelShuffle",
    nn.ZeroPad2d: "zeroPad2d",
    nn.Embedding: "embedding", nn.EmbeddingBag: "embeddingBag",
    nn.MultiheadAttention: "multiHeadAttention",
    nn.LSTM: "lstm", nn.GRU: "gru", nn.RNN: "rnn", nn.LSTMCell: "lstmCell", nn.GRUCell: "gruCell",
    nn.TransformerEncoderLayer: "transformerEncoderLayer", nn.TransformerDecoderLayer: "transformerDecoderLayer",
}

#: Neurarch type -> (param key, module attribute) pairs.
_PARAM_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "linear": (("inFeatures", "in_features"), ("outFeatures", "out_features"), ("bias", "bias")),
    "bilinear": (("in1Features", "in1_features"), ("in2Features", "in2_features"),
                 ("outFeatures", "out_features"), ("bias", "bias")),
    "embedding": (("numEmbeddings", "num_embeddings"), ("embeddingDim", "embedding_dim"),
                  ("paddingIdx", "padding_idx")),
    "embeddingBag": (("numEmbeddings", "num_embeddings"), ("embeddingDim", "embedding_dim"), ("mode", "mode")),
    "layerNorm": (("normalizedShape", "normalized_shape"), ("eps", "eps"),
                  ("elementwiseAffine", "elementwise_affine")),
    "rmsNorm": (("normalizedShape", "normalized_shape"), ("eps", "eps"),
                ("elementwiseAffine", "elementwise_affine")),
    "groupNorm": (("numGroups", "num_groups"), ("numChannels", "num_channels"), ("eps", "eps"),
                  ("affine", "affine")),
    "localResponseNorm": (("size", "size"),),
    "multiHeadAttention": (("embedDim", "embed_dim"), ("numHeads", "num_heads"), ("dropout", "dropout"),
                           ("batchFirst", "batch_first"), ("kdim", "kdim"), ("vdim", "vdim")),
    "leakyRelu": (("negativeSlope", "negative_slope"),),
    "elu": (("alpha", "alpha"),), "celu": (("alpha", "alpha"),),
    "softmax": (("dim", "dim"),), "logSoftmax": (("dim", "dim"),), "glu": (("dim", "dim"),),
    "gelu": (("approximate", "approximate"),),
    "prelu": (("numParameters", "num_parameters"),),
    "hardtanh": (("minVal", "min_val"), ("maxVal", "max_val")),
    "softplus": (("beta", "beta"), ("threshold", "threshold")),
    "flatten": (("startDim", "start_dim"), ("endDim", "end_dim")),
    "unflatten": (("dim", "dim"), ("unflattenedSize", "unflattened_size")),
    "upsample": (("scaleFactor", "scale_factor"), ("size", "size"), ("mode", "mode")),
    "pixelShuffle": (("upscaleFactor", "upscale_factor"),),
    "zeroPad2d": (("padding", "padding"),),
    "transformerEncoderLayer": (("normFirst", "norm_first"),),
    "transformerDecoderLayer": (("normFirst", "norm_first"),),
}

_CONV = (("inChannels", "in_channels"), ("outChannels", "out_channels"), ("kernelSize", "kernel_size"),
         ("stride", "stride"), ("padding", "padding"), ("dilation", "dilation"), ("groups", "groups"),
         ("bias", "bias"), ("paddingMode", "padding_mode"))
_NORM = (("numFeatures", "num_features"), ("eps", "eps"), ("momentum", "momentum"), ("affine", "affine"),
         ("trackRunningStats", "track_running_stats"))
_DROPOUT = (("p", "p"),)
_POOL = (("kernelSize", "kernel_size"), ("stride", "stride"), ("padding", "padding"))
_ADAPTIVE = (("outputSize", "output_size"),)
_RNN = (("inputSize", "input_size"), ("hiddenSize", "hidden_size"), ("numLayers", "num_layers"),
        ("bias", "bias"), ("batchFirst", "batch_first"), ("dropout", "dropout"), ("bidirectional", "bidirectional"))
_CELL = (("inputSize", "input_size"), ("hiddenSize", "hidden_size"), ("bias", "bias"))
for _type in NEURARCH_TYPES.values():
    if _type.startswith(("conv", "convTranspose")):
        _PARAM_KEYS[_type] = _CONV
    elif _type.startswith(("batchNorm", "instanceNorm")):
        _PARAM_KEYS[_type] = _NORM
    elif _type.startswith("dropout"):
        _PARAM_KEYS[_type] = _DROPOUT
    elif _type.startswith(("maxPool", "avgPool")):
        _PARAM_KEYS[_type] = _POOL
    elif _type.startswith("adaptive"):
        _PARAM_KEYS[_type] = _ADAPTIVE
    elif _type in ("lstm", "gru", "rnn"):
        _PARAM_KEYS[_type] = _RNN
    elif _type in ("lstmCell", "gruCell"):
        _PARAM_KEYS[_type] = _CELL


def _lookup(module: nn.Module) -> str | None:
    for cls in type(module).__mro__:
        if not cls.__module__.startswith("torch."):
            return None  # a class of the user's: its forward may do anything
        if cls in NEURARCH_TYPES:
            return NEURARCH_TYPES[cls]
    return None


def is_mapped(module: nn.Module) -> bool:
    """Whether the table knows `module` (it then becomes one node, its children not descended)."""
    return _lookup(module) is not None


def neurarch_type(module: nn.Module) -> str:
    """The Neurarch node type of `module`: its table entry, else `customModule`."""
    return _lookup(module) or CUSTOM_MODULE


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, nn.Parameter) or hasattr(value, "shape"):
        return True  # a bias tensor: the layer has one
    return str(value)


def neurarch_params(module: nn.Module) -> dict[str, Any]:
    """The node params of `module`: its table keys, or `className` and `paramCount` for a customModule."""
    kind = _lookup(module)
    if kind is None:
        return {"className": type(module).__name__, "paramCount": count_parameters(module)}
    params = {}
    for key, attr in _PARAM_KEYS.get(kind, ()):
        if not hasattr(module, attr):
            continue
        value = getattr(module, attr)
        params[key] = (value is not None if not isinstance(value, bool) else value) if attr == "bias" else _plain(value)
    return params
