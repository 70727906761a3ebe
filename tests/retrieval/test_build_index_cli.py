"""`kunlunlab build-index`: bad corpora end in one line, and a preset's embedder prefixes reach the vectors, the
manifest and the index that serving loads."""
import json
from pathlib import Path

import numpy as np
import pytest

from kunlunlab.cli import main
from kunlunlab.retrieval import load_preset, load_retriever, read_manifest

PRESET = Path(__file__).resolve().parents[2] / "experiments/configs/presets/search_r1_e5.json"


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("lines,message", [
    ([], "corpus {path} holds no passages"),
    (['{"id": "1", "contents": "\\"A\\"\\nfirst passage"}', '{"id": "2", "title": "B"}'],
     "{path}, line 2: unrecognised corpus layout (keys ['id', 'title'])"),
    (['{"id": "1", "contents": null}'], "{path}, line 1 (field 'contents'): expected str"),
])
def test_an_empty_corpus_or_a_line_without_contents_is_one_line_and_exit_2(tmp_path, capsys, lines, message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines))
    assert main(["build-index", "--corpus", str(corpus), "--kind", "flat", "--out", str(tmp_path / "index")]) == 2
    assert one_error_line(capsys).startswith("kunlunlab build-index: " + message.format(path=corpus))
    assert not (tmp_path / "index").exists()


def test_the_published_preset_names_search_r1s_setting():
    preset = load_preset(PRESET)
    index = preset.index
    assert (index.kind, index.embedder, index.query_prefix, index.passage_prefix, preset.top_k) == \
        ("flat", "intfloat/e5-base-v2", "query: ", "passage: ", 3)
    assert preset.corpus == "wiki-18.jsonl" and preset.corpus_layout == "flashrag"


def test_preset_conflicts_and_a_missing_embedder_are_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"A\\"\\nfirst passage"}\n')
    out = str(tmp_path / "index")
    assert main(["build-index", "--preset", str(PRESET), "--kind", "flat", "--corpus", str(corpus), "--out", out]) == 2
    assert "--preset sets the index kind and embedder" in one_error_line(capsys)
    assert main(["build-index", "--preset", str(tmp_path / "nope.json"), "--out", out]) == 2
    assert "retrieval preset not found" in one_error_line(capsys)
    # e5-base-v2 is not in this machine's model cache (nothing is downloaded at run time)
    assert main(["build-index", "--preset", str(PRESET), "--corpus", str(corpus), "--device", "cpu", "--out", out]) == 2
    assert "Cannot load embedder 'intfloat/e5-base-v2'" in one_error_line(capsys)


def test_preset_prefixes_are_applied_when_encoding_and_recorded_for_serving(tmp_path, capsys, encoder):
    passages = {"1": '"Paris"\nParis is the capital of France.', "2": '"Lyon"\nLyon lies on the Rhone.',
                "3": '"Nice"\nNice is on the Mediterranean coast.'}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in passages.items()))
    preset = json.loads(PRESET.read_text())
    preset["index"]["embedder"] = None  # the embedded MiniLM, with the preset's E5-style prefixes
    (tmp_path / "preset.json").write_text(json.dumps(preset))
    out = tmp_path / "index"
    assert main(["build-index", "--preset", str(tmp_path / "preset.json"), "--corpus", str(corpus),
                 "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kind"] == "flat"
    manifest = read_manifest(out)
    assert (manifest["query_prefix"], manifest["passage_prefix"]) == ("query: ", "passage: ")
    served = load_retriever(out)  # what serve-retriever loads: the manifest's prefixes, no re-embedding
    assert (served.encoder.query_prefix, served.encoder.passage_prefix) == ("query: ", "passage: ")
    model = encoder.model  # sentence-transformers itself, on the prefixed texts
    stored = served.index.reconstruct(np.arange(3))
    expected = model.encode(["passage: " + c for c in passages.values()], normalize_embeddings=True)
    assert np.allclose(stored, expected, atol=1e-5)
    unprefixed = model.encode(list(passages.values()), normalize_embeddings=True)
    assert not np.allclose(stored, unprefixed, atol=1e-3)  # the prefix changed the vectors
    query = "Which city is the capital of France?"
    hit = served.search([query], 1)[0][0]
    q = model.encode(["query: " + query], normalize_embeddings=True)[0]
    assert hit.id == "1" and hit.score == pytest.approx(float(q @ expected[0]), abs=1e-5)
