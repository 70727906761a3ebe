"""Two runs started at once on a fresh cache (``experiments/scripts/train_arms.sh``, several notebooks, a
cluster job array) both fill it: the embedded LLM's GGUF conversion and a corpus's embeddings. Both
processes must finish and leave a whole cache entry. Found on the GPU node: the second training process
of train_arms.sh died in safetensors ("No such file or directory") because both converted into one
shared ``.partial`` folder and the first rename took it away."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CONVERT = """
import json, sys, time
from pathlib import Path
start = Path(sys.argv[1])
while not start.exists():  # both processes leave the gate together
    time.sleep(0.01)
from kunlunlab import models
print(json.dumps({"dir": str(models.converted_llm_dir())}))
"""

EMBED = """
import json, sys, time
from pathlib import Path
start = Path(sys.argv[1])
from kunlunlab.data.types import Passage
from kunlunlab.retrieval import Encoder, corpus_embeddings
encoder = Encoder()
passages = [Passage(f"p{i}", f"Vel{i}", f"Passage number {i} is about the river town of Vel{i}.") for i in range(64)]
while not start.exists():
    time.sleep(0.01)
v = corpus_embeddings(encoder, passages, progress=False)
print(json.dumps({"shape": list(v.shape), "sum": float(abs(v).sum())}))
"""


def _race(script: str, tmp_path: Path) -> list[dict]:
    cache, gate = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "KUNLUNLAB_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(gate)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(2.0)
    gate.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_two_processes_convert_the_embedded_llm_at_once(tmp_path):
    from transformers import AutoConfig

    outs = _race(CONVERT, tmp_path)
    folder = Path(outs[0]["dir"])
    assert outs[1]["dir"] == str(folder) and (folder / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(folder).model_type == "llama"
    leftovers = [p.name for p in folder.parent.iterdir() if ".partial" in p.name]
    assert leftovers == []  # the loser's scratch folder is removed, not left to fill the disk


def test_two_processes_embed_one_corpus_at_once(tmp_path):
    outs = _race(EMBED, tmp_path)
    assert outs[0]["shape"] == outs[1]["shape"] == [64, 384]
    assert abs(outs[0]["sum"] - outs[1]["sum"]) < 1e-3
    files = list((tmp_path / "cache" / "embeddings").iterdir())
    assert [f.suffix for f in files] == [".npy"] and ".partial" not in files[0].name
    assert np.load(files[0]).shape == (64, 384)
