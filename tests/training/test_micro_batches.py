"""An RL update's micro-batches are trimmed of the rollout batch's padding (kunlunlab/training/micro_batches.py):
each micro-batch is as wide as its own longest prompt and completion, and the update's loss and gradients are the
ones TRL computes over the padded batch."""
import pytest
import torch
from trl import GRPOTrainer

import kunlunlab.training.dapo as dapo_module
from kunlunlab.models import load_llm
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.training.dapo import rl_dataset, run_dapo
from kunlunlab.training.micro_batches import TrimmedGRPOTrainer, trim_padding
from kunlunlab.training.rewards import RewardConfig
from tiny_training import KeepGradients, fixed_rollout, length_reward, tiny_llama

QUESTIONS = [f"question {i}" for i in range(4)]


def test_trim_padding_drops_the_columns_that_every_row_pads():
    inputs = {
        "prompt_ids": torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]]),
        "prompt_mask": torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]]),
        "completion_ids": torch.tensor([[1, 2, 0, 0, 0], [3, 4, 5, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
        "old_per_token_logps": torch.tensor([[-1.0, -2.0, 0.0, 0.0, 0.0], [-3.0, -4.0, -5.0, 0.0, 0.0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "ref_per_token_logps": None,
        "num_items_in_batch": 5,
    }
    out = trim_padding(inputs)
    assert out["prompt_ids"].tolist() == [[0, 5, 6], [7, 8, 9]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[1, 2, 0], [3, 4, 5]]
    assert out["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert out["tool_mask"].tolist() == [[1, 0, 1], [1, 1, 1]]
    assert out["old_per_token_logps"].tolist() == [[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]]
    assert out["advantages"].tolist() == [0.5, -0.5]
    assert out["ref_per_token_logps"] is None and out["num_items_in_batch"] == 5


def test_a_micro_batch_without_padding_is_handed_on_as_it_is():
    inputs = {"prompt_ids": torch.tensor([[5, 6]]), "prompt_mask": torch.tensor([[1, 1]]),
              "completion_ids": torch.tensor([[1, 2]]), "completion_mask": torch.tensor([[1, 1]])}
    assert trim_padding(inputs) is inputs


def _update(tokenizer, tmp_path, trainer_type, monkeypatch, env_mask=False, scored=None):
    """One DAPO update of 8 rollouts, one sequence per micro-batch, by ``trainer_type``; its loss, gradients and the
    (prompt, completion) widths of the micro-batches the loss saw. ``env_mask``: :func:`fixed_rollout`'s masks;
    ``scored``: a list that gets, per forward pass of the model, how many positions its labels score."""
    widths = []
    original = trainer_type._compute_loss

    def recording(self, model, inputs):
        widths.append((inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)))
        return original(self, model, inputs)

    monkeypatch.setattr(trainer_type, "_compute_loss", recording)
    monkeypatch.setattr(dapo_module, "trainer_class", lambda rollout: trainer_type)
    cfg = DAPOStageConfig(prompts_per_step=2, num_generations=4, dynamic_sampling=False, save_steps=100,
                          learning_rate=1e-3, steps=1, micro_batch_size=1)
    grads = KeepGradients()
    rollout = fixed_rollout(QUESTIONS, unequal_prompts=True, env_mask=env_mask)
    model = tiny_llama(tokenizer)
    if scored is not None:  # after any pre-hook: the labels the forward really got
        model.register_forward_hook(lambda module, args, kwargs, out: scored.append(
            int((kwargs["labels"] != -100).sum())), with_kwargs=True)
    trainer = run_dapo(model, tokenizer, rl_dataset(QUESTIONS, [["x"]] * len(QUESTIONS)), rollout,
                       cfg, RewardConfig(), tmp_path, seed=0, callbacks=[grads], reward_funcs=[length_reward],
                       world_size=1)
    monkeypatch.undo()
    loss = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return loss, grads.steps, widths


def test_an_update_on_trimmed_micro_batches_is_the_padded_update(tmp_path, monkeypatch):
    tokenizer = load_llm()[1]
    loss, grads, widths = _update(tokenizer, tmp_path / "trimmed", TrimmedGRPOTrainer, monkeypatch)
    padded_loss, padded_grads, padded_widths = _update(tokenizer, tmp_path / "padded", GRPOTrainer, monkeypatch)
    # TRL's micro-batches are as wide as the whole batch; trimmed, each is its own row's prompt and completion
    assert len(widths) == len(padded_widths) == 8
    assert len(set(padded_widths)) == 1
    prompt_width, completion_width = padded_widths[0]
    # the step's two questions have prompts of different lengths, the longer as wide as TRL's padded prompts
    assert len({w for w, _ in widths}) == 2 and max(w for w, _ in widths) == prompt_width
    assert sorted(c for _, c in widths) == [3, 3, 5, 5, 7, 7, 9, 9] and completion_width == 9
    assert loss == pytest.approx(padded_loss, rel=1e-5, abs=1e-7)
    assert len(grads) == len(padded_grads) == 1
    assert sum(g.pow(2).sum() for g in grads[0].values()) > 0
    for name, g in padded_grads[0].items():
        torch.testing.assert_close(grads[0][name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_tokens_without_loss_cost_no_head_work_and_the_update_is_trl_s(tmp_path, monkeypatch):
    tokenizer = load_llm()[1]
    scored, trl_scored = [], []
    loss, grads, _ = _update(tokenizer, tmp_path / "ours", TrimmedGRPOTrainer, monkeypatch, True, scored)
    trl_loss, trl_grads, _ = _update(tokenizer, tmp_path / "trl", GRPOTrainer, monkeypatch, True, trl_scored)
    # TRL: 8 forwards, each scoring its whole completion (3, 5, 7, 9 tokens in both groups)
    assert sorted(trl_scored) == [3, 3, 5, 5, 7, 7, 9, 9]
    # here: the fully masked group's 4 micro-batches never reach the model, the other's score model tokens only
    # (each completion less its 2 environment tokens)
    assert sorted(scored) == [1, 3, 5, 7]
    assert loss == pytest.approx(trl_loss, rel=1e-5, abs=1e-7)
    assert sum(g.pow(2).sum() for g in grads[0].values()) > 0
    assert set(grads[0]) == set(trl_grads[0])
    for name, g in trl_grads[0].items():  # to rounding: the head's vocabulary tiles sum fewer rows
        torch.testing.assert_close(grads[0][name], g, rtol=1e-5, atol=2e-6, msg=name)


def test_the_rl_trainers_trim():
    from kunlunlab.training.exploration import ExplorationGRPOTrainer, trainer_class

    assert trainer_class(fixed_rollout(QUESTIONS)) is TrimmedGRPOTrainer
    assert issubclass(ExplorationGRPOTrainer, TrimmedGRPOTrainer)
