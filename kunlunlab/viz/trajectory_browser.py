"""A trajectory browser for evaluation records (notebook 06): pick a question, read what the agent did.

Input: the per-question records :func:`kunlunlab.eval.harness.evaluate` writes (one JSON object per
line of ``<dataset>.<method>.jsonl``; :func:`kunlunlab.studies.suite.run_suite` returns them as
``records[dataset][method]`` and ``ablations[dataset][variant]``). A record holds the question, the
gold answers, the prediction and its EM / F1, and a ``trajectory``:

* the rollout methods (``search_o1``, ``agent``, ``kunlun``) store the rollout engine's
  :class:`~kunlunlab.agent.rollout.Trajectory`: ``steps`` (``prefix`` / ``model`` / ``result`` /
  ``feedback`` texts, in order), ``rounds`` (one per answer: answer, confidence, the documents
  retrieved since the previous answer), ``finish``; ``kunlun`` adds ``rdra`` (plan, plan queries,
  the ``<background>`` text);
* the single-shot baselines store ``steps`` only (``search`` / ``result`` / ``model``).

STIE's decisions are not stored in the record: STIE is a pure function of the rounds
(:func:`kunlunlab.agent.stie.replay`), so the browser **replays** it on the recorded rounds with the
run's STIE settings (:func:`stie_config_for`) and says when the replay's answer differs from the
recorded one (a sign that the run used other settings).

:func:`record_html` turns one record into self-contained HTML and never raises: a record with
missing or broken tags, or with no trajectory at all, renders with a message saying what is
missing. :class:`TrajectoryBrowser` is the ipywidgets UI (a run dropdown, a question dropdown and an
HTML view); :func:`trajectories_html` writes the same views as one static page, for exports where
widgets do not render.
"""
from __future__ import annotations

import html
import re
from typing import Mapping, Sequence

import ipywidgets as widgets

from kunlunlab.agent.protocol import parse_turn
from kunlunlab.agent.stie import LAGS, RoundInput, STIEConfig, STIEDecision, replay
from kunlunlab.eval.harness import EvalConfig, with_checkpoint_settings

_STYLE = {"rdra": "#eef", "model": "#f7f7f7", "result": "#eaf6ea", "feedback": "#fff4e0", "search": "#e8f0fe",
          "stie": "#fdeff4", "note": "#fff8d6"}

# Why STIE stopped (the termination criteria of §2.2, unnumbered prose in the paper), in words.
STOP_REASONS = {
    "new_answer": "a valid answer whose mean overlap with the recent rounds is below overlap_stop: "
                  "a new answer broke the loop (termination i)",
    "confident": "the round's confidence reached confidence_ceiling and its answer is not shielded (termination ii)",
    "no_new_info": "the round's searches brought a share of new documents below min_new_info (termination iii)",
    "max_rounds": "the round budget max_rounds is used up",
}


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _box(kind: str, title: str, body: str) -> str:
    return (f"<div class='tb-{kind}' style='background:{_STYLE.get(kind, '#fff')};padding:6px 8px;margin:4px 0;"
            f"border-radius:4px'><div><small><b>{title}</b></small></div>{body}</div>")


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap;margin:2px 0'>{_e(text)}</pre>"


def _note(text: str) -> str:
    return _box("note", "note", f"<p style='margin:2px 0'>{_e(text)}</p>")


# --- parsing the texts a record carries ------------------------------------------------------------

_QUERY_LINE = re.compile(r"^Query (\d+): (.*)$")
_PASSAGE_LINE = re.compile(r"^\((\d+)\) ?(.*)$")


def parse_passages(text: str) -> tuple[list[tuple[str | None, list[str]]], list[str]]:
    """The passages of a ``<result>`` block (or of a baseline's numbered documents), grouped per query.

    Returns ``(groups, notes)``: ``groups`` is ``[(query or None, [passage, …]), …]`` in order, as
    :func:`kunlunlab.agent.protocol.format_results` writes them (``Query i: …`` lines when a search had
    several queries, ``(j) passage`` entries, a passage running on until the next entry); ``notes``
    are the lines that are no passage (``(no results)``, the search-limit notice, an environment message).
    Text without a ``<result>`` tag is read as the block's content."""
    text = str(text or "")
    match = re.search(r"<result>(.*?)(?:</result>|$)", text, re.S)
    body = match.group(1) if match else text
    groups: list[tuple[str | None, list[str]]] = []
    notes: list[str] = []
    current: list[str] | None = None
    for line in body.splitlines():
        if not line.strip():
            continue
        q = _QUERY_LINE.match(line.strip())
        p = _PASSAGE_LINE.match(line.strip())
        if q:
            groups.append((q.group(2), []))
            current = None
        elif p and p.group(2).startswith("(repeated query"):  # rollout.py's blocked repeat, not a passage
            notes.append(p.group(2))
            current = None
        elif p:
            if not groups:
                groups.append((None, []))
            groups[-1][1].append(p.group(2))
            current = groups[-1][1]
        elif current is not None:
            current[-1] += "\n" + line.strip()
        else:
            notes.append(line.strip())
    return [g for g in groups if g[1]], notes


def _passages_html(text: str, title: str, kind: str = "result") -> str:
    groups, notes = parse_passages(text)
    parts = []
    for query, passages in groups:
        if query is not None:
            parts.append(f"<div><small>query: <i>{_e(query)}</i></small></div>")
        items = "".join(f"<li class='tb-passage'>{_pre(p)}</li>" for p in passages)
        parts.append(f"<ol style='margin:2px 0 2px 18px;padding:0'>{items}</ol>")
    parts += [f"<p style='margin:2px 0'><i>{_e(n)}</i></p>" for n in notes]
    n = sum(len(p) for _, p in groups)
    return _box(kind, f"{title} · {n} passage{'s' if n != 1 else ''}", "".join(parts) or "<i>(empty)</i>")


# --- STIE ------------------------------------------------------------------------------------------

def stie_config_for(model: str | None) -> STIEConfig:
    """The STIE settings an evaluation of ``model`` ran with: the checkpoint's (``kunlunlab_agent.json``:
    its whole ``stie``, or the round budget ``stie_rounds`` of older files) where it has them, STIE's defaults
    otherwise, exactly as :func:`kunlunlab.eval.harness.with_checkpoint_settings` resolves them for
    :func:`kunlunlab.eval.harness.build_pipeline` (without collection mode)."""
    return with_checkpoint_settings(EvalConfig(model=model)).stie


def stie_ran(trajectory: Mapping) -> bool:
    """Whether STIE controlled this rollout: only then does a rollout end with ``finish == "controller"``
    or carry a ``feedback`` step (STIE's note to the model before another round)."""
    steps = trajectory.get("steps")
    steps = steps if isinstance(steps, list) else []
    return trajectory.get("finish") == "controller" or any(isinstance(s, dict) and s.get("kind") == "feedback"
                                                          for s in steps)


def round_inputs(rounds: Sequence) -> list[RoundInput]:
    """The recorded answer rounds as STIE's inputs; raises ValueError on a malformed round."""
    out = []
    for i, r in enumerate(rounds):
        if not isinstance(r, Mapping):
            raise ValueError(f"round {i + 1} is not an object")
        try:
            out.append(RoundInput(r.get("answer"), float(r.get("confidence", 0.0)), list(r.get("doc_ids") or [])))
        except (TypeError, ValueError) as err:
            raise ValueError(f"round {i + 1}: {err}") from None
    return out


def decision_text(decision: STIEDecision, round_: RoundInput) -> list[str]:
    """STIE's decision on one round, as sentences (eqs. 8–13 and the termination criteria)."""
    lines = [f"round {decision.round + 1}: answer {round_.answer!r}, confidence {round_.confidence:.3f}"
             if round_.answer else f"round {decision.round + 1}: no answer in this round"]
    if round_.answer:
        if decision.redundant_with is not None:
            lag = decision.round - decision.redundant_with
            lines.append(f"redundant with round {decision.redundant_with + 1}: difference D below δ{lag} (eq. 9)")
        elif decision.mean_overlap is None:
            lines.append("valid: no earlier answered round to repeat (eqs. 8-9)")
        else:
            lines.append("valid: differs enough from the recent rounds (eqs. 8-9)")
        if decision.mean_overlap is not None:
            lines.append(f"mean overlap with the last {LAGS} rounds that gave an answer: {decision.mean_overlap:.2f}")
        if decision.all_blocked:
            lines.append(f"all candidates blocked: kept the most confident answer {decision.accepted!r} (eq. 11)")
        elif decision.replaced:
            lines.append(f"replaced: the current answer is {decision.accepted!r} (eqs. 10-11)")
        elif decision.redundant_with is not None:
            lines.append(f"kept: the current answer stays {decision.accepted!r}, no unblocked rival is more "
                         "confident by more than the margin (eq. 10)")
        else:
            lines.append(f"accepted: the current answer is {decision.accepted!r} (eq. 11)")
    else:
        lines.append(f"the current answer stays {decision.accepted!r}")
    if decision.shielded:
        lines.append(f"shielded (given K times or more within the history window, eq. 12): "
                     f"{', '.join(decision.shielded)}")
    if decision.blocked:
        lines.append(f"blocked from generation (given K times or more, eq. 13): {', '.join(decision.blocked)}")
    if decision.stop:
        lines.append(f"stop ({decision.reason}): {STOP_REASONS.get(decision.reason or '', decision.reason)}")
    else:
        lines.append("continue: feedback to the model, then another round")
    return lines


def _decision_html(decision: STIEDecision, round_: RoundInput) -> str:
    lines = decision_text(decision, round_)
    body = "".join(f"<li>{_e(x)}</li>" for x in lines[1:])
    return _box("stie", f"STIE decision · {_e(lines[0])}", f"<ul class='tb-stie' style='margin:2px 0'>{body}</ul>")


# --- one record ------------------------------------------------------------------------------------

def _header(record: Mapping, label: str | None) -> str:
    golds = record.get("golds")
    golds = [str(g) for g in golds] if isinstance(golds, (list, tuple)) else ([str(golds)] if golds else [])
    em, f1 = record.get("em"), record.get("f1")
    colour = "#2a7" if em else "#c33"
    facts = [f"<b>gold</b> {_e(' | '.join(golds) or '(none recorded)')}",
             f"<b>prediction</b> {_e(record.get('prediction'))}",
             f"<b style='color:{colour}'>EM {_e(em)}</b>"]
    if f1 is not None:
        facts.append(f"<b>F1</b> {f1:.2f}" if isinstance(f1, (int, float)) else f"<b>F1</b> {_e(f1)}")
    if record.get("lj") is not None:
        facts.append(f"<b>LJ</b> {_e(record.get('lj'))}")
    for key in ("answer_source", "searches"):
        if record.get(key) is not None:
            facts.append(f"<b>{key.replace('_', ' ')}</b> {_e(record.get(key))}")
    title = f"<div><small>{_e(label)}</small></div>" if label else ""
    return (f"{title}<h3 style='margin:4px 0'>{_e(record.get('question') or '(no question text)')}</h3>"
            f"<p class='tb-header'>{' &nbsp; '.join(facts)}</p>")


def _rdra_html(rdra) -> str:
    if not isinstance(rdra, Mapping):
        return _note("RDRA entry is not an object; skipped")
    parts = []
    if rdra.get("plan"):
        parts.append(f"<div><small>plan (eq. 2)</small></div>{_pre(rdra['plan'])}")
    queries = rdra.get("plan_queries")
    if isinstance(queries, list) and queries:
        parts.append("<div><small>second-stage queries (eq. 3)</small></div><ul style='margin:2px 0'>"
                     + "".join(f"<li>{_e(q)}</li>" for q in queries) + "</ul>")
    if rdra.get("error"):
        parts.append(f"<p><i>retrieval error: {_e(rdra['error'])}</i></p>")
    background = str(rdra.get("background") or "")
    docs = background.split("Documents:\n", 1)[1] if "Documents:\n" in background else ""
    body = "".join(parts)
    if docs:
        body += _passages_html(docs, "background documents D₁ ∪ D₂ (eq. 4)", "rdra")
    elif background:
        body += _pre(background)
    return _box("rdra", "RDRA background (§2.1): what the agent's prompt started from", body or "<i>(empty)</i>")


def _stie_plan(record: Mapping, trajectory: Mapping, config: STIEConfig
               ) -> tuple[list[tuple[RoundInput, STIEDecision | None]], list[str]]:
    """Per recorded round: (round, STIE's replayed decision or None), and notes for the summary."""
    rounds = trajectory.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        return [], ["no answer round: STIE had nothing to decide"]
    try:
        inputs = round_inputs(rounds)
    except ValueError as err:
        return [], [f"the recorded rounds are malformed ({err}); STIE's decisions cannot be replayed"]
    if not stie_ran(trajectory):
        return [(r, None) for r in inputs], [
            "no sign of STIE in this record (no feedback step, finish is not 'controller'): the rollout ended at "
            "its first answer, as it does without STIE (−STIE, the plain agent, Search-o1)"]
    final, used, decisions = replay(inputs, config)
    notes = [f"replayed with kunlunlab.agent.stie.replay on the {len(inputs)} recorded round(s), max_rounds "
             f"{config.max_rounds}, K {config.repeat_k}, δ = {config.deltas}"]
    if used < len(inputs):
        notes.append(f"the replay stops after round {used} but {len(inputs)} rounds were recorded: the run used "
                     "other STIE settings (e.g. collection mode, which never stops early)")
    elif decisions and not decisions[-1].stop:
        notes.append(f"STIE did not stop after the last round; the rollout ended there "
                     f"(finish: {trajectory.get('finish') or 'unknown'}, e.g. the token budget)")
    recorded = trajectory.get("stie_answer", record.get("prediction"))
    if final is not None and recorded is not None and final != recorded:
        notes.append(f"the replay's answer {final!r} differs from the recorded {recorded!r}: the run used "
                     "other STIE settings, or its answer came from the fallback extraction")
    else:
        notes.append(f"STIE's final answer: {final!r}")
    return [(r, decisions[i] if i < len(decisions) else None) for i, r in enumerate(inputs)], notes


def _turns_html(steps: list, protocol: bool, plan: list[tuple[RoundInput, STIEDecision | None]]) -> tuple[str, bool]:
    """The steps in order; answer turns are followed by their STIE decision. Returns (html, rounds shown)."""
    parts: list[str] = []
    carry = ""
    turn = 0
    answers = 0
    parsed = []
    for step in steps:
        if isinstance(step, Mapping) and step.get("kind") == "model" and protocol:
            parsed.append(parse_turn(carry + str(step.get("text") or "")))
            carry = ""
        elif isinstance(step, Mapping) and step.get("kind") == "prefix":
            carry = str(step.get("text") or "")
    aligned = protocol and sum(t.kind == "answer" for t in parsed) == len(plan)
    prefix = ""  # the assistant prefix (e.g. "<think>") that opened the reply: part of the first turn's text
    model_i = 0
    for step in steps:
        if not isinstance(step, Mapping):
            parts.append(_note(f"a step that is not an object was skipped: {str(step)[:80]!r}"))
            continue
        kind, text = step.get("kind", "model"), str(step.get("text") or "")
        if kind == "prefix":
            prefix = text
            continue
        if kind == "model":
            turn += 1
            if not protocol:
                parts.append(_box("model", f"turn {turn} · model output", _pre(text)))
                continue
            t = parsed[model_i]
            model_i += 1
            body = []
            if t.think:
                body.append(f"<div><small>think</small></div>{_pre(t.think)}")
            if t.kind == "search":
                body.append("<div><small>search</small></div><ul style='margin:2px 0'>"
                            + "".join(f"<li class='tb-query'>{_e(q)}</li>" for q in t.queries) + "</ul>")
            elif t.kind == "answer":
                body.append(f"<div><small>{_e(t.answer_mode)} answer</small></div>{_pre(t.answer)}")
            if t.issues:
                body.append(f"<p style='margin:2px 0'><small>protocol issues: {_e(', '.join(t.issues))}</small></p>")
            raw = _pre(prefix + text)
            prefix = ""
            body.append(f"<details><summary><small>raw model text</small></summary>{raw}</details>"
                        if t.think or t.kind in ("search", "answer") else raw)
            parts.append(_box("model", f"turn {turn} · {t.kind}", "".join(body)))
            if t.kind == "answer" and aligned:
                r, d = plan[answers]
                answers += 1
                if d is not None:
                    parts.append(_decision_html(d, r))
        elif kind == "search":
            parts.append(_box("search", "retrieval query", _pre(text)))
        elif kind == "feedback":
            # The engine labels every non-search environment text "feedback": STIE's note after an answer
            # round, but also the search-limit notice and the empty-query notice after other turns.
            _, notes = parse_passages(text)
            after_answer = protocol and model_i > 0 and parsed[model_i - 1].kind == "answer"
            title = "STIE feedback to the model (environment tokens)" if after_answer else "environment notice"
            parts.append(_box("feedback", title, _pre("\n".join(notes) or text)))
        elif kind == "result":
            parts.append(_passages_html(text, "retrieved (&lt;result&gt;)" if "<result>" in text else "retrieved"))
        else:
            parts.append(_box("model", _e(kind), _pre(text)))
    return "".join(parts), aligned


def record_html(record, label: str | None = None, stie: STIEConfig | None = None) -> str:
    """One evaluation record as self-contained HTML: the header (question, gold vs prediction, EM, F1),
    RDRA's plan and background documents, every turn in order (think, search queries, the passages of
    each ``<result>`` block, the answer), STIE's replayed decision after each answer round and its
    feedback, then a summary of the rounds. ``stie``: the run's STIE settings (default
    :class:`~kunlunlab.agent.stie.STIEConfig`). Never raises: what cannot be shown is said in a note."""
    try:
        return _record_html(record, label, stie or STIEConfig())
    except Exception as err:  # a malformed record must not break the browser; say what happened
        return _wrap(_note(f"this record could not be rendered ({type(err).__name__}: {err})"))


def _wrap(body: str) -> str:
    return f"<div class='trajectory' style='font-family:sans-serif;max-width:960px'>{body}</div>"


def _record_html(record, label: str | None, stie: STIEConfig) -> str:
    if not isinstance(record, Mapping):
        return _wrap(_note(f"not an evaluation record (expected an object, got {type(record).__name__})"))
    parts = [_header(record, label)]
    trajectory = record.get("trajectory")
    if not isinstance(trajectory, Mapping) or not trajectory:
        parts.append(_note("no trajectory recorded for this question: only the prediction and its scores"))
        return _wrap("".join(parts))
    if trajectory.get("rdra") is not None:
        parts.append(_rdra_html(trajectory["rdra"]))
    steps = trajectory.get("steps")
    protocol = "rounds" in trajectory  # the rollout engine's trajectories; the baselines store steps only
    plan, notes = _stie_plan(record, trajectory, stie) if protocol else ([], [])
    if not isinstance(steps, list) or not steps:
        parts.append(_note("the trajectory has no steps"))
        aligned = False
    else:
        body, aligned = _turns_html(steps, protocol, plan)
        parts.append(body)
    if protocol:
        rows = []
        for r, d in plan:
            what = "; ".join(decision_text(d, r)[1:]) if d is not None else "–"
            rows.append(f"<tr><td>{_e(r.answer)}</td><td>{r.confidence:.3f}</td><td>{_e(what)}</td></tr>")
        table = ("<table style='border-collapse:collapse'><tr><th>answer</th><th>confidence</th>"
                 f"<th>STIE</th></tr>{''.join(rows)}</table>") if rows else ""
        if plan and not aligned:
            notes.append("the answer turns could not be matched to the recorded rounds (broken tags?): the rounds "
                         "are listed here only")
        extra = [f"finish: {trajectory.get('finish')}"] if trajectory.get("finish") else []
        if trajectory.get("issues"):
            extra.append(f"protocol issues: {', '.join(map(str, trajectory['issues']))}")
        parts.append(_box("stie", "answer rounds and STIE (§2.2)",
                          table + "".join(f"<p style='margin:2px 0'><small>{_e(n)}</small></p>"
                                          for n in notes + extra)))
    return _wrap("".join(parts))


# --- many records ------------------------------------------------------------------------------------

def runs_from_suite(records: Mapping[str, Mapping[str, Sequence[dict]]],
                    ablations: Mapping[str, Mapping[str, Sequence[dict]]] | None = None,
                    first: str | None = None) -> dict[str, list[dict]]:
    """``{"dataset · method": records}`` from :class:`kunlunlab.studies.suite.SuiteResult`'s ``records`` and
    ``ablations``: per dataset ``first`` (the method under test) leads, then the baselines, then the
    ablation variants (the reference run, already listed, is not repeated)."""
    runs: dict[str, list[dict]] = {}
    for dataset, per_method in records.items():
        names = sorted(per_method, key=lambda m: m != first)  # stable: keeps the suite's order otherwise
        for name in names:
            runs[f"{dataset} · {name}"] = list(per_method[name])
    for dataset, variants in (ablations or {}).items():
        for name, recs in variants.items():
            runs.setdefault(f"{dataset} · {name}", list(recs))
    return runs


def question_label(i: int, record) -> str:
    """The question dropdown's entry: number, ✓/✗ for EM, the question (cut to 90 characters)."""
    if not isinstance(record, Mapping):
        return f"{i + 1}. (not a record)"
    mark = "✓" if record.get("em") else "✗"
    q = str(record.get("question") or "(no question text)")
    return f"{i + 1}. {mark} {q if len(q) <= 90 else q[:89] + '…'}"


def _as_runs(runs) -> dict[str, list]:
    if isinstance(runs, Mapping):
        return {str(k): list(v) for k, v in runs.items()}
    return {"records": list(runs)}


class TrajectoryBrowser:
    """The ipywidgets browser: ``run`` (a Dropdown of "dataset · method", hidden when there is one run),
    ``question`` (a Dropdown of that run's questions) and ``view`` (an HTML widget showing
    :func:`record_html` of the pick). ``widget`` is the assembled box; the object displays as it.

    ``runs``: ``{label: records}`` (e.g. :func:`runs_from_suite`) or one list of records."""

    def __init__(self, runs, stie: STIEConfig | None = None):
        self.runs = _as_runs(runs)
        self.stie = stie or STIEConfig()
        labels = list(self.runs)
        self.run = widgets.Dropdown(options=labels, value=labels[0] if labels else None, description="run",
                                    layout=widgets.Layout(width="60%", display=None if len(labels) > 1 else "none"))
        self.question = widgets.Dropdown(description="question", layout=widgets.Layout(width="95%"))
        self.view = widgets.HTML()
        self._quiet = False
        self.widget = widgets.VBox([self.run, self.question, self.view])
        self.run.observe(self._on_run, names="value")
        self.question.observe(self._on_question, names="value")
        self._on_run()

    @property
    def records(self) -> list:
        return self.runs.get(self.run.value, []) if self.run.value is not None else []

    def _on_run(self, _=None) -> None:
        options = [(question_label(i, r), i) for i, r in enumerate(self.records)]
        self._quiet = True  # the options change fires value changes of their own; render once, below
        try:
            self.question.options = options
            self.question.value = 0 if options else None
        finally:
            self._quiet = False
        self._on_question()

    def _on_question(self, _=None) -> None:
        if self._quiet:
            return
        i = self.question.value
        if i is None or not self.records:
            self.view.value = _wrap(_note("no evaluated questions in this run"))
            return
        self.view.value = record_html(self.records[i], label=self.run.value, stie=self.stie)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def trajectory_browser(runs, stie: STIEConfig | None = None) -> TrajectoryBrowser:
    """Builds the :class:`TrajectoryBrowser` over ``runs`` (``{label: records}`` or one list of records)."""
    return TrajectoryBrowser(runs, stie)


def trajectories_html(runs, stie: STIEConfig | None = None) -> str:
    """Every run's questions as one static HTML page (a collapsible entry per question), for exports
    where widgets do not render."""
    parts = []
    for label, records in _as_runs(runs).items():
        parts.append(f"<h2 style='font-family:sans-serif'>{_e(label)}</h2>")
        for i, r in enumerate(records):
            parts.append(f"<details><summary style='font-family:sans-serif'>{_e(question_label(i, r))}</summary>"
                         f"{record_html(r, label, stie)}</details>")
    return "<!DOCTYPE html><html><head><meta charset='utf-8'><title>trajectories</title></head><body>" + \
        "".join(parts) + "</body></html>"
