"""Views for notebooks 01-03: inside the clustering retriever, the mixed training data, the reward read-out.

Every function takes plain records (or the package's own objects) and returns an HTML string or a plotly
figure, so a notebook cell is a call and a ``display``; what they compute is reachable by the tests.
"""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np
import plotly.graph_objects as go

from kunlunlab.studies.reward_cases import REWARD_CASES, case_rows
from kunlunlab.training.rewards import RewardConfig, parse_completion
from kunlunlab.viz.training_views import reward_table_html

# ---------------------------------------------------------------------------- shared
_CELL = "padding:3px 8px;border-bottom:1px solid #ddd"


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:.3f}".rstrip("0").rstrip(".")
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    head = "".join(f"<th style='{_CELL};text-align:left'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{_fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"


# ---------------------------------------------------------------------------- notebook 01: indexes
def index_rows_html(rows: Sequence) -> str:
    """The rows of :func:`~kunlunlab.retrieval.evaluation.compare_indexes` as a table (one line per setting)."""
    return _table(["index", "setting", "ms / query", "recall@k vs exact", "RAM bytes / vector", "disk bytes / vector"],
                  [[r.index, f"{r.knob}={r.value:g}" if r.knob else "default", r.ms_per_query, r.recall_at_k,
                    round(r.bytes_per_vector, 1), round(r.disk_bytes_per_vector, 1)] for r in rows])


def cluster_allocation_figure(rows: Sequence[dict], title: str = "One query's cluster quotas") -> go.Figure:
    """Quota ``q_c = p_c·B`` of each considered cluster (nearest centroid first, log scale), scanned clusters
    in colour, with the line ``q_c = 1`` above which a cluster is always scanned. ``rows``: the output of
    :func:`~kunlunlab.retrieval.evaluation.cluster_allocation`."""
    fig = go.Figure()
    labels = [f"#{r['rank']} (c{r['cluster']})" for r in rows]
    for scanned, name, color in ((True, "scanned", "#1f77b4"), (False, "not scanned", "#c7c7c7")):
        pick = [i for i, r in enumerate(rows) if r["scanned"] == scanned]
        fig.add_trace(go.Bar(
            x=[labels[i] for i in pick], y=[rows[i]["quota"] for i in pick], name=name, marker_color=color,
            customdata=[[rows[i]["score"], rows[i]["weight"], rows[i]["probability"], rows[i]["cap"], rows[i]["size"]]
                        for i in pick],
            hovertemplate="%{x}<br>q_c=%{y:.3g}<br>s_c=%{customdata[0]:.3f}, w_c=%{customdata[1]:.2f}"
                          "<br>p_c=%{customdata[2]:.3g}, cap %{customdata[3]}, size %{customdata[4]}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="q_c = 1", annotation_position="top right")
    fig.update_layout(title=title, xaxis_title="considered cluster (nearest centroid first)",
                      yaxis_title="quota q_c = p_c·B (log)", yaxis_type="log", template="plotly_white",
                      xaxis={"categoryorder": "array", "categoryarray": labels})
    return fig


def cluster_weights_figure(weights: np.ndarray, bounds: tuple[float, float]) -> go.Figure:
    """Every cluster's EMA weight ``w_c``, sorted, on a log axis between its bounds ``[1/ρ, ρ]``."""
    w = np.sort(np.asarray(weights, dtype=float))[::-1]
    fig = go.Figure(go.Scatter(x=np.arange(len(w)), y=w, mode="lines", name="w_c"))
    for y, text in ((bounds[0], "1/ρ"), (1.0, "neutral"), (bounds[1], "ρ")):
        fig.add_hline(y=y, line_dash="dot", annotation_text=text, annotation_position="right")
    fig.update_layout(title="EMA cluster weights after warm-up", xaxis_title="clusters, by weight",
                      yaxis_title="w_c (log)", yaxis_type="log", template="plotly_white", showlegend=False)
    return fig


# ---------------------------------------------------------------------------- notebook 02: the mixed data
_SEGMENT_STYLE = {"prompt": "#eef", "trained": "#f7f7f7", "masked": "#fde8e8", "result": "#eaf6ea",
                  "feedback": "#fff4e0"}
_SEGMENT_LABEL = {"prompt": "assistant prefix (prompt, not in the loss)", "trained": "model turn (in the loss)",
                  "masked": "model turn kept out of the loss", "result": "retrieved result (masked)",
                  "feedback": "STIE feedback (masked)"}


def segment_kind(segment: dict) -> str:
    """How a trajectory segment is shown: ``trained``, ``masked`` (a model turn out of the loss),
    ``result`` or ``feedback`` (environment text, never in the loss)."""
    if segment["role"] == "env":
        return "feedback" if segment.get("feedback") else "result"
    return "trained" if segment["train"] else "masked"


def mask_legend_html() -> str:
    return "<p>" + " ".join(f"<span style='background:{_SEGMENT_STYLE[k]};padding:1px 6px;margin-right:4px'>"
                            f"{html.escape(v)}</span>" for k, v in _SEGMENT_LABEL.items()) + "</p>"


def mixed_trajectory_html(t, title: str | None = None, legend: bool = False) -> str:
    """A :class:`~kunlunlab.training.mixing.TrajectoryExample` as the SFT step sees it: the prompt's
    background (if any), then every segment coloured by whether it is in the loss."""
    noise = ", ".join(t.noise) or "none"
    head = (f"<p>{'<b>' + html.escape(title) + '</b><br>' if title else ''}"
            f"<b>{html.escape(t.quality)}</b> · {html.escape(t.source)} ({html.escape(str(t.qtype))})"
            f" · epoch {t.epoch}"
            f" · noise: {html.escape(noise)}{' · first turn only' if t.partial else ''}<br>"
            f"<b>Q:</b> {html.escape(t.question)} &nbsp; <b>gold:</b> {html.escape(' | '.join(t.answers))}</p>")
    parts = [head]
    if t.prompt_messages:
        shown = "\n\n".join(f"[{m['role']}] {m['content']}" for m in t.prompt_messages)
        parts.append(f"<details><summary>prompt</summary><pre style='white-space:pre-wrap'>"
                     f"{html.escape(shown)}</pre></details>")
    if t.background:
        parts.append(f"<details><summary>background block in the prompt</summary>"
                     f"<pre style='white-space:pre-wrap'>{html.escape(t.background)}</pre></details>")
    blocks = ([("prompt", t.prefix)] if t.prefix else []) + [(segment_kind(s), s["text"]) for s in t.segments]
    for kind, text in blocks:
        parts.append(f"<pre title='{_SEGMENT_LABEL[kind]}' data-kind='{kind}' style='background:{_SEGMENT_STYLE[kind]};"
                     f"margin:0;padding:2px 4px;white-space:pre-wrap'>{html.escape(text)}</pre>")
    if legend:
        parts.append(mask_legend_html())
    return "".join(parts)


def example_trajectories(trajectories: Sequence) -> dict[str, object]:
    """One example of each kind the mix holds, in a fixed order: high quality (per source), each noise kind
    (a trajectory with that noise alone when there is one), first-turn and plan samples."""
    found: dict[str, object] = {}

    def label(t) -> list[str]:
        if t.kind == "plan":
            return ["plan sample"]
        if t.partial:
            return ["first turn only"]
        if t.quality == "hq":
            return [f"high quality ({t.source})"]
        return [f"noisy: {kind}" for kind in t.noise]

    for sole in (True, False):  # prefer a trajectory whose only noise is the one shown
        for t in trajectories:
            names = label(t)
            if sole and len(names) > 1:
                continue
            for name in names:
                found.setdefault(name, t)
    order = ["high quality (world)", "high quality (hotpotqa)", "noisy: distractor", "noisy: wrong_hop",
             "noisy: background", "noisy: stie_correction", "first turn only", "plan sample"]
    return {k: found[k] for k in sorted(found, key=lambda k: order.index(k) if k in order else len(order))}


def schedule_table_html(rows: Sequence[dict]) -> str:
    """The rows of :func:`~kunlunlab.training.mixing.schedule`: per epoch, the shares and the sample counts."""
    return _table(["epoch", "p_hq(e)", "high-quality samples", "noisy share", "noisy samples", "noise ratio ρ(e)"],
                  [[r["epoch"], round(r["hq_share"], 3), r["n_hq"], round(1 - r["hq_share"], 3), r["n_noisy"],
                    round(r["noise_ratio"], 3)] for r in rows])


def mixing_summary(stats: Sequence[dict]) -> dict:
    """What the mix contains, from :func:`~kunlunlab.training.mixing.data_stats` rows: the count per epoch of
    each quality and noise kind (``"noise:<kinds>"``), the sources, first-turn samples, the mean length per
    quality (``mean_tokens`` when the rows carry tokens, else ``mean_chars``) and the mean searches."""
    per_epoch: dict[str, Counter] = {}
    for r in sorted(stats, key=lambda r: r["epoch"]):
        c = per_epoch.setdefault(str(r["epoch"]), Counter())
        c[r["quality"]] += 1
        c["noise:" + r["noise"]] += 1
    unit = "tokens" if stats and all("tokens" in r for r in stats) else "chars"
    mean_length = {}
    for quality in ("hq", "noisy"):
        values = [r[unit] for r in stats if r["quality"] == quality]
        mean_length[quality] = round(sum(values) / len(values), 1) if values else 0.0
    return {"trajectories": len(stats), "per_epoch": {e: dict(c) for e, c in per_epoch.items()},
            "sources": dict(Counter(r["source"] for r in stats)),
            "first_turn_samples": sum(1 for r in stats if r.get("partial")),
            f"mean_{unit}": mean_length,
            "mean_searches": round(sum(r["searches"] for r in stats) / len(stats), 2) if stats else 0.0}


def epoch_table_html(per_epoch: dict[str, dict]) -> str:
    """``mixing_summary(...)["per_epoch"]`` as a table: one row per epoch, a column per quality and noise kind."""
    columns = ["hq", "noisy"] + sorted({k for c in per_epoch.values() for k in c if k.startswith("noise:")})
    return _table(["epoch"] + [c.replace("noise:", "noise: ") for c in columns],
                  [[e] + [c.get(k, 0) for k in columns] for e, c in per_epoch.items()])


# ---------------------------------------------------------------------------- notebook 03: rewards
def reward_explanation_html(text: str, golds: str | Sequence[str], cfg=None, model_tokens: int | None = None) -> str:
    """The reward explorer's read-out for one response: the component table of eqs. 17-18 and what the
    parser read (answer, mode, protocol issues, searches). ``golds``: a list, or aliases joined by ``|``."""
    if isinstance(golds, str):
        golds = [g.strip() for g in golds.split("|") if g.strip()]
    record = parse_completion(text, model_tokens=model_tokens)
    rows = case_rows([{"name": "your response", "text": text, "golds": list(golds), "model_tokens": model_tokens}], cfg)
    issues = ", ".join(record.issues) or "none"
    return (reward_table_html(rows) + f"<p>answer: <code>{html.escape(repr(record.answer))}</code>, mode: "
            f"{html.escape(str(record.mode))}, issues: {html.escape(issues)}, searches: {record.n_searches}</p>")


def reward_rankings(settings: dict[str, dict], cfg=None, cases: Sequence[dict] | None = None) -> dict[str, list[str]]:
    """For each named set of weight overrides (``{"format-heavy": {"w_format": 1.5}}``), the case names from
    the highest total reward to the lowest (ties keep the cases' order)."""
    base = cfg or RewardConfig()
    out = {}
    for label, weights in settings.items():
        totals = {r["name"]: r["total"] for r in case_rows(list(cases or REWARD_CASES), replace(base, **weights))}
        out[label] = sorted(totals, key=totals.get, reverse=True)
    return out


__all__ = ["cluster_allocation_figure", "cluster_weights_figure", "epoch_table_html", "example_trajectories",
           "index_rows_html", "mixing_summary", "reward_explanation_html", "reward_rankings", "schedule_table_html",
           "segment_kind", "mixed_trajectory_html", "mask_legend_html"]
