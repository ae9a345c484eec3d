"""SamplingParams accepts exactly what the sampler can run, and names the field of anything else.

The oracle below states each field's range independently of the code (vLLM's bounds, the sampler's int64
tensors, the vocabulary for token IDs). Hypothesis draws each numeric field's extremes (inf, NaN, 2**63,
2**64, 1e308, -1, 0, huge negatives) besides strings, None, bools and lists: a value out of range is a
ValueError whose message starts with the field's name (the server turns it into a 400 naming it); a value
in range is accepted and then sampled, in a batch beside a default row, without any error.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Hashable

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.core.sampler import Sampler
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

torch.set_num_threads(1)

VOCAB = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    """A finite float, or an integer that is one (the sampler's tensors take floats: 10**400 is none)."""
    return (_int(v) and abs(v) <= sys.float_info.max) or (isinstance(v, float) and math.isfinite(v))


# field -> (the SamplingParams keyword arguments for a value, whether the value is valid there)
FIELDS = {
    "temperature": (lambda v: {"temperature": v}, lambda v: _real(v) and 0 <= v <= 100),
    "top_p": (lambda v: {"top_p": v}, lambda v: _real(v) and 0 < v <= 1),
    "top_k": (lambda v: {"top_k": v}, lambda v: _int(v) and (v == -1 or 1 <= v <= INT64_MAX)),
    "max_tokens": (lambda v: {"max_tokens": v}, lambda v: _int(v) and 1 <= v <= INT64_MAX),
    "seed": (lambda v: {"seed": v}, lambda v: v is None or (_int(v) and INT64_MIN <= v <= INT64_MAX)),
    "logprobs": (lambda v: {"logprobs": v}, lambda v: v is None or (_int(v) and 0 <= v <= 20)),
    "prompt_logprobs": (lambda v: {"prompt_logprobs": v}, lambda v: v is None or (_int(v) and 0 <= v <= 20)),
    "presence_penalty": (lambda v: {"presence_penalty": v}, lambda v: _real(v) and -2 <= v <= 2),
    "frequency_penalty": (lambda v: {"frequency_penalty": v}, lambda v: _real(v) and -2 <= v <= 2),
    "repetition_penalty": (lambda v: {"repetition_penalty": v}, lambda v: _real(v) and v > 0),
    "min_p": (lambda v: {"min_p": v}, lambda v: _real(v) and 0 <= v <= 1),
    "n": (lambda v: {"n": v}, lambda v: _int(v) and 1 <= v <= INT64_MAX),
    "best_of": (lambda v: {"best_of": v}, lambda v: v is None or (_int(v) and 1 <= v <= INT64_MAX)),
    "logit_bias": (lambda v: {"logit_bias": {5: v}}, lambda v: _real(v) and -100 <= v <= 100),
    "logit_bias keys": (lambda v: {"logit_bias": {v: 1.0}}, lambda v: _int(v) and 0 <= v < VOCAB),
    "stop_token_ids": (lambda v: {"stop_token_ids": [v]}, lambda v: _int(v) and 0 <= v < VOCAB),
}

EXTREMES = [math.inf, -math.inf, math.nan, 2**63, 2**63 - 1, 2**64, 1e308, -1e308, -1, 0, 1, -(2**63),
            -(2**63) - 1, -(2**64), 10**400, 5e-324, 1e-5, 0.5, 100.0, 100.5, "1", "", None, True, False, [1], {}]
VALUES = st.one_of(st.sampled_from(EXTREMES), st.integers(-(2**70), 2**70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none(), st.booleans(),
                   st.lists(st.integers(), max_size=2))


def _params(field: str, value) -> SamplingParams:
    """Made as the engine makes a Sequence: constructed, then checked against the vocabulary."""
    params = SamplingParams(**FIELDS[field][0](value))
    params.validate(VOCAB)
    return params


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(list(FIELDS)), value=VALUES)
def test_each_field_accepts_its_range_and_names_itself_otherwise(field, value):
    assume(field != "logit_bias keys" or isinstance(value, Hashable))
    valid = FIELDS[field][1](value)
    try:
        params = _params(field, value)
    except ValueError as e:
        assert not valid, f"{field}={value!r} was refused: {e}"
        assert str(e).split(" ")[0] == field.split(" ")[0], str(e)
        return
    assert valid, f"{field}={value!r} was accepted"
    # what is accepted samples, beside a default row, without failing either row
    seqs = [Sequence("x", [3, 4, 5], params, 0.0), Sequence("y", [3, 4], SamplingParams(), 0.0)]
    seqs[0].token_ids.append(7)  # an output token, for the presence / frequency penalties
    out = Sampler(0)(torch.randn(2, VOCAB), seqs)
    assert out.errors is None and all(0 <= t < VOCAB for t in out.token_ids)


def test_a_vocabulary_is_checked_only_when_known():
    """SamplingParams alone cannot know the vocabulary; the engine checks it where the Sequence is made."""
    params = SamplingParams(logit_bias={VOCAB: 1.0}, stop_token_ids=[VOCAB])
    with pytest.raises(ValueError, match=r"^stop_token_ids must be an integer in \[0, 63\]"):
        params.validate(VOCAB)


@pytest.mark.parametrize("kwargs", [{"stop": "x"}, {"stop": [1]}, {"ignore_eos": 1}, {"logit_bias": [1]},
                                    {"stop_token_ids": 3}])
def test_other_fields_of_the_wrong_type_are_refused_by_name(kwargs):
    (field,) = kwargs
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**kwargs)
