"""A flame graph (plotly icicle) of py-spy folded stacks ("a;b;c" -> samples)."""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

ROOT = "all"


def tree(stacks: Iterable[tuple[str, int]]) -> tuple[list[str], list[str], list[str], list[int]]:
    """(ids, labels, parents, values) with inclusive sample counts for every stack prefix."""
    values: dict[str, int] = {ROOT: 0}
    parents: dict[str, str] = {ROOT: ""}
    labels: dict[str, str] = {ROOT: ROOT}
    for stack, samples in stacks:
        samples = int(samples)
        if samples <= 0 or not stack:
            continue
        values[ROOT] += samples
        node = ROOT
        for frame in stack.split(";"):
            child = f"{node};{frame}"
            if child not in values:
                values[child], parents[child], labels[child] = 0, node, frame
            values[child] += samples
            node = child
    ids = list(values)
    return ids, [labels[i] for i in ids], [parents[i] for i in ids], [values[i] for i in ids]


def figure(stacks: Iterable[tuple[str, int]], max_depth: int = 30) -> go.Figure:
    ids, labels, parents, values = tree(stacks)
    fig = go.Figure(go.Icicle(ids=ids, labels=labels, parents=parents, values=values,
                              branchvalues="total", maxdepth=max_depth, tiling={"orientation": "v", "flip": "y"},
                              hovertemplate="%{label}<br>%{value} samples (%{percentRoot:.1%})<extra></extra>"))
    fig.update_layout(margin={"t": 10, "l": 0, "r": 0, "b": 0}, height=600)
    return fig
