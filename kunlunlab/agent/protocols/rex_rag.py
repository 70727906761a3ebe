"""REX-RAG's protocol and exploration spec (Jiang et al. 2025, arXiv 2508.08149), read at github
MiliLab/REX-RAG @d9dbbb4 (d9dbbb428e39b23b5424c05abbda90c68e2096db).

REX-RAG is Search-R1 retrained with exploration: the prompt, tags, document block and reward are Search-R1's
(:mod:`kunlunlab.agent.protocols.search_r1`), with two differences its rollout code has. What follows a turn without
a closed action is its own shorter notice (``search_r1/llm_agent/thinking_prompts.py`` ``action_invalid_prompt``,
appended in ``generation.py`` ``execute_predictions`` and kept out of the loss as environment text, component 3), and
its loop runs ``max_turns=5`` search turns (``scripts/search-r1-sgl/run_grpo_sglang_fsdp.sh``). The reward is the
exact match of the last ``<answer>``: ``verl/trainer/main_ppo.py`` ``_select_rm_score_fn`` picks
``qa_em_format.compute_score_em_custom``, which with ``structure_format_score`` 0 (``ppo_trainer.yaml``; the script
sets none) is 1 for a match and 0 otherwise, Search-R1's ``compute_score_em``.

What REX-RAG adds is :data:`EXPLORATION`, data that ``kunlunlab.training.exploration`` reads:

* prompts: the 30 exploratory prompts, quoted verbatim (a checkpoint trained with them depends on every character)
  from ``thinking_prompts.py`` ``revision_prompts``, the active set (marked ``# 原始``, "original"; three other sets
  are commented out); ``execute_predictions`` draws one uniformly (``random.randint(0, len - 1)``).
* cut: at a trajectory's answer turn, ``execute_predictions`` deletes the first ``<(search|answer)>…</…>`` match
  of the turn (``_delete_contents(predictions[i], complete_predictions[i])``), i.e. the answer, keeps the reasoning
  before it, appends the prompt and continues the rollout (``clone_rollout``); the prompt's tokens are trained on
  (``_info_masked_concatenate_with_padding`` restores them in ``info_mask``, component 5).
* probe_share 0.2: a wrong answer (score < 1) of an original trajectory is probed when
  ``random.randint(0, 100) < revision_prob``, ``data.revision_prob=20`` in the script.
* keep ratio: ``verl/trainer/ppo/ray_trainer.py`` ``reorder_batch`` keeps ``train_batch_size x n_agent x
  keep_ratio`` probes, those whose prompt tokens have the highest mean old log-prob; ``keep_ratio`` is the
  exponential moving average (``pd.Series.ewm(alpha=0.1, adjust=False)``) of the series that starts at
  ``keep_ratio=0.08`` (``ppo_trainer.yaml``, the script) and gets each step's probe accuracy appended.

Departure in the trigger: upstream probes any wrong trajectory; here only the samples of a dead-end group (every
sample of the question wrong), the paper's "dead end", because TRL's groups are of a fixed size and a kept probe
takes the place of a sample of its group (docs/method.md, "REX-RAG").
"""
from __future__ import annotations

import re
from dataclasses import replace

from kunlunlab.agent.protocols.base import ExplorationSpec
from kunlunlab.agent.protocols.search_r1 import PROTOCOL as SEARCH_R1
from kunlunlab.agent.protocols.search_r1 import search_r1_reward

REX_RAG_INVALID = "\nMy action is invalid. "  # thinking_prompts.py action_invalid_prompt

REX_RAG_PROMPTS = (  # thinking_prompts.py revision_prompts (the active, "original" set), verbatim
    "<think> Perhaps I've overlooked critical points or slipped up in my logic.",
    "<think> I wonder if vital information escaped my notice or if I made an error.",
    "<think> There might be key gaps in my understanding or errors in reasoning.",
    "<think> It's possible I've missed something important or misunderstood crucial details.",
    "<think> I suspect errors crept in, or essential points went unnoticed.",
    "<think> Maybe I've misjudged something important or neglected key facts.",
    "<think> Reflecting now, I might have overlooked critical data or erred somewhere.",
    "<think> Possibly, I've missed significant insights or made a mistake.",
    "<think> I'm sensing a gap or error might be present in my recent reasoning.",
    "<think> I could have misinterpreted important facts or overlooked necessary details.",
    "<think> Aware that my reasoning might be flawed or lacking crucial points.",
    "<think> I need to reconsider—I might've skipped vital information or erred.",
    "<think> There's a chance my previous thinking has unnoticed mistakes or omissions.",
    "<think> I feel there might be something critical I overlooked or misunderstood.",
    "<think> Perhaps my earlier reasoning has hidden mistakes or missing information.",
    "<think> Concerned I might have overlooked key aspects or made subtle errors.",
    "<think> I might have unintentionally ignored essential details or misunderstood something.",
    "<think> Revisiting carefully, perhaps errors or oversights went unnoticed earlier.",
    "<think> Maybe important points slipped my attention, or I made a miscalculation.",
    "<think> It's likely I've overlooked something crucial or stumbled in logic.",
    "<think> Reflecting, I could've missed critical clues or made errors in judgment.",
    "<think> Possibly, I misunderstood something fundamental or missed key evidence.",
    "<think> Concerned about potential unnoticed mistakes or overlooked essential details.",
    "<think> Perhaps my earlier step wasn't entirely accurate or lacked vital points.",
    "<think> It's conceivable that I've neglected critical information or erred.",
    "<think> Wondering if I've mistakenly dismissed something important or misunderstood it.",
    "<think> Maybe my previous reasoning has blind spots or unnoticed errors.",
    "<think> I'm doubting if crucial points were missed or mistakes made earlier.",
    "<think> Feeling uncertain—perhaps critical details slipped past or were misunderstood.",
    "<think> Recognizing possible gaps or missteps I didn't previously notice.",
)

EXPLORATION = ExplorationSpec(
    prompts=REX_RAG_PROMPTS,
    cut_pattern=r"<(search|answer)>(.*?)</\1>",  # generation.py postprocess_predictions: the turn's action
    probe_share=0.2,  # run_grpo_sglang_fsdp.sh data.revision_prob=20 (percent)
    keep_ratio_start=0.08, keep_ratio_smoothing=0.1,  # keep_ratio=0.08; ray_trainer.py ewm(alpha=0.1)
    source="MiliLab/REX-RAG@d9dbbb4 search_r1/llm_agent/generation.py, thinking_prompts.py, "
           "verl/trainer/ppo/ray_trainer.py reorder_batch, verl/workers/actor/dp_actor.py update_policy")


def rex_rag_reward(text: str, golds) -> float:
    """``qa_em_format.compute_score_em_custom`` with ``structure_format_score`` 0: exact match of the last
    ``<answer>`` (SQuAD normalisation, any alias), 1 or 0."""
    return search_r1_reward(text, golds)


PROTOCOL = replace(
    SEARCH_R1, name="rex_rag",
    source="MiliLab/REX-RAG@d9dbbb4 search_r1/llm_agent/generation.py, thinking_prompts.py; the rest is "
    "Search-R1's (PeterGriffinJin/Search-R1@a14dc3a)",
    env_pattern=r"\n\n<information>.*?</information>\n\n|" + re.escape(REX_RAG_INVALID),
    invalid_block=REX_RAG_INVALID, max_searches=5,  # run_grpo_sglang_fsdp.sh max_turns=5
    rewards={"rex_rag": rex_rag_reward}, exploration=EXPLORATION)
