"""Constrained decoding (response_format, engine/core/structured_output.py) in the engine: on the shipped
reference model and a tiny random-weight Llama, greedy and sampled output under json_object parses as a
JSON object and under a json_schema validates against it, while the same requests unconstrained do not
(so these go red if the mask is not applied); bad formats are ValueErrors; a constrained request leaves
the greedy output of the unconstrained ones in its batch unchanged; ignore_eos still ends at the JSON's end."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.structured_output import CACHE_LIMIT_BYTES, StructuredOutput, backend_identity, grammar_spec
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

JSON_OBJECT = {"type": "json_object"}
# required string + integer + enum fields; bounded, so that even a random model must finish within max_tokens
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "color"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
MAX_TOKENS = 100


def _run(engine, requests: dict[str, tuple]) -> dict:
    """request id -> (prompt, params); run them in one batch; id -> finished output."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _params(response_format=None, temperature=0.0, seed=None, **kw):
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=MAX_TOKENS,
                          response_format=response_format, **kw)


def _object(text: str):
    """The JSON object `text` is, or None."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _valid(text: str, schema: dict) -> bool:
    value = _object(text)
    if value is None:
        return False
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return LLMEngine(EngineConfig(model=str(REFERENCE), num_kv_blocks=64, max_num_seqs=16))


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, max_num_seqs=16))


def _prompts(engine) -> list:
    if engine.tokenizer.hf.chat_template:
        return [engine.chat_prompt([{"role": "user", "content": c}])
                for c in ("add 12 and 30", "reverse: abc", "sort: 3 1 2")]
    return ["The quick brown fox", "hello", "1 2 3"]


# --------------------------------------------------------------- validation


@pytest.mark.parametrize("fmt, words", [
    ({"type": "xml"}, "type must be one of"),
    ({"type": "json_schema"}, "needs json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}, "cannot compile"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}, "cannot compile"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
     "cannot compile"),
])
def test_bad_formats_are_value_errors_naming_response_format(fmt, words):
    with pytest.raises(ValueError, match="response_format") as e:
        SamplingParams(response_format=fmt)
    assert words in str(e.value)


def test_text_is_unconstrained_and_the_key_keeps_the_property_order():
    assert grammar_spec(None) is None and grammar_spec({"type": "text"}) is None
    key = grammar_spec(JSON_SCHEMA)
    assert key.index('"name"') < key.index('"age"') < key.index('"color"')  # generated in the client's order
    assert grammar_spec({"type": "json_schema", "json_schema": {"name": "p", "schema": json.loads(key)}}) == key


def _schema_format(n_fields: int, prefix: str = "cache_test") -> dict:
    """A schema of n integer fields, unlike any other test's (so no cache holds it yet)."""
    props = {f"{prefix}_{i}": {"type": "integer"} for i in range(n_fields)}
    return {"type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": props, "required": list(props)}}}


def test_grammars_are_compiled_once_per_schema(reference):
    """xgrammar's compiler cache keeps the compiled grammar: a second request with the same schema (or the
    same schema written again) adds nothing to it, a new schema does."""
    so = reference.structured_output
    fmt = _schema_format(3)
    a = so.grammar_for(fmt)
    after_first = so.cache_bytes()
    b = so.grammar_for(json.loads(json.dumps(fmt)))  # an equal dict, not the same object
    assert a is not b and a.matcher is not b.matcher  # one matcher per sequence ...
    assert so.cache_bytes() == after_first > 0  # ... and a cache hit: nothing compiled again
    so.grammar_for(_schema_format(4))
    assert so.cache_bytes() > after_first


def test_a_schema_is_parsed_once_to_check_and_compile(reference, monkeypatch):
    """Admission's check (SamplingParams.validate) parses the schema; the engine compiles that parse."""
    import xgrammar as xgr

    parses = []
    for cls, name in ((xgr.Grammar, "from_json_schema"), (xgr.GrammarCompiler, "compile_json_schema")):
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda *a, _real=real, _name=name, **k: parses.append(_name) or _real(*a, **k))
    fmt = _schema_format(5, prefix="parse_once")
    params = SamplingParams(response_format=fmt)  # validated
    assert reference.structured_output.grammar_for(params.response_format) is not None
    assert parses == ["from_json_schema"]


def test_the_compiled_grammars_memory_is_bounded(reference):
    """Past cache_limit_bytes xgrammar evicts the least recently used grammars: the cache holds at most the
    limit plus the grammar just compiled (an unbounded one holds them all)."""
    def cache_sizes(limit):
        so = StructuredOutput(reference.tokenizer.hf, reference.vocab_size, reference.eos_token_ids,
                              cache_limit_bytes=limit)
        sizes = []
        for n in range(2, 8):
            assert so.grammar_for(_schema_format(n)) is not None
            sizes.append(so.cache_bytes())
        return sizes

    unbounded, limit = cache_sizes(-1), 20_000
    grammar = [b - a for a, b in zip([0] + unbounded, unbounded)]  # each grammar's own size
    assert unbounded[-1] > limit + grammar[-1]  # so the bound below has something to bound
    assert all(size <= limit + g for size, g in zip(cache_sizes(limit), grammar))
    assert reference.structured_output._get_compiler().cache_limit_bytes == CACHE_LIMIT_BYTES


def test_the_replica_identity_names_the_backend(reference):
    assert backend_identity().startswith("xgrammar 0.2.")
    config = json.loads(reference.replica_record.config_json)
    assert config["generation"]["structured_output"] == backend_identity()


def test_tool_choice_schemas_compile(reference):
    """The forms engine/serving/server/tool_calls.py sets: a named function's parameters, and "required"'s array."""
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    named = {"type": "json_schema", "json_schema": {"name": "get_weather", "schema": params}}
    required = {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": {
        "type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
            {"properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": params},
             "required": ["name", "parameters"]}]}}}}
    for fmt in (named, required):
        assert reference.structured_output.grammar_for(SamplingParams(response_format=fmt).response_format)


# --------------------------------------------------------------- generation


@pytest.mark.parametrize("model", ["reference", "tiny"])
def test_greedy_and_sampled_outputs_follow_the_schema(request, model):
    engine = request.getfixturevalue(model)
    prompts = _prompts(engine)
    requests = {}
    for i, p in enumerate(prompts):
        requests[f"plain-{i}"] = (p, _params())
        requests[f"greedy-{i}"] = (p, _params(JSON_SCHEMA))
        requests[f"sampled-{i}"] = (p, _params(JSON_SCHEMA, temperature=1.0, seed=i))
    out = _run(engine, requests)
    for i in range(len(prompts)):
        for kind in ("greedy", "sampled"):
            o = out[f"{kind}-{i}"]
            assert o.finish_reason == "stop" and _valid(o.text, PERSON), (kind, o.text)
        assert not _valid(out[f"plain-{i}"].text, PERSON), out[f"plain-{i}"].text  # the mask did it


def test_json_object_greedy_outputs_parse_on_the_reference_model(reference):
    prompts = _prompts(reference)
    requests = {}
    for i, p in enumerate(prompts):
        requests[f"plain-{i}"] = (p, _params())
        requests[f"greedy-{i}"] = (p, _params(JSON_OBJECT))
    out = _run(reference, requests)
    for i in range(len(prompts)):
        o = out[f"greedy-{i}"]
        assert o.finish_reason == "stop" and _object(o.text) is not None, o.text
        assert _object(out[f"plain-{i}"].text) is None, out[f"plain-{i}"].text


@pytest.mark.parametrize("model", ["reference", "tiny"])
def test_sampled_json_object_is_json_and_a_json_prefix_where_cut(request, model):
    """An open-ended object (json_object: strings of any length) need not close within max_tokens at
    temperature 1 (this model, once inside a key, rarely closes it). Every sample that stopped must parse;
    every sample must be the start of a JSON object (a fresh matcher accepts all its tokens)."""
    engine = request.getfixturevalue(model)
    prompts = _prompts(engine) * 3
    out = _run(engine, {f"s-{i}": (p, _params(JSON_OBJECT, temperature=1.0, seed=i)) for i, p in enumerate(prompts)})
    for o in out.values():
        assert o.text.startswith("{"), o.text
        state = engine.structured_output.grammar_for(JSON_OBJECT)
        state.advance(list(o.token_ids), 0)  # raises on a token the grammar does not allow
        if o.finish_reason == "stop":
            assert _object(o.text) is not None, o.text
    if model == "reference":  # not vacuous: the trained model closes most of its objects
        assert sum(o.finish_reason == "stop" for o in out.values()) >= len(prompts) // 2


@pytest.mark.parametrize("model", ["reference", "tiny"])
def test_a_constrained_request_leaves_its_batch_mates_alone(request, model):
    engine = request.getfixturevalue(model)
    prompts = _prompts(engine)
    alone = _run(engine, {f"u-{i}": (p, _params()) for i, p in enumerate(prompts)})
    mixed = _run(engine, {**{f"u-{i}": (p, _params()) for i, p in enumerate(prompts)},
                          **{f"c-{i}": (p, _params(JSON_SCHEMA)) for i, p in enumerate(prompts)}})
    for i in range(len(prompts)):
        assert mixed[f"u-{i}"].token_ids == alone[f"u-{i}"].token_ids
        assert _valid(mixed[f"c-{i}"].text, PERSON)


def test_ignore_eos_still_ends_where_the_json_ends(reference):
    p = _prompts(reference)[0]
    out = _run(reference, {"a": (p, _params(JSON_SCHEMA, ignore_eos=True)), "b": (p, _params(JSON_SCHEMA))})
    assert out["a"].finish_reason == "stop" and out["a"].token_ids == out["b"].token_ids
    assert _valid(out["a"].text, PERSON)


def test_penalties_and_bias_cannot_break_the_grammar(reference):
    quote = reference.tokenizer.encode('"', add_special_tokens=False)[0]
    p = _prompts(reference)[1]
    params = _params(JSON_SCHEMA, temperature=0.7, seed=5, repetition_penalty=1.5, frequency_penalty=1.0,
                     logit_bias={quote: -100.0})
    out = _run(reference, {"x": (p, params)})["x"]
    assert _valid(out.text, PERSON), out.text


def test_speculative_decoding_leaves_constrained_requests_to_the_sampler():
    engine = LLMEngine(EngineConfig(model=str(REFERENCE), num_kv_blocks=64, speculative_mode="ngram"))
    plain = LLMEngine(EngineConfig(model=str(REFERENCE), num_kv_blocks=64))
    p = _prompts(plain)[0]
    spec = _run(engine, {"x": (p, _params(JSON_SCHEMA))})["x"]
    assert _valid(spec.text, PERSON) and spec.metrics.spec_proposed == 0
    assert spec.token_ids == _run(plain, {"x": (p, _params(JSON_SCHEMA))})["x"].token_ids


def test_a_penalty_below_float32_range_keeps_logits_finite_and_the_grammar_kept(reference):
    """schemathesis sent repetition_penalty=2.7e-201 (0 in float32): x / 0 = inf, 0 / 0 = NaN, NaN
    probabilities, a token outside the grammar. The penalty now saturates at the dtype's range."""
    from engine.core.logits_processors import apply_repetition_penalty

    x = torch.tensor([[2.0, 0.0, -1.0, 3.0]])
    apply_repetition_penalty(x, slice(None), torch.tensor([[True, True, True, False]]), torch.tensor([2.7e-201]))
    assert torch.isfinite(x).all() and x[0, 0] > 1e38 and x[0, 3] == 3.0
    p = _prompts(reference)[0]
    out = _run(reference, {"x": (p, _params(JSON_SCHEMA, temperature=1.0, seed=1, repetition_penalty=2.7e-201))})
    assert out["x"].finish_reason == "stop" and _valid(out["x"].text, PERSON), out["x"].text


def test_length_bounded_strings_hold_no_raw_control_characters(reference):
    """xgrammar 0.2.9 lets raw control characters into a maxLength string (invalid JSON; the random model
    wrote a vertical tab): such strings become patterns of plain characters."""
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "maxLength": 5}}}
    for text, ok in (('"a\x0b', False), ('"a\x01', False), ('"abcdef', False), ('"abc"', True)):
        assert reference.structured_output.grammar_for(fmt).matcher.accept_string(text) is ok, text
    schema = json.loads(grammar_spec({"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"default": {"type": "string", "minLength": 1}},
        "const": {"type": "string", "maxLength": 2}}}}))
    assert "pattern" in schema["properties"]["default"] and "minLength" not in schema["properties"]["default"]
    assert schema["const"] == {"type": "string", "maxLength": 2}  # a literal value, not a schema
