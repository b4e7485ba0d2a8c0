"""capture_dataset writes every kept tensor as it was bound, though it holds the run's own tensors instead of
cloning them (store/writer.py, `_Unit.keep` and `settle`): a value changed in place later in its run, by a
later run (a module that keeps it), or by the inputs' iterable (a buffer filled again for the next input)
is stored as it was when bound, equal (torch.equal) to a forward hook's clone at that point."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnschemaparser import NNParser, TraceStore, capture_dataset
from nnschemaparser.store import held


class Bump(nn.Module):
    """Changes its projection in place after binding it; keeps its result and changes it at the next call."""

    def __init__(self, width: int = 6):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.last = None

    def forward(self, x):
        hidden = self.fc(x)
        doubled = hidden * 2
        hidden.add_(1)
        kept = doubled + hidden
        if self.last is not None:
            self.last.mul_(-3)  # the previous input's value, changed by this run
        self.last = kept
        flat = kept.reshape(-1)  # a view of what the module keeps
        return flat.sum(-1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.bump = Bump()

    def forward(self, x):
        return self.bump(x)


def _bound_values(model: Net, data: list) -> list:
    """Each input's fc output and kept value as a forward hook clones them, in a fresh copy of `model`."""
    seen: list = []
    model.bump.fc.register_forward_hook(lambda m, a, out: seen.append(out.clone()))
    outs = []
    model.bump.register_forward_hook(lambda m, a, out: outs.append(m.last.clone()))
    with torch.no_grad():
        for x in data:
            model(x.clone())
    return list(zip(seen, outs))


def _refilled(data: list):
    """The inputs, each written into the same buffer (as a loader reusing its memory would)."""
    buffer = torch.empty_like(data[0])
    for x in data:
        buffer.copy_(x)
        yield buffer


@pytest.mark.parametrize("refill", [True, False], ids=["one-buffer", "fresh-inputs"])
def test_kept_values_are_stored_as_bound_whatever_changes_them_later(tmp_path, monkeypatch, refill):
    monkeypatch.setattr(held, "HOLD_BYTES", 1)  # every value held, however small (64 KiB and up by default)
    torch.manual_seed(0)
    data = [torch.randn(1, 6) for _ in range(5)]  # one row each: every input is one sample
    model = Net()
    schema = NNParser.parse_model(model=model, inputs_tensors_values={"x": data[0].clone()})
    model.bump.last = None
    expected = _bound_values(_copy(model), data)
    model.bump.last = None
    source = _refilled(data) if refill else [x.clone() for x in data]
    capture_dataset(schema, source, tmp_path / "s", keep="bump:hidden,bump:kept,bump:flat", block_size=8,
                    progress=False)
    store = TraceStore(tmp_path / "s")
    steps = store.steps
    for sample, (x, (hidden, kept)) in enumerate(zip(data, expected)):
        rows = steps[(steps["sample"] == sample) & steps["kept"]]
        by_var = {(r.block_path, r.out_var, r.slot_type): r.container_id for r in rows.itertuples()}
        inputs = [cid for (path, var, slot), cid in by_var.items() if slot == "input"]
        assert inputs and all(torch.equal(store.tensor(sample, cid), x) for cid in inputs), sample
        hiddens = [cid for (path, var, slot), cid in by_var.items() if var == "hidden" and slot != "input"]
        keeps = [cid for (path, var, slot), cid in by_var.items() if var == "kept" and slot != "input"]
        assert hiddens and keeps, by_var
        assert torch.equal(store.tensor(sample, hiddens[0]), hidden), sample
        assert torch.equal(store.tensor(sample, keeps[0]), kept), sample
        flats = [cid for (path, var, slot), cid in by_var.items() if var == "flat"]
        assert flats and torch.equal(store.tensor(sample, flats[0]), kept.reshape(-1)), sample


def _copy(model: Net) -> Net:
    twin = Net()
    twin.load_state_dict(model.state_dict())
    return twin
