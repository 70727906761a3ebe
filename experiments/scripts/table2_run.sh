#!/usr/bin/env bash
# Issue 43's measured run: Table 2 with the peers retrained here under one budget (docs/results.md, "Table 2 against
# the peers"). Five training runs from SmolLM2-135M-Instruct, one config each (experiments/configs/runs/table2.*.json,
# `kunlunlab rerun <name>`): kunlun (DAPO), kunlun_grpo (GRPO from kunlun's SFT checkpoint), search_r1, research,
# r1_searcher; then `kunlunlab suite` for the prompt baselines on the untrained backbone, all on the same 100
# held-out world and 20 HotpotQA questions; then Table 2 and the DAPO-GRPO pair from the records
# (experiments/scripts/table2_report.py, JSON last). About 2 h on 2 cores.
# Usage: bash experiments/scripts/table2_run.sh [RUNS_DIR]   (default runs/)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs}
BIN=${BIN:-.venv/bin}
ARMS=(kunlun kunlun_grpo search_r1 research r1_searcher)
for arm in "${ARMS[@]}"; do
  "$BIN/kunlunlab" rerun "table2.$arm" --runs-dir "$RUNS"
done
if [ "${TABLE2_SUITE:-1}" = 1 ]; then
  # the prompt baselines on the untrained backbone (the suite's default for them), kunlun on its checkpoint again:
  # the same 100 world and 20 HotpotQA held-out questions, budgets and retrieval of the checkpoint's agent settings
  "$BIN/kunlunlab" suite --model "$RUNS/table2.kunlun/dapo/final" --train-config "$RUNS/table2.kunlun/train_config.json" \
    --out "$RUNS/table2.suite" --set 'datasets=["world","hotpotqa_distractor"]' world_questions=100 hotpot_questions=20 \
    'ablations=[]' nlr=false
fi
"$BIN/python" experiments/scripts/table2_report.py "$RUNS"
