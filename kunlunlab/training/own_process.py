"""A training stage run in a child process, so that the process holding the run keeps no trace of its heap.

Why (issue 54): on a CPU, torch frees a stage's activations into glibc's heap, whose holes stay resident and which
the next stage in the same process grows from. In notebook 04 (make run's recipe, 2-core EPYC, 2026-12-03) the
8 DAPO steps after SFT raised the kernel's peak from 6.41 GiB after SFT to 7.86 GiB, while the same steps from
the SFT checkpoint in a fresh process peaked at 4.69 GiB. Tried instead: glibc's ``MALLOC_ARENA_MAX=1`` (one heap
for every thread), under which ``kunlunlab train`` of the same recipe still peaked at 7.11 GiB in DAPO (5.61 after
SFT) and its 8 DAPO steps took 456.5 s against the notebook's 356.6 s. A child process gives its whole heap back when it
exits: the parent drops its model, waits, and reads the finished stage back from ``<stage>/final`` as it reads
any finished stage (:class:`~kunlunlab.training.pipeline.TrainingRun`). What the child prints reaches the
parent's ``say`` line by line; its progress bar is redrawn in the parent from events
(:class:`~kunlunlab.training.progress.BarFromEvents`); its stderr (library logs, warnings) goes to
``<stage>/process.log``, whose last lines a failure quotes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from kunlunlab.training.progress import EVENTS_ENV, BarFromEvents

CHILD_MODULE = "kunlunlab.training.stage_child"
QUOTED_LINES = 20


class StageProcessError(RuntimeError):
    """A stage's child process ended with an error; the message quotes the end of its log."""


def run_in_own_process(run_dir: Path, stage: str, say: Callable[[str], None]) -> None:
    """Runs ``stage`` of the run in ``run_dir`` (its ``train_config.json`` and ``state.json``) in a child
    process and waits for it; raises :class:`StageProcessError` when the child fails. Interrupted (a notebook's
    stop button), the child is terminated: the stage resumes from its last checkpoint next time."""
    log_path = Path(run_dir) / stage / "process.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, EVENTS_ENV: "1", "PYTHONUNBUFFERED": "1"}
    bar = BarFromEvents()
    with log_path.open("w") as log, subprocess.Popen([sys.executable, "-m", CHILD_MODULE, str(run_dir), stage],
                                                     stdout=subprocess.PIPE, stderr=log, text=True, env=env) as child:
        try:
            for line in child.stdout:
                if not bar.feed(line.rstrip("\n")):
                    say(line.rstrip("\n"))
            child.wait()
        finally:
            bar.close()
            if child.poll() is None:
                child.terminate()
                child.wait()
    if child.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-QUOTED_LINES:]
        raise StageProcessError(f"the {stage} stage's process exited with {child.returncode}; the end of "
                                f"{log_path}:\n" + "\n".join(tail))
