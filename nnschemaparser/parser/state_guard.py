"""`preserved_state`: run something on a model and put back what it changed, copying only what it wrote.

A parse runs the model (the schema and eager, on example inputs) and must leave it as it was: its
parameters and buffers, plain attributes, training flags, lazy modules, hooks and the RNG, and the
Python state its forwards write (`python_state`: globals, class attributes, mutable defaults). Copying
every tensor first would hold a second copy of the weights (4 GB more for a 1B model in float32),
so tensors are guarded copy-on-write instead:

- before the run, each parameter and buffer is kept as an *alias* (`detach()`: the same storage,
  no copy) with its version counter;
- during the run, a `TorchDispatchMode` looks at every op that writes one of its arguments in place
  (`alias_info.is_write` in the op's schema: `add_`, `copy_`, `index_put_`, `out=` variants,
  `set_`...) and, the first time such an op writes a guarded storage, copies that storage before
  the op runs. It sees writes through views and through `.data` (which has its own version counter,
  so version counters alone would miss `weight.data.mul_(2)`);
- after the run, a tensor whose storage was replaced (`weight.data = other`, `set_`) gets its
  original storage back (`value.data = alias`: no copy, the same memory as before), and a written
  storage gets its saved bytes back.

So a forward that writes nothing costs nothing, and one that updates BatchNorm statistics or a
cache copies just those. A write the mode cannot see (a compiled kernel writing an input, a numpy
view of a tensor) bumps the version counter: if a guarded tensor's version changed while no copy
was taken, `StateNotRestoredError` says which tensor, instead of leaving it silently changed.
A DTensor (FSDP2's sharded parameters, tensor-parallel weights) is guarded through its local
shard: the mode sees the op on the DTensor before DTensor's own dispatch runs it on the shard, so
the shard's storage is the one copied before a write. Tensors whose storage cannot be read from
Python (other wrapper subclasses, sparse tensors) and the tensors of modules the dispatcher may not
see into (TorchScript, `torch.compile` wrappers) are copied up front, as every tensor used to be.

FSDP2 (`fully_shard`) keeps its own record of which parameters a module holds: a run's root
pre-forward hook unshards the root's group and swaps the module's parameters for the gathered ones,
and the root stays unsharded after its forward. Putting the registered (sharded) parameters back
leaves that record saying "unsharded", so the next forward's hook would gather nothing and compute
with the shards. `resync_fsdp` puts such a group back into FSDP2's sharded state after the restore,
so the model runs eagerly and under its schema (its hooks unsharding it) as before the run.

Depends on torch, the schema errors, `special_modules`, `python_state` and `live_calls` (RNG states).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..schema.errors import NNSchemaError
from .live_calls import python_rng_states, set_python_rng_states
from .python_state import PythonState
from .special_modules import ClassAndHooks, opaque_reason, snapshot, tensors_of_module

__all__ = ["preserved_state", "StateGuard", "StateNotRestoredError", "resync_fsdp"]


class StateNotRestoredError(NNSchemaError):
    """A run changed a model tensor in place by a route the state guard could not see."""


_WRITTEN: dict[Any, tuple] = {}  # op overload -> the arguments it writes, and those it writes when training


# Ops that write arguments their schema does not mark as written (`Tensor? running_mean`, not
# `Tensor(a!)`): the batch norms update their running statistics in place when training.
_UNMARKED_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4), "miopen_batch_norm": (3, 4)}
_TRAINING_ARGUMENT = 5


def _written_arguments(func: Any) -> tuple:
    found = _WRITTEN.get(func)
    if found is None:
        schema = getattr(func, "_schema", None)
        found = () if schema is None else tuple(
            (index, argument.name, argument.kwarg_only) for index, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write)
        unmarked = _UNMARKED_WRITES.get(schema.name.split("::")[-1]) if schema is not None else None
        training = ()
        if unmarked is not None:
            training = tuple((index, schema.arguments[index].name, False) for index in unmarked)
        found = _WRITTEN[func] = (found, training)
    return found


def _is_training(args: tuple, kwargs: dict) -> bool:
    flag = args[_TRAINING_ARGUMENT] if len(args) > _TRAINING_ARGUMENT else kwargs.get("training", True)
    return bool(flag)


def _local_shard(value: torch.Tensor) -> Optional[torch.Tensor]:
    """A DTensor's local shard (a plain tensor), or None for anything else."""
    if not any(cls.__name__ == "DTensor" for cls in type(value).__mro__):
        return None
    local = getattr(value, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) and _plain_subclass(local) else None


def storage_key(value: torch.Tensor) -> Optional[int]:
    """The identity of the memory `value` lives in (shared by its views), or None when Python cannot see it.

    A DTensor lives in its local shard's memory."""
    local = _local_shard(value)
    if local is not None:
        value = local
    if not _plain_subclass(value):
        return None
    if value.layout is not torch.strided:
        return None
    try:
        return value.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _plain_subclass(value: torch.Tensor) -> bool:
    """A Tensor subclass that does not take over dispatch (a Parameter subclass, transformers'
    own kinds): its storage is the real memory."""
    cls = type(value)
    return getattr(cls, "__torch_dispatch__", None) is torch.Tensor.__torch_dispatch__


class _CopyOnWrite(TorchDispatchMode):
    """Copies a guarded storage the first time an op is about to write it."""

    def __init__(self, guard: "StateGuard") -> None:
        super().__init__()
        self.guard = guard

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile still compiles under the guard (else it would fall back to eager and the
        # run would not be the one the user gets); what its kernels write is caught by versions
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written, when_training = _written_arguments(func)
        if when_training and _is_training(args, kwargs):
            written = written + when_training
        if written:
            for index, name, kwarg_only in written:
                value = kwargs.get(name) if kwarg_only or index >= len(args) else args[index]
                if isinstance(value, (list, tuple)):
                    for item in value:
                        if isinstance(item, torch.Tensor):
                            self.guard.before_write(item)
                elif isinstance(value, torch.Tensor):
                    self.guard.before_write(value)
        return func(*args, **kwargs)


class StateGuard:
    """The tensors of one guarded run: aliases, version counters, and the storages copied before a write.

    `copied` names the tensors whose memory had to be copied (`"bn.running_mean"`), in the order
    the run first wrote them; `copied_bytes` is what those copies hold. `copied_up_front` names the
    tensors copied before the run because the guard cannot watch their memory (see the module's
    text), and `copied_up_front_bytes` what those copies hold.
    """

    def __init__(self, model: nn.Module) -> None:
        self.entries: list[tuple] = []  # (module, store, name, value, alias, version, eager copy)
        self.by_storage: dict[int, list[str]] = {}  # storage key -> names of the guarded tensors in it
        self.saved: dict[int, tuple] = {}  # storage key -> (alias, its storage's bytes before the write)
        self.copied: list[str] = []
        self.copied_bytes = 0
        self.copied_up_front: list[str] = []
        self.copied_up_front_bytes = 0
        opaque_paths: list[str] = []
        for path, module in model.named_modules():
            if opaque_reason(module) is not None:
                opaque_paths.append(path)
            opaque = any(path == p or path.startswith(p + ".") or p == "" for p in opaque_paths)
            for store in ("_parameters", "_buffers"):
                for name, value in getattr(module, store).items():
                    self.add(module, store, f"{path}.{name}" if path else name, name, value, opaque)

    def add(self, module: nn.Module, store: str, label: str, name: str, value: Any, opaque: bool) -> None:
        if value is None or isinstance(value, nn.parameter.UninitializedTensorMixin):
            self.entries.append((module, store, name, value, None, 0, None))
            return
        key = None if opaque else storage_key(value)
        if key is None:  # memory the dispatcher may not show us: copied now, as before
            copy = snapshot(value)
            self.entries.append((module, store, name, value, None, 0, copy))
            if copy is not None:
                self.copied_up_front.append(label)
                self.copied_up_front_bytes += copy.numel() * copy.element_size()
            return
        local = _local_shard(value)
        alias = (value if local is None else local).detach()  # a DTensor: its shard's alias
        self.entries.append((module, store, name, value, alias, _version(alias), None))
        self.by_storage.setdefault(key, []).append(label)

    def before_write(self, value: torch.Tensor) -> None:
        if not self.by_storage:
            return
        key = storage_key(value)
        if key is None or key not in self.by_storage or key in self.saved:
            return
        local = _local_shard(value)
        storage = (value if local is None else local).untyped_storage()
        with torch.no_grad():
            self.saved[key] = (storage, storage.clone())
        self.copied.extend(self.by_storage[key])
        self.copied_bytes += storage.nbytes()

    def restore(self) -> None:
        """Put every guarded tensor back: the registered objects, their storages, their bytes."""
        # what changed unseen is read before anything is put back (putting back bumps versions too)
        unseen = [name for _, _, name, _, alias, version, _ in self.entries
                  if alias is not None and version is not None and _version(alias) != version
                  and storage_key(alias) not in self.saved]
        with torch.no_grad():
            for storage, before in self.saved.values():
                if storage.nbytes() != before.nbytes():
                    storage.resize_(before.nbytes())
                storage.copy_(before)
            for module, store, name, value, alias, version, eager_copy in self.entries:
                getattr(module, store)[name] = value
                if value is None:
                    continue
                if eager_copy is not None:
                    if value.shape == eager_copy.shape:
                        value.copy_(eager_copy)
                    else:
                        value.data = eager_copy
                elif alias is not None:
                    local = _local_shard(value)
                    if local is not None:
                        if not _same_view(local, alias):
                            value._local_tensor = alias  # the shard was replaced: the original one again
                    elif not _same_view(value, alias):
                        value.data = alias  # `.data = other` or `set_` replaced it: the original memory again
        if unseen:
            raise StateNotRestoredError(
                f"the run changed {', '.join(unseen)} in place by a route the state guard does not see (a "
                "compiled kernel or a numpy view writing the tensor's memory), so its old value is lost; "
                "copy the model first (copy.deepcopy) or keep such writes out of forward")


def resync_fsdp(model: nn.Module) -> list[str]:
    """Put each FSDP2 module whose group records "unsharded" while it holds its sharded parameters
    back into FSDP2's sharded state (its next pre-forward hook unshards it again); the names fixed.

    A group whose module holds the gathered parameters (unsharded on purpose, e.g. by `unshard()`
    or an eager forward before the parse) is consistent and left as it is.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without torch.distributed
        return []
    fixed = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
        if group is None or not group.is_unsharded:
            continue
        stale = any(getattr(param._module_info.module, param._module_info.param_name) is param.sharded_param
                    for param in group.fsdp_params)
        if stale:
            group._to_sharded()  # reshard() would not when the group's training state says "forward"
            fixed.append(name or type(module).__name__)
    return fixed


def _version(value: torch.Tensor) -> Optional[int]:
    try:
        return value._version
    except RuntimeError:  # an inference tensor keeps no version counter (and cannot be written outside one)
        return None


def _same_view(value: torch.Tensor, alias: torch.Tensor) -> bool:
    try:
        return value.untyped_storage()._cdata == alias.untyped_storage()._cdata and \
            value.storage_offset() == alias.storage_offset() and value.shape == alias.shape and \
            value.stride() == alias.stride() and value.dtype == alias.dtype
    except (RuntimeError, NotImplementedError):
        return False


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[StateGuard]:
    """Run something on `model` and put back its parameters, buffers, attributes, modes and RNG, and
    the Python state its classes' code can write (`python_state.PythonState`: their modules' globals,
    class attributes, mutable defaults and closure cells).

    Yields the `StateGuard`, whose `copied` names the tensors the run wrote (and only those were copied).
    """
    guard = StateGuard(model)
    saved = []
    classes = []
    lazy = []  # uninitialised tensors materialise in place (data and class): put both back
    for module in model.modules():
        attrs = {k: v for k, v in module.__dict__.items() if not k.startswith("_")}
        saved.append((module, module.training, attrs))
        classes.append(ClassAndHooks(module))
        lazy.extend((value, type(value), value.data) for value in tensors_of_module(module)
                    if isinstance(value, nn.parameter.UninitializedTensorMixin))
    devices = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = list(range(torch.cuda.device_count()))
    python_states = python_rng_states()
    python = PythonState(model)
    try:
        with torch.random.fork_rng(devices=devices), _CopyOnWrite(guard):
            yield guard
    finally:
        set_python_rng_states(python_states)
        try:
            guard.restore()
        finally:
            python.restore()
            for module, training, attrs in saved:
                for key in [k for k in module.__dict__ if not k.startswith("_") and k not in attrs]:
                    del module.__dict__[key]
                module.__dict__.update(attrs)
                module.training = training
            for value, cls, data in lazy:
                if type(value) is not cls:
                    value.data = data
                    value.__class__ = cls
            for state in classes:
                state.restore()
            resync_fsdp(model)
