"""SFT in micro-batches (``sft.micro_batch_size``): an optimizer step over a batch of 4 trajectories fed as two
micro-batches of 2 gives the loss and gradients of the whole batch at once (a token mean over the batch's
completion tokens, not a mean of per-micro-batch means), which is what lets make run's SFT halve its peak memory
without changing what it learns."""
import pytest
import torch
from datasets import Dataset

from kunlunlab.models import load_llm
from kunlunlab.training.config import SFTStageConfig
from kunlunlab.training.sft import run_sft
from tiny_training import KeepGradients, tiny_llama


def _rows():
    """Four trajectories of unequal prompt and completion lengths, so the micro-batches hold unequal token
    counts and a mean of means would differ from the token mean."""
    rows = []
    for i, (prompt, completion) in enumerate(((3, 2), (4, 9), (2, 5), (6, 14))):
        ids = [100 + 11 * i + j for j in range(prompt + completion)]
        rows.append({"input_ids": ids, "completion_mask": [0] * prompt + [1] * completion})
    return Dataset.from_list(rows)


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


def _step(tokenizer, tmp_path, name, **sft):
    grads = KeepGradients()
    cfg = SFTStageConfig(**{"batch_size": 4, "learning_rate": 1e-3, "max_steps": 1, "save_steps": 100,
                            "max_length": 64, **sft})
    trainer = run_sft(tiny_llama(tokenizer), tokenizer, _rows(), cfg, tmp_path / name, seed=0, callbacks=[grads])
    loss = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return trainer, loss, grads.steps


def test_micro_batches_give_the_whole_batch_loss_and_gradients(tokenizer, tmp_path):
    whole, whole_loss, whole_grads = _step(tokenizer, tmp_path, "whole")
    micro, micro_loss, micro_grads = _step(tokenizer, tmp_path, "micro", micro_batch_size=2)
    assert (whole.args.per_device_train_batch_size, whole.args.gradient_accumulation_steps) == (4, 1)
    assert (micro.args.per_device_train_batch_size, micro.args.gradient_accumulation_steps) == (2, 2)
    assert len(whole_loss) == len(micro_loss) == 1 and len(whole_grads) == len(micro_grads) == 1
    # a random model over a 49k vocabulary: the loss is about ln(49152) = 10.8
    assert 9.0 < whole_loss[0] < 12.5
    assert micro_loss[0] == pytest.approx(whole_loss[0], rel=1e-4)
    for name, g in whole_grads[0].items():
        torch.testing.assert_close(micro_grads[0][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(ValueError, match=r"sft.micro_batch_size=3 must be a positive divisor of sft.batch_size=4"):
        SFTStageConfig(batch_size=4, micro_batch_size=3)
    assert SFTStageConfig(batch_size=4, grad_accum=2, micro_batch_size=1).accumulation_steps == 8
