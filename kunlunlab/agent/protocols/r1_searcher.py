"""R1-Searcher's protocol and rewards (Song et al. 2025), as its code does them.

Read at github RUCAIBox/R1-Searcher @631167c (prompts quoted verbatim, since a checkpoint depends on every
character; the code is written here; each function names the peer function it follows). ``background`` (RDRA's
context) is no peer's: None gives the peer's prompt exactly; a background goes before the question as this
project's ``<background>`` block. Departures: the parsers' tables and docs/method.md ("The peers' protocols and
rewards").

Rewards: ``r1_searcher_stage1``: ``train/reward_server_llama_stage1.py``; ``r1_searcher_stage2``:
``train/reward_server_qwen_zero.py`` (the README's server, penalty 2) or, ``variant="llama"``,
``train/reward_server_llama_stage2.py`` (penalty 1, fewer checks); ``r1_searcher``: the two stages in one RL stage,
stage 1 for the first ``rewards.stage1_share`` of the steps, then stage 2 (``staged_rewards``). Departure: the
servers look the gold answer up by question in their data file and take one string; here the golds are passed and
the best alias counts (max over aliases, as the other peers do).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

from kunlunlab.agent.protocol import Turn
from kunlunlab.agent.protocols.base import AgentProtocol, _answer_turn, _think, _with_background

BEGIN_QUERY, END_QUERY = "<|begin_of_query|>", "<|end_of_query|>"
BEGIN_DOCS, END_DOCS = "<|begin_of_documents|>", "<|end_of_documents|>"
_R1_FORMAT = ('The output format of reasoning process and final answer are enclosed within <think> </think> and '
              '<answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final '
              'answer here </answer>".\n')
R1_SEARCHER_SYSTEM = (  # prompts_dataset.py, apply_chat_template branch (Llama-3.1-8B-Instruct)
    "You are a helpful assistant.\nGiven a question, you should answer it by first thinking about the reasoning "
    "process in the mind and then providing the final answer.\n" + _R1_FORMAT +
    'During the thinking process, **you can perform searching for uncertain knowledge** if necessary with the format '
    'of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)<|end_of_query|>". '
    '**A query must involve only a single triple**.\nThen, the search system will provide you with the retrieval '
    'information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".')
R1_SEARCHER_BASE = (  # prompts_dataset.py, base-model branch (Qwen-2.5-7B-Base), up to "User:{question}"
    "The User asks a question, and the Assistant solves it.\nThe Assistant first thinks about the reasoning process "
    "in the mind and then provides the User with the final answer.\n" + _R1_FORMAT +
    'During the thinking process, **the Assistant can perform searching** for uncertain knowledge if necessary with '
    'the format of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)'
    '<|end_of_query|>". **A query must involve only a single triple**.\nThen, the search system will provide the '
    'Assistant with the retrieval information with the format of "<|begin_of_documents|> ...search results... '
    '<|end_of_documents|>".\n\n')
R1_SEARCHER_EVAL_BASE = (  # evaluation/eval_search_loacl.py base_prompt_v0 (README: --prompt_type v0), up to "User:"
    "The User asks a question, and the Assistant solves it.\nThe Assistant first thinks about the reasoning process "
    "in the mind and then provides the User with the final answer.\n" + _R1_FORMAT +
    'During the thinking process, the Assistant can perform searching for uncertain knowledge if necessary with the '
    'format of "<|begin_of_query|> search query (only keywords) here <|end_of_query|>". **A query must involve only a '
    'single triple**.\nThen, the system will provide the Assistant with helpful information with the format of '
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\n')


def _r1_doc(contents: str) -> str:
    """A FlashRAG passage (``"Title"\\ntext``) as R1-Searcher's training corpus lays its passages out (the HotpotQA
    abstracts TSV: ``Title: X Text:  Y``, two spaces, as in every passage of data/eval_results/hotpotqa_qwen.jsonl);
    a passage without a title line stays as it is."""
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first[0] == first[-1] == '"':
        return f"Title: {first[1:-1]} Text:  {rest.lstrip()}"
    return contents


def _r1_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``experience_maker.py``: ``(j)<passage>\\n`` per passage (a leading corpus id removed), ``None`` when there is
    none, between the document tags."""
    flat = [re.sub(r"^\d+\s+", "", _r1_doc(d)) for group in docs for d in group]
    return _r1_notice("".join(f"({j + 1}){d}\n" for j, d in enumerate(flat)) or "None")


def _r1_notice(text: str) -> str:
    """Departure: the peer appends ``<|end_of_query|>\\n\\n`` itself and trains on it (its mask starts at the
    documents tag); here the model generated ``<|end_of_query|>`` (a stop string) and the ``\\n\\n`` is environment."""
    return f"\n\n{BEGIN_DOCS}\n{text}{END_DOCS}\n\n"


def _r1_parse(text: str) -> Turn:
    """A turn ends at ``<|end_of_query|>`` (training) or ``</answer>`` (evaluation stops there too); the query follows
    the last ``<|begin_of_query|>``, quotes removed and white space collapsed as in training. An empty query or no
    begin tag: ``invalid``, ``empty_query`` (the peer ends the trajectory); ``<answer>`` never closed: no answer,
    ``unclosed:answer`` (evaluation: "shot_down")."""
    think, issues = _think(text)
    q_end, a_end = text.find(END_QUERY), text.find("</answer>")
    if q_end != -1 and (a_end == -1 or q_end < a_end):
        head = text[:q_end]
        query = " ".join(head.split(BEGIN_QUERY)[-1].replace('"', "").split()) if BEGIN_QUERY in head else ""
        # the prefix's <think> stays open across searches (one think span closes before the answer): no issue
        issues = [i for i in issues if i != "unclosed:think"]
        if not query:
            return Turn("invalid", think=think, issues=issues + ["empty_query"])
        return Turn("search", queries=[query], think=think, issues=issues)
    if "<answer>" in text:
        tail = text.split("<answer>")[-1]
        if "</answer>" not in tail:
            return Turn("answer", answer_mode="short", think=think, issues=issues + ["unclosed:answer"])
        return _answer_turn(tail.split("</answer>")[0], think, issues)
    if BEGIN_QUERY in text:
        return Turn("incomplete", think=think, issues=issues + ["unclosed:query"])
    return Turn("none", think=think, issues=issues + ["no_action"])


def _r1_answer(text: str) -> str | None:
    """The reward servers' ``extract_answer_math``: the text between the last ``<answer>`` and ``</answer>``."""
    if "<answer>" not in text or "</answer>" not in text.split("<answer>")[-1]:
        return None
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def r1_searcher_checks(text: str) -> dict[str, bool]:
    """The format conditions of R1-Searcher's reward servers, on the solution (the text after the prompt's
    ``<think>``), each True when met: ``docs_balanced`` (the seven tag counts agree, ``(1)`` opening each block),
    ``searched`` (at least one such block), ``think_answer_once`` (no ``<think>``, one ``</think>``, one answer),
    ``answer_clean`` (no query or document tag inside the answer), ``answer_short`` (at most 10 words),
    ``no_assistant`` (neither "Assistant" nor "assistant", documents included), ``no_chinese`` (outside documents)."""
    counts = [text.count(t) for t in (f"{BEGIN_DOCS}\n", f"{END_DOCS}\n\n", BEGIN_QUERY, END_QUERY, BEGIN_DOCS,
                                      END_DOCS, f"{BEGIN_DOCS}\n(1)")]
    answer = text.split("<answer>")[-1].split("</answer>")[0].strip()
    outside = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", text, flags=re.S)
    return {"docs_balanced": len(set(counts)) == 1, "searched": len(set(counts)) == 1 and counts[0] >= 1,
            "think_answer_once": text.count("<think>") == 0 and text.count("</think>") == 1
            and text.count("<answer>") == 1 and text.count("</answer>") == 1,
            "answer_clean": "begin_of_query" not in answer and "begin_of_documents" not in answer,
            "answer_short": len(answer.split()) <= 10,
            "no_assistant": "Assistant" not in text and "assistant" not in text,
            "no_chinese": not any("\u4e00" <= ch <= "\u9fff" for ch in outside)}


def _r1_format(text: str) -> bool:
    """The stage-2 reward's format check (``train/reward_server_qwen_zero.py``): every condition but ``searched``."""
    return all(ok for check, ok in r1_searcher_checks(text).items() if check != "searched")


# ----------------------------------------------------------------------------------------------- rewards
def r1_normalize(text: str) -> str:
    """The servers' ``normalize_answer``: ``_`` as a space, lower case, punctuation (and ‘ ’ ´ `) replaced by a space
    (SQuAD removes it), articles dropped, white space collapsed; ``True``/``False`` read as yes/no first."""
    text = {"True": "yes", "False": "no"}.get(text, text).replace("_", " ").lower()
    text = "".join(" " if ch in _R1_PUNCT else ch for ch in text)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


_R1_PUNCT = set(string.punctuation + "‘’´`")


def r1_cover_em(prediction: str, gold: str) -> bool:
    """``cover_exact_match_score_1``: every word of the gold is a word of the prediction, in any order."""
    words = r1_normalize(prediction).split(" ")
    return all(w in words for w in r1_normalize(gold).split(" "))


def r1_f1(prediction: str, gold: str) -> float:
    """``f1_score`` with :func:`r1_normalize`; a yes/no/noanswer on either side scores only when both agree."""
    pred, ref = r1_normalize(prediction), r1_normalize(gold)
    if (pred in ("yes", "no", "noanswer") or ref in ("yes", "no", "noanswer")) and pred != ref:
        return 0.0
    common = sum((Counter(pred.split()) & Counter(ref.split())).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred.split()), common / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def _r1_prediction(text: str) -> str:
    """``extract_answer_math``: after the last ``<answer>``, before the next ``</answer>`` (the whole text without)."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def _r1_finished(text: str) -> bool:
    return "<answer>" in text and "</answer>" in text


def r1_searcher_stage1(text: str, golds: Sequence[str], with_answer: bool = True) -> float:
    """Stage 1, "learn to invoke search" (``reward_server_llama_stage1.py``): +1 for a cover-EM answer, −1 for a
    wrong or missing one; +0.5 when retrieval was invoked with well-formed document blocks (``searched``); +0.5 when
    ``</think>`` and the answer tags occur once and ``<think>`` not at all. In [−1, 2]. ``with_answer=False`` drops
    the ±1 term: the paper's reading of stage 1 (retrieval and format only; its README and code keep the answer)."""
    right = _r1_finished(text) and any(r1_cover_em(_r1_prediction(text), g) for g in golds)
    checks = r1_searcher_checks(text)
    score = (1.0 if right else -1.0) if with_answer else 0.0
    return score + 0.5 * checks["searched"] + 0.5 * checks["think_answer_once"]


_STAGE2_CHECKS = {"qwen": ("docs_balanced", "think_answer_once", "answer_clean", "answer_short", "no_assistant",
                           "no_chinese"),
                  "llama": ("docs_balanced", "think_answer_once", "no_chinese")}
_STAGE2_PENALTY = {"qwen": 2.0, "llama": 1.0}


def r1_searcher_stage2(text: str, golds: Sequence[str], variant: str = "qwen") -> float:
    """Stage 2, "learn to use search": the answer's F1 (:func:`r1_f1`, 0 without both answer tags) minus 2 when any
    format check fails (``variant="qwen"``, ``reward_server_qwen_zero.py``: balanced document blocks, think and
    answer once, no tag and at most 10 words in the answer, no "assistant", no Chinese outside documents); minus 1
    with the three checks of ``reward_server_llama_stage2.py`` (``variant="llama"``)."""
    if variant not in _STAGE2_CHECKS:
        raise ValueError(f"variant must be one of {sorted(_STAGE2_CHECKS)}, got {variant!r}")
    score = max((r1_f1(_r1_prediction(text), g) for g in golds), default=0.0) if _r1_finished(text) else 0.0
    checks = r1_searcher_checks(text)
    return score - (_STAGE2_PENALTY[variant] if not all(checks[c] for c in _STAGE2_CHECKS[variant]) else 0.0)


# a peer: no repeat blocking; past the search limit the trajectory ends, no notice (experience_maker.py, whose
# generation at t == 8 is kept as it is and ends)
PROTOCOL = AgentProtocol(
    name="r1_searcher", source="RUCAIBox/R1-Searcher@631167c OpenRLHF-RAG/openrlhf/datasets/prompts_dataset.py, "
    "OpenRLHF-RAG/openrlhf/trainer/ppo_utils/experience_maker.py, train/reward_server_*.py",
    assistant_prefix="<think>", stop_strings=(END_QUERY, "</answer>"),
    build_messages=lambda q, bg: [{"role": "system", "content": R1_SEARCHER_SYSTEM},
                                  {"role": "user", "content": _with_background(q, bg)}],
    build_base_prompt=lambda q, bg: f"{R1_SEARCHER_BASE}User:{_with_background(q, bg)}\nAssistant: ",
    format_docs=_r1_docs, wrap_notice=_r1_notice, parse_turn=_r1_parse, final_answer=_r1_answer,
    format_ok=_r1_format, env_pattern=r"\n\n<\|begin_of_documents\|>\n.*?<\|end_of_documents\|>\n\n",
    invalid_block=None, reprompt=(), top_k=3, max_searches=8,
    # SFT turns: one think span for the whole trajectory, opened by the prefix, closed before the answer
    render_search=lambda think, query: f"{think} {BEGIN_QUERY} {query} {END_QUERY}",
    render_answer=lambda think, answer: f"{think}</think>\n\n<answer> {answer} </answer>",
    rewards={"r1_searcher_stage1": r1_searcher_stage1, "r1_searcher_stage2": r1_searcher_stage2},
    staged_rewards={"r1_searcher": ("r1_searcher_stage1", "r1_searcher_stage2")})
