"""A garbage-collector callback that times collections in its module's globals, as hypothesis's and
profilers' do: it runs inside any run whenever a collection starts or stops, and is no model code
(tests/traces/test_patching_held_state.py)."""

STARTED = None
SEEN = 0


def on_collection(phase: str, info: dict) -> None:
    global STARTED, SEEN
    SEEN += 1
    STARTED = phase
