"""Figures of notebooks 02-04: the mixing schedule, the mixed data, reward components, training curves."""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def schedule_figure(rows: Sequence[dict]) -> go.Figure:
    """High-quality share (eqs. 14-15) and noise ratio (eq. 16) per epoch."""
    epochs = [r["epoch"] for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=epochs, y=[r["hq_share"] for r in rows], mode="lines+markers",
                             name="high-quality share p_hq(e)"))
    fig.add_trace(go.Scatter(x=epochs, y=[1 - r["hq_share"] for r in rows], mode="lines+markers",
                             name="noisy share 1 - p_hq(e)"))
    fig.add_trace(go.Scatter(x=epochs, y=[r["noise_ratio"] for r in rows], mode="lines+markers",
                             name="noise ratio ρ(e)", line={"dash": "dot"}))
    fig.update_layout(title="Progressive mixing schedule", xaxis_title="epoch", yaxis_title="fraction",
                      yaxis_range=[0, 1.05], template="plotly_white")
    return fig


def data_figure(stats: Sequence[dict]) -> go.Figure:
    """Hops, searches and token lengths of the mixed trajectories, split by quality."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("hops", "searches", "tokens"))
    for quality in ("hq", "noisy"):
        rows = [s for s in stats if s["quality"] == quality]
        if not rows:
            continue
        for col, key in ((1, "hops"), (2, "searches"), (3, "tokens" if "tokens" in rows[0] else "chars")):
            fig.add_trace(go.Histogram(x=[r[key] for r in rows], name=quality, legendgroup=quality,
                                       showlegend=col == 1, opacity=0.7), 1, col)
    fig.update_layout(barmode="overlay", title="Mixed trajectories", template="plotly_white")
    return fig


def reward_components_figure(cases: Sequence[dict]) -> go.Figure:
    """Stacked weighted components per hand-written case (``name`` + component values and weights)."""
    fig = go.Figure()
    for key in ("format", "length", "accuracy", "structure", "overlong"):
        fig.add_trace(go.Bar(x=[c["name"] for c in cases], y=[c.get(f"w_{key}", 0.0) for c in cases], name=key))
    fig.add_trace(go.Scatter(x=[c["name"] for c in cases], y=[c["total"] for c in cases], mode="markers",
                             marker={"size": 12, "symbol": "diamond", "color": "black"}, name="total"))
    fig.update_layout(barmode="relative", title="Reward components (weighted) per case", yaxis_title="reward",
                      template="plotly_white")
    return fig


def training_curves(sft_log: Sequence[dict], dapo_log: Sequence[dict], rollouts: Sequence[dict]) -> go.Figure:
    """SFT loss; DAPO reward and its components, response length, searches per rollout, format compliance
    (the paper's Figures 2-3 over training steps)."""
    fig = make_subplots(rows=2, cols=3, subplot_titles=(
        "SFT loss", "DAPO reward (components)", "response length (model tokens)",
        "searches per rollout", "format compliance", "dynamic sampling"))
    sft = [r for r in sft_log if "loss" in r]
    fig.add_trace(go.Scatter(x=[r["step"] for r in sft], y=[r["loss"] for r in sft], name="SFT loss"), 1, 1)
    dapo = [r for r in dapo_log if "reward" in r]
    steps = [r["step"] for r in dapo]
    fig.add_trace(go.Scatter(x=steps, y=[r["reward"] for r in dapo], name="reward", line={"width": 3}), 1, 2)
    for key in ("format", "length", "accuracy", "structure", "overlong"):
        values = [r.get(f"rewards/{key}_reward/mean") for r in dapo]
        if any(v is not None for v in values):
            fig.add_trace(go.Scatter(x=steps, y=values, name=key, line={"dash": "dot"}), 1, 2)
    fig.add_trace(go.Scatter(x=steps, y=[r.get("completions/mean_length") for r in dapo], name="length"), 1, 3)
    rsteps = [r["step"] + 1 for r in rollouts]
    fig.add_trace(go.Scatter(x=rsteps, y=[r["searches"] for r in rollouts], name="searches"), 2, 1)
    fig.add_trace(go.Scatter(x=rsteps, y=[r["format_compliance"] for r in rollouts], name="format"), 2, 2)
    fig.add_trace(go.Bar(x=rsteps, y=[r["refilled_groups"] for r in rollouts], name="refilled groups"), 2, 3)
    fig.add_trace(go.Bar(x=rsteps, y=[r["filtered_groups"] for r in rollouts], name="groups out of the loss"), 2, 3)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="Training", template="plotly_white", height=650)
    return fig


def before_after_figure(summary: dict) -> go.Figure:
    """EM, F1 and format compliance before and after training (held-out questions)."""
    metrics = ("em", "f1", "format_compliance")
    fig = go.Figure()
    for when in ("before", "after"):
        fig.add_trace(go.Bar(x=[m.replace("_", " ") for m in metrics], y=[summary[f"{m}_{when}"] for m in metrics],
                             name=when, text=[summary[f"{m}_{when}"] for m in metrics], textposition="outside"))
    hotpot = summary.get("hotpotqa_distractor")
    if hotpot:
        for when in ("before", "after"):
            fig.add_trace(go.Bar(x=[f"HotpotQA {m.replace('_', ' ')}" for m in metrics],
                                 y=[hotpot[f"{m}_{when}"] for m in metrics], name=f"{when} (HotpotQA)",
                                 text=[hotpot[f"{m}_{when}"] for m in metrics], textposition="outside"))
    fig.update_layout(barmode="group", title="Held-out evaluation before and after training (%)",
                      yaxis_title="%", template="plotly_white")
    return fig


def reward_table_html(rows: Sequence[dict]) -> str:
    """The hand-written case table: one row per case, raw components and the total."""
    keys = ("mode", "format", "length", "accuracy", "structure", "overlong", "total")
    head = "".join(f"<th>{k}</th>" for k in ("case",) + keys)
    body = []
    for r in rows:
        cells = "".join(f"<td>{'—' if r[k] is None else (f'{r[k]:.2f}' if isinstance(r[k], float) else r[k])}</td>"
                        for k in keys)
        body.append(f"<tr><td>{html.escape(r['name'])}</td>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def config_table_html(config: dict, defaults: dict) -> str:
    """A config as a compact table: the settings that differ from the dataclass defaults, one row each (dotted
    key, value, default), and how many leave the default; the whole config stays in ``train_config.json``."""
    def leaves(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {prefix + k: v})
        return out

    have, base = leaves(config), leaves(defaults)
    changed = [k for k in have if have[k] != base.get(k)]
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(repr(have[k]))}</td>"
                   f"<td>{html.escape(repr(base.get(k)))}</td></tr>" for k in changed)
    return (f"<table><tr><th>setting</th><th>this run</th><th>default</th></tr>{rows}</table>"
            f"<p>{len(have) - len(changed)} more settings at their defaults (the whole config: train_config.json)</p>")


def sft_loss_figure(sft_log: Sequence[dict]) -> go.Figure:
    """Stage 1's training loss per optimizer step (TRL's log history), shown right after the SFT cell."""
    rows = [r for r in sft_log if "loss" in r]
    fig = go.Figure(go.Scatter(x=[r["step"] for r in rows], y=[r["loss"] for r in rows], name="SFT loss"))
    fig.update_layout(title="Stage 1 · format cold start: SFT loss (model tokens only)", xaxis_title="step",
                      yaxis_title="loss", template="plotly_white", height=350)
    return fig


def clip_ratio_figure(clip: dict[str, Sequence[dict]]) -> go.Figure:
    """The share of tokens whose importance ratio was clipped, per RL step and arm (TRL's ``clip_ratio/high_mean``
    above 1 + ε_high, ``clip_ratio/low_mean`` below 1 − ε): where clip-higher binds and where it does not."""
    fig = go.Figure()
    for name, rows in clip.items():
        for key, dash in (("clip_ratio/high_mean", "solid"), ("clip_ratio/low_mean", "dot")):
            points = [r for r in rows if r.get(key) is not None]
            fig.add_trace(go.Scatter(x=[r["step"] for r in points], y=[r[key] for r in points], mode="lines+markers",
                                     line={"dash": dash}, name=f"{name}: {key.split('/')[1].split('_')[0]}"))
    fig.update_layout(title="Clipped tokens per RL step (above: clip-higher's bound, below: the low bound)",
                      xaxis_title="step", yaxis_title="share of tokens", template="plotly_white", height=350)
    return fig


BEFORE_AFTER_ROWS = (("EM", "em"), ("F1", "f1"), ("format compliance", "format_compliance"),
                     ("searches / question", "searches"), ("long answers %", "long_share"))
SUMMARY_ROWS = (("summary questions: EM of the boxed link", "em"), ("summary questions: fact coverage %", "fact_coverage"),
                ("summary questions: long answers %", "long_share"))


def before_after_html(summary: dict) -> str:
    """``training_summary.json``'s before/after figures as a table (world rows, then HotpotQA's, then the
    summary-oriented questions': the long-answer mode)."""

    def cell(value) -> str:
        return "—" if value is None else html.escape(str(value))

    rows = [(label, summary.get(f"{key}_before"), summary.get(f"{key}_after")) for label, key in BEFORE_AFTER_ROWS]
    hotpot = summary.get("hotpotqa_distractor") or {}
    if hotpot:
        rows += [(f"HotpotQA {label}", hotpot.get(f"{key}_before"), hotpot.get(f"{key}_after"))
                 for label, key in BEFORE_AFTER_ROWS[:3]]
    summaries = summary.get("world_summary") or {}
    if summaries:
        rows += [(f"{label} (n = {summaries.get('n')})", summaries.get(f"{key}_before"), summaries.get(f"{key}_after"))
                 for label, key in SUMMARY_ROWS]
    body = "".join(f"<tr><td>{html.escape(label)}</td><td>{cell(b)}</td><td>{cell(a)}</td></tr>" for label, b, a in rows)
    return f"<table><tr><th></th><th>before</th><th>after</th></tr>{body}</table>"
