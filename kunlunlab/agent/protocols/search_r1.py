"""Search-R1's protocol and reward (Jin et al. 2025), as its code does them.

Read at github PeterGriffinJin/Search-R1 @a14dc3a (prompts quoted verbatim, since a checkpoint depends on every
character; the code is written here; each function names the peer function it follows). ``background`` (RDRA's
context) is no peer's: None gives the peer's prompt exactly; a background goes before the question as this
project's ``<background>`` block, so an RDRA ablation shows every protocol the same context. Departures: the
parsers' tables and docs/method.md ("The peers' protocols and rewards").

Reward: ``verl/utils/reward_score/qa_em.py`` ``compute_score_em`` (the released EM recipe); with
``SEARCH_R1_FORMAT`` it is ``qa_em_format.py`` ``compute_score_em`` as ``scripts/nq_hotpotqa/v0.3/train_ppo_format.sh``
sets it (structure 0.2, final format 0.1, retrieval 0).
"""
from __future__ import annotations

import re
from typing import Sequence

from kunlunlab.agent.protocol import BACKGROUND_TEMPLATE, Turn
from kunlunlab.agent.protocols.base import AgentProtocol, _answer_turn, _think
from kunlunlab.data.answers import exact_match, normalize_answer

SEARCH_R1_INSTRUCTION = (  # scripts/data_process/nq_search.py make_prefix(template_type="base"), also infer.py
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. ")
_SR1_WRAP = "\n\n<information>{}</information>\n\n"  # execute_predictions
SEARCH_R1_INVALID = (  # generation.py execute_predictions: what follows a turn with no closed action
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n")


def _search_r1_prompt(question: str, background: str | None) -> str:
    question = question.strip()
    if not question.endswith("?"):  # qa_search_train_merge.py / infer.py append the question mark
        question += "?"
    block = BACKGROUND_TEMPLATE.format(background=background.strip()) if background else ""
    return f"{SEARCH_R1_INSTRUCTION}{block}Question: {question}\n"


def _search_r1_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``_passages2string``: ``Doc i(Title: <first line>) <other lines>``, one a line, the whole block stripped and
    wrapped as ``execute_predictions`` wraps it. The title keeps the FlashRAG quotes (``Doc 1(Title: "X")``)."""
    lines = []
    for contents in (d for group in docs for d in group):
        first, _, rest = contents.partition("\n")
        lines.append(f"Doc {len(lines) + 1}(Title: {first}) {rest}\n")
    return _SR1_WRAP.format("".join(lines).strip())


def _search_r1_parse(text: str) -> Turn:
    """``postprocess_predictions``: the first closed ``<search>``/``<answer>`` is the action. No closed action:
    ``incomplete`` (``unclosed:<tag>``) or ``none`` (``no_action``), both re-prompted by the peer; an empty search:
    ``invalid``, ``empty_query`` (departure: the peer searches ""); an empty answer: no answer, ``empty_answer``."""
    think, issues = _think(text)
    m = re.search(r"<(search|answer)>(.*?)</\1>", text, re.S)
    if m is None:
        opened = sorted((text.find(f"<{t}>"), t) for t in ("search", "answer") if f"<{t}>" in text)
        if opened:
            return Turn("incomplete", think=think, issues=issues + [f"unclosed:{opened[0][1]}"])
        return Turn("none", think=think, issues=issues + ["no_action"])
    content = m.group(2).strip()
    if m.group(1) == "answer":
        return _answer_turn(content, think, issues)
    if not content:
        return Turn("invalid", think=think, issues=issues + ["empty_query"])
    return Turn("search", queries=[content], think=think, issues=issues)


def _search_r1_answer(text: str) -> str | None:
    """``qa_em.extract_solution``: the last ``<answer>`` of the sequence. The peer reads prompt + response and needs
    two matches because its instruction holds ``<answer> Beijing </answer>``; over the completion one suffices."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    return matches[-1].strip() if matches else None


_SEARCH_R1_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_SEARCH_R1_STEPS = {("start", "<think>"): "in_think", ("information", "<think>"): "in_think",
                    ("in_think", "</think>"): "after_think", ("after_think", "<search>"): "in_search",
                    ("in_search", "</search>"): "after_search", ("after_search", "<information>"): "in_information",
                    ("in_information", "</information>"): "information", ("after_think", "<answer>"): "in_answer",
                    ("in_answer", "</answer>"): "end"}


def search_r1_valid_sequence(text: str) -> tuple[bool, str]:
    """``qa_em_format.is_valid_sequence`` on a completion: balanced tags, then
    think (search information think)* answer with only white space between the blocks."""
    for tag in ("think", "search", "information", "answer"):
        if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
            return False, f"unbalanced {tag}"
    state = "start"
    for part in _SEARCH_R1_TAG.split(text):
        if not part.strip():
            continue
        if _SEARCH_R1_TAG.fullmatch(part):
            state = _SEARCH_R1_STEPS.get((state, part), "")
            if not state:
                return False, f"unexpected tag {part}"
        elif not state.startswith("in_"):
            return False, f"text between tags in state {state}"
    return (True, "valid") if state == "end" else (False, f"ended in state {state}")


# ----------------------------------------------------------------------------------------------- reward
SEARCH_R1_FORMAT = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.0}


def search_r1_reward(text: str, golds: Sequence[str], structure_format_score: float = 0.0,
                     final_format_score: float = 0.0, retrieval_score: float = 0.0) -> float:
    """Exact match of the last ``<answer>`` (SQuAD normalisation, any alias). With every score 0 (the default) this
    is ``qa_em.compute_score_em``: 1 for a match, else 0. With the format scores it is ``qa_em_format``'s: a valid
    sequence (think (search information think)* answer) earns ``structure_format_score`` when wrong (plus
    ``retrieval_score`` when an ``<information>`` block contains a gold answer), a right answer in an invalid
    sequence earns 1 − ``structure_format_score``, a wrong one ``final_format_score``; no answer in an invalid
    sequence, 0. The peer checks the sequence after ``<|im_start|>assistant``; here the completion is that part."""
    answer = _search_r1_answer(text)
    valid = search_r1_valid_sequence(text)[0]
    retrieved = valid and any(normalize_answer(g) in normalize_answer(block) for g in golds
                              for block in re.findall(r"<information>(.*?)</information>", text, re.S))
    partial = structure_format_score + (retrieval_score if retrieved else 0.0)
    if answer is None:
        return partial if valid else 0.0
    if exact_match(answer, list(golds)):
        return 1.0 if valid else 1.0 - structure_format_score
    return partial if valid else final_format_score


# a peer: no repeat blocking; past the search limit the trajectory ends, no notice (generation.py run_llm_loop, whose
# last generation after max_turns runs execute_predictions(do_search=False) and appends nothing)
PROTOCOL = AgentProtocol(
    name="search_r1", source="PeterGriffinJin/Search-R1@a14dc3a search_r1/llm_agent/generation.py, "
    "scripts/data_process/nq_search.py, verl/utils/reward_score/qa_em.py",
    assistant_prefix="", stop_strings=("</search>", "</answer>"),
    build_messages=lambda q, bg: [{"role": "user", "content": _search_r1_prompt(q, bg)}],
    build_base_prompt=_search_r1_prompt, format_docs=_search_r1_docs, wrap_notice=_SR1_WRAP.format,
    parse_turn=_search_r1_parse, final_answer=_search_r1_answer,
    format_ok=lambda text: search_r1_valid_sequence(text)[0],
    env_pattern=r"\n\n<information>.*?</information>\n\n|" + re.escape(SEARCH_R1_INVALID),
    invalid_block=SEARCH_R1_INVALID, reprompt=("invalid", "incomplete", "none"), top_k=3, max_searches=4,
    render_search=lambda think, query: f"<think>{think}</think>\n<search> {query} </search>",
    render_answer=lambda think, answer: f"<think>{think}</think>\n<answer> {answer} </answer>",
    rewards={"search_r1": search_r1_reward})
