"""A training stage shows a reader one progress bar and one closing line, not one raw log dictionary per step
(issue 54: executed notebooks printed hundreds), and its logged values still reach the trainer's history."""
import warnings

from datasets import Dataset

from kunlunlab.models import load_llm
from kunlunlab.training.config import SFTStageConfig
from kunlunlab.training.sft import run_sft
from tiny_training import tiny_llama


def test_sft_prints_a_bar_and_one_summary_line_not_a_dict_per_step(tmp_path, capfd):
    tokenizer = load_llm()[1]
    rows = Dataset.from_list([{"input_ids": [100 + 7 * i + j for j in range(12)], "completion_mask": [0] * 4 + [1] * 8}
                              for i in range(6)])
    cfg = SFTStageConfig(batch_size=2, learning_rate=1e-3, max_steps=3, save_steps=100, max_length=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run_sft(tiny_llama(tokenizer), tokenizer, rows, cfg, tmp_path / "sft", seed=0)
    out, err = capfd.readouterr()
    assert "{'loss'" not in out + err and "'learning_rate'" not in out + err
    summary = [line for line in out.splitlines() if line.startswith("SFT: ")]
    assert len(summary) == 1 and summary[0].startswith("SFT: 3 steps in ") and "last loss " in summary[0]
    assert "3/3" in err  # the bar reached the stage's last step
    assert len([row for row in trainer.state.log_history if "loss" in row]) == 3  # every step still logged
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
