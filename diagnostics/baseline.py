"""Which side of a comparison is the baseline: the rule that breaks the two-replica tie.

With one baseline and one canary (the most common deploy) a 1-to-1 disagreement cannot say by
itself which side drifted. Every diagnostic that compares replicas of one model takes its
baseline from here, in this order, and says which rule it used:

1. `pinned`: a golden probe round pinned for the model (`infersight probe --pin`, table
   probe_baselines): replicas whose identity equals the pin's are the baseline, and the pinned
   token IDs are the reference outputs;
2. `requested`: the request's baseline scope (`--baseline replica=r0`, `version=0.1.0` ...):
   the replicas in it;
3. `first_served`: the identity that started serving the model first (the earliest latest-start
   among its replicas); a newer identity is the candidate.

An identity is what can change the answers: weights, tokenizer, chat template, config, engine
version (telemetry.contract.records.ReplicaRecord). Replicas that share it are one side.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.request import DiagnosticRequest

IDENTITY_FIELDS = ("weights_hash", "tokenizer_hash", "chat_template_hash", "config_hash", "engine_version")

_PINS = """
SELECT model_name, probe_id, argMax(tuple(pinned_time, round_id, replica_id, api, weights_hash, tokenizer_hash,
                                          chat_template_hash, config_hash, engine_version, prompt_text_hash,
                                          rendered_prompt_hash, sampling_params_json, prompt_token_ids,
                                          output_token_ids, finish_reason, note), pinned_time) AS pin
FROM probe_baselines
WHERE model_name = {model:String}
GROUP BY model_name, probe_id
ORDER BY probe_id
"""
_PIN_FIELDS = ("pinned_time", "round_id", "replica_id", "api", "weights_hash", "tokenizer_hash", "chat_template_hash",
               "config_hash", "engine_version", "prompt_text_hash", "rendered_prompt_hash", "sampling_params_json",
               "prompt_token_ids", "output_token_ids", "finish_reason", "note")


def identity_key(replica: dict) -> tuple:
    """The fields of a replica row (diagnostics.scope.replicas_in, or a pin) that can change its answers."""
    return tuple(str(replica.get(f, "")) for f in IDENTITY_FIELDS)


@dataclass(frozen=True)
class Baseline:
    model_name: str
    identity: tuple  # identity_key of the baseline side
    replicas: tuple[str, ...]  # the replicas in the window that have that identity
    rule: str  # "pinned" | "requested" | "first_served"
    reason: str  # one sentence a person reads: which side and why
    pins: dict | None = None  # probe_id -> pinned row, under the "pinned" rule

    def is_baseline(self, replica: dict) -> bool:
        return identity_key(replica) == self.identity

    def label(self) -> str:
        """`r0, first served` / `r0, requested` / `pin of round p1 from r0`: how summaries name it."""
        if self.rule == "pinned":
            latest = max(self.pins.values(), key=lambda p: p["pinned_time"])
            return f"pin of round {latest['round_id']} from {latest['replica_id']}"
        return f"{', '.join(self.replicas) or 'none in the window'}, {self.rule.replace('_', ' ')}"

    def describe(self) -> dict:
        return {"rule": self.rule, "reason": self.reason, "replicas": list(self.replicas),
                "identity": dict(zip(IDENTITY_FIELDS, self.identity))}


def pinned_probes(store, model: str) -> dict[str, dict]:
    """probe_id -> the latest pin of that probe for `model` ({} when none is pinned)."""
    rows = store.query_arrow(_PINS, {"model": model}).to_pylist()
    out = {}
    for r in rows:
        pin = r["pin"]
        values = list(pin.values()) if isinstance(pin, dict) else list(pin)
        out[r["probe_id"]] = {"model_name": model, "probe_id": r["probe_id"], **dict(zip(_PIN_FIELDS, values))}
    return out


def choose_baseline(store, model: str, replicas: list[dict], request: DiagnosticRequest | None = None,
                    pins: dict[str, dict] | None = None) -> Baseline | None:
    """The baseline among `replicas` (rows of diagnostics.scope.replicas_in, all serving `model`);
    None when there are none. `pins` defaults to the store's pins for the model."""
    if not replicas:
        return None
    pins = pinned_probes(store, model) if pins is None else pins
    if pins:
        latest = max(pins.values(), key=lambda p: p["pinned_time"])
        key = identity_key(latest)
        members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
        return Baseline(model, key, members, "pinned",
                        f"the probe round {latest['round_id']} pinned from {latest['replica_id']} "
                        f"is the baseline of {model}"
                        + ("" if members else " (no replica in the window has its identity)"), pins)
    if request is not None and request.baseline is not None:
        wanted = set(request.baseline.replicas)
        versions, configs = set(request.baseline.versions), set(request.baseline.config_hashes)
        chosen = [r for r in replicas
                  if (not wanted or r["replica_id"] in wanted) and (not versions or r["engine_version"] in versions)
                  and (not configs or r["config_hash"] in configs)]
        if chosen:
            first = min(chosen, key=lambda r: (r["started"], r["replica_id"]))
            key = identity_key(first)
            members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
            return Baseline(model, key, members, "requested",
                            f"the baseline was named ({request.baseline.label()}): {', '.join(members)}")
    first = min(replicas, key=lambda r: (r["started"], r["replica_id"]))
    key = identity_key(first)
    members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
    newer = sorted({r["replica_id"] for r in replicas if identity_key(r) != key})
    return Baseline(model, key, members, "first_served",
                    f"{first['replica_id']}'s identity served {model} first (started {_clock(first['started'])})"
                    + (f"; {', '.join(newer)} started later with another identity" if newer else ""))


def baselines_by_model(store, replicas: list[dict], request: DiagnosticRequest | None = None,
                       models=None) -> dict[str, Baseline | None]:
    """model -> its Baseline among `replicas` (rows of diagnostics.scope.replicas_in), for every
    model in `models` (default: every model the rows serve; a model without rows maps to None)."""
    by_model: dict[str, list[dict]] = {}
    for r in replicas:
        by_model.setdefault(r["model_name"], []).append(r)
    wanted = sorted(by_model) if models is None else sorted(set(models))
    return {m: choose_baseline(store, m, by_model.get(m, []), request) for m in wanted}


def _clock(started) -> str:
    return started.strftime("%Y-%m-%d %H:%M:%S UTC") if hasattr(started, "strftime") else str(started)
