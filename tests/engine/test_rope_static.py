"""The rope table's static marking, set without importing torch._dynamo, is what torch._dynamo.mark_static sets."""

from __future__ import annotations

import torch

from engine.core.models.rope import mark_static_for_dynamo


def _marking(t: torch.Tensor) -> dict:
    return {name: getattr(t, name, None) for name in ("_dynamo_static_indices", "_has_dynamo_dim_marking")}


def test_the_marking_is_the_one_mark_static_sets():
    import torch._dynamo

    ours, theirs = torch.ones(8), torch.ones(8)
    mark_static_for_dynamo(ours)
    torch._dynamo.mark_static(theirs)
    assert _marking(ours) == _marking(theirs)
    assert _marking(ours)["_dynamo_static_indices"] == {0}
    # and every attribute mark_static adds to a tensor is one we set
    assert set(vars(theirs)) <= set(vars(ours))
