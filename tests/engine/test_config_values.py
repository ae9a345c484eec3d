"""A configuration value of the wrong type is an error that names the key and the type it takes
(engine/core/config_values.py), for every key of a fleet TOML, every engine option (in a fleet's `engine` table and
in an EngineConfig TOML for `infersight eval`) and every eval policy key, never Python's "invalid literal for
int()" or a TypeError about a value nobody can find."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.serving.fleet.config import _FLEET_KEYS, _PROBE_KEYS, _REPLICA_KEYS, _SIDECAR_KEYS, load_fleet, parse_fleet
from engine.serving.server.engine_args import engine_fields
from evals.sides import load_engine_config

TOML_VALUES = st.one_of(st.text(max_size=8), st.integers(-5, 10**6), st.floats(allow_nan=False), st.booleans(),
                        st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=1))


def _fits(value, kinds) -> bool:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    for kind in kinds:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind not in (int, float) and isinstance(value, kind):
            return True
    return False


def _fleet(table: str, key: str, value) -> dict:
    data = {"fleet": {"name": "t"}, "replica": [{"id": "r0", "model": "reference"}]}
    if table == "replica":
        data["replica"][0][key] = value
    else:
        data.setdefault(table, {})[key] = value
    return data


TABLES = {"fleet": _FLEET_KEYS, "sidecar": _SIDECAR_KEYS, "replica": _REPLICA_KEYS, "probe": _PROBE_KEYS}
KEYS = [(t, k) for t, keys in TABLES.items() for k in keys if k not in ("engine", "vllm")]


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS), value=TOML_VALUES)
def test_a_fleet_key_of_the_wrong_type_is_named(key, value):
    table, name = key
    if _fits(value, TABLES[table][name]):
        return
    with pytest.raises(ValueError) as e:
        parse_fleet(_fleet(table, name, value))
    assert name in str(e.value) and "must be" in str(e.value), str(e.value)


ENGINE_OPTIONS = [f.name for f in engine_fields()]


@settings(max_examples=300, deadline=None)
@given(option=st.sampled_from(ENGINE_OPTIONS), value=st.one_of(st.text(min_size=1, max_size=6).filter(
    lambda s: not s.strip().isdigit()), st.floats(allow_nan=False).filter(lambda f: not f.is_integer()),
    st.dictionaries(st.sampled_from("ab"), st.integers(), min_size=1, max_size=1)))
def test_an_engine_option_of_the_wrong_type_is_named(option, value):
    field_type = str(next(f.type for f in engine_fields() if f.name == option))
    if field_type.startswith("str") and isinstance(value, str):
        return  # a string option given a string: its values are checked where they are used
    if field_type.startswith("list") and isinstance(value, str):
        return  # a comma-separated list
    if field_type.startswith(("float", "int")) and option.endswith("_bytes") and isinstance(value, str):
        value = value + "?"  # never a size
    with pytest.raises(ValueError) as e:
        parse_fleet({"fleet": {"name": "t"}, "replica": [{"id": "r0", "model": "reference", "engine": {option: value}}]})
    assert option in str(e.value), str(e.value)


def test_the_file_and_the_key_are_named(tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text('[fleet]\nname = "t"\nbase_port = "8100"\n[[replica]]\nid = "r0"\nmodel = "reference"\n')
    with pytest.raises(ValueError, match=r"fleet.toml: \[fleet\]: base_port must be an integer, got '8100'"):
        load_fleet(path)
    path.write_text('[fleet]\nname = "t"\n[[replica]]\nid = "r0"\nmodel = "reference"\n'
                    'engine = { max_num_seqs = "16" }\n')
    with pytest.raises(ValueError, match=r"\(r0\): engine option 'max_num_seqs' must be an integer, got '16'"):
        load_fleet(path)


def test_an_eval_engine_config_names_the_key(tmp_path, tiny_llama):
    path = tmp_path / "candidate.toml"
    path.write_text(f'model = "{tiny_llama}"\nmax_num_seqs = "eight"\n')
    with pytest.raises(ValueError, match=r"candidate.toml: engine option 'max_num_seqs' must be an integer"):
        load_engine_config(path)
    path.write_text(f'model = "{tiny_llama}"\nmax_num_seqs = 8\nkv_cache_memory_bytes = "64MiB"\n')
    assert load_engine_config(path).max_num_seqs == 8


POLICY_KEYS = {"run": {"suites": list, "max_items": int, "per_task": int, "max_tokens": int},
               "accuracy": {"max_accuracy_drop": float, "alpha": float, "paired_test": str,
                            "bootstrap_resamples": int, "confidence": float},
               "drift": {"max_mean_kl": float, "max_p99_kl": float, "min_same_top_p": float,
                         "min_greedy_agreement": float, "require_logit_drift": bool}}


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from([(s, k) for s, keys in POLICY_KEYS.items() for k in keys]),
       value=st.sampled_from(['"0.5"', '"x"', "[1]", "{a = 1}", "true", "0.5", "3", '"mcnemar"', '["a.jsonl"]']))
def test_an_eval_policy_value_of_the_wrong_type_is_named(tmp_path_factory, key, value):
    from engine.core.config_values import is_kind
    from evals.policy import load_policy

    section, name = key
    parsed = __import__("tomllib").loads(f"v = {value}")["v"]
    kind = POLICY_KEYS[section][name]
    if is_kind(parsed, kind) or (parsed is False and kind is float):
        return  # the right type: its range is validate()'s business
    path = tmp_path_factory.mktemp("policy") / "policy.toml"
    path.write_text(f"[{section}]\n{name} = {value}\n")
    with pytest.raises(ValueError) as e:
        load_policy(path)
    assert f"{name} must be" in str(e.value) and "policy.toml" in str(e.value), str(e.value)
