"""A training stage resumed from its last checkpoint, and one whose last checkpoint is already its end.

Transformers' Trainer resumes by skipping the batches it trained and training on: it checks ``max_steps`` only
after a step. A stage killed after it wrote its last checkpoint but before the pipeline marked it done (its final
model saved or not) therefore trained one step more on resume, with one more rollout call in RL: a Table 2 run
(``table2.search_r1.s2``) came back with 9 updates and 40 rollouts against its budget's 8 and 32. Here a checkpoint
at the stage's end is read back instead: its weights into the model, its ``TrainerState`` (steps, log) onto the
trainer, and nothing trained.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

from transformers import TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import get_last_checkpoint

log = logging.getLogger(__name__)


def train_from_last_checkpoint(trainer, output_dir: str | Path, stage: str,
                               finished: Callable[[TrainerState], bool] | None = None) -> None:
    """Trains ``trainer`` from the last ``checkpoint-*`` in ``output_dir`` (from the start where there is none).
    A checkpoint at the stage's end (its ``global_step`` at this trainer's ``max_steps``, or ``finished(state)``
    true: the RL rollout budget spent) is loaded, not trained on. A stage given more steps than the checkpoint's
    run trains on to them; one counted in epochs (``max_steps`` -1) is left to the Trainer, which skips epochs it
    finished."""
    last = get_last_checkpoint(str(output_dir))
    if last is None:
        trainer.train()
        return
    state = TrainerState.load_from_json(os.path.join(last, TRAINER_STATE_NAME))
    at_end = 0 < trainer.args.max_steps <= state.global_step
    if at_end or (finished is not None and finished(state)):
        log.info("%s had finished at %s (step %d): read back, not trained on", stage, last, state.global_step)
        trainer._load_from_checkpoint(last)  # the weights (a LoRA adapter too), as Trainer.train's resume loads them
        trainer.state = state
        return
    log.info("resuming %s from %s", stage, last)
    trainer.train(resume_from_checkpoint=last)
