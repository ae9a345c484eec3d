"""A replica's config document (the `replicas` rows' config_json) as dotted keys, and how a difference
in them is said: the one place that flattens, filters and explains identity keys.

The document holds the engine options (max_num_seqs ...), `generation` (eos / bos ids),
`model_files` (the model directory's files, engine/core/model_files.py: config.json parsed, tokenizer
files by hash ...), `serve_options` (the server's flags and limits), `placement.cgroup` (CPU quota,
cpuset, memory limit: engine/core/cgroup_limits.py), or vLLM's own (vllm_config.cache_config ...).
Nested keys are dotted: `model_files.config_json.rope_theta`, `vllm_config.cache_config.enable_prefix_caching`.

`behaviour` keeps what changes how a replica answers or how fast: labels and per-start or per-host
keys (replica_id, served_model_name, ports, a proxy's upstream URL, "_"-prefixed start-time readings)
and the GPU index of `device` are left out, and so are the model / tokenizer paths (where, not what:
the content is in the hashes and model_files). `explain` says a difference the way a person reads
it, most specific first: `rope_theta 10000 vs 100000 in config.json` before an engine option, before a
serve flag, before a placement limit.

A key a replica does not record is unknown (None), and listed only when a peer records it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from engine.core.model_files import SECTION as MODEL_FILES
from engine.core.model_files import file_name
from engine.serving.vllm_adapter.config_json import VOLATILE_KEYS

NOT_BEHAVIOUR = frozenset({"replica_id", "served_model_name", "upstream", *VOLATILE_KEYS})
PATH_KEYS = ("model", "tokenizer")  # top-level config paths: where the content came from
# the document's sections, most specific first (the order explanations list differences in)
SECTIONS = (MODEL_FILES, "generation", "", "serve_options", "placement")


@lru_cache(maxsize=512)  # one row's document is read per field and per comparison; vLLM's are large
def document(text: str | None) -> dict:
    try:
        doc = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def flat(text: str | None) -> dict:
    """Every key of the document, dotted, with its value (nothing left out)."""
    out: dict = {}

    def walk(value, prefix: str):
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{prefix}{k}.")
        elif prefix:
            out[prefix[:-1]] = value

    walk(document(text), "")
    return out


def _behaviour_of(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and not value:
        return {}  # an empty section ({}: no serve flags offline) holds no key to differ in
    if not isinstance(value, dict):
        return {prefix[:-1]: value} if prefix else {}
    out = {}
    for k, v in value.items():
        if k in NOT_BEHAVIOUR or str(k).startswith("_"):
            continue
        if k == "device" and isinstance(v, str):
            v = v.split(":")[0]  # cuda:3 vs cuda:5 is which GPU, not how it computes
        out.update(_behaviour_of(v, f"{prefix}{k}."))
    return out


@lru_cache(maxsize=512)
def _behaviour(text: str) -> tuple:
    doc = document(text)
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in _behaviour_of(doc).items()
                        if k not in PATH_KEYS))


def behaviour(text: str | None) -> dict:
    """The dotted keys that change behaviour (see the module's docstring), with their values."""
    return {k: json.loads(v) for k, v in _behaviour(text or "{}")}


def section(key: str) -> str:
    head = key.split(".", 1)[0]
    return head if head in SECTIONS else ""


def rank(key: str) -> tuple[int, str]:
    """Sort key: most specific section first, then by name."""
    return SECTIONS.index(section(key)), key


def where(key: str) -> tuple[str, str]:
    """(the key as a person names it, where it is set): `model_files.config_json.rope_theta` ->
    (`rope_theta`, `config.json`); `serve_options.max_queue` -> (`max_queue`, `serve flags`)."""
    part = section(key)
    if "." not in key:  # a section recorded empty ({}: an offline engine has no serve flags)
        return key, ""
    if part == MODEL_FILES:
        _, file_key, *rest = key.split(".")
        return ".".join(rest) or "content", file_name(file_key)
    if part == "serve_options":
        return key.split(".", 1)[1], "serve flags"
    if part == "placement":
        return key.split(".", 1)[1], "placement"
    return key, ""  # an engine option, or the generation ids the engine read: the key says it


def _value(v) -> str:
    return "unset" if v is None else v if isinstance(v, str) else json.dumps(v, default=str)  # JSON: true, 1e+05


def say(key: str, mine, theirs) -> str:
    """`rope_theta 100000 vs 10000 in config.json`."""
    name, place = where(key)
    return f"{name} {_value(mine)} vs {_value(theirs)}" + (f" in {place}" if place else "")


def explain(diffs: list[dict], mine: str = "replica", theirs: str = "reference", limit: int = 4) -> str:
    """The differences ({key, mine, theirs}) most specific first, the first `limit` said, the rest counted."""
    ordered = sorted(diffs, key=lambda d: rank(d["key"]))
    text = ", ".join(say(d["key"], d[mine], d[theirs]) for d in ordered[:limit])
    return text + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def differences(subject: dict, peers: list[dict], wanted: Callable[[str], bool]) -> list[dict]:
    """[{key, replica, peers: {value: count}}] for the wanted behaviour keys on which `subject` is off its
    peers' most common value, most specific first."""
    mine = {k: v for k, v in behaviour(subject.get("config_json")).items() if wanted(k)}
    theirs = [{k: v for k, v in behaviour(p.get("config_json")).items() if wanted(k)} for p in peers]
    out = []
    for key in sorted(set(mine).union(*theirs) if theirs else mine, key=rank):
        counts = Counter(json.dumps(t.get(key), sort_keys=True) for t in theirs)
        if not counts:
            continue
        common, _ = counts.most_common(1)[0]
        if json.dumps(mine.get(key), sort_keys=True) != common:
            out.append({"key": key, "replica": mine.get(key), "peers": dict(counts),
                        "reference": json.loads(common)})
    return out


def describe(diffs: list[dict]) -> str:
    """Each difference said against the peers' most common value, their other values counted where they split."""
    return "; ".join(say(d["key"], d["replica"], d["reference"])
                     + (f" (peers: {', '.join(d['peers'])})" if len(d["peers"]) > 1 else "") for d in diffs[:4])
