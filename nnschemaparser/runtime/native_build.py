"""C sources of the package built with the system C compiler on first use, and loaded with ctypes.

`load(source, stem)` gives the `ctypes.CDLL` of `source` (a `.c` file shipped in the package),
built once per (source, compiler, flags, CPU) into `$NNSCHEMAPARSER_CACHE` (default
`$XDG_CACHE_HOME/nnschemaparser` or `~/.cache/nnschemaparser`), under `native/`, as
`<stem>-<key>.so`: written to a temporary name and renamed, so processes that build it at once do not
clash. Flags: `-O3 -ffp-contract=off -fno-fast-math` (no fused multiply-add, IEEE rounding of each
operation), tuned for this CPU where the compiler accepts it. `Loaded` keeps one library per process
with the reason it could not be had; `switched_off()` is `NNSCHEMAPARSER_NATIVE=0` (or no, off,
false), read at each call, which leaves every kernel out (the callers use torch instead).

Used by the store's statistics kernel (store/native.py) and diverge's per-row errors
(traces/diverge_native.py). What both need (half-width floats widened exactly) is in the header
`_nsp_floats.h` beside this module, on the include path of every build; the headers' text is part
of the cache key, so a changed header builds the libraries again. Depends on the standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Generic, Optional, TypeVar

__all__ = ["FLAGS", "TUNED", "load", "switched_off", "cache_root", "Loaded"]

# -ffp-contract=off: no fused multiply-add, so every machine rounds each product and sum the same way
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math")
HEADERS = Path(__file__).resolve().parent  # the shared headers (`_nsp_*.h`) the sources include
TUNED = ("-march=native", "-mprefer-vector-width=512")  # dropped where the compiler refuses them
_BUILD_SECONDS = 120

T = TypeVar("T")


def cache_root() -> Path:
    """Where built libraries go (`native/` under it)."""
    named = os.environ.get("NNSCHEMAPARSER_CACHE")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nnschemaparser"


def _cpu() -> str:
    """What the CPU offers (its flags on Linux), so a cache shared between machines holds one build each."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> Optional[str]:
    named = os.environ.get("CC")
    return shutil.which(named) if named else (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"))


def _build(compiler: str, source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    failures = []
    for extra in (TUNED, ()):
        handle, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".so", dir=target.parent)
        os.close(handle)
        try:
            done = subprocess.run([compiler, *FLAGS, *extra, f"-I{HEADERS}", "-o", tmp, str(source), "-lm"],
                                  capture_output=True, text=True, timeout=_BUILD_SECONDS)
            if done.returncode == 0:
                os.replace(tmp, target)
                return
            failures.append(done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(f"{compiler} could not build {source.name}: {failures[-1][0]}")


def switched_off() -> bool:
    """Whether `NNSCHEMAPARSER_NATIVE` is 0 (or no, off, false) now."""
    return os.environ.get("NNSCHEMAPARSER_NATIVE", "1").strip().lower() in ("0", "no", "off", "false")


def load(source: Path, stem: str) -> tuple[ctypes.CDLL, Path]:
    """The library built from `source` (from the cache, or built into it now) and its path. Raises
    RuntimeError where there is no C compiler or the build fails."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or clang; or $CC) was found")
    text = Path(source).read_bytes() + b"".join(header.read_bytes() for header in sorted(HEADERS.glob("_nsp_*.h")))
    made = os.stat(compiler)
    key = hashlib.sha256(b"\0".join([text, " ".join(FLAGS + TUNED).encode(), compiler.encode(),
                                     f"{made.st_size}:{made.st_mtime_ns}".encode(), _cpu().encode(),
                                     platform.machine().encode(), sys.platform.encode()])).hexdigest()[:20]
    target = cache_root() / "native" / f"{stem}-{key}.so"
    if not target.is_file():
        _build(compiler, Path(source), target)
    return ctypes.CDLL(str(target)), target


class Loaded(Generic[T]):
    """One process's kernel made by `make()` (which calls `load`) on first use: `get()` is it, or None where
    it cannot be had (`problem()` says why) or `switched_off()`."""

    __slots__ = ("_make", "_value", "_problem", "_done")

    def __init__(self, make: Callable[[], T]):
        self._make = make
        self._value: Optional[T] = None
        self._problem: Optional[str] = None
        self._done = False

    def get(self) -> Optional[T]:
        if switched_off():
            return None
        if not self._done:
            try:
                self._value, self._problem = self._make(), None
            except Exception as exc:  # no compiler, a failed build, a cache that cannot be written: torch instead
                self._value, self._problem = None, f"{type(exc).__name__}: {exc}"
            self._done = True
        return self._value

    def problem(self) -> Optional[str]:
        """Why `get()` is None (None when it is not)."""
        if switched_off():
            return "NNSCHEMAPARSER_NATIVE is off"
        self.get()
        return self._problem
