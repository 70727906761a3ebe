"""JAX is kept off the GPU in every process that may import it (issue 53): ``bm25s`` switches to JAX when it is
importable and JAX preallocates most of a GPU's memory at first use. ``kunlunlab/__init__.py`` sets
``JAX_PLATFORMS=cpu`` and ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (unless the user set them); these tests start
fresh processes the way training, evaluation and the GPU check start, and read the environment at the moment
``bm25s`` is imported (an import hook), not afterwards."""
import json
import os
import subprocess
import sys

import pytest

from kunlunlab.paths import PROJECT_ROOT

KEYS = ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")

# an import hook that records the environment when bm25s (or jax) is first looked for, then the entry point's own
# imports, then a BM25 index built and searched (bm25s imported there, as a BM25 run imports it)
PROBE = """
import importlib.abc, json, os, sys
seen = {{}}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("bm25s", "jax") and name not in seen:
            seen[name] = {{k: os.environ.get(k) for k in {keys!r}}}
        return None
sys.meta_path.insert(0, Watch())
{entry}
from kunlunlab.retrieval.indexes import BM25Index
index = BM25Index()
index.add_texts(["the river runs north", "a castle on the hill"])
index.search_text(["castle"], 1)
print(json.dumps(seen))
"""

ENTRIES = {  # how each kind of process starts
    "kunlunlab CLI (train, eval, serve)": "from kunlunlab.cli import main",
    "training pipeline": "import kunlunlab.training.pipeline",
    "evaluation harness": "import kunlunlab.eval.harness",
    "GPU check": ("import runpy; runpy.run_path('experiments/scripts/gpu_check.py', run_name='gpu_check')"),
    "retrieval first": "",
}


def probe(entry: str, env: dict) -> dict:
    code = PROBE.format(keys=KEYS, entry=entry)
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_jax_is_kept_off_the_gpu_before_bm25s_is_imported(entry):
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    seen = probe(ENTRIES[entry], env)
    assert seen["bm25s"] == {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if "jax" in seen:  # where JAX is installed (the GPU image), it is imported with the same settings
        assert seen["jax"] == seen["bm25s"]


def test_a_user_s_own_jax_settings_are_kept():
    env = {**os.environ, "JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    seen = probe(ENTRIES["kunlunlab CLI (train, eval, serve)"], env)
    assert seen["bm25s"] == {"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
