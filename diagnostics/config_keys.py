"""Config keys of one replica that differ from its peers' most common value: the identity evidence
that the traffic-mix and prefix-hit findings name (eos ids, stop settings, prefix caching).

config_json (the `replicas` rows' full config) is flattened to dotted keys (generation.eos_token_ids,
vllm_config.cache_config.enable_prefix_caching); only the keys a finding asks about are compared.
A key a replica does not record is unknown (None), and listed only when a peer records it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable


def flat(text: str | None) -> dict:
    try:
        doc = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    out: dict = {}

    def walk(value, prefix: str):
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{prefix}{k}.")
        elif prefix:
            out[prefix[:-1]] = value

    walk(doc if isinstance(doc, dict) else {}, "")
    return out


def differences(subject: dict, peers: list[dict], wanted: Callable[[str], bool]) -> list[dict]:
    """[{key, replica, peers: {value: count}}] for the wanted keys on which `subject` is off its peers'
    most common value."""
    mine = {k: v for k, v in flat(subject.get("config_json")).items() if wanted(k)}
    theirs = [{k: v for k, v in flat(p.get("config_json")).items() if wanted(k)} for p in peers]
    out = []
    for key in sorted(set(mine).union(*theirs) if theirs else mine):
        counts = Counter(json.dumps(t.get(key), sort_keys=True) for t in theirs)
        if not counts:
            continue
        common, _ = counts.most_common(1)[0]
        if json.dumps(mine.get(key), sort_keys=True) != common:
            out.append({"key": key, "replica": mine.get(key), "peers": dict(counts)})
    return out


def describe(diffs: list[dict]) -> str:
    return "; ".join(f"{d['key']} {json.dumps(d['replica'])} (peers: {', '.join(d['peers'])})" for d in diffs[:4])
