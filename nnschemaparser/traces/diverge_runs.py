"""The four runs of `diverge` and the listener they share: keyed rows, kept values, forced values.

`RowListener` hears every tensor a run binds (`every_instruction = False`, the observer's direct
path) and turns the rows among them (traces/diverge_align.py: named bindings, returns of
temporaries) into keys `((block path, a's file, a's line, a's name), occurrence)`: b's statements are
mapped onto a's by the alignment, so one key names a row in both runs; a statement of b alone keys
as `("b", path, file, line, name)`. Temporaries are not rows: they are the inside of their statement.

What each run does at a row (`mode`):

- `"keep"`   (a, free): keep the value (the reference `A`).
- `"carry"`  (b, free): the carried error against `A`; nothing kept.
- `"force"`  (b, teacher-forced): keep the value (`L`), then replace the
  variable by `A` cast to the value's dtype and device, so the next statement starts from a's values.
  A statement of b alone that rebinds a name (`h = h.to(torch.bfloat16)` inserted) is measured
  against the value the name held, which is a's there, and the name is put back to it.
- `"replay"` (a's code, b's weights in the replay dtype, teacher-forced): the local error of `L`
  against this value (`Q`), then replace the variable by `A` cast to b's dtype (the force run
  left it so) and then to the replay dtype. `A` and `L` of the
  row are dropped as soon as they are used, so memory falls during this last run.

A kept value that a later in-place op would change (`on_before_mutation`: an operand sharing its
storage) is cloned first. Values are replaced by binding a new tensor to the frame's name (or the
return slot), never written in place, so a parameter read into a variable is never touched.

Depends on schema, runtime (listener interface) and torch; never on views.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional

import torch

from ..runtime.listeners import RETURN_SLOT, TraceListener
from ..schema.model import Instruction, ReturnInstruction, VarRef
from .diverge_align import Alignment, row_var_names
from .diverge_bounds import Scratch, local_error, relative_error
from .diverge_memory import RowValues

__all__ = ["RowListener", "RowInfo", "Recent", "side_context", "check_side", "cast_inputs", "replay_weights", "replay_dtype", "replay_is_keep", "model_place", "holds_cast"]


class RowInfo:
    """What a run saw of one row: its place in the run and in the source."""

    __slots__ = ("order", "path", "filename", "lineno", "var", "dtype", "shape")

    def __init__(self, order: int, path: str, filename: str, lineno: int, var: str, dtype: Any, shape: tuple):
        self.order, self.path, self.filename, self.lineno, self.var = order, path, filename, lineno, var
        self.dtype, self.shape = dtype, shape


class RowListener(TraceListener):
    """One run's rows (see the module docstring); `side` is "a" or "b", `mode` what to do at a row."""

    every_instruction = False

    def __init__(self, side: str, mode: str, alignment: Alignment, store: dict):
        self.side, self.mode, self.alignment, self.store = side, mode, alignment, store
        self.rows: dict[tuple, RowInfo] = {}
        self._keys: dict[tuple[int, str], Optional[list]] = {}
        self._counts: dict[tuple, int] = {}
        self._kept_storage: dict[int, list] = {}
        self._last: dict[int, dict[str, torch.Tensor]] = {}  # force: id(frame) -> the values its names hold
        self._recent = Recent()
        scratch = store.get("scratch") if store is not None else None
        if scratch is None and store is not None:
            scratch = store["scratch"] = Scratch()  # one set of work buffers for every run's errors
        self._relative = functools.partial(relative_error, scratch=scratch)
        self._local = functools.partial(local_error, scratch=scratch)
        self.carried: dict[tuple, float] = store.setdefault("carried", {}) if mode == "carry" else {}
        self.errors: dict[tuple, tuple[float, Optional[torch.dtype]]] = (
            store.setdefault("local", {}) if mode in ("replay", "force") else {})

    # --- the observer's hooks ------------------------------------------------------------------

    def tensor_result_hook(self) -> Callable[[Instruction, dict, Any], None]:
        return self._after

    def on_instruction(self, event: Any) -> None:
        self._after(event.instruction, event.frame, event)

    def on_before_mutation(self, instruction: Instruction, frame: dict) -> None:
        if not self._kept_storage:
            return
        for arg in getattr(instruction, "args", ())[:1]:
            value = frame.get(arg.name) if isinstance(arg, VarRef) else None
            if isinstance(value, torch.Tensor):
                keys = self._kept_storage.pop(_storage_id(value), None)
                for table, key in keys or ():
                    if key in table:
                        table[key] = table[key].clone()

    # --- rows ------------------------------------------------------------------------------------

    def _after(self, instr: Instruction, frame: dict, observer: Any) -> None:
        if instr.__class__ is ReturnInstruction:
            names = row_var_names(instr)
            if not names:
                return
            value = frame.get(RETURN_SLOT)
            if len(names) == 1 and names[0] == "return":
                if isinstance(value, torch.Tensor):
                    new = self._row(instr, "return", value, frame, observer.path)
                    if new is not None:
                        frame[RETURN_SLOT] = new
                return
            if not isinstance(value, tuple):
                return
            items = list(value)
            changed = False
            for i, item in enumerate(items):
                if isinstance(item, torch.Tensor) and f"return[{i}]" in names:
                    new = self._row(instr, f"return[{i}]", item, frame, observer.path)
                    if new is not None:
                        items[i], changed = new, True
            if changed:
                frame[RETURN_SLOT] = tuple(items)
            return
        out = instr.out_var
        value = frame.get(out) if out else None
        if not isinstance(value, torch.Tensor):
            return
        if out[0] == "$" or out[0] == ".":
            return  # a temporary: the inside of its statement
        new = self._row(instr, out, value, frame, observer.path)
        if new is not None:
            frame[out] = new

    def _key(self, instr: Instruction, var: str, path: str) -> Optional[tuple]:
        cached = self._keys.get((id(instr), var, path))
        if cached is not None:
            return cached[0]
        loc = instr.location
        if loc is None:
            key = None
        elif self.side == "a":
            key = (path, loc.filename, loc.lineno, var)
        else:
            where = (path, loc.filename, loc.lineno)
            paired = self.alignment.b_to_a.get(where)
            if paired is None:
                key = ("b", path, loc.filename, loc.lineno, var)
            else:
                name = self.alignment.var_b_to_a.get(where, {}).get(var)
                key = (path, paired[0], paired[1], name) if name is not None else ("b", path, loc.filename,
                                                                                     loc.lineno, var)
        self._keys[(id(instr), var, path)] = [key, instr]
        return key

    def _register(self, instr: Instruction, var: str, value: torch.Tensor, path: str) -> Optional[tuple]:
        """The row key `(statement key, occurrence)` of this binding, recorded in `rows`; None: not a row."""
        base = self._key(instr, var, path)
        if base is None:
            return None
        occurrence = self._counts[base] = self._counts.get(base, -1) + 1
        key = (base, occurrence)
        loc = instr.location
        self.rows[key] = RowInfo(len(self.rows), path, loc.filename, loc.lineno, var, value.dtype, tuple(value.shape))
        return key

    def _row(self, instr: Instruction, var: str, value: torch.Tensor, frame: dict, path: str) -> Optional[torch.Tensor]:
        key = self._register(instr, var, value, path)
        if key is None:
            return None
        base = key[0]
        mode = self.mode
        if mode == "keep":
            self._keep("A", key, value.detach())
            return None
        reference = self.store["A"].get(key)
        if mode == "carry":
            if reference is not None:
                self.carried[key] = self._recent.error(self._relative, value, reference)
            return None
        if mode == "force":
            self.store.setdefault("dtype", {})[key] = self.store["precision"] if value.is_floating_point() else None
            names = self._last.setdefault(id(frame), {})
            if base[0] == "b":  # a statement of b alone: against the value its name held before, if any
                forced = self._inserted(key, var, value, names.get(var))
            else:
                self._keep("L", key, value.detach())
                forced = None
                if reference is not None and tuple(reference.shape) == tuple(value.shape):
                    forced = self._recent.cast(reference, value.device, value.dtype)
                    if forced.dtype != reference.dtype:
                        self.store["lossy"] = True  # the replay's input here is not A: it must be made
                        self._keep("A", key, forced)  # the replay forces the same cast value (and it is smaller)
                    elif not self.store.get("replay_is_keep"):
                        self._keep("A", key, forced)
            if not var.startswith("return"):
                names[var] = value if forced is None else forced
            return forced
        # replay: a's statement in float64 on cast inputs
        lvalue = self.store["L"].pop(key, None)
        if lvalue is not None:
            dtype = self.store["dtype"].get(key)
            self.errors[key] = (self._recent.error(self._local, lvalue, value) if lvalue.shape == value.shape
                                else float("inf"), dtype)
        reference = self.store["A"].pop(key, None)
        if reference is None or tuple(reference.shape) != tuple(value.shape):
            return None
        forced = self._recent.cast(reference, value.device, value.dtype)  # already cast to b's dtype by the force run
        if reference.is_floating_point() and forced.is_floating_point():
            self._recent.known(self._local, reference, forced, 0.0)  # a later row that is these values: no error
        return forced

    def local_errors(self) -> None:
        """Without a replay (`store["replay_is_keep"]`, no lossy cast in the force run): each row's
        local error against A itself, which is what the replay would have given (`Q` is `A`)."""
        tables = self.store
        values, dtypes = tables.get("L", {}), tables.get("dtype", {})
        for key in list(values):
            lvalue = values.pop(key)
            reference = tables["A"].pop(key, None)
            if reference is None:
                continue
            self.errors[key] = (self._recent.error(self._local, lvalue, reference)
                                if lvalue.shape == reference.shape else float("inf"), dtypes.get(key))

    def _inserted(self, key: tuple, var: str, value: torch.Tensor, previous: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """An inserted statement rebinding `var`: a's run had `previous` (as forced) there, so its
        local error is its change of that value; the name is put back to `previous` after, so the
        statements after it start from a's values. A new name has no reference (not measured)."""
        if previous is None or previous.shape != value.shape or not value.is_floating_point():
            return None
        self.store.setdefault("inserted", {})[key] = self._local(value, previous)
        return previous.to(device=value.device, dtype=value.dtype)

    def on_block_enter(self, event: Any) -> None:
        self._last.pop(id(event.frame), None)  # a new frame: names a dead frame of that id bound are not its own

    def on_block_exit(self, event: Any) -> None:
        self._last.pop(id(event.frame), None)  # the frame is done: its names' values are not held past it

    def _keep(self, table_name: str, key: tuple, value: torch.Tensor) -> None:
        table = self.store.get(table_name)
        if table is None:  # a budget (store["spill"]): held in memory up to it, on disk past it
            spill = self.store.get("spill")
            table = self.store[table_name] = RowValues(spill) if spill is not None else {}
        table[key] = value
        if not isinstance(table, RowValues) or table.in_memory(key):  # a value on disk is a copy already
            self._kept_storage.setdefault(_storage_id(value), []).append((table, key))


class Recent:
    """The last few results of a costly function of tensors (an error, a cast), keyed by the
    tensors' identity: data pointer, shape, strides, dtype, device and version counter. A row is
    often the very tensor of the row before it (a callee's return bound by the caller, `residual =
    hidden_states`): its error and its cast are those of that row, not computed again. The entries
    hold their tensors, so no other tensor can take their memory while they are keyed, and an
    in-place write moves the version counter, so a changed tensor never matches.

    An error is also reused for another view of the same two storages that pairs the same elements
    (`query = q_proj(h).view(...).transpose(1, 2)` after the projection's row): both tensors dense,
    covering the same span of their storage as the earlier pair, each pair laid out alike (one
    shape and one set of strides). The pairs of elements are then the same, in another order, and
    the error is a maximum over them."""

    SIZE = 2

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[tuple, Any, tuple]] = []

    def _get(self, key: tuple) -> Any:
        for entry in self._entries:
            if entry[0] == key:
                return entry
        return None

    def _put(self, key: tuple, result: Any, held: tuple, spans: Optional[tuple] = None) -> None:
        self._entries.append((key, result, held, spans))
        if len(self._entries) > self.SIZE:
            del self._entries[0]

    def known(self, fn: Callable, x: torch.Tensor, ref: torch.Tensor, result: float) -> None:
        """`fn(x, ref)` is `result` (known without computing it)."""
        ids = (_identity(x), _identity(ref))
        if ids[0] is not None and ids[1] is not None:
            self._put((fn, *ids), result, (x, ref), _spans(x, ref))

    def error(self, fn: Callable, x: torch.Tensor, ref: torch.Tensor) -> float:
        """`fn(x, ref)`, or its result for the same two tensors a moment ago."""
        ids = (_identity(x), _identity(ref))
        if ids[0] is None or ids[1] is None:
            return fn(x, ref)
        if ids[0] == ids[1]:
            return 0.0  # the same tensor: every element equals itself
        key = (fn, *ids)
        entry = self._get(key)
        if entry is not None:
            return entry[1]
        spans = _spans(x, ref)
        if spans is not None:
            for entry in self._entries:
                if entry[3] == spans and entry[0][0] is fn:
                    return entry[1]  # the same pairs of elements, in another order
        result = fn(x, ref)
        self._put(key, result, (x, ref), spans)
        return result

    def cast(self, value: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """`value.to(device=device, dtype=dtype)`, or the tensor that cast gave a moment ago for the
        same value, if nothing has written to it since."""
        ident = _identity(value)
        if ident is None:
            return value.to(device=device, dtype=dtype)
        key = ("cast", ident, device, dtype)
        entry = self._get(key)
        if entry is not None and _identity(entry[1]) == entry[2][1]:
            return entry[1]
        result = value.to(device=device, dtype=dtype)
        out = _identity(result)
        if out is not None and result is not value:
            self._put(key, result, (value, out))
        return result


def _identity(value: torch.Tensor) -> Optional[tuple]:
    try:
        version = value._version
    except (RuntimeError, AttributeError):  # an inference tensor: no version counter, no in-place writes here
        version = -1
    try:
        return (value.data_ptr(), value.shape, value.stride(), value.dtype, value.device, version)
    except (RuntimeError, NotImplementedError):  # sparse or other layouts: never reused
        return None


def _spans(x: torch.Tensor, ref: torch.Tensor) -> Optional[tuple]:
    """What makes two pairs of tensors pair the same elements: each tensor's storage, span (offset and
    size), dtype, device and version, for dense tensors laid out alike (None otherwise)."""
    if x.shape != ref.shape or x.stride() != ref.stride():
        return None
    sx, sr = _span(x), _span(ref)
    return None if sx is None or sr is None else (sx, sr)


def _span(value: torch.Tensor) -> Optional[tuple]:
    if type(value) is not torch.Tensor or value.layout != torch.strided:
        return None
    if not value.is_contiguous():  # contiguous: dense at once; else its strides, smallest first
        expected = 1
        for stride, size in sorted((s, n) for n, s in zip(value.shape, value.stride()) if n != 1):
            if stride != expected:
                return None  # gaps or overlaps: not every element of its span, or some twice
            expected *= size
    try:
        version = value._version
    except (RuntimeError, AttributeError):
        version = -1
    try:
        ptr = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (ptr, value.storage_offset(), value.numel(), value.dtype, value.device, version)


def replay_dtype(precision: torch.dtype) -> torch.dtype:
    """The dtype of the reference replay for b's precision: float64 for a float64 b, else float32.

    float32's eps (2^-23) is 2^16 times below bfloat16's and 2^13 below float16's, so against a half
    precision b the replay's own rounding is nothing; against a float32 b it is one more rounding
    of the same size per op, which the bound's factor covers (and the same code in the same dtype
    on the same inputs gives the same bits: no error at all). float64 everywhere cost 2-4x the
    replay's time on CPU for no change in what is flagged (bench/bench_diverge.py)."""
    return torch.float64 if precision == torch.float64 else torch.float32


def replay_is_keep(model_a: torch.nn.Module, model_b: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether the replay (a's code, `replay_weights(model_a, model_b, dtype)`) holds exactly a's own
    weights: every floating parameter and buffer of a is of `dtype`, and b's tensor of its name and
    shape (where b has one) is equal to it once cast so. Then, with b's values cast losslessly (b's
    dtype is a's) and no autocast on a, the replay is a's free run again, value for value."""
    tensors_b: dict[str, torch.Tensor] = {}
    if model_b is not model_a:
        tensors_b.update(dict(model_b.named_parameters()))
        tensors_b.update(dict(model_b.named_buffers()))
    for name, tensor in list(model_a.named_parameters()) + list(model_a.named_buffers()):
        if not tensor.is_floating_point():
            continue
        if tensor.dtype != dtype:
            return False
        source = tensors_b.get(name)
        if source is None or source is tensor or source.shape != tensor.shape or not source.is_floating_point():
            continue
        if not torch.equal(source.detach().to(device=tensor.device, dtype=dtype), tensor.detach()):
            return False
    return True


CHECK_CHUNK = 1 << 16
"""Elements compared at a time by `holds_cast` (its temporaries stay this small)."""


def holds_cast(tensor: torch.Tensor, source: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `tensor` (of `dtype`, on `source`'s device) is `source` cast to `dtype`, bit for bit
    (compared as integers: -0.0 is not 0.0): then the replay reads `tensor` itself, not a new cast
    of `source`. Float32 weights loaded from a bfloat16 checkpoint and their bfloat16 copy are so.
    The first 64 elements are compared first (random float32 weights differ there at once), then
    the rest in chunks of `CHECK_CHUNK`, never a cast of the whole tensor."""
    if tensor.dtype != dtype or tensor.shape != source.shape or tensor.device != source.device \
            or type(tensor.data) is not torch.Tensor or not tensor.is_contiguous() or not source.is_contiguous():
        return False
    bits = _BITS.get(dtype)
    if bits is None:
        return False
    mine, theirs = tensor.detach().reshape(-1).view(bits), source.detach().reshape(-1)
    n = mine.numel()
    head = min(64, n)
    if not torch.equal(theirs[:head].to(dtype).view(bits), mine[:head]):
        return False
    for start in range(head, n, CHECK_CHUNK):
        end = min(start + CHECK_CHUNK, n)
        if not torch.equal(theirs[start:end].to(dtype).view(bits), mine[start:end]):
            return False
    return True


_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def _storage_id(value: torch.Tensor) -> int:
    try:
        return value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return id(value)


# --- the sides' settings ----------------------------------------------------------------------

SETTINGS_KEYS = ("threads", "deterministic", "mkldnn")


@contextlib.contextmanager
def _cpu_settings(settings: dict) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if "threads" in settings:
            n = settings["threads"]
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"settings['threads'] must be a positive int, got {n!r}")
            old = torch.get_num_threads()
            torch.set_num_threads(n)
            stack.callback(torch.set_num_threads, old)
        if "deterministic" in settings:
            old_det = torch.are_deterministic_algorithms_enabled()
            old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
            torch.use_deterministic_algorithms(bool(settings["deterministic"]))
            stack.callback(torch.use_deterministic_algorithms, old_det, warn_only=old_warn)
        if "mkldnn" in settings:
            stack.enter_context(torch.backends.mkldnn.flags(enabled=bool(settings["mkldnn"])))
        yield


@contextlib.contextmanager
def side_context(settings: Any, autocast: Any, device: torch.device) -> Iterator[None]:
    """The context one side's runs happen in: its settings (a dict of `SETTINGS_KEYS`, or a callable
    returning a context manager) and its autocast dtype (None: none). Entered at `with`, not before."""
    check_side(settings, autocast)
    with contextlib.ExitStack() as stack:
        if isinstance(settings, dict):
            stack.enter_context(_cpu_settings(settings))
        elif settings is not None:
            manager = settings()
            if not hasattr(manager, "__enter__"):
                raise TypeError(f"settings callable must return a context manager, got {type(manager).__name__}")
            stack.enter_context(manager)
        if autocast is not None:
            stack.enter_context(torch.autocast(device_type=device.type, dtype=autocast))
        yield


def check_side(settings: Any, autocast: Any) -> None:
    """Refuse settings or an autocast dtype `side_context` cannot use, before any run."""
    if settings is not None and not isinstance(settings, dict) and not callable(settings):
        raise TypeError(f"settings must be a dict ({', '.join(SETTINGS_KEYS)}) or a callable returning a "
                        f"context manager, got {type(settings).__name__}")
    if isinstance(settings, dict):
        unknown = sorted(set(settings) - set(SETTINGS_KEYS))
        if unknown:
            raise ValueError(f"settings keys {unknown} are not known; use {list(SETTINGS_KEYS)}, or pass a "
                             "callable returning a context manager for anything else")
    if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast must be torch.bfloat16 or torch.float16, got {autocast!r}")


def model_place(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device and floating dtype of a model's first floating parameter (or buffer); CPU/float32 if none."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


def cast_inputs(inputs: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """`inputs` moved to `device`, floating tensors cast to `dtype` (others keep theirs)."""
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
        out[name] = value
    return out


@contextlib.contextmanager
def replay_weights(model_a: torch.nn.Module, model_b: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Model a's floating parameters and buffers, for the length of the block, hold b's values in
    `dtype` (b's tensor of the same name and shape; a's own where b has none), on a's devices; put back after."""
    tensors_b: dict[str, torch.Tensor] = {}
    if model_b is not model_a:
        tensors_b.update(dict(model_b.named_parameters()))
        tensors_b.update(dict(model_b.named_buffers()))
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        seen: set[int] = set()
        for name, tensor in list(model_a.named_parameters()) + list(model_a.named_buffers()):
            if id(tensor) in seen or not tensor.is_floating_point():
                continue
            seen.add(id(tensor))
            source = tensors_b.get(name)
            if source is None or source.shape != tensor.shape or not source.is_floating_point():
                source = tensor
            if source is not tensor and holds_cast(tensor, source, dtype):
                continue  # a's tensor is b's cast already (a float32 copy of bfloat16 weights): no copy
            saved.append((tensor, tensor.data))
            tensor.data = source.detach().to(device=tensor.device, dtype=dtype)
        yield
    finally:
        for tensor, data in saved:
            tensor.data = data
