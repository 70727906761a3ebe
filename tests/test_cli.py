import json

from kunlunlab.cli import main
from kunlunlab.retrieval import load_retriever


def test_build_index_then_load(tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["build-index", "--corpus", "world", "--n", "400", "--kind", "bm25", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 400 and report["kind"] == "bm25"
    hits = load_retriever(out).search(["Who founded a company?"], k=3)
    assert len(hits[0]) == 3
