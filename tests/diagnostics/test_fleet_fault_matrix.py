"""Faults caught on real local fleets under production-shaped traffic: the loadgen's default mix
(sampled, each request to one replica) plus the prober; nothing broadcast by the test.

Three cases of diagnostics/benchmarks/fault_matrix.py (which runs the whole matrix, every fault on
both fleet shapes and three clean runs each, and prints the confusion table; its numbers are in
the issue's note): a canary with other weights at the same path and options, and clean fleets of
both shapes, which must yield nothing above info. The tokenizer and template faults are caught in
process by tests/real_tokenizers and tests/diagnostics (same diagnostics, cheaper than fleets).
"""

from __future__ import annotations

import pytest

from diagnostics.benchmarks.fault_matrix import FAULTS, run_case, table

pytestmark = pytest.mark.slow

REQUESTS = 60  # of the default mix, besides two probe rounds

CASES = [("noisy_weights", "canary"), (None, "canary"), (None, "three")]


@pytest.mark.parametrize("fault,shape", CASES, ids=[f"{f or 'clean'}-{s}" for f, s in CASES])
def test_fault_is_named_on_the_candidate_and_clean_fleets_are_quiet(fault, shape, tmp_path, capsys):
    outcome = run_case(FAULTS[fault] if fault else None, shape, tmp_path, requests=REQUESTS, checkpoints=1,
                       log=lambda line: None)
    with capsys.disabled():
        print("\n" + table([outcome]))
    assert outcome.false_positives == [], outcome.false_positives
    if fault is not None:
        assert outcome.caught_after is not None, f"{fault} on a {shape} fleet was missed"
        assert outcome.candidate in outcome.explanation
