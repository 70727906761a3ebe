"""The peers' rewards as the peers compute them, as pure functions and as TRL reward functions.

Each function scores one completion (the text after the prompt, the assistant prefix excluded, retrieved documents
included: what the peers' reward code splits off the decoded sequence) against the gold answers. The format checks
and answer extraction are the protocols' (:mod:`kunlunlab.agent.protocols`), so a rollout and its reward read a
trajectory the same way. Sources, read at the commits named there:

* ``search_r1``: Search-R1 ``verl/utils/reward_score/qa_em.py`` ``compute_score_em`` (the released EM recipe); with
  ``SEARCH_R1_FORMAT`` it is ``qa_em_format.py`` ``compute_score_em`` as ``scripts/nq_hotpotqa/v0.3/train_ppo_format.sh``
  sets it (structure 0.2, final format 0.1, retrieval 0).
* ``research``: ReSearch (branch ``re-search``) ``src/verl/utils/reward_score/re_search.py`` ``compute_score``.
* ``r1_searcher_stage1``: R1-Searcher ``train/reward_server_llama_stage1.py``; ``r1_searcher_stage2``:
  ``train/reward_server_qwen_zero.py`` (the README's server, penalty 2) or, ``variant="llama"``,
  ``train/reward_server_llama_stage2.py`` (penalty 1, fewer checks).

Departures: R1-Searcher's servers look the gold answer up by question in their data file and take one string;
here the golds are passed and the best alias counts (max over aliases, as the other peers do). The peers' LLM-judge
metrics (ReSearch ``scripts/evaluation/llm_judge.py``, R1-Searcher ``metric_calc_gpt_as_judge.py``) are evaluation
only and are not rewards. ReSearch's "over length" (a response that does not end with EOS) cannot be seen in
decoded text: pass ``truncated=True`` (the TRL adapter reads ``truncated`` or the rollout's ``finish``).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Callable, Sequence

from kunlunlab.agent.protocols import (get_protocol, r1_searcher_checks, research_format,
                                       search_r1_valid_sequence)
from kunlunlab.data.answers import exact_match, f1, normalize_answer

SEARCH_R1_FORMAT = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.0}
_EOS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")


# ------------------------------------------------------------------------------------------- Search-R1
def search_r1_reward(text: str, golds: Sequence[str], structure_format_score: float = 0.0,
                     final_format_score: float = 0.0, retrieval_score: float = 0.0) -> float:
    """Exact match of the last ``<answer>`` (SQuAD normalisation, any alias). With every score 0 (the default) this
    is ``qa_em.compute_score_em``: 1 for a match, else 0. With the format scores it is ``qa_em_format``'s: a valid
    sequence (think (search information think)* answer) earns ``structure_format_score`` when wrong (plus
    ``retrieval_score`` when an ``<information>`` block contains a gold answer), a right answer in an invalid
    sequence earns 1 − ``structure_format_score``, a wrong one ``final_format_score``; no answer in an invalid
    sequence, 0. The peer checks the sequence after ``<|im_start|>assistant``; here the completion is that part."""
    answer = get_protocol("search_r1").final_answer(text)
    valid = search_r1_valid_sequence(text)[0]
    retrieved = valid and any(normalize_answer(g) in normalize_answer(block) for g in golds
                              for block in re.findall(r"<information>(.*?)</information>", text, re.S))
    partial = structure_format_score + (retrieval_score if retrieved else 0.0)
    if answer is None:
        return partial if valid else 0.0
    if exact_match(answer, list(golds)):
        return 1.0 if valid else 1.0 - structure_format_score
    return partial if valid else final_format_score


# ------------------------------------------------------------------------------------------- ReSearch
def research_reward(text: str, golds: Sequence[str], truncated: bool = False) -> float:
    """0 for a bad format (:func:`~kunlunlab.agent.protocols.research_format`), an over-length response or an
    answer without a usable ``\\boxed{}``; else the answer's F1 (SQuAD normalisation, yes/no only exactly, max over
    aliases) when above 0, and 0.1 for a well-formed wrong answer."""
    if not research_format(text)[0] or truncated:
        return 0.0
    answer = get_protocol("research").final_answer(text)
    if answer is None:
        return 0.0
    score = f1(answer, list(golds))
    return score if score > 0 else 0.1


# ------------------------------------------------------------------------------------------- R1-Searcher
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


# ------------------------------------------------------------------------------------------- TRL
PEER_REWARDS: dict[str, Callable[..., float]] = {
    "search_r1": search_r1_reward, "research": research_reward,
    "r1_searcher_stage1": r1_searcher_stage1, "r1_searcher_stage2": r1_searcher_stage2}


def _text(completion) -> str:
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    for eos in _EOS:
        if text.endswith(eos):
            return text[:-len(eos)]
    return text


def peer_reward_functions(name: str, **options) -> list:
    """TRL reward functions (``f(prompts, completions, **columns) -> list[float]``) for the peer reward ``name``
    (a key of :data:`PEER_REWARDS`), with ``options`` passed on (e.g. ``**SEARCH_R1_FORMAT``, ``variant="llama"``).
    They read the dataset's ``answers`` column as ``training.rewards.reward_functions`` does; ``research`` also
    reads ``truncated`` (bools) or the rollout's ``finish`` (``"budget"``: the token budget ran out)."""
    if name not in PEER_REWARDS:
        raise ValueError(f"unknown peer reward {name!r}; known: {', '.join(sorted(PEER_REWARDS))}")
    score = PEER_REWARDS[name]

    def reward(prompts, completions, answers, truncated=None, finish=None, **kw):
        texts = [_text(c) for c in completions]
        if name != "research":
            return [float(score(t, g, **options)) for t, g in zip(texts, answers)]
        cut = truncated if truncated is not None else [f == "budget" for f in finish] if finish is not None \
            else [False] * len(texts)
        return [float(score(t, g, truncated=bool(c), **options)) for t, g, c in zip(texts, answers, cut)]

    reward.__name__ = f"{name}_reward"
    return [reward]


__all__ = ["PEER_REWARDS", "SEARCH_R1_FORMAT", "peer_reward_functions", "r1_cover_em", "r1_f1", "r1_normalize",
           "r1_searcher_stage1", "r1_searcher_stage2", "research_reward", "search_r1_reward"]
