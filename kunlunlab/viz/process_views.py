"""Views of notebook 07: ReasonRAG's step preference pairs and explored trees
(:mod:`kunlunlab.training.preferences`' ``preferences.jsonl`` / ``trees.jsonl`` rows), and the DAPO runs'
rollout curves side by side."""
from __future__ import annotations

import html
from typing import Iterable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

ACTION_PAIRS = ("search≻answer", "answer≻search", "search≻search", "answer≻answer")
_ACTION_STYLE = {"root": "#eef", "search": "#e8f0fe", "answer": "#eaf6ea", "none": "#f3f3f3"}


def _row(pair) -> dict:
    return pair.to_dict() if hasattr(pair, "to_dict") else dict(pair)


def _gap(row: dict) -> float:
    gap = row.get("gap")
    return float(gap) if gap is not None else float(row["chosen_value"]) - float(row["rejected_value"])


def _summary(gaps: list[float]) -> dict:
    return {"pairs": len(gaps), "mean_gap": round(sum(gaps) / len(gaps), 4) if gaps else None}


def pair_stats(pairs: Iterable) -> dict:
    """Preference pairs (``preferences.jsonl`` rows or :class:`PreferencePair` objects) counted by action pair
    (``chosen≻rejected``; the four search/answer pairs always listed, others such as ``search≻none`` when
    present) and by depth of the two steps, each with the mean value gap ``chosen_value − rejected_value``."""
    by_action: dict[str, list[float]] = {k: [] for k in ACTION_PAIRS}
    by_depth: dict[int, list[float]] = {}
    n = cross = 0
    for pair in pairs:
        row = _row(pair)
        gap = _gap(row)
        chosen, rejected = row.get("chosen_action"), row.get("rejected_action")
        by_action.setdefault(f"{chosen}≻{rejected}", []).append(gap)
        by_depth.setdefault(int(row["depth"]), []).append(gap)
        n += 1
        cross += chosen != rejected
    return {"pairs": n, "cross_action": cross,
            "by_action": {k: _summary(v) for k, v in by_action.items()},
            "by_depth": {d: _summary(by_depth[d]) for d in sorted(by_depth)}}


def pair_stats_table(stats: dict) -> tuple[list[str], list[list]]:
    """:func:`pair_stats` as (header, rows): the action pairs, then the depths."""
    rows = [["action pair", k, v["pairs"], v["mean_gap"]] for k, v in stats["by_action"].items()]
    rows += [["depth", d, v["pairs"], v["mean_gap"]] for d, v in stats["by_depth"].items()]
    return ["by", "group", "pairs", "mean value gap"], rows


def pair_stats_figure(pairs: Iterable) -> go.Figure:
    """Pairs per action pair and per depth (bars) with their mean value gap (markers, right axis)."""
    stats = pair_stats(pairs)
    fig = make_subplots(rows=1, cols=2,
                        subplot_titles=("by action pair (chosen ≻ rejected)", "by depth of the steps"),
                        specs=[[{"secondary_y": True}, {"secondary_y": True}]], horizontal_spacing=0.14)
    for col, (groups, name) in enumerate(((stats["by_action"], "action"), (stats["by_depth"], "depth")), start=1):
        x = [str(k) for k in groups]
        fig.add_trace(go.Bar(x=x, y=[v["pairs"] for v in groups.values()], name="pairs", marker_color="#4c78a8",
                             showlegend=col == 1, legendgroup="pairs"), 1, col, secondary_y=False)
        fig.add_trace(go.Scatter(x=x, y=[v["mean_gap"] for v in groups.values()], mode="markers", name="mean value gap",
                                 marker={"size": 11, "symbol": "diamond", "color": "#e45756"}, showlegend=col == 1,
                                 legendgroup="gap"), 1, col, secondary_y=True)
        fig.update_yaxes(title_text="pairs", row=1, col=col, secondary_y=False)
        fig.update_yaxes(title_text="mean value gap", row=1, col=col, secondary_y=True, rangemode="tozero")
    fig.update_xaxes(title_text="depth", row=1, col=2, type="category")
    if not stats["pairs"]:
        fig.add_annotation(text="no preference pairs: every explored sibling scored the same", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 15})
    fig.update_layout(title=f"Step preference pairs ({stats['pairs']}, {stats['cross_action']} across actions)",
                      template="plotly_white", height=380)
    return fig


def dapo_runs_figure(rollouts: Mapping[str, Sequence[dict]]) -> go.Figure:
    """The DAPO rollout log of several runs (label → ``training_logs(run)["rollouts"]``) side by side: mean
    shaped reward, accuracy, searches per rollout and the search-budget term (where the run had one)."""
    panels = (("reward", "reward"), ("accuracy", "accuracy"), ("searches", "searches per rollout"),
              ("budget", "budget term (FrugalRAG)"))
    fig = make_subplots(rows=1, cols=4, subplot_titles=[t for _, t in panels])
    palette = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2")
    for i, (label, rows) in enumerate(rollouts.items()):
        color = palette[i % len(palette)]
        for col, (key, _) in enumerate(panels, start=1):
            points = [(r["step"] + 1, r.get(key)) for r in rows if r.get(key) is not None]
            if not points:
                continue
            fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                     name=label, legendgroup=label, showlegend=col == 1, line={"color": color}),
                          1, col)
    if not any(rollouts.values()):
        fig.add_annotation(text="no DAPO rollout logged", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="DAPO rollouts per step", template="plotly_white", height=340)
    return fig


# -- one explored tree ----------------------------------------------------------------------------------------------
class _Malformed(ValueError):
    pass


def _number(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return html.escape(str(value))
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _as_float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _children(node: dict) -> list:
    kids = node.get("children")
    if kids is None:
        return []
    if not isinstance(kids, list):
        raise _Malformed(f"the children of a step at depth {node.get('depth')!r} are a {type(kids).__name__}, "
                         "not a list")
    for kid in kids:
        if not isinstance(kid, dict):
            raise _Malformed(f"a step under depth {node.get('depth')!r} is a {type(kid).__name__}, not an object")
    return kids


def _descendants(node: dict) -> int:
    return sum(1 + _descendants(kid) for kid in _children(node))


def _strings(value) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _step_html(node: dict, level: int, max_depth: int | None, best: bool) -> str:
    action = str(node.get("action", "?"))
    reward, estimate = node.get("reward"), node.get("estimate")
    if reward is not None:
        worth = f"SPRE reward {_number(reward)}"
    elif estimate is not None:
        worth = f"estimate {_number(estimate)}"
    else:
        worth = "no reward yet"
    head = [f"depth {_number(node.get('depth'))}", f"<b>{html.escape(action)}</b>",
            f"visits {_number(node.get('visits'))}", f"value {_number(node.get('value'))}", worth]
    if node.get("answer") is not None:
        head.append(f"answer “{html.escape(str(node['answer']))}” F1 {_number(node.get('f1'), 2)}")
    finish = node.get("finish")
    if finish and finish != "answer":
        head.append(f"ended: {html.escape(str(finish))}")
    summary = ("★ " if best else "") + " · ".join(head)
    body = []
    if node.get("text"):
        body.append(f"<pre style='white-space:pre-wrap;margin:2px 0'>{html.escape(str(node['text']))}</pre>")
    queries, doc_ids = _strings(node.get("queries")), _strings(node.get("doc_ids"))
    if queries:
        body.append("<div><small>queries:</small> " + "; ".join(f"<code>{html.escape(q)}</code>" for q in queries)
                    + "</div>")
    if queries or doc_ids:
        body.append("<div><small>retrieved passages:</small> "
                    + (", ".join(f"<code>{html.escape(d)}</code>" for d in doc_ids) or "none") + "</div>")
    if node.get("answer") is not None:
        body.append(f"<div><small>answer:</small> {html.escape(str(node['answer']))} &nbsp; "
                    f"<small>F1</small> {_number(node.get('f1'), 2)}</div>")
    issues = _strings(node.get("issues"))
    if issues:
        body.append("<div><small>protocol issues: " + html.escape(", ".join(issues)) + "</small></div>")
    if node.get("env_text"):
        body.append("<details><summary><small>environment block after the step</small></summary><pre "
                    f"style='white-space:pre-wrap;margin:2px 0'>{html.escape(str(node['env_text']))}</pre></details>")
    kids = _children(node)
    if kids and max_depth is not None and level >= max_depth:
        hidden = _descendants(node)
        body.append(f"<p><small>… {hidden} deeper step{'s' if hidden != 1 else ''} not shown "
                    f"(max_depth={max_depth})</small></p>")
    elif kids:
        values = [_as_float(k.get("value")) for k in kids]
        known = [v for v in values if v is not None]
        top = max(known) if len(set(known)) > 1 else None
        body.extend(_step_html(k, level + 1, max_depth, top is not None and v == top) for k, v in zip(kids, values))
    style = _ACTION_STYLE.get(action, "#fff")
    return (f"<details class='step' data-depth='{level}'{' open' if level <= 1 else ''} "
            f"style='margin:3px 0 3px {0 if level == 0 else 16}px;border-left:3px solid {style};padding-left:6px'>"
            f"<summary style='background:{style};padding:2px 4px'>{summary}</summary>{''.join(body)}</details>")


def _message(text: str) -> str:
    return f"<div style='font-family:sans-serif;color:#a00'><b>cannot render this tree:</b> {html.escape(text)}</div>"


def tree_html(tree: dict, max_depth: int | None = None) -> str:
    """One explored tree (a ``trees.jsonl`` row, :meth:`SearchTree.to_dict`) as nested collapsible steps: each
    step's depth, action, visits, value, SPRE reward (terminal) or value-source estimate (open leaf), its text,
    queries and retrieved passage ids, its answer and F1, its environment block. ★ marks the best-valued
    sibling(s). ``max_depth`` stops at that many model turns below the prompt (the rest is counted). A malformed
    tree renders a message instead of raising."""
    try:
        if not isinstance(tree, dict):
            raise _Malformed(f"expected a trees.jsonl row (an object), got {type(tree).__name__}")
        root = tree.get("root")
        if not isinstance(root, dict):
            raise _Malformed("the tree has no root step ('root' object)")
        if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 0):
            raise _Malformed(f"max_depth must be a non-negative integer or None, got {max_depth!r}")
        golds = " | ".join(_strings(tree.get("answers")))
        head = (f"<p><b>question:</b> {html.escape(str(tree.get('question', '')))}<br><b>gold:</b> {html.escape(golds)}"
                f" &nbsp; <b>steps explored:</b> {_descendants(root)} &nbsp; <b>gold passages:</b> "
                f"{html.escape(', '.join(_strings(tree.get('supporting_ids')))) or '–'}</p>")
        return ("<div style='font-family:sans-serif;max-width:1000px'>" + head
                + _step_html(root, 0, max_depth, False) + "</div>")
    except _Malformed as err:
        return _message(str(err))
    except Exception as err:  # noqa: BLE001 — a view of a file must never take the notebook down
        return _message(f"{type(err).__name__}: {err}")


__all__ = ["ACTION_PAIRS", "dapo_runs_figure", "pair_stats", "pair_stats_figure", "pair_stats_table", "tree_html"]
