"""DAPO through TRL with the geometry of :mod:`kunlunlab.training.geometry`: a rollout batch fed in micro-batches
gives the whole batch's loss and gradients, and several updates per rollout batch move the importance ratio
so that the clipping (clip-higher) binds, which one update per rollout batch never does.

A tiny randomly initialised Llama (the embedded tokenizer's vocabulary) and a fixed rollout: the same prompts,
completions and rewards for every geometry, so only the geometry differs."""
import pytest
import torch

from kunlunlab.models import load_llm
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.training.dapo import rl_dataset, run_dapo
from kunlunlab.training.rewards import RewardConfig
from tiny_training import KeepGradients, fixed_rollout, length_reward, tiny_llama

QUESTIONS = [f"question {i}" for i in range(8)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


def _train(tokenizer, tmp_path, name, **dapo):
    model = tiny_llama(tokenizer)
    cfg = DAPOStageConfig(**{"prompts_per_step": 2, "num_generations": 4, "dynamic_sampling": False,
                             "save_steps": 100, "learning_rate": 1e-3, "steps": 1, **dapo})
    grads = KeepGradients()
    trainer = run_dapo(model, tokenizer, rl_dataset(QUESTIONS, [["x"]] * len(QUESTIONS)), fixed_rollout(QUESTIONS), cfg,
                       RewardConfig(), tmp_path / name, seed=0, callbacks=[grads], reward_funcs=[length_reward],
                       world_size=1)
    return trainer, grads.steps


@pytest.fixture(scope="module")
def whole(tokenizer, tmp_path_factory):
    """Two rollout batches, one update each, over the whole batch (the CPU default geometry)."""
    return _train(tokenizer, tmp_path_factory.mktemp("whole"), "whole", steps=2, learning_rate=3e-2)


def test_micro_batches_give_the_whole_batch_loss_and_gradients(tokenizer, whole, tmp_path):
    whole, whole_grads = whole
    micro, micro_grads = _train(tokenizer, tmp_path, "micro", micro_batch_size=2)
    assert whole.args.per_device_train_batch_size == 8 and whole.args.gradient_accumulation_steps == 1
    assert micro.args.per_device_train_batch_size == 2 and micro.args.gradient_accumulation_steps == 4
    # the first update's loss and gradients do not depend on the learning rate, which differs between the two
    loss = [row["loss"] for row in whole.state.log_history if "loss" in row]
    micro_loss = [row["loss"] for row in micro.state.log_history if "loss" in row]
    assert len(micro_loss) == 1 and micro_loss[0] == pytest.approx(loss[0], rel=1e-4, abs=1e-6)
    assert len(whole_grads) == 2 and len(micro_grads) == 1
    norm = sum(g.pow(2).sum() for g in whole_grads[0].values()).sqrt()
    assert norm > 0  # the rewards differ inside each group: there is a gradient to compare
    for name, g in whole_grads[0].items():
        torch.testing.assert_close(micro_grads[0][name], g, rtol=1e-4, atol=1e-6, msg=name)


def _clip_ratios(trainer) -> list[float]:
    return [row["clip_ratio/region_mean"] for row in trainer.state.log_history if "clip_ratio/region_mean" in row]


def test_several_updates_per_rollout_batch_let_the_clip_bind(tokenizer, whole, tmp_path):
    # one update per rollout batch: the ratio is exactly 1 at every update and nothing is ever clipped
    assert _clip_ratios(whole[0]) == [0.0, 0.0]
    # two updates per rollout batch: the second update's ratio is against the policy that sampled the batch
    double, _ = _train(tokenizer, tmp_path, "double", steps=2, updates_per_generation=2, learning_rate=3e-2)
    assert double.args.steps_per_generation == 2
    ratios = _clip_ratios(double)
    assert len(ratios) == 2 and ratios[0] == 0.0 and ratios[1] > 0.0, ratios
