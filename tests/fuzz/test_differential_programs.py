"""Differential fuzzing in CI: fixed-seed samples of generated programs behave exactly as eager.

Three deterministic samples: Hypothesis-drawn programs (derandomized; a failure shrinks to a small
program), seeded programs of the same family `make fuzz` runs by the ten thousand, and seeded
programs of the "names" family (forwards rebinding module names mid-run, `--family names`). The oracle's
own ability to fail is checked on a model whose schema really does differ from eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from .minimizer import minimize
from .oracle import check_source
from .programs import program_for_seed, programs

SEEDED_PROGRAMS = 200
SEED_CHUNK = 50

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny tensors: one intra-op thread is much faster on small machines; eager and schema share it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    """Where the programs are written: the parser reads their source from real files."""
    return tmp_path_factory.mktemp("fuzz_programs")


@settings(max_examples=120, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_drawn_programs_match_eager_or_raise_alike(program_dir, program):
    outcome = check_source(program.source, program_dir)
    assert outcome.ok, f"{outcome.describe()}\n\n{program.source}"


@pytest.mark.parametrize("first", range(0, SEEDED_PROGRAMS, SEED_CHUNK))
def test_seeded_programs_match_eager_or_raise_alike(program_dir, first):
    failing = []
    for seed in range(first, first + SEED_CHUNK):
        outcome = check_source(program_for_seed(seed).source, program_dir)
        if not outcome.ok:
            failing.append(f"seed {seed}: {outcome.describe()}")
    assert not failing, ("reproduce with `python -m tests.fuzz.run_fuzz --programs 1 --seed N --minimize`:\n"
                         + "\n".join(failing))


NAMES_PROGRAMS = 60  # the "names" family: forwards that rebind module names mid-run (issue 38)


@pytest.mark.parametrize("first", range(0, NAMES_PROGRAMS, 30))
def test_seeded_programs_rebinding_names_mid_forward_match_eager(program_dir, first):
    failing = []
    for seed in range(first, first + 30):
        outcome = check_source(program_for_seed(seed, "names").source, program_dir)
        if not outcome.ok:
            failing.append(f"seed {seed}: {outcome.describe()}")
    assert not failing, ("reproduce with `python -m tests.fuzz.run_fuzz --family names --programs 1 --seed N "
                         "--minimize`:\n" + "\n".join(failing))


def test_the_names_family_leaves_the_base_programs_as_they_were():
    base = program_for_seed(7).source
    names = program_for_seed(7, "names").source
    assert "reset_names()" in names and "reset_names" not in base
    assert all(text in names for text in ("G = 1.0", "LIB.K", "Knobs.FACTOR", "def use_act"))


def test_program_of_a_seed_is_the_same_every_time():
    assert program_for_seed(7).source == program_for_seed(7).source
    assert program_for_seed(7).source != program_for_seed(8).source


def test_seeded_programs_are_valid_python():
    for seed in range(300):
        compile(program_for_seed(seed).source, f"<seed {seed}>", "exec")


_DIVERGING = '''
import torch
from torch import nn

TRAIN = False
CALLS = []


class Model(nn.Module):
    def forward(self, x):
        CALLS.append(1)
        y = x + 1
        z = y * 2
        return x * len(CALLS)


def make_inputs():
    return {"x": torch.ones(2, 4)}
'''


def test_oracle_reports_a_schema_that_differs_from_eager(program_dir):
    # The module-level counter makes the second run (the schema's) return twice eager's result.
    outcome = check_source(_DIVERGING, program_dir)
    assert outcome.verdict == "divergence"
    assert outcome.category == "plain: different outputs"


def test_oracle_reports_a_different_exception(program_dir):
    source = _DIVERGING.replace("return x * len(CALLS)", "return [x][len(CALLS) - 1]")
    outcome = check_source(source, program_dir)
    assert outcome.verdict == "divergence"
    assert outcome.category == "plain: the schema raised where eager returned"


def test_minimizer_keeps_only_what_the_divergence_needs(program_dir):
    source, outcome = minimize(_DIVERGING, program_dir)
    assert outcome.category == "plain: different outputs"
    assert "CALLS.append(1)" in source
    assert "y = x + 1" not in source and "z = y * 2" not in source
