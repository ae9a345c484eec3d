"""The few chart shapes the pages draw, built with plotly.graph_objects directly.

plotly.express spends most of a page's render time regrouping the frame; the data here is
already aggregated by ClickHouse (a few hundred rows), so one trace per series is all it takes.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

LAYOUT = {"margin": {"t": 40, "l": 10, "r": 10, "b": 10}, "legend": {"orientation": "h", "y": -0.15},
          "hovermode": "x unified"}


def _figure(traces, title: str, x_title: str, y_title: str, height: int, **layout) -> go.Figure:
    fig = go.Figure(traces)
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=height, **{**LAYOUT, **layout})
    return fig


def _groups(frame: pd.DataFrame, color: str | None):
    if color is None:
        yield None, frame
    else:
        for key, group in frame.groupby(color, sort=True):
            yield str(key), group


def lines(frame: pd.DataFrame, x: str, y: str | list[str], color: str | None = None, title: str = "",
          x_title: str = "time (UTC)", y_title: str = "", height: int = 380, y_range=None,
          markers: bool = False) -> go.Figure:
    """One line per `color` group, or one per column of `y` when it is a list."""
    mode = "lines+markers" if markers else "lines"
    columns = y if isinstance(y, list) else [y]
    traces = []
    for name, group in _groups(frame, color):
        for column in columns:
            label = name if len(columns) == 1 and name is not None else (
                column if name is None else f"{name} {column}")
            traces.append(go.Scatter(x=group[x], y=group[column], mode=mode, name=label))
    layout = {"yaxis": {"range": y_range}} if y_range else {}
    return _figure(traces, title, x_title, y_title or (columns[0] if len(columns) == 1 else ""), height, **layout)


def bars(frame: pd.DataFrame, x: str, y: str, color: str | None = None, title: str = "",
         x_title: str = "time (UTC)", y_title: str = "", height: int = 380, barmode: str = "stack") -> go.Figure:
    traces = [go.Bar(x=group[x], y=group[y], name=name or y) for name, group in _groups(frame, color)]
    return _figure(traces, title, x_title, y_title or y, height, barmode=barmode)


def stacked_area(frame: pd.DataFrame, x: str, columns: list[str], title: str = "", y_title: str = "",
                 height: int = 380) -> go.Figure:
    traces = [go.Scatter(x=frame[x], y=frame[c], name=c, mode="lines", stackgroup="one") for c in columns]
    return _figure(traces, title, "time (UTC)", y_title, height)


def shares(labels, values, title: str = "", height: int = 260) -> go.Figure:
    """Horizontal bars of each part's share of the total (values are shares in 0..1)."""
    trace = go.Bar(x=list(values), y=list(labels), orientation="h", text=[f"{v:.1%}" for v in values],
                   textposition="auto")
    return _figure([trace], title, "share", "", height, showlegend=False, hovermode="closest")
