"""A zoo of tiny, randomly initialised ``transformers`` models for validation sweeps.

Every case is a :class:`ZooCase`: a name, a family, a ``build()`` that returns a
small model in eval mode (fixed seed, eager attention), and a ``make_inputs(model)``
that returns keyword inputs built from a fixed ``torch.Generator`` seed.

Nothing here downloads anything: every model is built from its config class with
tiny dimensions (hidden <= 64, 2 layers, vocab <= 128, 32x32 images, 1600-sample
audio). ``transformers`` is imported lazily, inside the builders, so importing this
module works without it.

The common parts (the case record, configs, input builders) live in ``zoo_common``; the cases
themselves in ``zoo_cases_text`` (encoders, decoders, kv-cache,
MoE, SSM) and ``zoo_cases_media`` (encoder-decoder, vision, audio, multimodal).
Cases that cannot be built or run eagerly with the pinned transformers are listed
in :data:`REFUSED` with a reason; they stay defined (see :func:`all_cases`) but
are left out of :func:`zoo_cases`.

Self-check::

    python -m nnschemaparser.validation.zoo --check          # every case in zoo_cases()
    python -m nnschemaparser.validation.zoo --check --all    # refused ones too
    python -m nnschemaparser.validation.zoo --check --fast   # fast_subset() only
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch

from . import zoo_cases_media, zoo_cases_text
from .zoo_common import *  # noqa: F401,F403  (the helpers, re-exported: tests and benches build cases with them)
from .zoo_common import FAMILIES, REFUSED, ZooCase

# --------------------------------------------------------------------------- registry


def all_cases() -> list[ZooCase]:
    """Every defined case, refused ones included."""
    cases = [*zoo_cases_text.CASES, *zoo_cases_media.CASES]
    names = [c.name for c in cases]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise RuntimeError(f"duplicate zoo case names: {sorted(dupes)}")
    return cases


def zoo_cases() -> list[ZooCase]:
    """The cases the sweep runs: every defined case not listed in REFUSED."""
    return [c for c in all_cases() if c.name not in REFUSED]


FAST_SUBSET: tuple[str, ...] = (
    "bert",
    "gpt2",
    "llama-kv-prefill",
    "t5",
    "vit",
    "resnet",
    "wav2vec2",
    "whisper",
    "clip",
    "mixtral",
    "mamba",
    "qwen2-moe",
)


def fast_subset() -> list[ZooCase]:
    """About a dozen quick cases, at least one per family."""
    by_name = {c.name: c for c in zoo_cases()}
    return [by_name[n] for n in FAST_SUBSET if n in by_name]


def get_case(name: str) -> ZooCase:
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)


# --------------------------------------------------------------------------- output walking


def _is_cache(obj: Any) -> bool:
    return any("Cache" in k.__name__ for k in type(obj).__mro__)


def iter_float_tensors(obj: Any, _seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Floating tensors inside a model output, depth first, in order: ModelOutput / dicts /
    tuples / lists, and transformers cache objects (DynamicCache, EncoderDecoderCache, their
    layers: anything with "Cache" in a base-class name), walked through their attributes."""
    if _seen is None:
        _seen = set()
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield obj
        return
    if obj is None or isinstance(obj, (int, float, bool, str)) or id(obj) in _seen:
        return
    _seen.add(id(obj))
    if isinstance(obj, dict):  # ModelOutput is an OrderedDict
        for v in obj.values():
            yield from iter_float_tensors(v, _seen)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            yield from iter_float_tensors(v, _seen)
    elif _is_cache(obj) and not isinstance(obj, torch.nn.Module):
        for v in vars(obj).values():
            if isinstance(v, (torch.Tensor, dict, tuple, list)) or _is_cache(v):
                yield from iter_float_tensors(v, _seen)


def output_loss(output: Any) -> torch.Tensor:
    """Sum of every floating output (the scalar the self-check backpropagates)."""
    parts = [t.real.sum() if t.is_complex() else t.sum() for t in iter_float_tensors(output) if t.numel()]
    if not parts:
        raise RuntimeError("no floating outputs")
    return torch.stack([p.to(torch.float64) for p in parts]).sum()


# --------------------------------------------------------------------------- self-check


def check_case(case: ZooCase, *, train: bool = True) -> dict[str, Any]:
    """Build, eager forward (eval mode) and backward; then the same in train mode.

    Returns ``{"ok": bool, "reason": str, "params": int, "seconds": float, "train": str}``.
    """
    import time

    t0 = time.perf_counter()
    res: dict[str, Any] = {"ok": False, "reason": "", "params": 0, "train": "-"}
    try:
        model = case.build()
        res["params"] = sum(p.numel() for p in model.parameters())
        if model.training:
            raise RuntimeError("build() returned a model in train mode")
        out = model(**case.make_inputs(model))
        loss = output_loss(out)
        if not loss.requires_grad:
            raise RuntimeError("no floating output requires grad")
        if not torch.isfinite(loss):
            raise RuntimeError(f"non-finite outputs (sum={loss.item()})")
        loss.backward()
        if not any(p.grad is not None for p in model.parameters()):
            raise RuntimeError("backward reached no parameter")
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported, never swallowed silently
        res["reason"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    if res["ok"] and train:
        try:
            model.zero_grad(set_to_none=True)
            model.train()
            torch.manual_seed(SEED)
            out = model(**case.make_inputs(model))
            loss = output_loss(out)
            loss.backward()
            res["train"] = "ok" if torch.isfinite(loss) else "non-finite"
        except Exception as e:  # noqa: BLE001
            res["train"] = f"FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
    res["seconds"] = time.perf_counter() - t0
    return res


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import time
    import warnings

    ap = argparse.ArgumentParser(prog="python -m nnschemaparser.validation.zoo", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="build and run every case eagerly")
    ap.add_argument("--all", action="store_true", help="include cases listed in REFUSED")
    ap.add_argument("--fast", action="store_true", help="only fast_subset()")
    ap.add_argument("--no-train", action="store_true", help="skip the train-mode forward/backward")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list cases and exit")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

    cases = fast_subset() if args.fast else (all_cases() if args.all else zoo_cases())
    if args.k:
        cases = [c for c in cases if args.k in c.name]
    if args.list or not args.check:
        for c in cases:
            flag = f"  REFUSED: {REFUSED[c.name]}" if c.name in REFUSED else ""
            print(f"{c.name:28s} {c.family:18s}{flag}")
        if not args.check:
            print(f"{len(cases)} cases ({len(REFUSED)} refused); use --check to run them")
        return 0

    t_start = time.perf_counter()
    passed: dict[str, int] = {f: 0 for f in FAMILIES}
    total: dict[str, int] = {f: 0 for f in FAMILIES}
    failed: list[tuple[str, str]] = []
    for c in cases:
        r = check_case(c, train=not args.no_train)
        total[c.family] += 1
        if r["ok"]:
            passed[c.family] += 1
            status = "ok" + ("" if r["train"] in ("ok", "-") else f" (train: {r['train']})")
        else:
            status = f"refused: {r['reason']}"
            failed.append((c.name, r["reason"]))
        print(f"{c.name:28s} {c.family:18s} {r['params']:>9,d} params {r['seconds']:6.2f}s  {status}", flush=True)
    elapsed = time.perf_counter() - t_start
    # Cases listed in REFUSED are not run (unless --all) but always reported.
    refused = [] if args.all or args.fast else [c for c in all_cases() if c.name in REFUSED and args.k in c.name]
    for c in refused:
        print(f"{c.name:28s} {c.family:18s} {'-':>9s} params {'':7s} refused (REFUSED): {REFUSED[c.name]}")
    n_refused = {f: sum(c.family == f for c in refused) for f in FAMILIES}
    print("-" * 72)
    for f in FAMILIES:
        extra = f", {n_refused[f]} refused" if n_refused[f] else ""
        print(f"{f:18s} {passed[f]:3d} / {total[f]:3d} ok{extra}")
    n_ok = sum(passed.values())
    print(f"{'total':18s} {n_ok:3d} / {len(cases):3d} ok in {elapsed:.1f}s; {len(REFUSED)} listed in REFUSED")
    for name, reason in failed:
        print(f"FAILED {name}: {reason}")
    return 0 if not failed else 1


if __name__ == "__main__":
    import importlib
    import sys

    # Run through the package module so case modules and REFUSED share one copy.
    sys.exit(importlib.import_module("nnschemaparser.validation.zoo")._main())
