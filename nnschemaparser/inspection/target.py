"""Turning a command-line TARGET string into a constructed model.

    path/to/file.py:Name        a file, imported under its own module name
    package.module:Name         an importable module (the working directory is importable too)
    hf:<model_type>             a transformers model built offline from its config, with small sizes

`Name` may be dotted (`zoo.build`) and may name an nn.Module instance, an nn.Module subclass
(constructed without arguments) or a factory called without arguments that returns a module.
Nothing is downloaded: `hf:` targets use `AutoConfig.for_model` and `AutoModel.from_config`, with
random weights, and the hub is switched to offline mode.

Depends on torch, the standard library and (for `hf:` only, imported lazily) transformers; never on
the parser, interpreter or views.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ..schema.errors import NNSchemaError

__all__ = ["TargetError", "LoadedTarget", "load_target", "HF_SMALL_SIZES"]


class TargetError(NNSchemaError):
    """A TARGET string that cannot be turned into a model; the message says what to write instead."""


@dataclass(frozen=True)
class LoadedTarget:
    """A constructed model with how to name it: `source` is the file, module or `hf:<type>` it came from.

    `token_range` bounds random integer inputs (a vocabulary size) when the target knows it;
    `default_inputs` are the --input specs used when none are given.
    """

    model: nn.Module
    name: str
    source: str
    token_range: Optional[int] = None
    default_inputs: tuple[str, ...] = field(default_factory=tuple)


#: Config fields set for `hf:` targets when the config has them: two small layers.
HF_SMALL_SIZES: dict[str, int] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}

_FORMS = "path/to/file.py:Name, package.module:Name or hf:<model_type>"


def load_target(spec: str) -> LoadedTarget:
    """Build the model a TARGET string names (see the module docstring for the forms)."""
    if spec.startswith("hf:"):
        return _load_hf(spec[3:])
    location, sep, attr = spec.rpartition(":")
    if not sep or not location or not attr:
        raise TargetError(f"TARGET {spec!r} names no object; write {_FORMS}")
    if location.endswith(".py") or "/" in location or os.sep in location:
        module = _import_file(location)
        source = location
    else:
        module = _import_module(location)
        source = location
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            known = sorted(n for n in dir(obj) if not n.startswith("_"))[:12]
            raise TargetError(f"{source} has no attribute {attr!r}; it defines: {', '.join(known) or '(nothing)'}")
        obj = getattr(obj, part)
    return LoadedTarget(model=_instantiate(obj, attr), name=attr.rsplit(".", 1)[-1], source=source)


def _import_file(location: str) -> Any:
    path = Path(location).expanduser().resolve()
    if not path.is_file():
        raise TargetError(f"no such file: {location}")
    name = path.stem if path.stem.isidentifier() else "nnschemaparser_target"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) != str(path):
        name = f"nnschemaparser_target_{zlib.crc32(str(path).encode()):08x}"
    # Sibling modules of the file import as they would when running it as a script.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"{location} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # The parser reads forward sources through sys.modules, so the module must be registered.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(name: str) -> Any:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise TargetError(f"no module named {name!r}; give a file path (path/to/{name.replace('.', '/')}.py:Name) "
                              "or run from the folder that holds the package") from None
        raise


def _instantiate(obj: Any, attr: str) -> nn.Module:
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        try:
            return obj()
        except TypeError as exc:
            raise TargetError(f"{attr}() cannot be built without arguments ({exc}); point TARGET at a module "
                              "instance or at a factory function that builds it") from None
    if callable(obj):
        made = obj()
        if not isinstance(made, nn.Module):
            raise TargetError(f"{attr}() returned {type(made).__name__}, not an nn.Module; the factory must return "
                              "the model itself")
        return made
    raise TargetError(f"{attr} is a {type(obj).__name__}; TARGET must name an nn.Module instance, an nn.Module "
                      "class or a factory function")


def _load_hf(model_type: str) -> LoadedTarget:
    if not model_type:
        raise TargetError("hf: needs a model type, e.g. hf:bert or hf:gpt2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise TargetError("hf: targets need the transformers package: pip install transformers") from None
    try:
        defaults = transformers.AutoConfig.for_model(model_type)
    except (ValueError, KeyError):
        raise TargetError(f"transformers knows no model type {model_type!r}; use a config model_type such as "
                          "bert, gpt2 or llama (not a hub checkpoint name: nothing is downloaded)") from None
    small = {key: value for key, value in HF_SMALL_SIZES.items() if getattr(defaults, key, None) is not None}
    if getattr(defaults, "head_dim", None) is not None and "hidden_size" in small:
        small["head_dim"] = small["hidden_size"] // small.get("num_attention_heads", 1)
    config = transformers.AutoConfig.for_model(model_type, **small)
    torch.manual_seed(0)
    try:
        model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    except (TypeError, ValueError):
        model = transformers.AutoModel.from_config(config)
    vocab = getattr(config, "vocab_size", None)
    return LoadedTarget(model=model, name=type(model).__name__, source=f"hf:{model_type}",
                        token_range=int(vocab) if isinstance(vocab, int) and vocab > 0 else None,
                        default_inputs=("1,16:long",))
