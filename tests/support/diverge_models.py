"""Models for `diverge`'s tests and bench/bench_diverge.py: tiny GPT-2 and Llama, versions of a
module with one line changed (written to a temporary folder and imported), and a toy block whose
source is written from a template, so that a fault can be planted on a known line.

`variant_module(module, {old line: new line})` copies a module's source with the given lines
replaced (matched after stripping, indentation kept), makes its relative imports absolute, imports
it under a new name and returns `(module, {new line text: line number})`. A model of the variant's
class loads the original's state_dict: another version of the code with the same weights.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

_COUNTER = itertools.count()
_FOLDER = Path(tempfile.mkdtemp(prefix="nnsp_diverge_"))


def import_source(source: str, stem: str) -> ModuleType:
    """Write `source` as `<stem>_<n>.py` in a temporary folder and import it (a new module each call)."""
    name = f"{stem}_{next(_COUNTER)}"
    path = _FOLDER / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def line_of(module: ModuleType, text: str) -> int:
    """The 1-based line of `module`'s file whose stripped text is `text` (exactly one)."""
    lines = [i + 1 for i, line in enumerate(Path(module.__file__).read_text().splitlines()) if line.strip() == text]
    if len(lines) != 1:
        raise ValueError(f"{text!r} is on lines {lines} of {module.__file__}, not on exactly one")
    return lines[0]


def variant_module(module: ModuleType, edits: dict[str, str], stem: Optional[str] = None) -> tuple[ModuleType, dict]:
    """A copy of `module` with each line whose stripped text is a key of `edits` replaced by its value."""
    source = Path(inspect.getsourcefile(module)).read_text()
    package = module.__name__.rsplit(".", 1)[0]

    def absolute(match: re.Match) -> str:
        dots, rest = len(match.group(1)), match.group(2)
        base = package.split(".")
        base = base[:len(base) - (dots - 1)] if dots > 1 else base
        return f"from {'.'.join(base)}{'.' + rest if rest else ''} import"

    source = re.sub(r"^from (\.+)([\w.]*) import", absolute, source, flags=re.M)
    out, found = [], set()
    for line in source.splitlines():
        key = line.strip()
        if key in edits:
            indent = line[:len(line) - len(line.lstrip())]
            line = indent + edits[key]
            found.add(key)
        out.append(line)
    missing = set(edits) - found
    if missing:
        raise ValueError(f"lines not found in {module.__name__}: {sorted(missing)}")
    variant = import_source("\n".join(out) + "\n", stem or module.__name__.rsplit(".", 1)[-1] + "_v2")
    return variant, {new: line_of(variant, new.strip()) for new in edits.values() if new.strip()}


def llama(layers: int = 2, seed: int = 0, module: Optional[ModuleType] = None, seq: int = 8, **config) -> tuple[torch.nn.Module, dict]:
    """A tiny Llama (eager attention, random weights) and its inputs; `module`: another version's module."""
    import transformers
    from transformers.models.llama import modeling_llama

    from nnschemaparser.validation.zoo_common import LLAMA

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": layers, **config})
    cfg._attn_implementation = "eager"
    model = (module or modeling_llama).LlamaForCausalLM(cfg).eval()
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (2, seq)), "use_cache": False}
    return model, inputs


def gpt2(layers: int = 2, seed: int = 0, module: Optional[ModuleType] = None, seq: int = 8, **config) -> tuple[torch.nn.Module, dict]:
    """A tiny GPT-2 (eager attention, random weights) and its inputs; `module`: another version's module."""
    import transformers
    from transformers.models.gpt2 import modeling_gpt2

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(**{"vocab_size": 128, "n_embd": 32, "n_layer": layers, "n_head": 4,
                                     "n_positions": max(64, seq), "bos_token_id": 0, "eos_token_id": 0, **config})
    cfg._attn_implementation = "eager"
    model = (module or modeling_gpt2).GPT2LMHeadModel(cfg).eval()
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (2, seq)), "use_cache": False}
    return model, inputs


def same_weights(model: torch.nn.Module, module: ModuleType, class_name: str) -> torch.nn.Module:
    """An instance of `module.<class_name>` with `model`'s config and state_dict (another version, same weights)."""
    other = getattr(module, class_name)(model.config).eval()
    other.load_state_dict(model.state_dict())
    return other


# --- the toy block: a template with one line per fault site ----------------------------------------

TOY_TEMPLATE = '''
import torch
from torch import nn


class ToyBlock(nn.Module):
    def __init__(self, width, gain=1.0):
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(width))
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.o = nn.Linear(width, width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.gain = gain
        self.eps = 1e-6

    def forward(self, x):
        NORM
        scale = torch.rsqrt(variance + EPS)
        h = (x.float() * scale).to(x.dtype) * self.norm_weight
        q = self.q(h)
        k = self.k(h)
        scores = torch.matmul(q, k.transpose(-1, -2)) * GAIN
        probs = SOFTMAX
        mixed = torch.matmul(probs, self.v(h))
        y = x + self.o(mixed)
        total = REDUCE
        centred = y - total / y.shape[-1]
        m = self.up(centred)
        m = torch.relu(m)
        out = y + self.down(m)
        return out


class ToyModel(nn.Module):
    def __init__(self, width=32, layers=2, gain=1.0):
        super().__init__()
        self.blocks = nn.ModuleList([ToyBlock(width, gain) for _ in range(layers)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
'''

TOY_LINES = {
    "NORM": "variance = x.float().pow(2).mean(-1, keepdim=True)",
    "EPS": "self.eps",
    "GAIN": "self.gain",
    "SOFTMAX": "torch.softmax(scores.float(), dim=-1).to(scores.dtype)",
    "REDUCE": "y.sum(-1, keepdim=True)",
}


def toy_module(**changes: str) -> ModuleType:
    """The toy module with the template's slots filled (`TOY_LINES`, or the given text per slot)."""
    source = TOY_TEMPLATE
    for slot, text in {**TOY_LINES, **changes}.items():
        source = source.replace(slot, text)
    return import_source(source, "toy_block")


def toy_line(module: ModuleType, startswith: str) -> int:
    """The line of the toy module's `forward` that starts with `startswith` (after indentation)."""
    lines = [i + 1 for i, line in enumerate(Path(module.__file__).read_text().splitlines())
             if line.strip().startswith(startswith)]
    if len(lines) != 1:
        raise ValueError(f"{startswith!r} starts lines {lines}")
    return lines[0]


def toy(module: ModuleType, seed: int = 0, width: int = 32, layers: int = 2, gain: float = 1.0,
        amplitude: float = 1.0, state: Optional[dict] = None) -> tuple[torch.nn.Module, dict]:
    """A toy model of `module` (weights from `seed`, or `state`) and inputs of `amplitude`."""
    torch.manual_seed(seed)
    model = module.ToyModel(width, layers, gain).eval()
    if state is not None:
        model.load_state_dict(state)
    x = torch.randn(2, 8, width, generator=torch.Generator().manual_seed(seed + 1000)) * amplitude
    return model, {"x": x}
