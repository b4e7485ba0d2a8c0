"""Stage 4, parsing a live model: one block per module, lowered, resolved by a run, verified against eager.

`model_parser` walks the module tree (`NNParser.parse_model`), lowers each forward and the methods
it calls, runs the schema once on the example inputs under a protected state to fill shapes, and
skips (re-dispatches to the real module) any child whose schema cannot be lowered or differs from
eager; `equality` is the exact structural comparison of results that verification uses;
`special_modules` names the modules that run as themselves (TorchScript, `torch.compile`, a
replaced forward) and the state a lazy module's first call changes; `dispatch` resolves decorators
that dispatch a forward to another implementation (`use_experts_implementation`) the way they do;
`live_calls` marks what the live-call detector saw live code reach, and replays Python's and
numpy's RNG for verification; `state_guard` (`preserved_state`) puts back what a parse's run wrote,
with `python_state` for the Python state outside the model (globals, class attributes, defaults;
what they hold, two levels in, fingerprinted by `held_objects`).

May import: `schema`, `lowering`, `runtime`.
"""

from .model_parser import NNParser, example_inputs, preserved_state  # the old `nnschemaparser.parser` names

__all__ = ["NNParser", "preserved_state", "example_inputs"]
