"""Code-execution attacks on a schema file loaded with its model (issue 13), built as real instructions.

`AttackModel`'s own forward uses a module as a value (`getattr(F, self.act)`), a format string, a
transformers config and a raise: everything an attacker needs to reach beyond it. Each `Attack`
inserts real instructions (real callables, operands the lowering would write) at the top of the
model's freshly parsed forward, so that

- run in memory (`attacked_schema(...)`), the payload really fires: a canary file is written, a
  canary attribute is set, a class is patched, a hook is left, SystemExit escapes
  (tests/files/test_hostile_attacks.py proves it, so the refusals below are not vacuous);
- saved as a file (`attack_file(...)`), `load_schema(path, model=m)` must refuse it.

`canaries_fired(model, canary)` lists every trace a payload leaves; it must stay empty.
"""

from __future__ import annotations

import json
import os  # noqa: F401 - in the forward's globals, as the format-string traversal expects
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.files.schema_file import schema_to_json
from nnschemaparser.schema.model import Const, ModelBlockSchema, OpInstruction, RaiseInstruction, VarRef

__all__ = ["AttackModel", "Attack", "ATTACKS", "attacked_schema", "attack_file", "canaries_fired", "inputs",
           "ORIGINALS", "restore_process_state"]


class AttackModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.act = "relu"
        self.config = transformers.PretrainedConfig(hidden_size=4)

    def forward(self, x):
        h = getattr(F, self.act)(self.fc1(x))
        label = "{0}".format(self.act)
        if self.config.hidden_size != 4:
            raise ValueError(label)
        return self.fc2(h)


def inputs() -> dict:
    return {"x": torch.linspace(-1.0, 1.0, 8).reshape(2, 4)}


ORIGINALS = {"relu": torch.Tensor.relu, "linear_forward": nn.Linear.forward,
             "default_dtype": torch.get_default_dtype()}


def canaries_fired(model: nn.Module, canary: Path) -> list[str]:
    """What a payload would have left behind; empty when nothing of the file ran."""
    fired = []
    if canary.exists():
        fired.append(f"the canary file {canary} exists")
    if "leaked" in model.__dict__:
        fired.append(f"the canary attribute model.leaked was set ({str(model.__dict__['leaked'])[:60]!r})")
    if torch.Tensor.relu is not ORIGINALS["relu"]:
        fired.append("torch.Tensor.relu was replaced")
    if nn.Linear.forward is not ORIGINALS["linear_forward"]:
        fired.append("nn.Linear.forward was replaced")
    if torch.get_default_dtype() is not ORIGINALS["default_dtype"]:
        fired.append("the default dtype was changed")
    for module in model.modules():
        if module._forward_pre_hooks or module._forward_hooks:
            fired.append(f"a hook was left on {type(module).__name__}")
    return fired


def restore_process_state(model: nn.Module) -> None:
    """Undo what an in-memory payload did to the process (for the tests that run payloads on purpose)."""
    torch.Tensor.relu = ORIGINALS["relu"]
    nn.Linear.forward = ORIGINALS["linear_forward"]
    torch.set_default_dtype(ORIGINALS["default_dtype"])
    model.__dict__.pop("leaked", None)
    for module in model.modules():
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()


def _get(out: str, obj, name: str) -> OpInstruction:
    return OpInstruction(out_var=out, target=getattr, qualified_name="builtins.getattr", display_name="getattr",
                         args=[obj, name])


def _call(out: str, target, *args, name: str = "") -> OpInstruction:
    if isinstance(target, str):
        return OpInstruction(out_var=out, target=VarRef(target), qualified_name=target, display_name=target,
                             args=list(args))
    return OpInstruction(out_var=out, target=target, qualified_name=name, display_name=name.rpartition(".")[2],
                         args=list(args))


def _import_dotted(prefix: str, dotted: str) -> list:
    """F -> torch -> torch._utils -> _import_dotted_name(dotted), through non-dunder attributes only."""
    return [_get(f"{prefix}torch", Const(F, "F"), "torch"), _get(f"{prefix}utils", VarRef(f"{prefix}torch"), "_utils"),
            _get(f"{prefix}imp", VarRef(f"{prefix}utils"), "_import_dotted_name"),
            _call(f"{prefix}fn", f"{prefix}imp", dotted)]


def _leak(value_var: str) -> list:
    return [_call("$atk_leak", setattr, VarRef("self"), "leaked", VarRef(value_var), name="builtins.setattr")]


def _os_system(canary: str) -> list:
    return _import_dotted("$atk_", "os.system") + [_call("$atk_out", "$atk_fn", f"touch {canary}")]


def _builtins_open(canary: str) -> list:
    return _import_dotted("$atk_", "builtins.open") + [_call("$atk_out", "$atk_fn", canary, "w")]


def _numpy_savetxt(canary: str) -> list:
    return _import_dotted("$atk_", "numpy.savetxt") + [_call("$atk_out", "$atk_fn", canary, [1.0])]


def _ctypes(canary: str) -> list:
    return _import_dotted("$atk_", "ctypes.CDLL") + _leak("$atk_fn")


def _format_traversal(canary: str) -> list:
    return [_get("$atk_fmt", "{0.forward.__globals__[os].environ}", "format"), _call("$atk_env", "$atk_fmt",
                                                                                     VarRef("self"))] + _leak("$atk_env")


def _patch_tensor_relu(canary: str) -> list:
    return [_call("$atk_p", setattr, Const(torch.Tensor, "torch.Tensor"), "relu",
                  Const(torch.Tensor.neg, "torch.Tensor.neg"), name="builtins.setattr")]


def _patch_linear_forward(canary: str) -> list:
    return [_get("$atk_torch", Const(F, "F"), "torch"), _get("$atk_nn", VarRef("$atk_torch"), "nn"),
            _get("$atk_lin", VarRef("$atk_nn"), "Linear"),
            _call("$atk_p", setattr, VarRef("$atk_lin"), "forward", Const(F.linear, "F.linear"),
                  name="builtins.setattr")]


def _pre_hook_print(canary: str) -> list:
    return [_get("$atk_reg", VarRef("self"), "register_forward_pre_hook"), _call("$atk_h", "$atk_reg", print)]


def _forward_hook_child(canary: str) -> list:
    return [_get("$atk_fc", VarRef("self"), "fc2"), _get("$atk_reg", VarRef("$atk_fc"), "register_forward_hook"),
            _call("$atk_h", "$atk_reg", print)]


def _config_read(canary: str) -> list:
    return [_get("$atk_cfg", VarRef("self"), "config"), _get("$atk_rd", VarRef("$atk_cfg"), "_dict_from_json_file"),
            _call("$atk_d", "$atk_rd", canary + ".json")] + _leak("$atk_d")


def _default_dtype(canary: str) -> list:
    return [_call("$atk_d", torch.set_default_dtype, torch.float64, name="torch.set_default_dtype")]


def _raise(exc_type: type) -> Callable[[str], list]:
    def build(canary: str) -> list:
        return [_call("$atk_e", exc_type, 7, name=f"builtins.{exc_type.__name__}"),
                RaiseInstruction(exc=VarRef("$atk_e"))]
    return build


@dataclass(frozen=True)
class Attack:
    name: str
    build: Callable[[str], list]
    proof: str  # what running it in memory does: "canary" | "leak" | "patch" | "hook" | "dtype" | "escape"


ATTACKS = [
    Attack("module-value-to-import-dotted-name-os-system", _os_system, "canary"),
    Attack("module-value-to-builtins-open", _builtins_open, "canary"),
    Attack("module-value-to-numpy-savetxt", _numpy_savetxt, "canary"),
    Attack("module-value-to-ctypes", _ctypes, "leak"),
    Attack("format-string-traversal-to-globals", _format_traversal, "leak"),
    Attack("setattr-torch-tensor-relu", _patch_tensor_relu, "patch"),
    Attack("replace-nn-linear-forward", _patch_linear_forward, "patch"),
    Attack("register-forward-pre-hook-print", _pre_hook_print, "hook"),
    Attack("register-forward-hook-on-a-child", _forward_hook_child, "hook"),
    Attack("config-dict-from-json-file", _config_read, "leak"),
    Attack("process-wide-default-dtype", _default_dtype, "dtype"),
    Attack("raise-system-exit", _raise(SystemExit), "escape"),
    Attack("raise-keyboard-interrupt", _raise(KeyboardInterrupt), "escape"),
]


def attacked_schema(model: AttackModel, attack: Attack, canary: Path) -> ModelBlockSchema:
    """The model's resolved schema with the attack's instructions first in its forward."""
    Path(str(canary) + ".json").write_text(json.dumps({"secret": "read by the payload"}))
    schema = NNParser.parse_model(model, inputs_tensors_values=inputs())
    schema.body[0:0] = attack.build(str(canary))
    return schema


def attack_file(model: AttackModel, attack: Attack, canary: Path, path: Path) -> Path:
    """The attacked schema as a schema file, written with the project's own encoder."""
    document = schema_to_json(attacked_schema(model, attack, canary))
    path.write_text(json.dumps(document))
    return path

