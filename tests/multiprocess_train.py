"""The script ``tests/test_multiprocess_training.py`` launches on every process of ``accelerate launch``:
``kunlunlab train`` with one hook that records, per process, what TRL's ``GRPOTrainer`` hands each rank
after gathering the rewards across processes (``_calculate_rewards`` returns the gathered
``(processes × local completions, reward functions)`` tensor; advantages are normalised per group on it
and each rank then takes its own slice).

Each rank appends one line per DAPO generation batch to ``<run dir>/rank<i>_rewards.jsonl``: its rank,
the number of processes, its local completions, the gathered reward tensor, and the totals it computed
on its own rollouts before the gather (the reward functions' outputs on its slice). Usage, as
``kunlunlab train``:  ``python tests/multiprocess_train.py train --run-dir DIR --set ...``"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _run_dir(argv: list[str]) -> Path:
    return Path(argv[argv.index("--run-dir") + 1])


def install_reward_recorder(run_dir: Path) -> None:
    from trl import GRPOTrainer

    calculate = GRPOTrainer._calculate_rewards

    def recording(self, inputs, prompts, completions, completion_ids_list):
        gathered = calculate(self, inputs, prompts, completions, completion_ids_list)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        row = {"rank": rank, "processes": world, "step": self.state.global_step, "local": len(prompts),
               "questions": [p if isinstance(p, str) else p[-1]["content"] for p in prompts],
               "gathered": [[None if v != v else v for v in r] for r in gathered.tolist()]}  # NaN -> null
        with (run_dir / f"rank{rank}_rewards.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        return gathered

    GRPOTrainer._calculate_rewards = recording


def main(argv: list[str]) -> int:
    from kunlunlab.cli import main as cli

    install_reward_recorder(_run_dir(argv))
    return cli(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
