"""A training stage's progress as a reader follows it: one bar and one closing line per stage.

The stages' trainers run with ``disable_tqdm=True``, which makes transformers add its ``PrinterCallback``: one raw
log dictionary printed per logging step (hundreds in an executed notebook, issue 54). :func:`show_progress` swaps it
for :class:`StageProgress`: a tqdm bar over the stage's steps (a widget in Jupyter, a text line elsewhere) whose
postfix carries the latest values of a few logged quantities, and one summary line at the end. Every logged value
still reaches ``state.log_history``, the trainers' ``trainer_state.json`` and the trackers of ``report_to``.

A stage run in a child process (:mod:`kunlunlab.training.own_process`) has no notebook to draw in: with
:data:`EVENTS_ENV` set, the bar's updates go to stdout as one-line events (:data:`EVENT_PREFIX` and JSON) that
the parent turns back into its own bar (:class:`BarFromEvents`).
"""
from __future__ import annotations

import json
import os
import time

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

# logged keys shown beside the bar, in this order, where a stage logs them (SFT: loss; DAPO: reward, KL; DPO: margins)
SHOWN = ("loss", "reward", "kl", "rewards/margins", "clip_ratio/high_mean")
EVENTS_ENV = "KUNLUNLAB_PROGRESS_EVENTS"  # set (to 1): the bar is written as events for a parent process
EVENT_PREFIX = "kunlunlab-progress "


class EventBar:
    """tqdm's few calls that :class:`StageProgress` makes, written to stdout as events instead of drawn."""

    def __init__(self, total: int, initial: int, desc: str):
        self.n = initial
        self._emit({"desc": desc, "total": total, "n": initial})

    @staticmethod
    def _emit(event: dict) -> None:
        print(EVENT_PREFIX + json.dumps(event), flush=True)

    def update(self, k: int) -> None:
        self.n += k
        self._emit({"n": self.n})

    def set_postfix(self, postfix: dict, refresh: bool = False) -> None:
        self._emit({"postfix": postfix})

    def close(self) -> None:
        self._emit({"close": True})


class BarFromEvents:
    """The parent's side: a tqdm bar (a widget in Jupyter) driven by a child's :class:`EventBar` lines;
    :meth:`feed` returns False for a line that is not an event."""

    def __init__(self):
        self.bar = None

    def feed(self, line: str) -> bool:
        if not line.startswith(EVENT_PREFIX):
            return False
        event = json.loads(line[len(EVENT_PREFIX):])
        if "total" in event:
            self.close()
            self.bar = tqdm(total=event["total"], initial=event["n"], desc=event["desc"], unit="step", leave=True)
        elif self.bar is not None and "n" in event:
            self.bar.update(event["n"] - self.bar.n)
        elif self.bar is not None and "postfix" in event:
            self.bar.set_postfix(event["postfix"], refresh=False)
        elif "close" in event:
            self.close()
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class StageProgress(TrainerCallback):
    def __init__(self, stage: str, say=print):
        self.stage, self.say = stage, say
        self.bar = None
        self.latest: dict[str, float] = {}
        self.start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.start = time.perf_counter()
            if os.environ.get(EVENTS_ENV):
                self.bar = EventBar(state.max_steps, state.global_step, self.stage)
            else:
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
