"""The tokenizer diagnostic's SQL (diagnostics/tokenizer.py): each query it runs, its placeholders filled there.

`{filters}` takes WINDOW_FILTERS or PLAIN_FILTERS, `{source}` a scope's requests (diagnostics.scope), `{n}`
a sample size; `{name:Type}` are bound parameters.
"""

DIVERGENCE_COLUMNS = ("t.model_name AS model_name, t.prompt_text_hash AS prompt_text_hash, t.replica_id AS replica_id, "
                      "t.prompt_ids_hash AS prompt_ids_hash, t.rendered_prompt_hash AS rendered_prompt_hash, "
                      "t.arrival_time AS arrival_time")
# per prompt text seen on several replicas of a model, the reference token IDs: those most of them
# produced; where no variant has the most (always, when two replicas disagree) those of the baseline
# side, if its replicas saw the text and agree. The sampling of the request plays no part: a prompt
# is tokenized before any sampling. Chat prompts too: a chat's prompt_text_hash is its messages'.
# The IDs are compared by prompt_ids_hash, cityHash64(prompt_token_ids) materialized at insert
# (migration 0009): hashing the arrays here took 0.2 s of the query's 0.7 s over 1M requests and
# reading them another 0.3 s.
DIVERGENCE = """
SELECT model_name, replica_id, count() AS compared,
       countIf(resolved AND h != ref) AS divergent,
       countIf(resolved AND h != ref AND NOT by_majority) AS by_baseline,
       countIf(resolved AND h != ref AND rendered != '' AND ref_rendered != '' AND rendered != ref_rendered)
           AS template_divergent,
       countIf(NOT resolved AND length(arrayDistinct(hs)) > 1) AS tied,
       groupArraySampleIf(3, 1)((prompt_text_hash, ref_replica, if(by_majority, 'majority', 'baseline')),
                                resolved AND h != ref) AS examples,
       groupArraySampleIf(3, 1)((prompt_text_hash, arrayFirst(p -> p.2 != h, pairs).1, 'tie'),
                                NOT resolved AND length(arrayDistinct(hs)) > 1) AS tie_examples,
       groupArraySample(5, 1)(prompt_text_hash) AS compared_texts
FROM (
    SELECT model_name, prompt_text_hash, pairs, arrayMap(p -> p.2, pairs) AS hs, arrayReduce('topK(2)', hs) AS top,
           length(top) = 1 OR arrayCount(x -> x = top[1], hs) > arrayCount(x -> x = top[2], hs) AS by_majority,
           arrayDistinct(arrayMap(p -> p.2, arrayFilter(p -> has({baseline:Array(String)}, p.1), pairs))) AS base_hs,
           by_majority OR length(base_hs) = 1 AS resolved,
           if(by_majority, top[1], base_hs[1]) AS ref,
           arrayFirst(p -> p.2 = ref, pairs) AS ref_pair, ref_pair.1 AS ref_replica, ref_pair.3 AS ref_rendered,
           arrayJoin(pairs) AS pair, pair.1 AS replica_id, pair.2 AS h, pair.3 AS rendered
    FROM (
        SELECT model_name, prompt_text_hash, groupArray((replica_id, v.1, v.2)) AS pairs
        FROM (SELECT model_name, prompt_text_hash, replica_id,
                     argMax((prompt_ids_hash, rendered_prompt_hash), arrival_time) AS v
              FROM {source}
              WHERE prompt_text_hash != '' AND cityHash64(prompt_text_hash) % 1000 < {permille:UInt32}
              GROUP BY model_name, prompt_text_hash, replica_id)
        GROUP BY model_name, prompt_text_hash
        HAVING length(pairs) > 1
    )
)
GROUP BY model_name, replica_id
ORDER BY model_name, replica_id
"""

TEXT_PROMPTS = """
SELECT count() AS n FROM requests AS t WHERE t.prompt_text_hash != '' AND {filters}
"""

# IN rather than has(): IN uses the prompt_text_hash and primary-key indexes (29 of 129 granules read)
PROMPTS = """
SELECT replica_id, prompt_text_hash, argMax(prompt_token_ids, arrival_time) AS ids,
       argMax(prompt_text, arrival_time) AS text, argMax(rendered_prompt_hash, arrival_time) AS rendered
FROM requests
WHERE prompt_text_hash IN {hashes:Array(String)} AND replica_id IN {replicas:Array(String)}
GROUP BY replica_id, prompt_text_hash
"""

STORED_TEXTS = """
SELECT replica_id, groupArraySample({n}, 1)(prompt_text) AS texts, uniqExact(prompt_text) AS distinct_texts
FROM (SELECT t.replica_id AS replica_id, t.prompt_text AS prompt_text
      FROM requests AS t WHERE t.prompt_text != '' AND {filters})
GROUP BY replica_id
"""

# IN rather than has(): it is evaluated on the LowCardinality dictionary and prunes by the primary
# key (a count over 1M requests: 0.12 CPU-s with has(), 0.03 with IN)
WINDOW_FILTERS = ("t.arrival_time >= toDateTime64({start:Float64}, 6, 'UTC') "
                  "AND t.arrival_time < toDateTime64({end:Float64}, 6, 'UTC') "
                  "AND (empty({replicas:Array(String)}) OR t.replica_id IN {replicas:Array(String)}) "
                  "AND (empty({models:Array(String)}) OR t.model_name IN {models:Array(String)})")

# the window, restricted to the given replicas (those of the scope, resolved by identity)
PLAIN_FILTERS = WINDOW_FILTERS + " AND t.replica_id IN {ids:Array(String)}"

OUTPUTS = """
SELECT replica_id, groupArraySample({n}, 1)((output_token_ids, output_text, sampling_params_json, finish_reason))
       AS outputs
FROM (SELECT t.replica_id AS replica_id, t.output_token_ids AS output_token_ids, t.output_text AS output_text,
             t.sampling_params_json AS sampling_params_json, t.finish_reason AS finish_reason
      FROM requests AS t
      WHERE t.output_text != '' AND t.finish_reason IN ('stop', 'length') AND {filters})
GROUP BY replica_id
"""

# One tokenizer's replicas at a time, its numbers as constants, in up to three queries that read
# the token-ID arrays only where a check needs them (one query reading and scanning prompt_token_ids
# of every request took 0.5-1.0 s over 1M; the summaries of migration 0009 are read instead):
# - TOKEN_COUNTS, on the summaries: double BOS (prompt_ids_head), IDs past the vocabularies
#   (prompt_ids_max, output_ids_max), with the keys of up to 3 sampled examples of each;
# - SPECIAL_SCAN: special tokens in sampled prompts, reading the arrays only of the text prompts
#   whose IDs after the first span a special ID (prompt_tail_min/max: a prompt whose range holds
#   none cannot hold one) and of the sampled chat prompts; as a WHERE (PREWHERE) the test costs
#   0.01 CPU-s over 1M requests, as a countIf over all of them 0.25;
# - EXAMPLE_ROWS: the arrays of the sampled examples, by request_id (its bloom index).
_TEXT_SAMPLED = ("t.workload NOT IN {active:Array(String)} AND t.prompt_text_hash != '' "
                 "AND t.rendered_prompt_hash = '' AND cityHash64(t.prompt_text_hash) % 1000 < {permille:UInt32}")
_CHAT_SAMPLED = ("{chat:UInt8} AND t.workload NOT IN {active:Array(String)} AND t.rendered_prompt_hash != '' "
                 "AND cityHash64(t.prompt_text_hash) % 1000 < {permille:UInt32}")
_MAY_HOLD_SPECIAL = ("arrayExists((a, b) -> t.prompt_tail_min <= b AND t.prompt_tail_max >= a, "
                     "{special_starts:Array(UInt32)}, {special_ends:Array(UInt32)}) AND " + _TEXT_SAMPLED)

TOKEN_COUNTS = """
SELECT replica_id, count() AS requests,
       countIf(is_double_bos AND NOT is_probe) AS double_bos,
       groupArraySampleIf(3, 1)(key, is_double_bos AND NOT is_probe) AS double_bos_keys,
       countIf(is_double_bos AND is_probe) AS double_bos_probe,
       groupArraySampleIf(3, 1)(key, is_double_bos AND is_probe) AS double_bos_probe_keys,
       countIf(is_probe) AS probe_requests,
       countIf(pmax >= {model_vocab:UInt64}) AS prompt_out_of_vocab,
       countIf(omax >= {model_vocab:UInt64}) AS output_out_of_vocab,
       groupArraySampleIf(3, 1)(key, greatest(pmax, omax) >= {model_vocab:UInt64}) AS oov_keys,
       countIf(greatest(pmax, omax) >= {vocab:UInt64} AND greatest(pmax, omax) < {model_vocab:UInt64}) AS textless,
       groupArraySampleIf(3, 1)(key,
               greatest(pmax, omax) >= {vocab:UInt64} AND greatest(pmax, omax) < {model_vocab:UInt64}) AS textless_keys
FROM (
    SELECT t.replica_id AS replica_id, (t.request_id, toUnixTimestamp64Micro(t.arrival_time)) AS key,
           t.prompt_ids_max AS pmax, t.output_ids_max AS omax, t.workload IN {active:Array(String)} AS is_probe,
           length(t.prompt_ids_head) = 2 AND t.prompt_ids_head[1] = {bos:Int64}
               AND t.prompt_ids_head[2] = {bos:Int64} AS is_double_bos
    FROM requests AS t
    WHERE {filters}
)
GROUP BY replica_id
ORDER BY replica_id
"""

# the array scans are cheap vector functions (hasAny) rather than per-element lambdas where they can be
SPECIAL_SCAN = """
SELECT replica_id, countIf(is_special) AS special_from_text, countIf(is_chat_special) AS special_from_chat,
       groupArraySampleIf(3, 1)((prompt_token_ids, prompt_text, is_chat_special), is_special OR is_chat_special)
           AS special_examples
FROM (
    SELECT t.replica_id AS replica_id, t.prompt_token_ids AS prompt_token_ids, t.prompt_text AS prompt_text,
           (TEXT_SAMPLED) AND hasAny(arraySlice(t.prompt_token_ids, 2), {specials:Array(UInt32)}) AS is_special,
           -- chat: a transition between special tokens (or the prompt's ends) its template never writes
           (CHAT_SAMPLED)
               AND NOT hasAll({transitions:Array(UInt64)}, arrayMap((a, b) -> bitShiftLeft(toUInt64(a), 32) + b,
                   arrayPushFront(arrayFilter(x -> has({chat_specials:Array(UInt32)}, x), t.prompt_token_ids),
                                  4294967295),
                   arrayPushBack(arrayFilter(x -> has({chat_specials:Array(UInt32)}, x), t.prompt_token_ids),
                                 4294967295)))
               AS is_chat_special
    FROM requests AS t
    WHERE {filters} AND ((MAY_HOLD_SPECIAL) OR (CHAT_SAMPLED))
)
GROUP BY replica_id
""".replace("MAY_HOLD_SPECIAL", _MAY_HOLD_SPECIAL).replace("TEXT_SAMPLED", _TEXT_SAMPLED) \
    .replace("CHAT_SAMPLED", _CHAT_SAMPLED)

EXAMPLE_ROWS = """
SELECT replica_id, request_id, toUnixTimestamp64Micro(arrival_time) AS at, prompt_token_ids, output_token_ids
FROM requests WHERE request_id IN {request_ids:Array(String)} AND replica_id IN {replicas:Array(String)}
"""
