"""The prompt family of a request: what kind of prompt it is, so that content diagnostics (token
frequencies, prefix hits, sampled logprobs) compare like with like across replicas.

Two replicas of a healthy fleet differ in content whenever their clients do: a tenant with its own
system prompt, few-shot header or prompt lengths moves token frequencies, prefix-cache hits and the
model's confidence without anything being wrong with the replica. So a request's family is
(the longest head of its prompt token IDs shared by the kind of prompts it belongs to, its prompt-length
bucket), and a diagnostic compares only the families both sides served.

The head: of HEADS (64, 32, 16, 8 token IDs), the longest that at least MIN_SHARED requests of the
same model and workload share *with at least two different prompts behind it*: a system prompt, a
chat template's preamble, a few-shot header. A head shared only by copies of one prompt is that
prompt, not a kind of prompt (a repeated prompt alone would make a family of its own, where its
tokens cannot differ), and prompts that share no head with others form one family per length bucket
("unshared"). The family comes from token IDs, so a replica whose tokenizer differs puts the same
texts in other families: a tokenizer is judged on the same text (diagnostics.tokenizer),
never on a distribution difference.
"""

from __future__ import annotations

from diagnostics.request_strata import PROMPT_BUCKET

HEADS = (64, 32, 16, 8)  # token IDs, longest first
MIN_SHARED = 5  # requests (over all replicas) that share a head for it to name a family
UNSHARED = "unshared"

# the columns with_family reads from its source (qualified `t.`, as requests_in takes them)
COLUMNS = ("t.model_name AS model_name, t.workload AS workload, t.prompt_token_ids AS prompt_token_ids, "
           "t.prompt_ids_hash AS prompt_ids_hash, t.prompt_tokens AS prompt_tokens")


def with_family(source: str) -> str:
    """`source` (a subquery with COLUMNS' columns among its own) with a String column `family` added."""
    heads = "".join(f", cityHash64(arraySlice(prompt_token_ids, 1, {k})) AS _h{k}" for k in HEADS)
    # "two different prompts" as min != max of their hashes: the same answer as uniq() >= 2 at a
    # fraction of the window's cost
    shared = "".join(f", count() OVER w{k} AS _n{k}, min(prompt_ids_hash) OVER w{k} != max(prompt_ids_hash) "
                     f"OVER w{k} AS _d{k}" for k in HEADS)
    windows = (" WINDOW " + ", ".join(f"w{k} AS (PARTITION BY model_name, workload, _h{k})" for k in HEADS)
               if HEADS else "")
    head = f"'{UNSHARED}'"
    for k in reversed(HEADS):  # the longest head that qualifies
        head = f"if(_n{k} >= {MIN_SHARED} AND _d{k}, concat('head{k}:', hex(_h{k})), {head})"
    bucket = PROMPT_BUCKET.replace("t.prompt_tokens", "prompt_tokens")
    return (f"(SELECT *, concat({head}, '|', {bucket}) AS family "
            f"FROM (SELECT *{shared} FROM (SELECT *{heads} FROM {source}){windows}))")
