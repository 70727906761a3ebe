"""ReSearch's protocol and reward (Chen et al. 2025), as its code does them.

Read at github Agent-RL/ReSearch branch ``re-search`` @4bdb872 (``main`` is now ReCall) (prompts quoted verbatim,
since a checkpoint depends on every character; the code is written here; each function names the peer function it
follows). ``background`` (RDRA's context) is no peer's: None gives the peer's prompt exactly; a background goes
before the question as this project's ``<background>`` block. Departures: the parsers' tables and docs/method.md
("The peers' protocols and rewards").

Reward: ``src/verl/utils/reward_score/re_search.py`` ``compute_score``. Its "over length" (a response that does not
end with EOS) cannot be seen in decoded text: pass ``truncated=True`` (``rewards_read_truncation``: the TRL adapter
reads ``truncated`` or the rollout's ``finish``).
"""
from __future__ import annotations

import re
from typing import Sequence

from kunlunlab.agent.protocol import Turn
from kunlunlab.agent.protocols.base import AgentProtocol, _answer_turn, _think, _with_background
from kunlunlab.data.answers import f1

_RESEARCH_RULES = (  # src/verl/utils/dataset/template.py, the part both templates share
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags respectively, "
    "and the search query and result are enclosed within <search> </search> and <result> </result> tags respectively. "
    "For example, <think> This is the reasoning process. </think> <search> search query here </search> "
    "<result> search result here </result> <think> This is the reasoning process. </think> "
    "<answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. "
    "In the last part of the answer, the final exact answer is enclosed within \\boxed{} with latex format.")
_RS_WRAP = " <result>\n{}\n</result>"
RESEARCH_SYSTEM = (  # re_search_template_sys (instruct models, apply_chat=True)
    "You are a helpful assistant that can solve the given question step by step with the help of the wikipedia "
    "search tool. Given a question, you need to first think about the reasoning process in the mind and then provide "
    "the answer. During thinking, you can invoke the wikipedia search tool to search for fact information about "
    "specific topics if needed. " + _RESEARCH_RULES)
RESEARCH_BASE = (  # re_search_template (base models), up to its "User: {prompt}. Assistant:"
    "A conversation between User and Assistant. The user asks a question, and the assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. During "
    "thinking, the assistant can invoke the wikipedia search tool to search for fact information about specific "
    "topics if needed. " + _RESEARCH_RULES)


def _research_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``vLLMRolloutWithSearch.batch_search``: the passages' ``contents`` joined by blank lines, stripped, appended
    as `` <result>\\n…\\n</result>`` (the same in ``ReSearchPipeline.run_item``)."""
    return _RS_WRAP.format("\n\n".join(d for group in docs for d in group).strip())


def research_boxed(part: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(part))``; None where the peer's call raises (it then scores 0)."""
    if "\\boxed " in part:
        return part.split("\\boxed ")[-1].split("$")[0]
    start = part.rfind("\\boxed")
    if start < 0:
        return None  # a \fbox{} fails remove_boxed's assertion
    depth = 0
    for i in range(start, len(part)):
        depth += (part[i] == "{") - (part[i] == "}")
        if part[i] == "}" and depth == 0:
            boxed = part[start:i + 1]
            return boxed[len("\\boxed{"):-1] if boxed.startswith("\\boxed{") else None
    return None


def _research_parse(text: str) -> Turn:
    """A turn ends at ``</search>`` (the only stop string) or EOS; the query is the last ``<search>`` before the last
    ``</search>`` (``extract_search_content``), the answer the first ``<answer>…</answer>``'s last ``\\boxed``. An empty
    query: ``invalid``, ``empty_query`` (training searches "", evaluation says "nothing to search": ``invalid_block``);
    no usable box or no ``</answer>``: no answer (``missing_boxed``, ``unclosed:answer``; the peer's pred is "")."""
    think, issues = _think(text)
    end = text.rfind("</search>")
    if end != -1:
        start = text.rfind("<search>", 0, end)
        query = text[start + len("<search>"):end].strip() if start != -1 else ""
        if not query:
            return Turn("invalid", think=think, issues=issues + ["empty_query"])
        return Turn("search", queries=[query], think=think, issues=issues)
    if "<answer>" in text:
        m = re.search(r"<answer>(.*?)</answer>", text, re.S)
        if m is None:
            return Turn("answer", answer_mode="short", think=think, issues=issues + ["unclosed:answer"])
        boxed = research_boxed(m.group(1))
        return _answer_turn(boxed, think, issues + ([] if boxed is not None else ["missing_boxed"]))
    if "<search>" in text:
        return Turn("incomplete", think=think, issues=issues + ["unclosed:search"])
    return Turn("none", think=think, issues=issues + ["no_action"])


def _research_answer(text: str) -> str | None:
    """``ReSearchPipeline.run_item``: the first ``<answer>…</answer>`` of the response, its last box (None where the
    peer's prediction is "": no answer, no usable box; an over-length response the caller must rule out)."""
    m = re.search(r"<answer>(.*?)</answer>", text.strip(), re.S)
    boxed = research_boxed(m.group(1)) if m else None
    return boxed.strip() if boxed is not None else None


def research_format(text: str) -> tuple[bool, str]:
    """``re_search.validate_format`` on the response: think tags paired and present, exactly one answer, every
    search followed by its result, a ``\\boxed{`` and a ``}`` inside the answer."""
    if text.count("<think>") != text.count("</think>"):
        return False, "<think> </think> not paired"
    if text.count("<think>") == 0:
        return False, "<think> or </think> not found"
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return False, "<answer> or </answer> not found"
    pos = 0
    while (search := text.find("<search>", pos)) != -1:
        result, search_end = text.find("<result>", search), text.find("</search>", search)
        result_end = text.find("</result>", result)
        if -1 in (result, search_end, result_end):
            return False, "search/result tags are incomplete"
        if not search < search_end < result < result_end:
            return False, "search/result tags are nested in the wrong order"
        pos = result_end
    start, end = text.find("<answer>"), text.find("</answer>")
    if start > end:
        return False, "<answer> must be before </answer>"
    if "\\boxed{" not in text[start:end] or "}" not in text[start:end]:
        return False, "answer is missing \\boxed{} format"
    return True, "format is correct"


# ----------------------------------------------------------------------------------------------- reward
def research_reward(text: str, golds: Sequence[str], truncated: bool = False) -> float:
    """0 for a bad format (:func:`research_format`), an over-length response or an
    answer without a usable ``\\boxed{}``; else the answer's F1 (SQuAD normalisation, yes/no only exactly, max over
    aliases) when above 0, and 0.1 for a well-formed wrong answer."""
    if not research_format(text)[0] or truncated:
        return 0.0
    answer = _research_answer(text)
    if answer is None:
        return 0.0
    score = f1(answer, list(golds))
    return score if score > 0 else 0.1


# a peer: no repeat blocking; vllm_rollout.py has no search limit but the response length
PROTOCOL = AgentProtocol(
    name="research", source="Agent-RL/ReSearch@4bdb872 (branch re-search) src/verl/utils/dataset/template.py, "
    "src/verl/workers/rollout/vllm_rollout/vllm_rollout.py, src/verl/utils/reward_score/re_search.py",
    assistant_prefix="", stop_strings=("</search>",),
    build_messages=lambda q, bg: [{"role": "system", "content": RESEARCH_SYSTEM},
                                  {"role": "user", "content": _with_background(q, bg)}],
    build_base_prompt=lambda q, bg: f"{RESEARCH_BASE} User: {_with_background(q, bg)}. Assistant:",
    format_docs=_research_docs, wrap_notice=_RS_WRAP.format, parse_turn=_research_parse,
    final_answer=_research_answer, format_ok=lambda text: research_format(text)[0],
    env_pattern=r" <result>\n.*?\n</result>", invalid_block=_RS_WRAP.format("nothing to search"),
    reprompt=("invalid",), top_k=5, max_searches=None,
    render_search=lambda think, query: f"<think> {think} </think> <search> {query} </search>",
    render_answer=lambda think, answer: (f"<think> {think} </think> <answer> The final answer is "
                                         f"\\[ \\boxed{{{answer}}} \\] </answer>"),
    rewards={"research": research_reward}, rewards_read_truncation=True)
