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


class _StubEncoder:
    """What corpus_embeddings reads of an encoder, without a model."""

    name, passage_prefix, passage_precision, dim = "stub", None, "float32", 4

    def encode_passages(self, texts, progress=False):
        return np.arange(len(texts) * 4, dtype=np.float32).reshape(len(texts), 4)


def test_a_corpus_embedded_by_another_process_meanwhile_is_no_error(tmp_path, monkeypatch):
    """Deterministic form of the race: while this process saves its scratch file, a second process (another
    pid) embeds the same corpus and publishes it first. Both must end with the whole vectors (with one
    shared scratch name the second rename found no file)."""
    from kunlunlab.data.types import Passage
    from kunlunlab.retrieval import encoder as enc

    monkeypatch.setenv("KUNLUNLAB_CACHE", str(tmp_path))
    passages = [Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(5)]
    real_save, state = np.save, {"nested": False}

    def save_then_other_process_publishes(path, array):
        real_save(path, array)
        if not state["nested"]:
            state["nested"] = True
            with monkeypatch.context() as m:
                m.setattr(enc.os, "getpid", lambda: 999_999)  # the other process
                other = enc.corpus_embeddings(_StubEncoder(), passages, progress=False)
            assert other.shape == (5, 4)

    monkeypatch.setattr(enc.np, "save", save_then_other_process_publishes)
    vectors = enc.corpus_embeddings(_StubEncoder(), passages, progress=False)
    assert state["nested"] and np.array_equal(vectors, _StubEncoder().encode_passages(["x"] * 5))
    files = list((tmp_path / "embeddings").iterdir())
    assert len(files) == 1 and ".partial" not in files[0].name
    assert np.array_equal(np.load(files[0]), vectors)
