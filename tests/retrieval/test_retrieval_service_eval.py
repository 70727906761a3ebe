"""Retrieval through a service or a saved index: RemoteRetriever against the local retriever it stands for, the
errors it raises, open_retriever's three sources, the passage-embedding counter, and `kunlunlab eval
--retriever-url / --index` over a wiki-18-layout corpus made of the HotpotQA distractor contexts."""
import json
import subprocess
import sys
import threading

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from kunlunlab.cli import main
from kunlunlab.data.loaders import load_corpus, load_named_corpus
from kunlunlab.eval.harness import EvalConfig, ServiceSearch, open_eval_retriever
from kunlunlab.retrieval import (IndexConfig, IndexMismatchError, RemoteRetriever, Retriever, RetrievalServiceError,
                                 build_retriever, load_retriever, open_retriever, passages_embedded, save_retriever)
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread
from kunlunlab.retrieval.service import WARMUP_QUERY, ServiceThread


@pytest.fixture(scope="module")
def wiki_corpus(data_dir, tmp_path_factory):
    """The HotpotQA distractor contexts written as wiki-18 is: one {"id", "contents"} line per passage, contents
    '"Title"\\ntext'; read back with the corpus loader, as build-index reads wiki-18."""
    path = tmp_path_factory.mktemp("wiki") / "wiki-hotpot.jsonl"
    with path.open("w") as fh:
        for p in load_named_corpus("hotpotqa_distractor"):
            fh.write(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n")
    return path, load_corpus(path)


@pytest.fixture(scope="module")
def saved_index(wiki_corpus, encoder, tmp_path_factory):
    _, passages = wiki_corpus
    retriever = build_retriever(passages, IndexConfig(kind="flat"), encoder=encoder)
    return save_retriever(retriever, tmp_path_factory.mktemp("index") / "flat"), retriever


class Counted:
    """The served retriever, counting the queries that reach it (the service's warm-up search excluded)."""

    def __init__(self, retriever: Retriever):
        self.queries: list[str] = []
        self.lock = threading.Lock()
        search = retriever.search

        def counted(queries, k=5):
            with self.lock:
                self.queries += [q for q in queries if q != WARMUP_QUERY]
            return search(queries, k)

        retriever.search = counted


@pytest.fixture(scope="module")
def service(saved_index, encoder):
    folder, _ = saved_index
    served = load_retriever(folder, encoder=encoder)  # what serve-retriever does with the folder
    counter = Counted(served)
    with ServiceThread(served) as url:
        yield url, counter


QUERIES = ["Which magazine was started first, Arthur's Magazine or First for Women?",
           "Who was the director of the film that starred the actor from Fast Five?", "Scott Derrickson nationality"]


def ids_and_titles(rows):
    return [[(h.id, h.title) for h in row] for row in rows]


def test_service_saved_index_and_in_process_give_the_same_hits_and_only_the_build_embeds(
        service, saved_index, wiki_corpus, encoder):
    url, _ = service
    folder, local = saved_index
    expected = local.search(QUERIES, 3)
    assert all(h.title for row in expected for h in row)  # the corpus has titles, so the comparison covers them
    before = passages_embedded()
    remote = open_retriever(url=url, index_config=IndexConfig(kind="flat", embedder="all-MiniLM-L6-v2"))
    assert isinstance(remote, RemoteRetriever) and remote.info["n"] == len(wiki_corpus[1])
    got = remote.search(QUERIES, 3)
    assert ids_and_titles(got) == ids_and_titles(expected)  # titles parsed from the served contents
    assert [[round(h.score, 4) for h in row] for row in got] == [[round(h.score, 4) for h in row] for row in expected]
    from_folder = open_retriever(index_dir=folder)
    assert isinstance(from_folder, Retriever)
    assert ids_and_titles(from_folder.search(QUERIES, 3)) == ids_and_titles(expected)
    assert passages_embedded() == before  # neither the service nor the saved index embedded a passage here
    assert remote.search([], 3) == []


def test_the_counter_counts_an_in_process_build(monkeypatch, tmp_path, wiki_corpus):
    monkeypatch.setenv("KUNLUNLAB_CACHE", str(tmp_path))  # an empty embedding cache: the corpus must be embedded
    passages = wiki_corpus[1][:40]
    before = passages_embedded()
    retriever = open_retriever(passages=passages, index_config=IndexConfig(kind="flat"))
    assert passages_embedded() - before == 40 and len(retriever.passages) == 40
    with pytest.raises(ValueError, match="needs a service url, a saved index folder or the passages"):
        open_retriever()


def test_open_retriever_refuses_a_service_or_index_built_with_another_embedder(service, saved_index):
    url, _ = service
    with pytest.raises(IndexMismatchError, match="embeds with 'all-MiniLM-L6-v2', not 'intfloat/e5-base-v2'"):
        open_retriever(url=url, index_config=IndexConfig(embedder="intfloat/e5-base-v2"))
    with pytest.raises(IndexMismatchError, match="query_prefix '', not 'query: '"):
        open_retriever(index_dir=saved_index[0], index_config=IndexConfig(query_prefix="query: "))


# ---------------------------------------------------------------------------- what the client does with bad answers
def app_answering(retrieve, health=True):
    app = FastAPI()
    calls = []

    @app.post("/retrieve")
    def _retrieve(body: dict):
        calls.append(body)
        return retrieve(body)

    if health:
        @app.get("/health")
        def _health():
            return {"status": "ok", "ready": True, "kind": "flat", "n": 1, "embedder": "all-MiniLM-L6-v2"}
    return app, calls


def hit(i, contents='"T"\ntext'):
    return {"document": {"id": str(i), "contents": contents}, "score": 0.5}


@pytest.mark.parametrize("answer,message", [
    (lambda b: JSONResponse({"detail": "boom"}, status_code=500), "unavailable after 2 attempts: HTTP 500"),
    (lambda b: PlainTextResponse("<html>oops</html>"), "not JSON"),
    (lambda b: {"result": [[hit(1)]]}, "answered 1 results for 2 queries"),
    (lambda b: {"results": []}, "no 'result' list"),
    (lambda b: {"result": [[hit(1)], [{"document": {"id": "2"}, "score": 1.0}]]}, "unexpected layout: KeyError"),
    (lambda b: {"result": [[hit(1)], [hit(2, contents=None)]]}, "unexpected layout: TypeError"),
    (lambda b: {"result": [[hit(1)], [{"document": {"id": "2", "contents": "x"}, "score": "high"}]]},
     "unexpected layout: ValueError"),
])
def test_an_http_error_or_a_malformed_answer_is_an_error_naming_the_url(answer, message):
    app, calls = app_answering(answer)
    with ServerThread(app) as url:
        remote = RemoteRetriever(url, attempts=2, backoff=0.01)
        with pytest.raises(RetrievalServiceError, match=message) as err:
            remote.search(["q1", "q2"], 3)
    assert url in str(err.value)
    assert len(calls) == (2 if "HTTP 500" in message else 1)  # only the server error is tried again


def test_a_search_r1_server_without_health_is_accepted_and_its_hits_read():
    app, calls = app_answering(lambda b: {"result": [[hit(7, '"Paris"\nCapital of France.')] for _ in b["queries"]]},
                               health=False)
    with ServerThread(app) as url:
        remote = open_retriever(url=url)
        rows = remote.search(["capital of France"], 1)
    assert remote.info == {} and calls == [{"queries": ["capital of France"], "topk": 1, "return_scores": True}]
    assert [(h.id, h.title, h.contents, h.score) for h in rows[0]] == [("7", "Paris", '"Paris"\nCapital of France.', 0.5)]


def test_a_service_that_is_down_fails_after_the_configured_attempts():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrievalServiceError, match=f"retrieval service at {url} is unavailable after 3 attempts: "
                                                    "ConnectError"):
        open_retriever(url=url, attempts=3, backoff=0.01)
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        RemoteRetriever(url, attempts=0)


# ---------------------------------------------------------------------------- kunlunlab eval through the service
@pytest.mark.slow
def test_eval_through_the_service_sends_every_search_there_and_embeds_nothing(service, tmp_path, capsys):
    url, counter = service
    counter.queries.clear()
    out = tmp_path / "records.jsonl"
    before = passages_embedded()
    code = main(["eval", "--dataset", "hotpotqa_distractor", "--method", "iter_retgen", "--limit", "2",
                 "--retriever-url", url, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    searches = [r["searches"] for r in records]
    assert len(records) == 2 and searches == [3, 3]  # Iter-RetGen: one search per iteration, 3 iterations
    assert len(counter.queries) == sum(searches)
    queried = [s["text"] for r in records for s in r["trajectory"]["steps"] if s["kind"] == "search"]
    assert sorted(counter.queries) == sorted(queried)
    assert passages_embedded() == before
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["search_errors"] == 0
    assert summary["retrieval_recall"] is not None  # gold titles matched against the titles the service returned


def test_eval_config_takes_the_service_or_the_saved_index_and_not_both(service, saved_index):
    url, _ = service
    folder, local = saved_index
    with pytest.raises(ValueError, match="give one"):
        EvalConfig(dataset="hotpotqa_distractor", retriever_url=url, index_dir=str(folder))
    with pytest.raises(ValueError, match="the service searches its own corpus"):
        EvalConfig(dataset="hotpotqa_distractor", retriever_url=url, corpus="corpus.jsonl")
    before = passages_embedded()
    from_index = open_eval_retriever(EvalConfig(dataset="hotpotqa_distractor", index_dir=str(folder)), None)
    through_service = open_eval_retriever(EvalConfig(dataset="hotpotqa_distractor", retriever_url=url), None)
    assert isinstance(through_service, ServiceSearch)
    expected = ids_and_titles(local.search(QUERIES, 3))
    assert ids_and_titles(from_index.search(QUERIES, 3)) == expected
    assert ids_and_titles(through_service.search(QUERIES, 3)) == expected
    assert through_service.titles == {i: t for row in expected for i, t in row}
    assert passages_embedded() == before


@pytest.mark.slow
def test_eval_with_the_service_down_is_one_line_and_a_failing_exit(data_dir):  # HotpotQA's questions
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    run = subprocess.run([sys.executable, "-m", "kunlunlab.cli", "eval", "--dataset", "hotpotqa_distractor",
                          "--method", "naive_rag", "--limit", "1", "--retriever-url", url],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(f"kunlunlab eval: retrieval service at {url} is unavailable after 3 attempts")


def test_eval_against_a_service_answering_500_stops_with_one_line(data_dir, tmp_path, capsys):
    app, calls = app_answering(lambda b: JSONResponse({"detail": "index on fire"}, status_code=500))
    out = tmp_path / "records.jsonl"
    with ServerThread(app) as url:
        code = main(["eval", "--dataset", "hotpotqa_distractor", "--method", "naive_rag", "--limit", "1",
                     "--retriever-url", url, "--out", str(out)])
    stderr = capsys.readouterr().err
    # what a terminal shows: each line as its last carriage return left it (the progress bars rewrite theirs)
    shown = [line.split("\r")[-1] for line in stderr.split("\n")]
    err = [line for line in shown if line.strip() and not line.startswith("Loading weights")]  # the model's bar
    assert code == 1 and len(err) == 1 and "Traceback" not in stderr, err
    assert err[0].startswith("kunlunlab eval: retrieval failed, evaluation stopped: retrieval service at " + url)
    assert "HTTP 500" in err[0] and "index on fire" in err[0]
    assert len(calls) == 3 and not out.exists()  # three attempts, then no records scored without documents
