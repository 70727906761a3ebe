#!/usr/bin/env bash
# The GPU check of issue 33 in one call on one H100/H200 (docs/scaling.md): run
# experiments/scripts/gpu_check_prepare.sh here first, then on the device machine, with carry [".gpu_check"]:
#     bash experiments/scripts/gpu_check.sh
# It installs the carried wheels into /tmp/site (no network), runs experiments/scripts/gpu_check.py on the
# 7B shape and writes $OUT/gpu_check.json (last line printed: the same JSON). Budget: under 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu_check/wheels ] || { echo "gpu_check: .gpu_check/ missing: run experiments/scripts/gpu_check_prepare.sh and carry it" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu_check/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec python3 experiments/scripts/gpu_check.py --tokenizer .gpu_check/tokenizer "$@"
