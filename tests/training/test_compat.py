"""Each training stage switches activation checkpointing on under the transformers it runs on: 5.22 in the CPU lock,
5.17 on a GPU node (the ``gpu`` extra and the device image; ``make test-gpuenv`` runs this file there), and 5.2x with
the new name. Passing the new name ``activation_checkpointing`` to 5.17 raised ``TypeError`` in SFT, DPO and DAPO alike
(issue 42); passing the old name to 5.23+ works but warns that it is deprecated."""
import dataclasses
import warnings

import pytest
from transformers import TrainingArguments

from kunlunlab.training.config import DAPOStageConfig, SFTStageConfig
from kunlunlab.training.dapo import grpo_args
from kunlunlab.training.dpo import DPOStageConfig, dpo_args
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.training.sft import sft_args

FIELDS = {f.name for f in dataclasses.fields(TrainingArguments)}


def _checkpointing_on(args) -> bool:
    # whichever name this transformers has, the Trainer reads gradient_checkpointing (5.17) or the new name (5.2x)
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))


@pytest.mark.parametrize("stage", ["sft", "dpo", "dapo"])
def test_every_stage_turns_checkpointing_on_without_a_deprecation_warning(stage, tmp_path):
    build = {"sft": lambda: sft_args(SFTStageConfig(), tmp_path, 0, gradient_checkpointing=True),
             "dpo": lambda: dpo_args(DPOStageConfig(), tmp_path, 0, gradient_checkpointing=True),
             "dapo": lambda: grpo_args(DAPOStageConfig(), RewardConfig(), tmp_path, 0, gradient_checkpointing=True,
                                       world_size=1)}[stage]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = build()
    assert _checkpointing_on(args)
    deprecated = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecated == []


def test_checkpointing_off_stays_off(tmp_path):
    args = sft_args(SFTStageConfig(), tmp_path, 0, gradient_checkpointing=False)
    assert not _checkpointing_on(args)


def test_the_name_in_use_is_one_this_transformers_has():
    from kunlunlab.training.compat import checkpointing_args

    (name,) = checkpointing_args(True)
    assert name in FIELDS
    # where both exist the current name is the one used (the old one is the deprecated alias)
    assert name == ("activation_checkpointing" if "activation_checkpointing" in FIELDS else "gradient_checkpointing")


def test_trl_rl_step_helper_reads_checkpointing_without_a_deprecation_warning():
    """TRL 1.16's GRPOTrainer wraps every generation in ``disable_gradient_checkpointing``, which reads
    ``model.is_gradient_checkpointing``; transformers 5.23+ deprecated that property, so each RL step of notebooks
    04, 07 and 08 printed a FutureWarning (issue 54). The lock pins a transformers in which TRL's call is current."""
    from transformers import AutoTokenizer
    from trl.models.utils import disable_gradient_checkpointing

    from kunlunlab.models import resolve_llm
    from tests.tiny_training import tiny_llama

    model = tiny_llama(AutoTokenizer.from_pretrained(resolve_llm(None)))
    model.gradient_checkpointing_enable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with disable_gradient_checkpointing(model):
            pass
    assert [str(w.message) for w in caught if "checkpointing" in str(w.message)] == []
