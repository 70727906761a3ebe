"""Two runs started at once on a fresh cache (``experiments/scripts/train_arms.sh``, several notebooks, a
cluster job array) both fill it: the embedded LLM's GGUF conversion and a corpus's embeddings. Both
processes must finish and leave a whole cache entry. The tests below interleave the two processes
deterministically (the second, with another pid, runs inside the first's write). Found on the GPU node: the second training process
of train_arms.sh died in safetensors ("No such file or directory") because both converted into one
shared ``.partial`` folder and the first rename took it away."""
from __future__ import annotations

from pathlib import Path

import numpy as np

class _StubModel:
    """What converted_llm_dir calls on transformers' objects; save_pretrained writes like the real one (the
    folder first, then the weights), and ``during_save`` runs between the two."""

    during_save = None

    def __init__(self):
        self.config, self.generation_config = type("Config", (), {})(), None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def save_pretrained(self, folder, **kwargs):
        Path(folder).mkdir(parents=True, exist_ok=True)
        if _StubModel.during_save is not None:
            hook, _StubModel.during_save = _StubModel.during_save, None
            hook()
        (Path(folder) / "model.safetensors").write_bytes(b"weights")


class _StubTokenizer:
    def save_pretrained(self, folder):
        (Path(folder) / "tokenizer_config.json").write_text("{}")


def test_the_embedded_llm_converted_by_another_process_meanwhile_is_no_error(tmp_path, monkeypatch):
    """Deterministic form of the race: while this process writes its converted checkpoint, a second process
    (another pid) converts and publishes. With one shared scratch folder the second took the first's folder
    away and the first died writing its weights; now both return the one published checkpoint."""
    import transformers

    from kunlunlab import models

    monkeypatch.setenv("KUNLUNLAB_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "llm" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: gguf)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _StubTokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _StubModel())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", lambda *a, **k: _StubModel())
    seen = {}

    def other_process_converts():
        with monkeypatch.context() as m:
            m.setattr(models.os, "getpid", lambda: 999_999)
            seen["other"] = models.converted_llm_dir()

    _StubModel.during_save = other_process_converts
    folder = models.converted_llm_dir()
    assert seen["other"] == folder and (folder / "model.safetensors").read_bytes() == b"weights"
    assert (folder / "tokenizer_config.json").is_file()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no scratch folder left behind
    assert models.converted_llm_dir() == folder  # and the next call reads the cache


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
