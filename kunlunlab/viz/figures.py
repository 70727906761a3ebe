"""Figures: built from plain records so notebooks only pass results through."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go


def save_figure(fig: go.Figure, run_dir: str | Path | None, name: str) -> Path | None:
    """Writes ``name.html`` (plotly.js shared once per folder, so it opens offline)."""
    if run_dir is None:
        return None
    path = Path(run_dir) / f"{name}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs="directory")
    return path


def recall_latency_figure(points: Sequence, reference: dict[str, tuple[float, float]] | None = None,
                          k: int = 10) -> go.Figure:
    """Recall@k against ms/query, one line per index; ``reference`` adds single points (name -> (ms, recall))."""
    fig = go.Figure()
    for name in dict.fromkeys(p.index for p in points):
        series = [p for p in points if p.index == name]
        fig.add_trace(go.Scatter(
            x=[p.ms_per_query for p in series], y=[p.recall_at_k for p in series], mode="lines+markers", name=name,
            text=[f"{p.knob}={p.value:g}" for p in series], hovertemplate="%{text}<br>%{x:.3f} ms, recall %{y:.3f}"))
    for name, (ms, recall) in (reference or {}).items():
        fig.add_trace(go.Scatter(x=[ms], y=[recall], mode="markers", name=name, marker={"size": 12, "symbol": "star"}))
    fig.update_layout(title=f"Recall@{k} vs latency (one query at a time)", xaxis_title="ms per query (log)",
                      yaxis_title=f"recall@{k} vs exact", xaxis_type="log", template="plotly_white")
    return fig


def memory_figure(bytes_per_vector: dict[str, float]) -> go.Figure:
    names = list(bytes_per_vector)
    fig = go.Figure(go.Bar(x=names, y=[bytes_per_vector[n] for n in names],
                           text=[f"{bytes_per_vector[n]:.0f}" for n in names], textposition="outside"))
    fig.update_layout(title="Memory per vector", yaxis_title="bytes per vector", template="plotly_white")
    return fig
