"""The CI slice of the validation sweep: one transformers architecture per family, bit-exact.

`make sweep` runs the whole zoo; here the fast subset (about a dozen models) must come out exact in
outputs and gradients, in eval and train mode, with no child skipped.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from nnschemaparser.validation import zoo  # noqa: E402
from nnschemaparser.validation.sweep import markdown_table, run_case, summary  # noqa: E402

FAST = zoo.fast_subset()


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_fast_zoo_case_is_exact_in_outputs_and_gradients(case):
    row = run_case(case.name, case.family, case.build, case.make_inputs)
    assert row.status == "exact", row.detail
    assert row.output_maxdiff == 0.0 and row.grad_maxdiff == 0.0 and row.train_maxdiff == 0.0
    assert row.parsed_blocks == row.blocks, row.skipped


def test_fast_subset_covers_every_family():
    assert {c.family for c in FAST} >= {"encoder", "decoder", "encoder-decoder", "vision-vit", "vision-conv",
                                        "audio-encoder", "multimodal", "moe", "ssm"}


def test_sweep_reports_a_wrong_case_instead_of_stopping():
    import torch
    from torch import nn

    class Broken(nn.Module):
        def forward(self, x):
            return x.relu()

    def build():
        return Broken()

    good = run_case("good", "local", build, lambda m: {"x": torch.randn(3)})
    refused = run_case("refused", "local", lambda: (_ for _ in ()).throw(RuntimeError("no")), lambda m: {})
    assert good.status == "exact"
    assert refused.status == "refused" and "cannot build" in refused.detail
    info = summary([good, refused])
    assert info["exact"] == 1 and info["refused"] == 1 and info["wrong"] == 0
    assert "| good | local | exact |" in markdown_table([good])


def test_sweep_flags_a_schema_result_that_differs_from_eager(monkeypatch):
    import torch
    from torch import nn

    import nnschemaparser.validation.sweep as sweep

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    real_call = sweep.SchemaInterpreter.call

    def off_by_one_ulp(self, block, *args, **kwargs):
        out = real_call(self, block, *args, **kwargs)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(sweep.SchemaInterpreter, "call", off_by_one_ulp)
    row = run_case("tiny", "local", Tiny, lambda m: {"x": torch.randn(2, 4)})
    assert row.status == "wrong" and "values differ" in row.detail


def test_the_all_subset_includes_the_ten_local_fixture_architectures():
    from nnschemaparser.validation.sweep import _cases

    local = [name for name, family, _, _ in _cases("local", None)]
    assert len(local) == 10 and all(name.startswith("local:") for name in local)
    assert set(local) <= {name for name, *_ in _cases("all", None)}
