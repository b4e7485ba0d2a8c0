"""`inspect_config`: the fields of a model configuration tree, read without building anything.

    spec = inspect_config(config)
    spec.config_type                  # "my_pkg.configs.ModelConfig"
    spec.fields[0]                    # ConfigFieldSpec(path=("width",), declared_type="int", ...)

The walk records every field of the root, in declaration order, and descends depth-first into the
nested configurations it finds: a field holding a Pydantic model, and Pydantic models held directly
in a sequence (a list or tuple; their positions are decimal strings in the path). A sequence
element that is a model gets a record of its own, then its fields. Mappings, ordinary dataclasses
and other structured values are recorded by their configured type and not traversed. It reads the
current field values and `target_type` only: it never calls `setup_target` nor validates anything.

Beyond Pydantic, the same walk reads a `transformers` configuration (`PreTrainedConfig`, a
dataclass in transformers 5): its public dataclass fields in declaration order, descending into the
nested sub-configurations (`text_config`, `vision_config`, ...). A `PreTrainedConfig` inside a
Pydantic model is walked the same way.

Pydantic is optional (`pip install nnschemaparser[config]`): it is imported only to recognise a
model, and its absence only means that no value is one.

Depends on nothing of the package: a configuration is not a module.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["ConfigFieldSpec", "ModelStructureSpec", "inspect_config"]

_MAX_DEPTH = 64
_MAX_FIELDS = 100_000
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


@dataclass(frozen=True)
class ConfigFieldSpec:
    """One field observed in a construction-free configuration walk.

    `path`: field-name path from the root, sequence positions as decimal strings. `declared_type`:
    the annotation the field's model declares, as text. `configured_type`: the fully qualified
    runtime type of the configured value. `value`: the value itself when it is a scalar or an enum
    member, else a marker `<qualified.type>`.
    """

    path: tuple[str, ...]
    declared_type: str
    configured_type: str
    value: Any


@dataclass(frozen=True)
class ModelStructureSpec:
    """Construction-free description of one model configuration tree.

    `config_type`: the fully qualified type of the root. `target_type`: the fully qualified root
    `target_type`, or None when the root has none. `fields`: depth-first field records in
    declaration and sequence-index order. Each call makes a new record; equal configurations give
    equal records.
    """

    config_type: str
    target_type: Optional[str]
    fields: tuple[ConfigFieldSpec, ...]


def _qualified(cls: type) -> str:
    module = getattr(cls, "__module__", "") or ""
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", repr(cls))
    return f"{module}.{name}" if module else name


def _annotation_text(annotation: Any) -> str:
    """`int`, `list[LayerConfig]`, `Optional[int]`: the annotation as a reader would write it."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    if isinstance(annotation, str):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is None:
        if isinstance(annotation, type):
            return annotation.__qualname__
        text = repr(annotation)
        for prefix in ("typing.", "typing_extensions.", "collections.abc."):
            text = text.replace(prefix, "")
        return text
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        if len(args) == 2 and type(None) in args:
            other = args[0] if args[1] is type(None) else args[1]
            return f"Optional[{_annotation_text(other)}]"
        return " | ".join(_annotation_text(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    name = getattr(origin, "__qualname__", None) or repr(origin).replace("typing.", "")
    return f"{name}[{', '.join(_annotation_text(a) for a in args)}]" if args else name


def _pydantic_base() -> Optional[type]:
    try:
        from pydantic import BaseModel
    except ImportError:
        return None
    return BaseModel


def _transformers_base() -> Optional[type]:
    import sys

    module = sys.modules.get("transformers.configuration_utils")
    if module is None:
        return None  # a transformers config cannot exist before transformers was imported
    return getattr(module, "PreTrainedConfig", None) or getattr(module, "PretrainedConfig", None)


class _Walk:
    def __init__(self) -> None:
        self.pydantic = _pydantic_base()
        self.transformers = _transformers_base()
        self.records: list[ConfigFieldSpec] = []
        self.active: set[int] = set()  # ids of the configurations on the current path

    def kind(self, value: Any) -> Optional[str]:
        if self.pydantic is not None and isinstance(value, self.pydantic):
            return "pydantic"
        if self.transformers is not None and isinstance(value, self.transformers):
            return "transformers"
        return None

    def fields(self, config: Any) -> Iterator[tuple[str, str, Any]]:
        """(name, declared annotation text, current value) of each field, in declaration order."""
        if self.kind(config) == "pydantic":
            for name, info in type(config).model_fields.items():
                yield name, _annotation_text(info.annotation), getattr(config, name, None)
            return
        for item in dataclasses.fields(config):
            if item.name.startswith("_"):
                continue
            yield item.name, _annotation_text(item.type), getattr(config, item.name, None)

    def record(self, path: tuple[str, ...], declared: str, value: Any) -> None:
        if len(self.records) >= _MAX_FIELDS:
            raise ValueError(f"the configuration has more than {_MAX_FIELDS} fields; inspect a sub-configuration "
                             "instead")
        shown = value if isinstance(value, _SCALARS + (enum.Enum,)) else f"<{_qualified(type(value))}>"
        self.records.append(ConfigFieldSpec(path, declared, _qualified(type(value)), shown))

    def walk(self, config: Any, path: tuple[str, ...]) -> None:
        if len(path) > _MAX_DEPTH:
            raise ValueError(f"the configuration nests deeper than {_MAX_DEPTH} levels at {'.'.join(path)}")
        self.active.add(id(config))
        try:
            for name, declared, value in self.fields(config):
                here = path + (name,)
                self.record(here, declared, value)
                self.descend(value, here, declared)
        finally:
            self.active.discard(id(config))

    def descend(self, value: Any, path: tuple[str, ...], declared: str) -> None:
        if self.kind(value) is not None:
            if id(value) not in self.active:  # a configuration holding itself is recorded, not re-entered
                self.walk(value, path)
            return
        if isinstance(value, (list, tuple)):
            item_type = _item_annotation(declared)
            for position, item in enumerate(value):
                if self.kind(item) is not None:
                    here = path + (str(position),)
                    self.record(here, item_type, item)
                    if id(item) not in self.active:
                        self.walk(item, here)


def _item_annotation(declared: str) -> str:
    """`LayerConfig` for `list[LayerConfig]`; the sequence's own annotation when it is not that simple."""
    for opener in ("list[", "List[", "tuple[", "Tuple[", "Sequence["):
        if declared.startswith(opener) and declared.endswith("]"):
            inner = declared[len(opener):-1]
            if inner.endswith(", ..."):
                inner = inner[:-5]
            if "," not in inner:
                return inner
    return declared


def _target_type(config: Any) -> Optional[str]:
    """The root's `target_type` (a class, or a string naming one), read, never set up."""
    try:
        target = _read_attribute(config, "target_type")
    except AttributeError:
        return None
    if target is None:
        return None
    if isinstance(target, type):
        return _qualified(target)
    if isinstance(target, str):
        return target
    return _qualified(type(target))


def _read_attribute(config: Any, name: str) -> Any:
    """`config.<name>` as a field value or a class attribute; AttributeError when there is none."""
    fields = getattr(type(config), "model_fields", None)
    if isinstance(fields, dict) and name in fields:
        return getattr(config, name)
    if name in getattr(config, "__dict__", {}):
        return config.__dict__[name]
    for klass in type(config).__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            if isinstance(value, (property, staticmethod, classmethod)) or callable(value) and not isinstance(value, type):
                raise AttributeError(name)  # something computed: not a declared target
            return value
    raise AttributeError(name)


def inspect_config(config: Any) -> ModelStructureSpec:
    """Describe a Pydantic (or transformers) configuration tree without constructing its target.

    The walk records every root field, then descends depth-first into nested Pydantic models and
    Pydantic models held directly in sequences; mappings, ordinary dataclasses and other structured
    values are recorded by their configured type and not traversed. `setup_target` is never called.
    """
    walk = _Walk()
    if walk.kind(config) is None:
        if isinstance(config, type):
            raise TypeError(f"inspect_config needs a configuration instance, got the class {config.__name__}; "
                            f"construct it first: inspect_config({config.__name__}(...))")
        hint = "" if walk.pydantic is not None else " (pydantic is not installed: pip install 'nnschemaparser[config]')"
        raise TypeError(f"inspect_config needs a Pydantic model or a transformers PreTrainedConfig, got "
                        f"{_qualified(type(config))}{hint}")
    walk.walk(config, ())
    return ModelStructureSpec(config_type=_qualified(type(config)), target_type=_target_type(config),
                              fields=tuple(walk.records))
