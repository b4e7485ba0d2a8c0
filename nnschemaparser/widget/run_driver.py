"""How the inspector drives one stepped run: the run thread, the model's buffers, the run driver.

A paused run lives in a greenlet, and a greenlet can only be resumed from the thread that made it,
while a kernel may deliver the widget's messages on different threads. So every run is driven on
one worker thread owned by the state (`_RunThread`); callers on any thread wait for it, and the
caller's grad mode is carried over to each call. `_Buffers` puts the model's buffers back around
every run; `_RunDriver` is one live run: its step generator, recorder, step log and random state.

Split out of state.py (which uses them); depends on the interpreter and the widget's runs module.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional

import torch

from ..runtime.interpreter import CallPause, SchemaInterpreter, StepInfo
from ..schema.model import ModelBlockSchema
from .runs import RunRecord, StepLog

__all__ = ["_RunThread", "_Buffers", "_RunDriver", "_clone_scope"]


def _clone_scope(scope: Mapping[str, Any]) -> dict:
    out = {}
    for key, value in scope.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.detach().clone().requires_grad_(value.requires_grad)
        else:
            out[key] = value
    return out


class _RunThread:
    """The one thread on which an inspector's runs are stepped (see the module docstring)."""

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None
        self._ident: Optional[int] = None

    def call(self, fn: Callable[[], Any]) -> Any:
        if threading.get_ident() == self._ident:  # already on the run thread (a finalizer, a nested call)
            return fn()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nnsp-inspector-run")
        grad = torch.is_grad_enabled()

        def job() -> Any:
            self._ident = threading.get_ident()
            with torch.set_grad_enabled(grad):
                return fn()

        return self._pool.submit(job).result()

    def post(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the run thread without waiting for it (for finalizers, which must never block)."""
        if threading.get_ident() == self._ident:
            fn()
        elif self._pool is not None:
            self._pool.submit(fn)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _Buffers:
    """The model's buffers as they were when the inspector was made, put back around every run."""

    def __init__(self, schema: ModelBlockSchema):
        module = schema.module
        self.saved = [] if module is None else [(b, b.detach().clone()) for _, b in module.named_buffers()]

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, copy in self.saved:
                if buffer.shape == copy.shape and not buffer.is_inference():
                    buffer.copy_(copy)


class _RunDriver:
    """One live stepped run: the generator, its recorder and its own random generator state."""

    def __init__(self, state: Any, record: RunRecord):
        self.record = record
        self.thread = state.run_thread
        self.log = log = StepLog(record, state.tree, keep_live=state.options.gradients)
        self.interpreter = SchemaInterpreter(listeners=[record.recorder, log])
        self.generator = self.interpreter.step_run(state.schema, _clone_scope(state.scope), pause_before_calls=True,
                                                   interventions=state.interventions)  # a patch (patch_view.py)
        self.rng = state.rng_state.clone()
        self.buffers = state.buffers
        self.started = False
        self.done = False

    def advance(self) -> "Optional[StepInfo | CallPause]":
        """The next StepInfo (or CallPause, before a sub-block call), or None when the run has returned
        (its outputs are then in the record)."""
        return self.thread.call(self._advance)

    def _advance(self) -> "Optional[StepInfo | CallPause]":
        if not self.started:
            self.buffers.restore()  # every run starts from the model's state at construction
            self.started = True
        user_rng = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            return next(self.generator)
        except StopIteration:
            self.done = True
            self.record.outputs = self.interpreter.step_outputs
            self.record.finished = True
            return None
        except BaseException:
            self.done = True
            raise
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(user_rng)
            if self.done:
                self.buffers.restore()  # and leaves it as it was (BatchNorm statistics, caches)

    def close(self) -> None:
        if not self.done:
            self.thread.call(self.generator.close)
            self.done = True
            if self.started:
                self.buffers.restore()

    def __del__(self) -> None:
        # A paused generator left to the garbage collector would be closed on whatever thread
        # collects it, and its greenlet cannot be switched to from there: it is closed on the run
        # thread. The collector may run anywhere (inside another run, holding locks), so this posts
        # the close and never waits for it (waiting deadlocked a later run in the same process).
        if self.done:
            return
        generator, buffers, started = self.generator, self.buffers, self.started

        def close() -> None:
            generator.close()
            if started:
                buffers.restore()

        try:
            self.thread.post(close)
        except Exception:  # interpreter shutdown: the run thread is gone; nothing left to unwind
            pass
