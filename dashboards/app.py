"""The infersight debugging dashboard (Streamlit). Start it with `infersight dashboard --store ...`.

One page per question: which replica is unwell (Fleet), what happened to this request
(Requests), is B worse than A (Compare), is the GPU waiting on the host (Scheduler), is
the KV cache the bottleneck (KV cache), did answers change (Evals), what did the
diagnostics conclude (Findings), where does the time go (Profiles).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboards import data, settings
from telemetry.store import StoreUnavailableError

# One file per page. The folder is not called `pages/`: Streamlit would take a `pages/` folder
# beside this script for an old-style multipage app, and a fresh server whose first request is
# for a page (not this entry script) would then stay in that mode, bypassing this navigation.
VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="infersight", page_icon=":material/monitoring:", layout="wide")

navigation = st.navigation([
    st.Page(VIEWS / "fleet.py", title="Fleet", icon=":material/dns:", default=True),
    st.Page(VIEWS / "requests.py", title="Requests", icon=":material/search:"),
    st.Page(VIEWS / "compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page(VIEWS / "scheduler.py", title="Scheduler", icon=":material/timeline:"),
    st.Page(VIEWS / "kv_cache.py", title="KV cache", icon=":material/memory:"),
    st.Page(VIEWS / "evals.py", title="Evals", icon=":material/science:"),
    st.Page(VIEWS / "findings.py", title="Findings", icon=":material/flag:"),
    st.Page(VIEWS / "profiles.py", title="Profiles", icon=":material/local_fire_department:"),
])

st.sidebar.markdown("**infersight**")
try:
    target = getattr(data.store(), "target", "") or settings.from_env().store
except Exception as e:  # a wrong --store: say so on every page instead of a traceback
    st.error(f"Cannot open the store: {e}")
    st.stop()
st.sidebar.caption(f"store: `{target.split('@')[-1]}`")  # never show credentials

try:
    navigation.run()
except StoreUnavailableError as e:  # the store went away while the page read it: say so, not a traceback
    st.error(f"Cannot read the store: {e}. The page shows its data again once the store is back (reload).")
