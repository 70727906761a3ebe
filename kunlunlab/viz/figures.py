"""Figures: built from plain records so notebooks only pass results through."""
from __future__ import annotations

import math
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


def export_figure(fig: go.Figure, path: str | Path) -> Path:
    """Writes ``fig`` to ``path`` by its suffix: ``.html`` (plotly.js inline, opens offline) or a static image
    (``.png``/``.svg``/``.pdf``, for the README), which plotly renders through kaleido and a Chrome/Chromium
    (``BROWSER_PATH``); both are optional, so a missing one is a clear error, not a stack trace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".html":
        fig.write_html(path, include_plotlyjs=True)
        return path
    try:
        import kaleido  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"writing {path.name} needs kaleido (pip install kaleido) and a Chrome/Chromium "
                           "(e.g. apt-get install chromium; BROWSER_PATH=/usr/bin/chromium); "
                           "or write .html") from err
    fig.write_image(path, width=900, height=560, scale=2)
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


def pareto_figure(rows: Sequence[dict], k: int = 10, target: float = 0.95, subtitle: str = "") -> go.Figure:
    """Recall@k against ms/query for every family and setting of a Pareto sweep (one query at a time);
    marker size grows with RAM bytes per vector; the dotted line is the ``target`` recall."""
    key = f"recall_at_{k}"
    fig = go.Figure()
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = sorted((r for r in rows if r["family"] == family), key=lambda r: r["ms"])
        fig.add_trace(go.Scatter(
            x=[r["ms"] for r in mine], y=[r[key] for r in mine], mode="markers", name=family,
            marker={"size": [6 + 2 * math.log2(max(r["bytes_per_vector"], 1)) for r in mine], "opacity": 0.75},
            text=[f"{r['setting']}<br>{r['bytes_per_vector']:.0f} B/vector in RAM" for r in mine],
            hovertemplate="%{text}<br>%{x:.3f} ms, recall %{y:.3f}"))
    fig.add_hline(y=target, line_dash="dot", annotation_text=f"recall@{k} = {target}")
    fig.update_layout(title=f"Pareto sweep: recall@{k} vs latency (marker size: RAM per vector)"
                      + (f"<br><sup>{subtitle}</sup>" if subtitle else ""),
                      xaxis_title="ms per query (log)", yaxis_title=f"recall@{k} vs exact", xaxis_type="log",
                      template="plotly_white")
    return fig
