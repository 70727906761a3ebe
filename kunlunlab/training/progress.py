"""A training stage's progress as a reader follows it: one bar and one closing line per stage.

The stages' trainers run with ``disable_tqdm=True``, which makes transformers add its ``PrinterCallback``: one raw
log dictionary printed per logging step (hundreds in an executed notebook, issue 54). :func:`show_progress` swaps it
for :class:`StageProgress`: a tqdm bar over the stage's steps (a widget in Jupyter, a text line elsewhere) whose
postfix carries the latest values of a few logged quantities, and one summary line at the end. Every logged value
still reaches ``state.log_history``, the trainers' ``trainer_state.json`` and the trackers of ``report_to``.
"""
from __future__ import annotations

import time

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

# logged keys shown beside the bar, in this order, where a stage logs them (SFT: loss; DAPO: reward, KL; DPO: margins)
SHOWN = ("loss", "reward", "kl", "rewards/margins", "clip_ratio/high_mean")


class StageProgress(TrainerCallback):
    def __init__(self, stage: str, say=print):
        self.stage, self.say = stage, say
        self.bar = None
        self.latest: dict[str, float] = {}
        self.start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.start = time.perf_counter()
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.stage, unit="step",
                            leave=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        self.latest.update({k: v for k, v in logs.items() if k in SHOWN and isinstance(v, (int, float))})
        self.bar.set_postfix({k: f"{self.latest[k]:.4g}" for k in SHOWN if k in self.latest}, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is None:
            return
        self.bar.close()
        self.bar = None
        shown = ", ".join(f"{k} {self.latest[k]:.4g}" for k in SHOWN if k in self.latest)
        self.say(f"{self.stage}: {state.global_step} steps in {time.perf_counter() - self.start:.0f} s"
                 + (f"; last {shown}" if shown else ""))


def show_progress(trainer, stage: str):
    """``trainer`` with :class:`StageProgress` in place of transformers' ``PrinterCallback``; returns it."""
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StageProgress(stage))
    return trainer
