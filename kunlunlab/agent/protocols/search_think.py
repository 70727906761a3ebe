"""This project's search-think protocol (paper §2.3) as an :class:`~kunlunlab.agent.protocols.base.AgentProtocol`:
:mod:`kunlunlab.agent.protocol` unchanged (its prompt, tags, ``<result>`` block and parser), read over a whole
completion the way ``training.rewards.parse_completion`` reads it. Spoken by the methods ``agent`` and ``kunlun``
(not a peer); its reward is the dual-mode one (``rewards.kind`` ``kunlun``)."""
from __future__ import annotations

import re

from kunlunlab.agent.protocol import RESULT_TEMPLATE, STOP_STRINGS, Turn, build_messages, format_results, parse_turn
from kunlunlab.agent.protocols.base import AgentProtocol


def _search_think_turns(text: str) -> list[Turn]:
    """Every model turn of a completion, split as ``training.rewards.parse_completion`` splits it."""
    pieces = [p.replace("<|im_end|>", "") for p in re.split(r"<result>.*?(?:</result>|$)", text, flags=re.S)]
    segments = [s for p in pieces for s in re.split(r"(?<=</search>)", p) if s.strip()]
    return [parse_turn(s) for s in segments]


def _search_think_answer(text: str) -> str | None:
    answers = [t for t in _search_think_turns(text) if t.kind == "answer"]
    return answers[-1].answer if answers else None


def _search_think_format(text: str) -> bool:
    """``rewards.format_compliant(parse_completion(text))``: an answer tag with its box, and no issue in any turn
    (``no_action`` counts only in the last turn)."""
    turns = _search_think_turns(text)
    issues = [i for k, t in enumerate(turns) for i in t.issues if i != "no_action" or k == len(turns) - 1]
    answers = [t for t in turns if t.kind == "answer"]
    return bool(answers) and answers[-1].answer is not None and answers[-1].answer_mode is not None and not issues


PROTOCOL = AgentProtocol(
    name="search_think", source="kunlunlab/agent/protocol.py (this project, paper §2.3)",
    assistant_prefix="<think>", stop_strings=STOP_STRINGS, build_messages=build_messages, build_base_prompt=None,
    format_docs=format_results, wrap_notice=lambda text: RESULT_TEMPLATE.format(results=text),
    parse_turn=parse_turn, final_answer=_search_think_answer, format_ok=_search_think_format,
    env_pattern=r"\n<result>\n.*?\n</result>\n",
    invalid_block=RESULT_TEMPLATE.format(results="(empty query: nothing was searched)"), reprompt=("invalid",),
    top_k=3, max_searches=8, blocks_repeats=True, at_search_limit="notice",
    # this project's: the methods agent and kunlun speak it; its SFT trajectories are written in it already; its
    # reward is the dual-mode one (rewards.kind kunlun, kunlunlab.training.rewards), which reads the answer modes
    peer=False, answer_modes=True)
