#!/usr/bin/env bash
# Prepares what experiments/scripts/gpu_check.sh needs on a device machine that reaches no network (run here,
# once per checkout): the wheels its image lacks and the embedded tokenizer's files, in .gpu_check/ (ignored by
# git, carried by the device call: carry [".gpu_check"]). About 25 MB.
# The wheels: what the check and `kunlunlab train / eval / serve-*` need beyond the image (trl, datasets, faiss-cpu,
# bm25s, fastapi, uvicorn, pydantic) and, transitively, whatever of theirs the image lacks, each at the version of
# constraints-gpu.txt, for Python 3.12 on manylinux x86-64 (experiments/scripts/gpu_env.py wheels; the image's
# packages are listed in experiments/configs/gpu_check/image-packages.txt and never carried).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.gpu_check/' .git/info/exclude 2>/dev/null || echo '/.gpu_check/' >> .git/info/exclude
rm -rf .gpu_check && mkdir -p .gpu_check/tokenizer
"$PY" experiments/scripts/gpu_env.py wheels --python-version 3.12 --dest .gpu_check/wheels
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
# What the device call carries, recorded beside the configs: tests/project/test_tree_size.py adds it to the tracked
# tree and fails above 40 MiB (a device call carries 64 MiB; the rest is room for what a session adds)
"$PY" - <<'PY'
import json
from pathlib import Path

files = sorted(p for p in Path(".gpu_check").rglob("*") if p.is_file())
Path("experiments/configs/gpu_check/carried.json").write_text(json.dumps(
    {"_comment": "written by experiments/scripts/gpu_check_prepare.sh: what .gpu_check/ holds (the device call carries it)",
     "bytes": sum(p.stat().st_size for p in files), "files": {str(p): p.stat().st_size for p in files}}, indent=1) + "\n")
PY
