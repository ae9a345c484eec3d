"""The dashboard's building blocks: visible text, token diff, flame graph tree, settings, SQL rules."""

from __future__ import annotations

import re

import pytest

from dashboards import queries, settings
from dashboards.flamegraph import tree
from dashboards.tokendiff import diff_html, diff_ops
from dashboards.tokens import load_tokenizer, token_frame, visible
from evals.stats import first_divergence


def test_visible_makes_whitespace_and_invisible_characters_visible():
    assert visible("a b\nc\td\re") == "a·b⏎c⇥d␍e"
    assert visible("x\u200by") == "x\\u200by"  # zero-width space
    assert visible("\u00a0\u2028\x00\ufeff") == "\\u00a0\\u2028\\u0000\\ufeff"
    assert visible("café 日本 🚀") == "café·日本·🚀"


def test_decoder_round_trips_real_token_ids(tokenizer_dir):
    from tokenizers import Tokenizer

    text = "  hello\n\tworld"
    ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    decoder = load_tokenizer(str(tokenizer_dir))
    assert decoder.decode(ids, skip_special_tokens=False) == text
    assert "".join(decoder.piece(i) for i in ids) == text
    frame = token_frame(ids, decoder, times=[0.1 * k for k in range(len(ids))])
    assert list(frame["id"]) == ids
    assert "".join(frame["token"]) == visible(text)
    assert frame["gap (ms)"].iloc[1] == pytest.approx(100.0)
    assert decoder.piece(10**7) == "<out of vocabulary: 10000000>"


def test_token_frame_without_a_tokenizer_shows_ids_only():
    frame = token_frame([5, 6, 7])
    assert list(frame.columns) == ["position", "id"]


def test_token_diff():
    a, b = [1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6]
    assert first_divergence(a, b) == 2
    assert first_divergence(a, a) is None
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert diff_ops(a, b) == [("equal", [1, 2], [1, 2]), ("replace", [3], [9]),
                              ("equal", [4, 5], [4, 5]), ("insert", [], [6])]
    html = diff_html([1, 2], [1, 3])
    assert "line-through" in html and "#dfd" in html
    assert "&lt;" in diff_html([60], [60], decoder=type("D", (), {"pieces": lambda self, ids: ["<"] * len(ids)})())


def test_flame_graph_tree_has_inclusive_counts():
    ids, labels, parents, values = tree([("a;b;c", 3), ("a;b", 2), ("a;d", 5), ("", 7), ("x", 0)])
    node = dict(zip(ids, values))
    assert node["all"] == 10 and node["all;a"] == 10 and node["all;a;b"] == 5 and node["all;a;b;c"] == 3
    assert dict(zip(ids, parents))["all;a;d"] == "all;a"
    assert labels[ids.index("all;a;d")] == "d"


def test_settings_from_env():
    s = settings.from_env({settings.STORE_ENV: "http://u:p@h:1/db",
                           settings.TOKENIZERS_ENV: '{"m1": "/t1", "*": "/t0"}'})
    assert s.store == "http://u:p@h:1/db"
    assert s.tokenizer_dir("m1") == "/t1" and s.tokenizer_dir("other") == "/t0"
    assert settings.from_env({}).tokenizer_dir("m") is None
    assert settings.from_env(settings.to_env(s)) == s
    with pytest.raises(ValueError, match="not JSON"):
        settings.from_env({settings.TOKENIZERS_ENV: "{nope"})


def test_every_query_binds_parameters_and_has_a_limit():
    statements = {k: v for k, v in vars(queries).items() if k.isupper() and not k.startswith("_") and isinstance(v, str)
                  and v.lstrip().startswith(("SELECT", "WITH"))}
    statements.update({f"SEARCH_REQUESTS[{k}]": v for k, v in queries.SEARCH_REQUESTS.items()})
    assert len(statements) > 25
    from dashboards.data import ALLOWED_SQL

    assert set(statements.values()) == ALLOWED_SQL
    for name, sql in statements.items():
        # no Python placeholders left; every parameter is typed ClickHouse binding
        assert not re.search(r"\{[a-z_]+\}", sql), name
        assert "%s" not in sql and "%(" not in sql, name
        aggregated_to_one_row = "GROUP BY" not in sql and re.search(r"\b(count|sum|argMax|groupUniqArray)\(", sql)
        assert "LIMIT" in sql or aggregated_to_one_row, f"{name} has no LIMIT"


def test_data_refuses_sql_that_is_not_in_queries():
    from dashboards import data

    with pytest.raises(ValueError, match="only the statements"):
        data.query("SELECT * FROM requests")


# -- findings' evidence and the tables' empty cells ------------------------------------------------

def test_each_kind_gets_its_family_and_an_unknown_kind_the_table():
    from dashboards.evidence import LAGGING, REGRESSION, TABLE, TOKENS, family

    assert family("lagging_replica") == family("slow_steps") == LAGGING
    assert family("tokenizer_divergence") == family("batch_variance") == family("chat_template_mismatch") == TOKENS
    assert family("regression") == family("latency_change_point") == REGRESSION
    assert family("spec_acceptance_drop") == family("sampled_logprob_shift") == TABLE
    assert family("a_kind_added_tomorrow", {"n": 3}) == TABLE
    assert family("throughput_change_point") == REGRESSION  # a new change-point kind, by its name
    # a new kind whose evidence holds two token sequences gets the token view
    assert family("new_drift", {"examples": [{"a_token_ids": [1, 2], "b_token_ids": [1, 3]}]}) == TOKENS


def test_token_pairs_are_found_at_any_depth_and_diverge_where_the_ids_do():
    from dashboards.evidence import single_token_lists, token_pairs

    evidence = {"model_name": "m", "r0_token_ids": [1, 2, 3], "r2_token_ids": [1, 2, 4], "first_divergence": 0,
                "examples": [{"probe_id": "p1", "replica_token_ids": [5, 6], "reference_token_ids": [5, 6, 7],
                              "prompt_token_ids": [9, 9],
                              "prompt_divergence": {"replica_token_ids": [9], "reference_token_ids": [8]}}]}
    pairs = {p.path: p for p in token_pairs(evidence)}
    assert set(pairs) == {"evidence", "examples[0]", "examples[0].prompt_divergence"}
    assert pairs["evidence"].first_divergence == 2  # the IDs' own, not a number written beside them
    assert pairs["examples[0]"].names == ("replica", "reference") and pairs["examples[0]"].first_divergence == 2
    assert pairs["examples[0]"].context == {"probe_id": "p1"}
    assert pairs["examples[0].prompt_divergence"].first_divergence == 0
    assert single_token_lists(evidence) == [("examples[0].prompt_token_ids", [9, 9])]


def test_missing_values_show_as_a_dash_never_none():
    import math

    import numpy as np
    import pandas as pd

    from dashboards.evidence import numbers, shown
    from dashboards.widgets import displayable

    assert [shown(v) for v in (None, math.nan, pd.NaT, True, 0.5, 1e-9, [0.1, 0.2], ["a", "b"])] == \
        ["-", "-", "-", "yes", "0.5", "1.000e-09", "[0.1, 0.2]", "a, b"]
    assert dict(numbers({"a": {"b": None, "c": 1}, "method": "prose", "examples": [{"x": 1}]})) == \
        {"a.b": "-", "a.c": "1", "examples": "1 entries"}
    full = pd.DataFrame({"x": [1.0, 2.0]})
    assert displayable(full) is full  # nothing missing: the frame itself
    out = displayable(pd.DataFrame({"x": [1.5, np.nan], "y": ["a", None], "w": ["", "b"], "z": [1, 2]}))
    assert out.to_dict("list") == {"x": ["1.5", "-"], "y": ["a", "-"], "w": ["-", "b"], "z": [1, 2]}


def test_an_all_zero_bar_chart_gets_a_zero_based_axis_and_a_note():
    import pandas as pd

    from dashboards import charts

    empty = charts.bars(pd.DataFrame({"t": [1, 2], "preemptions": [0, 0]}), "t", "preemptions", title="Preemptions")
    assert list(empty.layout.yaxis.range) == [0, 1]
    assert [a.text for a in empty.layout.annotations] == ["no preemptions in the window"]
    some = charts.bars(pd.DataFrame({"t": [1, 2], "preemptions": [0, 3]}), "t", "preemptions", title="Preemptions")
    assert some.layout.yaxis.range is None and not some.layout.annotations
    # legends sit above the plot, clear of the x axis title
    assert some.layout.legend.y >= 1 and some.layout.legend.yanchor == "bottom"
