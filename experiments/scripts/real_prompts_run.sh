#!/usr/bin/env bash
# Issue 34's measured run: DAPO with real RL prompts through a retrieval service against the world-only recipe,
# on the same held-out questions, from one shared SFT checkpoint (make run's recipe otherwise).
#   corpus:   the 2Wiki paragraphs + the HotpotQA distractor paragraphs (6710 passages, wiki-18 layout), indexed
#             once with the embedded MiniLM (flat), served by `kunlunlab serve-retriever`
#   prompts:  2WikiMultihopQA dev (../shared/data); its first 60 questions are held out (data.rl_heldout)
#   runs:     sft (SFT only), world (8 DAPO steps on the world's questions: data.rl_prompts_share 0),
#             mixed (8 DAPO steps, half the prompt pool 2Wiki questions: data.rl_prompts_share 0.5)
# Usage: bash experiments/scripts/real_prompts_run.sh OUT_DIR   (about 1 h on 2 cores; JSON comparison last)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: real_prompts_run.sh OUT_DIR}
PORT=${PORT:-18734}
BIN=${BIN:-.venv/bin}
DATA=${KUNLUNLAB_DATA:-../shared/data}
mkdir -p "$OUT"
if [ ! -f "$OUT/index/manifest.json" ]; then
  "$BIN/python" - "$OUT/corpus.jsonl" <<'PY'
import json, sys
from kunlunlab.data.loaders import load_named_corpus
seen = set()
with open(sys.argv[1], "w") as f:
    for name in ("2wiki", "hotpotqa_distractor"):
        for p in load_named_corpus(name):
            if (p.title, p.text) not in seen:
                seen.add((p.title, p.text))
                f.write(json.dumps({"id": f"{name}-{p.id}", "contents": f'"{p.title}"\n{p.text}'}) + "\n")
PY
  "$BIN/kunlunlab" build-index --corpus "$OUT/corpus.jsonl" --kind flat --out "$OUT/index"
fi
"$BIN/kunlunlab" serve-retriever --index "$OUT/index" --port "$PORT" --threads 1 > "$OUT/service.log" 2>&1 &
SERVICE=$!
trap 'kill $SERVICE' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 2; done
COMMON=(retrieval.url=http://127.0.0.1:$PORT data.rl_prompts=$DATA/2wikimultihopqa/dev.json data.rl_heldout=60
        eval.before=false)
CFG=experiments/configs/training/train_embedded_cpu.json
"$BIN/kunlunlab" train --config $CFG --run-dir "$OUT/sft" --set "${COMMON[@]}" dapo.enabled=false data.rl_prompts_share=0.0
for arm in world:0.0 mixed:0.5; do
  "$BIN/kunlunlab" train --config $CFG --run-dir "$OUT/${arm%%:*}" --set "${COMMON[@]}" model="$OUT/sft/sft/final" \
      sft.enabled=false dapo.steps=8 data.rl_prompts_share=${arm##*:}
done
for dataset in rl_heldout world hotpotqa_distractor; do
  "$BIN/kunlunlab" compare-runs --dataset $dataset world="$OUT/world" mixed="$OUT/mixed" sft="$OUT/sft"
done
