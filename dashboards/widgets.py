"""Controls and helpers the pages share: the time window, replica pickers, decoders, timings."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import data, queries, settings
from dashboards.evidence import shown
from dashboards.tokens import load_tokenizer
from engine.core.tokenization import Tokenizer, TokenizerLoadError
from telemetry.contract.derived import QUANTILE_NAMES

WINDOWS = {"last 15 min": 900, "last hour": 3600, "last 6 hours": 6 * 3600, "last 24 hours": 86400,
           "last 7 days": 7 * 86400, "everything": None}
TARGET_POINTS = 120  # time buckets per chart


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    label: str

    @property
    def params(self) -> dict:
        return {"start": self.start, "end": self.end}

    @property
    def bucket_ms(self) -> int:
        """Bucket width that gives about TARGET_POINTS points, rounded to a readable step."""
        raw = (self.end - self.start) * 1000 / TARGET_POINTS
        for step in (10, 50, 100, 250, 500, 1000, 5000, 10_000, 15_000, 30_000, 60_000, 300_000,
                     600_000, 900_000, 1_800_000, 3_600_000, 10_800_000, 21_600_000, 86_400_000):
            if step >= raw:
                return step
        return 86_400_000


def epoch(ts) -> float:
    return pd.Timestamp(ts).timestamp()


def window() -> Window | None:
    """The sidebar's time window, anchored at the newest request in the store (so old data,
    e.g. last week's incident, opens at its own time, not at an empty 'now')."""
    rng = data.query(queries.DATA_RANGE)
    if rng.empty or int(rng.loc[0, "requests"]) == 0:
        return None
    first, last = epoch(rng.loc[0, "first"]), epoch(rng.loc[0, "last"]) + 1e-6
    label = st.sidebar.selectbox("Time window (ending at the newest request)", list(WINDOWS),
                                 index=2, key="window")
    span = WINDOWS[label]
    start = first if span is None else max(first, last - span)
    st.sidebar.caption(f"{pd.Timestamp(start, unit='s', tz='UTC'):%Y-%m-%d %H:%M:%S} → "
                       f"{pd.Timestamp(last, unit='s', tz='UTC'):%Y-%m-%d %H:%M:%S} UTC")
    return Window(start, last, label)


def replicas_frame() -> pd.DataFrame:
    return data.query(queries.REPLICAS_LATEST)


def replica_ids() -> list[str]:
    return sorted(replicas_frame()["replica_id"].tolist())


def pick_replicas(key: str, label: str = "Replicas (none = all)") -> list[str]:
    return st.multiselect(label, replica_ids(), key=key)


def pick_replica(key: str, options: list[str] | None = None) -> str | None:
    options = options if options is not None else replica_ids()
    if not options:
        return None
    return st.selectbox("Replica", options, key=key)


def decoder_for(model_name: str) -> Tokenizer | None:
    """The tokenizer configured for this model (or for every model), None when none is: the
    engine's own Tokenizer, so token strings here are those the engine and the diagnostics use."""
    directory = settings.from_env().tokenizer_dir(model_name)
    if not directory:
        return None
    try:
        return load_tokenizer(directory)
    except (TokenizerLoadError, OSError) as e:  # a wrong path must not take the page down: show IDs only
        st.warning(f"cannot load the tokenizer at {directory}: {e}. Showing token IDs only.")
        return None


@st.cache_resource(show_spinner=False)
def _recorded_tokenizers():
    """The diagnostics' loader of the tokenizer each replica recorded (one per directory, hash-checked)."""
    from diagnostics.replica_tokenizers import TokenizerSource

    return TokenizerSource()


def replica_decoder(replica_id: str, model_name: str, at: float) -> tuple[Tokenizer | None, str]:
    """(tokenizer, "") for what `replica_id` served at `at`, else (None, why not).

    A tokenizer given on the command line (--model / --tokenizer) wins; otherwise the store's
    `replicas` row names the model directory the replica started with and its tokenizer hash, and the
    directory's tokenizer is used when it is on this host and still hashes the same."""
    configured = decoder_for(model_name)
    if configured is not None or settings.from_env().tokenizer_dir(model_name):
        return configured, "" if configured is not None else "the configured tokenizer does not load"
    identity = data.query(queries.REPLICA_IDENTITY_AT, replica_id=replica_id, at=float(at))
    if identity.empty:
        return None, f"the store has no start of replica `{replica_id}`, so no model directory"
    source = _recorded_tokenizers()
    source.problems.pop(replica_id, None)
    tokenizer = source.for_replica(identity.iloc[0].to_dict())
    return tokenizer, "" if tokenizer is not None else source.problems.get(replica_id, "no tokenizer")


SEVERITY_ORDER = ("critical", "warning", "info")


def worst_severity(findings: pd.DataFrame, replica_ids) -> dict[str, str]:
    """{replica: its worst finding's severity} from OPEN_FINDINGS_BY_SUBJECT, over the findings whose subject
    names the replica ("r2", or both of "r0 vs r2"); a replica without findings is absent."""
    out: dict[str, str] = {}
    for row in findings.to_dict("records"):
        severity = "critical" if row["critical"] else "warning" if row["warning"] else "info"
        named = set(re.split(r"[\s,;:()]+", str(row["subject"])))
        for rid in named.intersection(replica_ids):
            if rid not in out or SEVERITY_ORDER.index(severity) < SEVERITY_ORDER.index(out[rid]):
                out[rid] = severity
    return out


def mark_replicas_with_findings(health: pd.DataFrame) -> None:
    """One line above a table of replicas naming those with critical, then warning findings."""
    for severity, say in (("critical", st.error), ("warning", st.warning)):
        named = health.loc[health["worst finding"] == severity, "replica_id"].tolist()
        if named:
            say(f"{severity.capitalize()} findings on {', '.join(named)}: see the Findings page.")


def no_data(what: str) -> None:
    st.info(f"No {what} in the store for this selection yet.")


def window_or_stop() -> Window:
    """The sidebar's window; a page with no requests in the store says so and stops there."""
    chosen = window()
    if chosen is None:
        no_data("requests")
        st.stop()
    return chosen


def expand_quantiles(frame: pd.DataFrame, column: str, names=QUANTILE_NAMES) -> pd.DataFrame:
    """An Array column of quantiles (as ClickHouse returns them) -> one column per quantile."""
    values = frame[column].map(lambda v: list(v) if v is not None and len(v) else [float("nan")] * len(names))
    for i, name in enumerate(names):
        frame[f"{column}_{name}"] = values.map(lambda v, i=i: v[i])
    return frame.drop(columns=[column])


def seconds(value: float) -> str:
    """A duration for a metric tile: "unknown" where its writer could not measure it (nan: a recording
    proxy's queue and prefill, a proxied whole response's TTFT), never a made-up 0."""
    return f"{value:.3f} s" if value == value else "unknown"


def rounded(frame: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """Float columns rounded for display (other columns untouched)."""
    floats = frame.select_dtypes("float").columns
    return frame.round({c: digits for c in floats})


def displayable(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as a table shows it: st.dataframe draws "None" in every missing cell (a Styler's
    na_rep does not reach numeric cells), so each column with a missing or blank value becomes text,
    "-" there and `evidence.shown` elsewhere; complete columns stay as they are (numbers sort)."""
    blank = frame.isna() | frame.apply(lambda c: c.map(lambda v: isinstance(v, str) and not v.strip()))
    if not blank.to_numpy().any():
        return frame
    out = frame.copy()
    for c in frame.columns[blank.any().to_numpy()]:
        out[c] = [("-" if is_blank else shown(list(v) if isinstance(v, np.ndarray) else v))
                  for v, is_blank in zip(frame[c], blank[c])]
    return out


def table(frame: pd.DataFrame, key: str | None, **kwargs) -> None:
    """st.dataframe of `displayable(frame)`, without the index unless asked for."""
    kwargs.setdefault("hide_index", True)
    st.dataframe(displayable(frame), key=key, **kwargs)


def query_timings() -> None:
    """What this page asked the store, and how long each query took (for the curious and for
    anyone chasing a slow page)."""
    timings = data.take_timings()
    with st.expander(f"Queries ({len(timings)})", expanded=False):
        table(pd.DataFrame(timings, columns=["query", "seconds", "rows"]), key=None)
