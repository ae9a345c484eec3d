"""Which context the load generator fits its prompts to: the fleet's smallest (every replica answers), or the
largest, as the model's users send them, so a canary with a shorter length limit refuses the long ones."""

from __future__ import annotations

import asyncio

import pytest

from engine.core.model_refs import REFERENCE_MODEL
from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import make_workload


@pytest.fixture(scope="module")
def pair(served_replica, store):
    """Two replicas of the reference model (a real tokenizer): `wide` with its 256-token context, `narrow`
    limited to 128."""
    with served_replica(REFERENCE_MODEL, "wide", store, max_model_len=256) as (wide, _), \
            served_replica(REFERENCE_MODEL, "narrow", store, max_model_len=128) as (narrow, _):
        yield {"wide": wide, "narrow": narrow}


def _load(pair, fit):
    workload = make_workload("batch", seed=3, max_tokens=4)
    return asyncio.run(run_load([pair["wide"], pair["narrow"]], workload, parse_arrival("closed:2"), num_requests=24,
                                seed=3, run_id=f"fit-{fit}", fit_context=fit))


def _refused(load) -> dict[str, int]:
    out = {"wide": 0, "narrow": 0}
    for r in load.results:
        out[r.replica] += r.status == 400
    return out


def test_fitted_to_the_smallest_context_every_replica_answers(pair):
    load = _load(pair, "smallest")
    assert load.config["fit"] == "smallest"
    assert _refused(load) == {"wide": 0, "narrow": 0}, [r.error for r in load.results if not r.ok]


def test_fitted_to_the_largest_context_the_shorter_limit_refuses_the_long_prompts(pair):
    load = _load(pair, "largest")
    refused = _refused(load)
    assert refused["wide"] == 0  # everything fits the largest context
    assert refused["narrow"] >= 3, refused  # batch prompts of 40-90 words: the longer pass 128 tokens
    assert all("context" in r.error for r in load.results if r.status == 400)
    assert load.config["prompt_scale"] > _load(pair, "smallest").config["prompt_scale"]


def test_an_unknown_fit_is_refused_before_any_traffic(pair):
    with pytest.raises(ValueError, match="smallest, largest, none"):
        _load(pair, "median")
