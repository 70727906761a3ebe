"""The child side of :mod:`kunlunlab.training.own_process`: ``python -m kunlunlab.training.stage_child RUN_DIR
STAGE`` runs one training stage of the run in ``RUN_DIR`` from its saved config and state, and exits."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from kunlunlab.training.config import OWN_PROCESS_STAGES, load_config
from kunlunlab.training.pipeline import TrainingRun, trained_model


def main(argv: list[str] | None = None) -> int:
    run_dir, stage = argv if argv is not None else sys.argv[1:]
    if stage not in OWN_PROCESS_STAGES:
        print(f"stage_child: unknown stage {stage!r}; choose from {list(OWN_PROCESS_STAGES)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    run = TrainingRun(load_config(Path(run_dir) / "train_config.json"), run_dir, progress=print, in_child=True,
                      start_model=trained_model(run_dir, before=stage))
    run.train_stage_here(stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
