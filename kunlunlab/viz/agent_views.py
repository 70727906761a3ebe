"""Figures and HTML views of the agent: STIE grids, the Table-2-style comparison, a trajectory viewer."""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_STEP_STYLE = {"prefix": "#eef", "model": "#f7f7f7", "result": "#eaf6ea", "feedback": "#fff4e0", "search": "#e8f0fe"}


def stie_heatmaps(x_values: Sequence, y_values: Sequence, em: Sequence[Sequence[float]],
                  rounds: Sequence[Sequence[float]], x_name: str, y_name: str, title: str) -> go.Figure:
    """EM and mean rounds used over a 2-D grid of STIE settings (rows: y, columns: x)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("EM", "rounds used"), horizontal_spacing=0.15)
    labels_x, labels_y = [f"{v:g}" for v in x_values], [f"{v:g}" for v in y_values]
    fig.add_trace(go.Heatmap(z=em, x=labels_x, y=labels_y, colorscale="Viridis", colorbar={"x": 0.43},
                             hovertemplate=f"{x_name}=%{{x}}<br>{y_name}=%{{y}}<br>EM=%{{z:.3f}}"), 1, 1)
    fig.add_trace(go.Heatmap(z=rounds, x=labels_x, y=labels_y, colorscale="Magma", colorbar={"x": 1.0},
                             hovertemplate=f"{x_name}=%{{x}}<br>{y_name}=%{{y}}<br>rounds=%{{z:.2f}}"), 1, 2)
    fig.update_xaxes(title_text=x_name)
    fig.update_yaxes(title_text=y_name)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def results_table(summaries: Sequence[dict], metrics: Sequence[str] = ("em", "lj")) -> tuple[list[str], list[list]]:
    """Rows per method, columns per dataset x metric (the shape of the paper's Table 2): (header, rows)."""
    datasets = list(dict.fromkeys(s["dataset"] for s in summaries))
    methods = list(dict.fromkeys(s["method"] for s in summaries))
    cell = {(s["method"], s["dataset"]): s for s in summaries}
    header = ["method"] + [f"{d} {m.upper()}" for d in datasets for m in metrics] + [f"avg {m.upper()}" for m in metrics]
    rows = []
    for method in methods:
        row, sums = [method], {m: [] for m in metrics}
        for d in datasets:
            for m in metrics:
                v = cell.get((method, d), {}).get(m)
                row.append(None if v is None else round(100 * v, 1))
                if v is not None:
                    sums[m].append(v)
        row += [round(100 * sum(v) / len(v), 1) if v else None for v in sums.values()]
        rows.append(row)
    return header, rows


def table_html(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th style='padding:4px 8px'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='padding:4px 8px;text-align:right'>{'' if v is None else v}</td>"
                                    for v in row) + "</tr>" for row in rows)
    return f"<table style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"


def method_bars(summaries: Sequence[dict], metric: str = "em") -> go.Figure:
    fig = go.Figure()
    for method in dict.fromkeys(s["method"] for s in summaries):
        rows = [s for s in summaries if s["method"] == method]
        fig.add_trace(go.Bar(name=method, x=[s["dataset"] for s in rows], y=[s[metric] for s in rows]))
    fig.update_layout(barmode="group", title=f"{metric.upper()} per dataset and method", yaxis_title=metric.upper(),
                      template="plotly_white")
    return fig


def render_trajectory(record: dict) -> str:
    """A question's think/search/result/answer steps as readable, self-contained HTML."""
    t = record.get("trajectory", {})
    parts = [f"<h3>{html.escape(record.get('question', ''))}</h3>",
             f"<p><b>gold:</b> {html.escape(' | '.join(record.get('golds', [])))} &nbsp; "
             f"<b>prediction:</b> {html.escape(str(record.get('prediction')))} &nbsp; "
             f"<b>EM</b> {record.get('em')} &nbsp; <b>searches</b> {record.get('searches')}</p>"]
    if t.get("rdra"):
        parts.append(f"<details><summary>RDRA background (plan + documents)</summary><pre>"
                     f"{html.escape(t['rdra']['background'])}</pre></details>")
    for step in t.get("steps", []):
        kind = step.get("kind", "model")
        parts.append(f"<div style='background:{_STEP_STYLE.get(kind, '#fff')};padding:6px;margin:4px 0;"
                     f"border-radius:4px'><small>{kind}</small><pre style='white-space:pre-wrap;margin:0'>"
                     f"{html.escape(step.get('text', ''))}</pre></div>")
    for i, r in enumerate(t.get("rounds", [])):
        parts.append(f"<p><small>round {i + 1}: answer {html.escape(str(r.get('answer')))}, "
                     f"confidence {r.get('confidence', 0):.3f}</small></p>")
    if t.get("issues"):
        parts.append(f"<p><small>protocol issues: {html.escape(', '.join(t['issues']))}</small></p>")
    return "<div style='font-family:sans-serif;max-width:900px'>" + "".join(parts) + "</div>"
