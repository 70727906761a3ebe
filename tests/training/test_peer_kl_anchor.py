"""The RL stage's KL anchor is the checkpoint the stage starts from (issue 51): after an in-process SFT that moved
the weights, TRL's GRPOTrainer builds its reference from ``config._name_or_path``, which named the base model until
the pipeline handed the stage over (:func:`kunlunlab.training.pipeline.hand_over`, called by every finished
stage). With beta > 0 the step-1 KL is then 0: the policy and its reference are the same weights. A tiny random
Llama (tests/tiny_training.py) and fixed rollouts keep it to seconds."""
import pytest
import torch
from datasets import Dataset

from kunlunlab.models import load_llm
from kunlunlab.training.config import DAPOStageConfig, SFTStageConfig
from kunlunlab.training.dapo import rl_dataset, run_dapo
from kunlunlab.training.pipeline import hand_over
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.training.sft import run_sft
from tiny_training import fixed_rollout, length_reward

QUESTIONS = ["question 0", "question 1"]


def _sft_then_rl(tiny_model, folder, handed_over: bool) -> float:
    """SFT in process (a learning rate that moves the weights), then one RL step with beta > 0: its logged KL."""
    model, tokenizer = load_llm(tiny_model)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = [{"input_ids": [100 + 11 * i + j for j in range(12)], "completion_mask": [0] * 4 + [1] * 8}
            for i in range(4)]
    sft = run_sft(model, tokenizer, Dataset.from_list(rows), SFTStageConfig(batch_size=4, learning_rate=1e-2,
                                                                             max_steps=2, save_steps=100,
                                                                             max_length=64), folder / "sft")
    assert any(not torch.equal(base[n], p) for n, p in model.named_parameters()), "SFT must move the weights"
    final = folder / "sft" / "final"
    sft.save_model(str(final))
    if handed_over:
        hand_over(model, final)
    cfg = DAPOStageConfig(steps=1, prompts_per_step=2, num_generations=2, dynamic_sampling=False, save_steps=100,
                          beta=0.1, loss_type="grpo")
    trainer = run_dapo(model, tokenizer, rl_dataset(QUESTIONS, [["x"]] * 2), fixed_rollout(QUESTIONS), cfg,
                       RewardConfig(), folder / "rl", seed=0, reward_funcs=[length_reward], world_size=1)
    (kl,) = [row["kl"] for row in trainer.state.log_history if "kl" in row]
    return kl


def test_the_rl_stage_anchors_its_kl_to_the_sft_checkpoint_it_starts_from(tiny_model, tmp_path):
    assert _sft_then_rl(tiny_model, tmp_path / "anchored", handed_over=True) == pytest.approx(0.0, abs=1e-6)
    # without the hand-over TRL reloads the base model as the reference: the KL the peers' Table 2 runs logged
    assert _sft_then_rl(tiny_model, tmp_path / "base", handed_over=False) > 1e-4  # 0.0018 measured
