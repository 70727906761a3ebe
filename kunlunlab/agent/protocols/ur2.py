"""UR2's protocol, rewards and difficulty-aware retrieval curriculum (Li et al. 2025, arXiv 2508.06165), as its code
does them for open-domain questions (its ``rag`` source).

Read at github Tsinghua-dhy/UR2 @b1cbc8b (prompts quoted verbatim, since a checkpoint depends on every character;
the code is written here; each function names the upstream code it follows). UR2 is built on R1-Searcher and keeps
its tags (``<|begin_of_query|>`` ... ``<|end_of_documents|>``), but its open-domain prompt asks for a ``\\boxed{}``
answer and no ``<think>`` block, and its rewards are its own:

* prompt: ``UR2_RL/OpenRLHF-RAG/openrlhf/datasets/prompts_dataset.py`` ``preprocess_data``, the ``rag`` branch (the
  same text as ``eval/eval_scripts/eval_hotpot500_multiturn_search_o1.py``'s "prompt of ur2"); the question alone as
  the user message; no assistant prefix.
* rollout: ``openrlhf/trainer/ppo_utils/experience_maker.py`` ``_generate_vllm_with_retrieve``: a turn stops at
  ``<|end_of_query|>``; the query after the last ``<|begin_of_query|>`` (quotes removed, white space collapsed) is
  searched for ``k=10`` documents, appended as ``<|begin_of_documents|>\\n`` + one ``doc\\n`` per document (``None``
  without any) + ``<|end_of_documents|>\\n\\n``; at the fifth generation (``t == 4``) the trajectory ends as it is: at
  most four searches.
* rewards: ``UR2_RL/train/reward_server_qwen_7b_math_rag_stage1.py`` (stage 1, retrieval behaviour: format, +3 for
  one search and +4 for two or more when retrieval was offered, no answer term) and
  ``UR2_RL/train/reward_server_qwen_math_rag_stage2.py`` (stage 2: 2 x F1 of the answer for a ``rag`` question, +1
  for a clean format); both read whether retrieval was offered (``is_retrieve``: the prompt holds
  ``<|begin_of_query|>``), here the ``offered`` argument.
* curriculum (:data:`UR2_CURRICULUM`): ``prompts_dataset.py`` decides once per training question whether its prompt
  offers retrieval, by the question's ``level``: ``very_hard`` always, ``hard`` with probability 5/7
  (``random.random() > 2/7``), ``easy`` and ``medium`` never; ``train/datasets/train_rag_math_stage2.jsonl`` carries
  the four levels (``train_rag_math_stage1.jsonl``, the first stage's data, is all ``very_hard``: every question of
  stage 1 is offered retrieval). The two stages are two trainings upstream (README "Stage 2 Training"; REINFORCE++
  baseline, ``UR2_RL/scripts/qwen_reinforce_plus_train.sh``).

Departures (docs/method.md, "UR2"): the repository ships the levels, not how they were estimated, and the paper's
text could not be read here (only its abstract was reachable), so the difficulty estimate is this project's: the
policy answers each question ``samples`` = 4 times under the closed prompt with no search, and 4/4 right is easy, 2-3
medium, 1 hard, 0 very hard. UR2 offers every open-domain (``rag``) question retrieval; the level rule above is the one
its code applies to its multiple-choice questions, and it is applied to the open-domain questions here because the
curriculum is what this recipe adds. UR2 has no closed prompt for open-domain questions: :data:`UR2_CLOSED_SYSTEM` is
its open-domain prompt with the search block cut out, as its math prompt without retrieval is its math prompt with
retrieval less that block. UR2's documents are one LLM summary per search (``retrieval_utils/gpt_summary_search_o1.py``:
GPT-4.1-mini condenses the top 10 passages given the query and the reasoning so far); here the passages themselves.
"""
from __future__ import annotations

import re
from typing import Sequence

from kunlunlab.agent.protocol import Turn
from kunlunlab.agent.protocols.base import AgentProtocol, RetrievalCurriculum, _with_background
from kunlunlab.agent.protocols.r1_searcher import BEGIN_DOCS, BEGIN_QUERY, END_DOCS, END_QUERY, r1_f1

_KQA_HEAD = (  # prompts_dataset.py, rag branch: the two paragraphs both prompts share (the second ends in a space)
    "You are solving a factual open-domain question from a Knowledge Question Answering (KQA) task. The question "
    "requires step-by-step reasoning over real-world knowledge to identify a specific, factually correct answer.\n"
    "\n"
    "Carefully analyze the question to understand the key entities, relationships, and constraints involved. "
    "Retrieve and consider relevant factual knowledge, and reason logically to identify the most accurate answer. \n"
    "\n")
_KQA_SEARCH = (  # the search block of the same prompt
    "During your reasoning, if you're unsure about any fact, you may issue a **search query** like this:  \n"
    "<|begin_of_query|> your concise query (less than 20 words) <|end_of_query|>\n"
    "\n"
    "* You can issue **multiple queries** at different steps in your reasoning.\n"
    "* **Each query must target only one fact or statement**. Do not combine multiple ideas in a single query.\n"
    "  * \u2705 Example:\n"
    "    * <|begin_of_query|> When did Einstein move to the United States? <|end_of_query|>\n"
    "    * <|begin_of_query|> Why did Einstein leave Germany? <|end_of_query|>\n"
    "  * \u274c Do **not** combine them like this:\n"
    "    * <|begin_of_query|> When did Einstein move to the US and why did he leave Germany? <|end_of_query|>\n"
    "* You may issue **at most five queries** in total \u2014 use them wisely.\n"
    "Once documents are returned in this format:  \n"
    "<|begin_of_documents|> \n"
    "... (search results here)  \n"
    "<|end_of_documents|>\n"
    "\n"
    "Use the evidence to confirm or revise your reasoning. Then continue analyzing the question until you're "
    "confident in the answer.\n"
    "\n")
_KQA_ANSWER = "At the end of your reasoning, give your final answer in the following format:  \n\\boxed{YOUR_ANSWER}"
UR2_SYSTEM = _KQA_HEAD + _KQA_SEARCH + _KQA_ANSWER  # the prompt of a question offered retrieval (and evaluation's)
UR2_CLOSED_SYSTEM = _KQA_HEAD + _KQA_ANSWER  # departure: the same prompt without its search block (see above)

# the reward servers' fallback text (the summariser's answer to a query it will not look up) and their special tokens
UR2_FALLBACK = ("This query requires design, computation, or complex reasoning, which exceeds the capabilities of a "
                "search engine. Please input another query or proceed with direct reasoning.")
_SPECIAL = ("\nuser", "\nassistant", "\nAssistant", "<|im_start|>", "<tool_call>")
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.S | re.I)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_LETTER = re.compile(r"[Tt]he correct answer is:?\s*([A-Ja-j])", re.S | re.I)
_TOOL_CALL = re.compile(r"<\|begin_of_query\|>\s*(.*?)\s*<\|end_of_query\|>", re.S)


def ur2_extract(text: str) -> str:
    """``extract_answer_math`` (both reward servers and the evaluation): every match of the greedy ``\\boxed{(.*)}``,
    then of ``<answer>(.*?)</answer>``, then of "the correct answer is X", in that order; the last one, stripped
    ("" when none)."""
    matches = _BOXED.findall(text) + _ANSWER_TAG.findall(text) + _LETTER.findall(text)
    return matches[-1].strip() if matches else ""


def _ur2_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``_generate_vllm_with_retrieve``: each document with a leading corpus id removed, stripped, one per line;
    ``None`` when there is none. Departure: the model generated ``<|end_of_query|>`` (a stop string) and the
    ``\\n\\n`` after it is environment (upstream appends both itself)."""
    flat = [re.sub(r"^\d+\s+", "", d).strip() for group in docs for d in group]
    return _ur2_block("".join(f"{d}\n" for d in flat) or "None")


def _ur2_block(text: str) -> str:
    return f"\n\n{BEGIN_DOCS}\n{text}{END_DOCS}\n\n"


def _ur2_parse(text: str) -> Turn:
    """A turn that stopped at ``<|end_of_query|>`` searches the text after the last ``<|begin_of_query|>`` (quotes
    removed, white space collapsed); without that begin tag or with an empty query the trajectory ends (upstream:
    "not in the required format, stop"). Any other turn is an answer when ``ur2_extract`` finds one, else it ends
    (``no_action``; the reward then scores no answer)."""
    end = text.find(END_QUERY)
    if end != -1:
        head = text[:end]
        query = " ".join(head.split(BEGIN_QUERY)[-1].replace('"', "").split()) if BEGIN_QUERY in head else ""
        if not query:
            return Turn("invalid", issues=["empty_query"])
        return Turn("search", queries=[query])
    answer = ur2_extract(text)
    if answer:
        return Turn("answer", answer=answer, answer_mode="short")
    if BEGIN_QUERY in text:
        return Turn("incomplete", issues=["unclosed:query"])
    return Turn("none", issues=["no_action"])


def ur2_checks(text: str, golds: Sequence[str] = (), offered: bool = True) -> list[str]:
    """The reward servers' format violations on a solution (the completion, documents included), one entry per
    violation as stage 1 counts them: not exactly one answer format (``\\boxed`` or "the correct answer is");
    unbalanced query/document tags or more than four queries; each query over 20 words; each special token; Chinese
    characters; an answer over 10 words and longer than the gold; a tag inside the answer; a query where retrieval
    was not offered."""
    issues = []
    pred = ur2_extract(text)
    if len(_LETTER.findall(text)) + len(_BOXED.findall(text)) != 1:
        issues.append("answer_format")
    counts = [text.count(t) for t in (BEGIN_QUERY, END_QUERY, BEGIN_DOCS, END_DOCS)]
    if counts[0] != counts[1] or counts[2] != counts[3] or counts[0] != counts[2] or counts[0] > 4:
        issues.append("tags")
    calls = _TOOL_CALL.findall(text)
    issues += ["long_query" for call in calls if len(call.split()) > 20]
    issues += [f"special:{tok.strip()}" for tok in _SPECIAL if tok in text]
    if any("\u4e00" <= ch <= "\u9fff" for ch in text):
        issues.append("chinese")
    gold_words = max((len(g.split()) for g in golds), default=0)
    if len(pred.split()) > 10 and len(pred.split()) > gold_words:
        issues.append("long_answer")
    if BEGIN_QUERY in pred or BEGIN_DOCS in pred:
        issues.append("tag_in_answer")
    if not offered and calls:
        issues.append("query_not_offered")
    return issues


def ur2_stage1(text: str, golds: Sequence[str], offered: bool = True) -> float:
    """Stage 1, retrieval behaviour (``reward_server_qwen_7b_math_rag_stage1.py``), no answer term. Offered
    retrieval: no search is one more violation; +1 without violations, else minus their number; +3 for one search,
    +4 for two or more (upstream: during its first 15 rollout steps, more than any budget here has); -0.5 per fallback
    text. Not offered: +1 without violations (a query is one), else 0."""
    issues = ur2_checks(text, golds, offered)
    searches = text.count(BEGIN_QUERY)
    if not offered:
        return 0.0 if issues else 1.0
    if searches == 0:
        issues.append("no_search")
    score = -0.5 * text.count(UR2_FALLBACK) + (1.0 if not issues else -float(len(issues)))
    return score + (3.0 if searches == 1 else 4.0 if searches >= 2 else 0.0)


def ur2_stage2(text: str, golds: Sequence[str], offered: bool = True) -> float:
    """Stage 2, answer quality (``reward_server_qwen_math_rag_stage2.py``, a ``rag`` question): 2 x F1 of the
    extracted answer (0 when there is none), +1 without any format violation (:func:`ur2_checks`), -0.5 per fallback
    text where retrieval was offered. The best gold alias counts (the servers look one gold up)."""
    pred = ur2_extract(text)
    answer = 2.0 * max((r1_f1(pred, g) for g in golds), default=0.0) if pred else 0.0
    fallback = -0.5 * text.count(UR2_FALLBACK) if offered else 0.0
    return answer + fallback + (0.0 if ur2_checks(text, golds, offered) else 1.0)


def _ur2_answer(text: str) -> str | None:
    return ur2_extract(text) or None


def _closed_messages(question: str, background: str | None) -> list[dict]:
    return [{"role": "system", "content": UR2_CLOSED_SYSTEM}, {"role": "user", "content": _with_background(question,
                                                                                                         background)}]


_ALL_LEVELS = (("easy", 1.0), ("medium", 1.0), ("hard", 1.0), ("very_hard", 1.0))
UR2_CURRICULUM = RetrievalCurriculum(
    closed_messages=_closed_messages, samples=4,
    # this project's thresholds on the share of the 4 closed-book answers that are right (see the docstring)
    levels=(("easy", 1.0), ("medium", 0.5), ("hard", 0.25), ("very_hard", 0.0)),
    # stage 1: every question offered retrieval (train_rag_math_stage1.jsonl is all very_hard); stage 2:
    # prompts_dataset.py's rule (hard: random.random() > 2/7)
    stages=(("retrieval", _ALL_LEVELS),
            ("answer", (("easy", 0.0), ("medium", 0.0), ("hard", 5 / 7), ("very_hard", 1.0)))),
    scope="drawn",
    source="Tsinghua-dhy/UR2@b1cbc8b UR2_RL/OpenRLHF-RAG/openrlhf/datasets/prompts_dataset.py (preprocess_data), "
           "train/datasets/train_rag_math_stage{1,2}.jsonl (level)")

# a peer: no repeat blocking; past four searches the trajectory ends as it is (experience_maker.py, t == 4)
PROTOCOL = AgentProtocol(
    name="ur2", source="Tsinghua-dhy/UR2@b1cbc8b UR2_RL/OpenRLHF-RAG/openrlhf/datasets/prompts_dataset.py, "
    "UR2_RL/OpenRLHF-RAG/openrlhf/trainer/ppo_utils/experience_maker.py, "
    "UR2_RL/train/reward_server_qwen_7b_math_rag_stage1.py, UR2_RL/train/reward_server_qwen_math_rag_stage2.py",
    assistant_prefix="", stop_strings=(END_QUERY,),
    build_messages=lambda q, bg: [{"role": "system", "content": UR2_SYSTEM},
                                  {"role": "user", "content": _with_background(q, bg)}],
    build_base_prompt=None, format_docs=_ur2_docs, wrap_notice=_ur2_block, parse_turn=_ur2_parse,
    final_answer=_ur2_answer, format_ok=lambda text: not ur2_checks(text),
    env_pattern=r"\n\n<\|begin_of_documents\|>\n.*?<\|end_of_documents\|>\n\n",
    invalid_block=None, reprompt=(), top_k=10, max_searches=4,
    # SFT turns (no SFT upstream: the shared cold start): free reasoning, then the query or the boxed answer
    render_search=lambda think, query: f"{think}\n\n{BEGIN_QUERY} {query} {END_QUERY}",
    render_answer=lambda think, answer: f"{think}\n\nThe final answer is \\boxed{{{answer}}}",
    rewards={"ur2_stage1": ur2_stage1, "ur2_stage2": ur2_stage2},
    staged_rewards={"ur2": ("ur2_stage1", "ur2_stage2")},
    curriculum=UR2_CURRICULUM)
