"""The protocols' own rewards (the peers': Search-R1, ReSearch, R1-Searcher) as TRL reward functions.

Each reward is a pure function of its protocol's module (:mod:`kunlunlab.agent.protocols`, ``AgentProtocol.rewards``:
the upstream code each follows is named there) that scores one completion (the text after the prompt, the assistant
prefix excluded, retrieved documents included: what the peers' reward code splits off the decoded sequence) against
the gold answers; the format checks and answer extraction are the same protocol's, so a rollout and its reward read a
trajectory the same way. The functions are re-exported here by name. :data:`PEER_REWARDS` is every registered
protocol's rewards, read from the protocol registry when it is used.

Departures: R1-Searcher's servers look the gold answer up by question in their data file and take one string;
here the golds are passed and the best alias counts (max over aliases, as the other peers do). The peers' LLM-judge
metrics (ReSearch ``scripts/evaluation/llm_judge.py``, R1-Searcher ``metric_calc_gpt_as_judge.py``) are evaluation
only and are not rewards. ReSearch's "over length" (a response that does not end with EOS) cannot be seen in
decoded text: a protocol whose rewards read it (``rewards_read_truncation``) gets ``truncated`` (the TRL adapter
reads ``truncated`` or the rollout's ``finish``).
"""
from __future__ import annotations

from kunlunlab.agent.protocols import PROTOCOLS, RegistryView, reward_owner
from kunlunlab.agent.protocols.r1_searcher import (r1_cover_em, r1_f1, r1_normalize, r1_searcher_stage1,
                                                   r1_searcher_stage2)
from kunlunlab.agent.protocols.research import research_reward
from kunlunlab.agent.protocols.search_r1 import SEARCH_R1_FORMAT, search_r1_reward

_EOS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")

# every registered protocol's rewards by kind (AgentProtocol.rewards), read when used
PEER_REWARDS: RegistryView = RegistryView(lambda: {kind: score for p in PROTOCOLS.values()
                                                   for kind, score in p.rewards.items()})


def _text(completion) -> str:
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    for eos in _EOS:
        if text.endswith(eos):
            return text[:-len(eos)]
    return text


def peer_reward_functions(name: str, **options) -> list:
    """TRL reward functions (``f(prompts, completions, **columns) -> list[float]``) for the peer reward ``name``
    (a key of :data:`PEER_REWARDS`), with ``options`` passed on (e.g. ``**SEARCH_R1_FORMAT``, ``variant="llama"``).
    They read the dataset's ``answers`` column as ``training.rewards.reward_functions`` does; a protocol whose rewards
    read truncation (ReSearch's) also reads ``truncated`` (bools) or the rollout's ``finish`` (``"budget"``: the
    token budget ran out); a protocol with a retrieval curriculum (UR2's) reads ``retrieval_offered`` (bools, the
    rollout's column; absent: offered) as its rewards' ``offered``."""
    rewards = PEER_REWARDS
    if name not in rewards:
        raise ValueError(f"unknown peer reward {name!r}; known: {', '.join(sorted(rewards))}")
    owner = reward_owner(name)
    score, reads_truncation = rewards[name], owner.rewards_read_truncation

    def reward(prompts, completions, answers, truncated=None, finish=None, retrieval_offered=None, **kw):
        texts = [_text(c) for c in completions]
        if owner.curriculum is not None:  # a curriculum's rewards read whether retrieval was offered (default: it was)
            offered = retrieval_offered if retrieval_offered is not None else [True] * len(texts)
            return [float(score(t, g, offered=bool(o), **options)) for t, g, o in zip(texts, answers, offered)]
        if not reads_truncation:
            return [float(score(t, g, **options)) for t, g in zip(texts, answers)]
        cut = truncated if truncated is not None else [f == "budget" for f in finish] if finish is not None \
            else [False] * len(texts)
        return [float(score(t, g, truncated=bool(c), **options)) for t, g, c in zip(texts, answers, cut)]

    reward.__name__ = f"{name}_reward"
    return [reward]


__all__ = ["PEER_REWARDS", "SEARCH_R1_FORMAT", "peer_reward_functions", "r1_cover_em", "r1_f1", "r1_normalize",
           "r1_searcher_stage1", "r1_searcher_stage2", "research_reward", "search_r1_reward"]
