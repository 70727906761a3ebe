#!/usr/bin/env bash
# Issue 43's measured run: Table 2 with the peers retrained here under one budget (docs/results.md, "Table 2 against
# the peers"). Training runs from SmolLM2-135M-Instruct, one config each (experiments/configs/runs/table2.*.json,
# `kunlunlab rerun <name>`): kunlun (DAPO), search_r1, research, r1_searcher under the shared budget, and the DAPO-GRPO
# pair where clip-higher can bind (kunlun_dapo_u4, kunlun_grpo_u4: the RL stage again from kunlun's SFT checkpoint at
# 4 updates per rollout batch, lr 1e-4); then the prompt baselines on the untrained backbone
# (experiments/scripts/table2_baselines.py), all on the same 100 held-out world questions (the arms also on 20
# HotpotQA); then Table 2 and the DAPO-GRPO pair from the records (experiments/scripts/table2_report.py, JSON last).
# About 3 h on 2 cores (run here as three lanes of one thread each).
# Usage: bash experiments/scripts/table2_run.sh [RUNS_DIR]   (default runs/)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-runs}
BIN=${BIN:-.venv/bin}
# every arm from its run config: a peer's is its recipe (experiments/configs/training/peers/<peer>.json) with the shared
# budget on top (dapo.steps=8 dapo.updates_per_generation=2 dapo.learning_rate=2e-05 eval.world_questions=100
# eval.hotpot_questions=20 eval.summary_questions=0 eval.before=false summary_share=0); table2.kunlun and
# table2.search_r1 ran with their three dtypes "auto" (float32 on that CPU without native bf16), research and
# r1_searcher with bf16=false model_dtype=float32 inference_dtype=float32, the same arithmetic on any CPU
ARMS=(kunlun search_r1 research r1_searcher kunlun_dapo_u4 kunlun_grpo_u4)
for arm in "${ARMS[@]}"; do
  "$BIN/kunlunlab" rerun "table2.$arm" --runs-dir "$RUNS"
done
# the prompt baselines on the untrained backbone, on the kunlun arm's held-out world questions and agent settings
"$BIN/python" experiments/scripts/table2_baselines.py "$RUNS/table2.kunlun/train_config.json" "$RUNS/table2.suite"
"$BIN/python" experiments/scripts/table2_report.py "$RUNS"
