"""Table 2's prompt baselines on the untrained backbone, on the kunlun arm's held-out world questions with its
agent settings (budgets, top-k, index), as notebook 08 runs them (``kunlunlab.training.evaluation.evaluate_baselines``),
into ``<out>/records/world.<method>.jsonl`` (where experiments/scripts/table2_report.py reads a suite's records). Used
by issue 43's measured run in place of ``kunlunlab suite``, which would first evaluate the kunlun checkpoint again
(25 minutes of a 2-core budget).

    python experiments/scripts/table2_baselines.py runs/table2.kunlun/train_config.json runs/table2.suite [METHOD ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kunlunlab.agent.methods import PROMPT_BASELINES
from kunlunlab.training.evaluation import evaluate_baselines
from kunlunlab.training.pipeline import run_config


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    summaries = evaluate_baselines(run_config(argv[0], {}), argv[2:] or PROMPT_BASELINES, Path(argv[1]) / "records",
                                   progress=lambda line: print(line, flush=True))
    print(json.dumps({m: {"em": s["em"], "f1": s.get("f1"), "n": s.get("n")} for m, s in summaries.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
