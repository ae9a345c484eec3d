"""Reading a finding's evidence (the JSON a diagnostic wrote) into what a page shows; no Streamlit here.

- `family(kind)`: which view a finding kind gets (lagging, tokens, regression, else table). Kinds are
  matched by name and, for kinds nobody listed yet, by what their name says; an unknown kind gets the
  table, so a new diagnostic's findings always render.
- `token_pairs(evidence)`: every pair of token-ID sequences the evidence carries, found by shape: a dict
  with two `<side>_token_ids` lists (what `diagnostics.token_evidence.divergence` writes), at any depth
  (`examples[0]`, `examples[0].prompt_divergence` ...), with where they first diverge.
- `numbers(evidence)`: the evidence flattened to (field, value) rows, long prose kept apart.
- `shown(value)`: one cell's text; missing values are "-", never "None".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evals.stats import first_divergence

LAGGING, TOKENS, REGRESSION, TABLE = "lagging", "tokens", "regression", "table"
INSUFFICIENT = "insufficient_data"  # diagnostics.findings.INSUFFICIENT: the evidence's status of a "cannot decide"
FAMILIES = {
    LAGGING: {"lagging_replica", "slow_steps", "host_overhead_outlier"},
    TOKENS: {"tokenizer_divergence", "tokenizer_divergence_tie", "tokenizer_divergence_unconfirmed",
             "output_drift", "probe_drift", "probe_nondeterminism", "batch_variance", "chat_template_mismatch",
             "quality_drift", "quality_unchanged", "stream_decode_mismatch", "double_bos",
             "special_tokens_from_text", "token_out_of_vocab", "token_without_text"},
    REGRESSION: {"regression", "improvement", "latency_change_point", "latency_creep"},
}
# prose fields (how it was tested, what was controlled for): shown as text, not as table cells
PROSE = ("method", "test", "tests", "controlled_for", "correction", "rule", "severity_rule", "note", "reason",
         "confirmation", "chat_method")
MAX_ROWS = 200  # a table of numbers, not a dump


def family(kind: str, evidence: dict | None = None) -> str:
    for name, kinds in FAMILIES.items():
        if kind in kinds:
            return name
    if kind.endswith(("_change_point", "_creep")):
        return REGRESSION
    if evidence and token_pairs(evidence):  # a new kind whose evidence has two token sequences
        return TOKENS
    return TABLE


@dataclass(frozen=True)
class TokenPair:
    path: str  # where in the evidence, e.g. "examples[0]"
    names: tuple[str, str]  # the two sides, e.g. ("replica", "reference")
    ids: tuple[list[int], list[int]]
    first_divergence: int | None
    texts: tuple[str | None, str | None]  # decoded by the diagnostic, when it had the tokenizer
    context: dict  # the pair's other scalar fields (probe id, scores, reference replica ...)


def _int_list(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _pair(obj: dict, path: str) -> TokenPair | None:
    sides = [k[: -len("_token_ids")] for k, v in obj.items() if k.endswith("_token_ids") and _int_list(v)
             and k != "prompt_token_ids"]
    if len(sides) < 2:
        return None
    a, b = sides[:2]
    ids = (list(obj[f"{a}_token_ids"]), list(obj[f"{b}_token_ids"]))
    pos = first_divergence(*ids)  # from the IDs themselves (the definition the diagnostics use)
    context = {k: v for k, v in obj.items() if isinstance(v, (str, int, float, bool)) and not isinstance(v, dict)
               and not k.endswith(("_text", "_text_from_divergence")) and k not in ("first_divergence", "identical")}
    return TokenPair(path, (a, b), ids, pos, (obj.get(f"{a}_text"), obj.get(f"{b}_text")), context)


def token_pairs(evidence, path: str = "") -> list[TokenPair]:
    """Every two-sided token-ID pair in the evidence, depth first (top level first)."""
    out = []
    if isinstance(evidence, dict):
        found = _pair(evidence, path or "evidence")
        if found:
            out.append(found)
        for k, v in evidence.items():
            if isinstance(v, (dict, list)):
                out += token_pairs(v, f"{path}.{k}" if path else k)
    elif isinstance(evidence, list):
        for i, v in enumerate(evidence):
            if isinstance(v, (dict, list)):
                out += token_pairs(v, f"{path}[{i}]")
    return out


def single_token_lists(evidence, path: str = "") -> list[tuple[str, list[int]]]:
    """(path, ids) for token-ID lists that are not one side of a pair (a prompt, an example's IDs)."""
    out = []
    if isinstance(evidence, dict):
        paired = _pair(evidence, path) is not None
        for k, v in evidence.items():
            p = f"{path}.{k}" if path else k
            if _int_list(v) and v and ("token" in k or k.endswith("ids")) and not (paired and k.endswith("_token_ids")
                                                                                   and k != "prompt_token_ids"):
                out.append((p, list(v)))
            elif isinstance(v, (dict, list)):
                out += single_token_lists(v, p)
    elif isinstance(evidence, list):
        for i, v in enumerate(evidence):
            out += single_token_lists(v, f"{path}[{i}]")
    return out


def missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    try:  # pandas' NA / NaT
        import pandas as pd

        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover
        return False


def shown(value, digits: int = 4) -> str:
    """One value as a cell's text: "-" when missing, numbers rounded, lists joined."""
    if missing(value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.{digits - 1}e}"
        return f"{round(value, digits):g}"
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            return f"[{shown(value[0], digits)}, {shown(value[1], digits)}]"  # an interval
        return ", ".join(shown(v, digits) for v in value)
    return str(value)


def numbers(evidence: dict, prefix: str = "") -> list[tuple[str, str]]:
    """(field, value) rows: nested dicts dotted, lists of scalars joined, lists of records counted
    (their contents are the views' business), prose left out (see `prose`)."""
    rows = []
    for k, v in evidence.items():
        key = f"{prefix}{k}"
        if not prefix and k in PROSE or k == "scope_key":
            continue
        if isinstance(v, dict):
            rows += numbers(v, f"{key}.") if v else [(key, "-")]
        elif isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
            rows.append((key, f"{len(v)} entries"))
        else:
            rows.append((key, shown(v)))
        if len(rows) >= MAX_ROWS:
            break
    return rows[:MAX_ROWS]


def prose(evidence: dict) -> list[tuple[str, str]]:
    return [(k, shown(evidence[k])) for k in PROSE if k in evidence and not missing(evidence[k])]


def records(evidence: dict) -> list[tuple[str, list[dict]]]:
    """Top-level lists of flat records (strata, levels, identity differences ...), for a table each."""
    out = []
    for k, v in evidence.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out.append((k, [{f: shown(x) if not isinstance(x, dict) else shown(str(x)) for f, x in r.items()
                             if not (isinstance(x, list) and len(x) > 8)} for r in v[:MAX_ROWS]]))
    return out
