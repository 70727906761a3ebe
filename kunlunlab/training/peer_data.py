"""The cold-start trajectories in a peer's protocol: the same SFT data, written as Search-R1, ReSearch or R1-Searcher
would have the agent write it.

Why a cold start at all (a named departure): the peers train their 3B-8B models with RL from the base or instruct
model, with no SFT; a 135M model given a peer's prompt never closes a tag (0 % format compliance untrained), so RL has
no reward to climb. Every recipe here starts from SFT on the same mixed trajectories (:mod:`kunlunlab.training.mixing`),
each in its own protocol, so what differs between the recipes is the protocol, the reward and the RL algorithm, not
the data or the budget.

A search-think trajectory is read turn by turn (think text; queries or the boxed answer; the documents each search
retrieved, kept on the environment segment by the mixing) and written again with the protocol's turns
(``AgentProtocol.render_search``, ``render_answer``: each protocol's module writes its own), document block
(:meth:`~kunlunlab.agent.protocols.AgentProtocol.result_block`) and prompt. Peers search one query at a time: a
multi-query search becomes consecutive searches, the later ones opened by a one-line think. Masked turns stay masked.
Long answers become short ones (no peer has the long mode). STIE feedback rounds, RDRA plan samples and the prompt's
``<background>`` block (RDRA's, or the mixing's irrelevant-background noise kind) have no counterpart and are dropped
(the peer recipes switch the first two off: ``mixing.stie_feedback_share`` 0, ``plan_samples`` 0).
"""
from __future__ import annotations

import re
from dataclasses import replace

from kunlunlab.agent.protocol import extract_boxed
from kunlunlab.agent.protocols import AgentProtocol
from kunlunlab.training.mixing import TrajectoryExample


def _split_turn(text: str) -> tuple[str, list[str] | None, str | None]:
    """A search-think model turn as (think text, its queries or None, its boxed answer or None)."""
    think, _, action = text.partition("</think>")
    think = think.removeprefix("<think>").strip()
    if "<search>" in action:
        return think, [q.strip() for q in re.findall(r"<query>(.*?)</query>", action, re.S)], None
    return think, None, extract_boxed(action) or re.sub(r"<[^>]+>", " ", action).strip()


def _search_text(protocol: AgentProtocol, think: str, query: str) -> str:
    return _renderer(protocol).render_search(think, query)


def _answer_text(protocol: AgentProtocol, think: str, answer: str) -> str:
    return _renderer(protocol).render_answer(think, answer)


def _renderer(protocol: AgentProtocol) -> AgentProtocol:
    """``protocol``, where it writes SFT turns (``render_search``, ``render_answer``); a ValueError otherwise."""
    if protocol.render_search is None or protocol.render_answer is None:
        raise ValueError(f"no cold-start rendering for protocol {protocol.name!r}")
    return protocol


def render(t: TrajectoryExample, protocol: AgentProtocol, max_result_chars: int) -> TrajectoryExample | None:
    """``t`` written in ``protocol`` (None for a sample with no counterpart: a plan sample). Environment segments
    must carry the ``docs`` and ``queries`` the mixing records."""
    if t.kind != "trajectory":
        return None
    segments: list[dict] = []
    pending: list[tuple[str, bool]] = []  # (query, train) of the last search turn, answered by the next env segment
    for seg in t.segments:
        if seg["role"] == "env":
            if seg.get("feedback"):  # a STIE round: the peers have none; it and what follows it are dropped
                if not segments[-1]["train"]:  # ... and the answer before it was a masked wrong one: no sample
                    return None
                break
            docs, queries = seg.get("docs"), seg.get("queries")
            if docs is None or queries is None:
                raise ValueError("an environment segment without its docs and queries: trajectories written before "
                                 "the mixing recorded them cannot be rendered in another protocol")
            for j, (query, train) in enumerate(pending):
                if j:  # a parallel hop of the same search: its own search turn
                    segments.append({"role": "model", "train": train,
                                     "text": _search_text(protocol, f"Next: {query}", query)})
                block = protocol.result_block([docs[j] if j < len(docs) else []], [query], max_result_chars)
                segments.append({"role": "env", "text": block, "train": False})
            pending = []
            continue
        think, queries, answer = _split_turn(seg["text"])
        if queries is not None:
            if not queries:
                continue
            segments.append({"role": "model", "train": seg["train"],
                             "text": _search_text(protocol, think, queries[0])})
            pending = [(q, seg["train"]) for q in queries]
        else:
            segments.append({"role": "model", "train": seg["train"],
                             "text": _answer_text(protocol, think, answer or "")})
    # no background block: it is RDRA's (or the mixing's irrelevant-background noise), which no peer's prompt has
    # and none sees at evaluation
    return replace(t, segments=segments, prompt_messages=protocol.messages(t.question, None), background=None,
                   noise=[kind for kind in t.noise if kind != "background"], prefix=protocol.assistant_prefix,
                   end_with_eos=True, stie_rounds=0)


def render_all(trajectories: list[TrajectoryExample], protocol: AgentProtocol,
               max_result_chars: int) -> list[TrajectoryExample]:
    """Every trajectory with a counterpart in ``protocol``, written in it (a protocol without SFT renderers, the
    search-think protocol: unchanged)."""
    if protocol.render_search is None:
        return list(trajectories)
    rendered = (render(t, protocol, max_result_chars) for t in trajectories)
    return [t for t in rendered if t is not None]
