#!/usr/bin/env bash
# Prepares what experiments/scripts/gpu_check.sh needs on a device machine that reaches no network (run here,
# once per checkout): the wheels its image lacks (python 3.12, manylinux x86-64; the image has torch,
# transformers, peft, accelerate, numpy, pandas, pyarrow, httpx) and the embedded tokenizer's files, in
# .gpu_check/ (ignored by git, carried by the device call: carry [".gpu_check"]). About 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.gpu_check/' .git/info/exclude 2>/dev/null || echo '/.gpu_check/' >> .git/info/exclude
rm -rf .gpu_check && mkdir -p .gpu_check/wheels .gpu_check/tokenizer
# trl/datasets for the DAPO step; faiss-cpu, fastapi and pydantic because kunlunlab.retrieval imports them;
# bm25s likewise. Versions: the tested CPU environment's (trl 1.16.0, datasets 5.2.0, faiss-cpu 1.15.1).
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu_check/wheels trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 faiss-cpu==1.15.1 \
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection bm25s
"$PY" - <<'PY'
import shutil
from pathlib import Path

from kunlunlab.models import resolve_llm

source = Path(resolve_llm(None))
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
    if (source / name).is_file():
        shutil.copy(source / name, Path(".gpu_check/tokenizer") / name)
PY
du -sh .gpu_check
