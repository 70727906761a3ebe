#!/usr/bin/env bash
# Table 2 under its one enforced budget (issue 51; docs/results.md, "Table 2 against the peers"): every arm of
# experiments/configs/comparisons/table2.json (kunlun, kunlun under GRPO, Search-R1, ReSearch, R1-Searcher, each its
# recipe with the budget on top) under seeds 0, 1 and 2, each evaluated after SFT and after RL on the same 200 held-out
# world and 30 HotpotQA distractor questions; the arms' ledgers checked against one another; then the prompt baselines
# on the untrained backbone (experiments/scripts/table2_baselines.py) on the same world questions; then the tables
# (experiments/scripts/table2_report.py, JSON last). Every step resumes: a finished run is reused, an interrupted one
# continues from its last checkpoint, so the runs can span sessions (`--arms`/`--seeds` run a part).
# Usage: bash experiments/scripts/table2_run.sh [RUNS_DIR]   (default runs/)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs}
BIN=${BIN:-.venv/bin}
"$BIN/kunlunlab" comparison table2 --runs-dir "$RUNS"
"$BIN/python" experiments/scripts/table2_baselines.py "$RUNS/table2.kunlun.s0/train_config.json" "$RUNS/table2.suite"
"$BIN/python" experiments/scripts/table2_report.py "$RUNS" table2
