"""The few chart shapes the pages draw, built with plotly.graph_objects directly.

plotly.express spends most of a page's render time regrouping the frame; the data here is
already aggregated by ClickHouse (a few hundred rows), so one trace per series is all it takes.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

# the legend sits above the plot, under the title: below it, it overlapped the x axis title
LAYOUT = {"margin": {"t": 80, "l": 10, "r": 10, "b": 10},
          "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
          "title": {"y": 0.97, "yanchor": "top", "yref": "container"}, "hovermode": "x unified"}


def _figure(traces, title: str, x_title: str, y_title: str, height: int, **layout) -> go.Figure:
    fig = go.Figure(traces)
    fig.update_layout(**{**LAYOUT, **layout})
    fig.update_layout(title_text=title, xaxis_title=x_title, yaxis_title=y_title, height=height)
    return fig


def _empty_note(fig: go.Figure, values, what: str) -> go.Figure:
    """All zero (or nothing): a 0-based axis and a note, not plotly's -1..1 around an invisible zero line."""
    if pd.Series(values, dtype=float).fillna(0).eq(0).all():
        fig.update_yaxes(range=[0, 1])
        fig.add_annotation(text=f"no {what} in the window", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font={"size": 14})
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
    fig = _figure(traces, title, x_title, y_title or y, height, barmode=barmode)
    fig.update_yaxes(rangemode="tozero")
    return _empty_note(fig, frame[y] if y in frame else [], (title or y).lower())


def intervals(labels, values, lows, highs, title: str = "", x_title: str = "", reference: float | None = None,
              height: int | None = None, colors=None, bars=None) -> go.Figure:
    """A point with its interval per label (a forest plot); `reference` draws the no-effect line, `bars`
    (one per label, missing ones left out) a tick where that label's interval had to start to count."""
    values, lows, highs = (pd.Series(list(v), dtype=float) for v in (values, lows, highs))
    names = [str(v) for v in labels]
    traces = [go.Scatter(x=values, y=names, mode="markers", name="estimate",
                         marker={"size": 10, "color": colors},
                         error_x={"type": "data", "symmetric": False, "array": (highs - values).clip(lower=0),
                                  "arrayminus": (values - lows).clip(lower=0)})]
    if bars is not None:
        bar = pd.Series(list(bars), dtype=float)
        keep = bar.notna().to_numpy()
        traces.append(go.Scatter(x=bar[keep], y=[n for n, k in zip(names, keep) if k], mode="markers", name="bar",
                                 marker={"symbol": "line-ns-open", "size": 18, "color": "red",
                                         "line": {"width": 2}}))
    fig = _figure(traces, title, x_title, "", height or 120 + 40 * len(values), showlegend=False,
                  hovermode="closest")
    fig.update_yaxes(autorange="reversed")
    if reference is not None:
        fig.add_vline(x=reference, line_dash="dot", line_color="gray")
    return fig


def distributions(curves: dict[str, tuple[list[float], list[float]]], highlight: str = "", title: str = "",
                  x_title: str = "seconds", height: int = 380) -> go.Figure:
    """Cumulative distributions, one line per name: x the value, y the share of requests at or below it;
    the `highlight`ed one drawn thicker (the replica a finding is about)."""
    traces = [go.Scatter(x=x, y=y, mode="lines", name=name, line={"width": 4 if name == highlight else 1.5})
              for name, (x, y) in curves.items()]
    fig = _figure(traces, title, x_title, "share of requests at or below", height, hovermode="closest")
    fig.update_yaxes(range=[0, 1])
    return fig


def series_with_change(frame: pd.DataFrame, x: str, y: str, change_at=None, title: str = "", y_title: str = "",
                       height: int = 380) -> go.Figure:
    """One series with a vertical line where a change point was found."""
    fig = _figure([go.Scatter(x=frame[x], y=frame[y], mode="lines+markers", name=y)], title, "time (UTC)",
                  y_title or y, height, showlegend=False)
    if change_at is not None:
        fig.add_vline(x=change_at, line_dash="dash", line_color="red")
        fig.add_annotation(x=change_at, y=1, yref="paper", text="change point", showarrow=False,
                           xanchor="left", yanchor="bottom", font={"color": "red"})
    return fig


def stacked_area(frame: pd.DataFrame, x: str, columns: list[str], title: str = "", y_title: str = "",
                 height: int = 380) -> go.Figure:
    traces = [go.Scatter(x=frame[x], y=frame[c], name=c, mode="lines", stackgroup="one") for c in columns]
    return _figure(traces, title, "time (UTC)", y_title, height)


def shares(labels, values, title: str = "", height: int = 260) -> go.Figure:
    """Horizontal bars of each part's share of the total (values are shares in 0..1)."""
    trace = go.Bar(x=list(values), y=list(labels), orientation="h", text=[f"{v:.1%}" for v in values],
                   textposition="auto")
    return _figure([trace], title, "share", "", height, showlegend=False, hovermode="closest")
