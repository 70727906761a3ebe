import contextlib
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kunlunlab.cli import main as cli_main
from kunlunlab.retrieval import Hit, IndexConfig, build_retriever, load_retriever, save_retriever
from kunlunlab.bench.loadtest import run_load
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread
from kunlunlab.retrieval.client import API_KEY_ENV, RemoteRetriever, RetrievalClient, RetrievalServiceError
from kunlunlab.retrieval.service import WARMUP_QUERY, ServiceThread, create_app


@pytest.fixture(scope="module")
def service(world, encoder, vectors):
    retriever = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    with ServiceThread(retriever) as url:
        yield url, retriever


def test_health_and_batched_retrieve(service):
    url, retriever = service
    client = RetrievalClient(url)
    health = client.health()
    assert health["status"] == "ok" and health["n"] == len(retriever.passages) and health["kind"] == "flat"
    queries = ["Who directed The Silent River?", "capital city", "founded company"]
    hits = client.retrieve(queries, topk=4)
    local = retriever.search(queries, k=4)
    assert [[h.id for h in row] for row in hits] == [[h.id for h in row] for row in local]
    assert all(h.contents and isinstance(h.score, float) for row in hits for h in row)


def test_search_r1_layout(service):
    url, _ = service
    body = httpx.post(url + "/retrieve", json={"queries": ["a film"], "topk": 2, "return_scores": True}).json()
    item = body["result"][0][0]
    assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
    bare = httpx.post(url + "/retrieve", json={"queries": ["a film"], "topk": 2}).json()
    assert set(bare["result"][0][0]) == {"id", "contents"}


@pytest.mark.parametrize("payload", [{"queries": [], "topk": 3}, {"queries": ["ok", "  "], "topk": 3},
                                     {"queries": ["x"], "topk": 0}, {"topk": 3}, {"queries": "not a list"}])
def test_bad_requests_are_rejected_clearly(service, payload):
    url, _ = service
    response = httpx.post(url + "/retrieve", json=payload)
    assert response.status_code == 422
    with pytest.raises(RetrievalServiceError, match="rejected the request"):
        RetrievalClient(url, retries=0)._post("/retrieve", payload)


def test_service_down_raises_with_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    client = RetrievalClient(url, timeout=0.5, retries=1, backoff=0.01)
    with pytest.raises(RetrievalServiceError, match=f"retrieval service at {url} is unavailable after 2 attempts"):
        client.retrieve(["anything"])
    with pytest.raises(RetrievalServiceError, match="unavailable"):
        client.health()


# ---------------------------------------------------------------------------- limits, readiness, batching
@pytest.mark.parametrize("payload,detail", [
    ({"queries": ["x"] * 257}, "too many queries: 257 in one request, the limit is 256"),
    ({"queries": ["x"], "topk": 101}, "topk must be between 1 and 100, got 101"),
    ({"queries": ["x"], "topk": 0}, "topk must be between 1 and 100, got 0"),
    ({"queries": ["ok", "y" * 2049]}, "query 1 is 2049 characters long, the limit is 2048"),
    ({"queries": ["ok", "  "]}, "query 1 is empty"),
    ({"queries": []}, "no queries"),
])
def test_each_limit_is_a_422_naming_the_limit_and_the_value(service, payload, detail):
    url, _ = service
    response = httpx.post(url + "/retrieve", json=payload)
    assert response.status_code == 422 and detail in response.json()["detail"]


def test_ready_only_after_the_warm_up_search(world_retriever):
    from fastapi.testclient import TestClient

    app = create_app(world_retriever)
    cold = TestClient(app)  # outside `with`: the lifespan (warm-up) has not run
    assert cold.get("/health").json()["status"] == "starting" and cold.get("/health").json()["ready"] is False
    refused = cold.post("/retrieve", json={"queries": ["a film"]})
    assert refused.status_code == 503 and "starting" in refused.json()["detail"] and refused.headers["retry-after"]
    with TestClient(app) as warm:
        health = warm.get("/health").json()
        assert health["status"] == "ok" and health["ready"] is True and health["kind"] == "bm25"
        assert health["n"] == len(world_retriever.passages) and health["queue"] == 0 and health["batches"] == 0
        assert warm.post("/retrieve", json={"queries": ["a film"]}).status_code == 200


class FakeRetriever:
    """Answers ``id-<query>``; queries starting with "slow" block until ``release`` (a busy index)."""

    kind = "fake"
    encoder = None

    def __init__(self, fail: bool = False):
        self.passages = ["p"] * 3
        self.fail = fail
        self.entered, self.release = threading.Event(), threading.Event()

    def search(self, queries, k):
        if self.fail:
            raise RuntimeError("index file unreadable")
        if queries[0].startswith("slow"):
            self.entered.set()
            self.release.wait(10)
        return [[Hit(f"id-{q}", q, 1.0)] for q in queries]


def test_a_failed_warm_up_keeps_the_service_from_starting():
    with pytest.raises(RetrievalServiceError, match="did not start"):
        ServiceThread(FakeRetriever(fail=True)).start()


def _concurrently(url: str, payloads: list[dict]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(payloads))

    def post(payload):
        barrier.wait()
        return httpx.post(url + "/retrieve", json=payload, timeout=30)

    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(pool.map(post, payloads))


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_requests_share_searches_and_each_gets_its_own_rows(world, questions, encoder, vectors, batching):
    retriever = build_retriever(world.passages, IndexConfig(kind="flat"), encoder=encoder, vectors=vectors)
    queries = list(dict.fromkeys(h.question for q in questions for h in q.chain))[:16]
    topks = [2 if i % 2 else 5 for i in range(len(queries))]
    expected = [retriever.search([q], k)[0] for q, k in zip(queries, topks)]  # one at a time, no service
    with ServiceThread(retriever, micro_batching=batching, batch_window_ms=20) as url:
        responses = _concurrently(url, [{"queries": [q], "topk": k, "return_scores": True}
                                        for q, k in zip(queries, topks)])
        health = httpx.get(url + "/health").json()
    assert [r.status_code for r in responses] == [200] * 16
    for response, hits, k in zip(responses, expected, topks):
        (row,) = response.json()["result"]
        assert len(row) == k and [item["document"]["id"] for item in row] == [h.id for h in hits]
        assert [item["score"] for item in row] == pytest.approx([h.score for h in hits], abs=1e-4)
    assert health["requests"] == 16 and health["micro_batching"] is batching and health["queue"] == 0
    if batching:  # 16 requests, two topk values: merged into a few searches
        assert 2 <= health["batches"] < 16 and health["mean_batch_queries"] > 1
    else:
        assert health["batches"] == 16 and health["mean_batch_queries"] == 1


def test_a_full_queue_answers_503_with_retry_after():
    fake = FakeRetriever()
    with ServiceThread(fake, max_queue=2, max_batch_queries=1, batch_window_ms=0) as url:
        with ThreadPoolExecutor(3) as pool:
            busy = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["slow 0"]}, timeout=30)
            assert fake.entered.wait(10)  # the worker is inside search; the next requests queue up
            waiting = [pool.submit(httpx.post, url + "/retrieve", json={"queries": [q]}, timeout=30)
                       for q in ("q1", "q2")]
            deadline = time.time() + 10
            while httpx.get(url + "/health").json()["queue"] < 2 and time.time() < deadline:
                time.sleep(0.01)
            refused = httpx.post(url + "/retrieve", json={"queries": ["q3"]})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["detail"] == "queue full: 2 queries waiting, retry later"
            client = RetrievalClient(url, retries=1, backoff=0.01, max_backoff=0.05)
            with pytest.raises(RetrievalServiceError, match="unavailable after 2 attempts.*queue full"):
                client.retrieve(["q4"])
            fake.release.set()
            answers = [f.result() for f in [busy, *waiting]]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["result"][0][0]["id"] for a in answers] == ["id-slow 0", "id-q1", "id-q2"]


def test_client_retries_overload_and_honours_retry_after_within_reason():
    app = FastAPI()
    calls: list[float] = []

    @app.post("/retrieve")
    def retrieve(body: dict):
        calls.append(time.perf_counter())
        if len(calls) == 1:
            return JSONResponse({"detail": "slow down"}, status_code=429, headers={"Retry-After": "0.3"})
        if len(calls) == 2:
            return JSONResponse({"detail": "queue full"}, status_code=503, headers={"Retry-After": "3600"})
        return {"result": [[{"document": {"id": "a", "contents": "A"}, "score": 1.0}]]}

    with ServerThread(app) as url:
        hits = RetrievalClient(url, retries=2, backoff=0.01, max_backoff=0.5).retrieve(["q"])
    assert [h.id for h in hits[0]] == ["a"] and len(calls) == 3
    assert calls[1] - calls[0] >= 0.3  # the server's Retry-After, not the 0.01 s backoff
    assert calls[2] - calls[1] < 2.0   # an hour's Retry-After is capped at max_backoff


# ---------------------------------------------------------------------------- a bad index, a dying service
@pytest.fixture
def saved_flat(tmp_path, world, encoder, vectors):
    retriever = build_retriever(world.passages[:300], IndexConfig(kind="flat"), encoder=encoder, vectors=vectors[:300])
    return save_retriever(retriever, tmp_path / "flat")


def _truncate(path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


@pytest.mark.parametrize("damage,message", [
    (lambda f: shutil.rmtree(f), "no index at"),
    (lambda f: (f / "index.faiss").write_bytes(b"this is not a FAISS index"), "incomplete or corrupt"),
    (lambda f: _truncate(f / "index.faiss", 0.5), "incomplete or corrupt"),
    (lambda f: (f / "index.faiss").unlink(), "incomplete or corrupt"),
    (lambda f: _truncate(f / "corpus.jsonl", 0.5), "incomplete or corrupt"),  # cut inside a line
    (lambda f: (f / "corpus.jsonl").write_text("".join((f / "corpus.jsonl").read_text().splitlines(True)[:100])),
     "corpus.jsonl does not match the manifest (100 passages, manifest n=300)"),
    (lambda f: (f / "manifest.json").write_text('{"kind": "flat"}'), "manifest.json is incomplete"),
])
def test_serve_refuses_a_missing_or_corrupt_index_in_one_line(saved_flat, damage, message, capsys):
    damage(saved_flat)
    code = cli_main(["serve-retriever", "--index", str(saved_flat), "--port", str(free_port())])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("kunlunlab serve-retriever: ") and message in lines[0]


@pytest.mark.slow
def test_serve_refusal_from_the_command_line_has_no_traceback(saved_flat):
    _truncate(saved_flat / "index.faiss", 0.3)
    done = subprocess.run([sys.executable, "-m", "kunlunlab.cli", "serve-retriever", "--index", str(saved_flat),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(lines) == 1
    assert lines[0].startswith("kunlunlab serve-retriever: ") and "rebuild it" in lines[0]


@pytest.mark.slow
def test_load_survives_a_service_killed_and_restarted_mid_load(tmp_path, world, questions):
    folder = save_retriever(build_retriever(world.passages[:300], IndexConfig(kind="bm25")), tmp_path / "bm25")
    queries = list(dict.fromkeys(h.question for q in questions for h in q.chain))[:24]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "service.log", "ab")

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "kunlunlab.cli", "serve-retriever", "--index", str(folder),
                                 "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).json()["ready"]:
                    return proc
            time.sleep(0.05)
        proc.kill()
        raise AssertionError(f"service did not start: {(tmp_path / 'service.log').read_text()[-2000:]}")

    result: dict = {}
    procs = [start()]
    # 120 retries at up to 0.25 s: each client rides out an outage of ~30 s (the restart's imports took over the
    # ~10 s that 40 retries allowed on a loaded 2-core machine, and 8 clients gave up)
    load = threading.Thread(target=lambda: result.update(run_load(
        url, queries, clients=8, duration_s=5.0, timeout=5.0, retries=120, backoff=0.05, max_backoff=0.25,
        keep_answers=True)))
    try:
        load.start()
        time.sleep(1.0)
        procs[0].kill()  # a crash: in-flight requests are cut, the port goes dark
        procs[0].wait()
        procs.append(start())
        load.join(90)
        second = httpx.get(url + "/health").json()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        log.close()
    assert not load.is_alive()
    assert result["lost"] == 0 and result["errors"] == 0 and result["retries"] > 0  # the outage was felt
    assert result["ok"] == result["requests"] and second["requests"] > 0  # the restarted service took part
    local = load_retriever(folder)  # the same saved index, searched in this process
    for query, hits in zip(queries, local.search(queries, 3)):
        answers = result["answers"][query]
        assert len(answers) >= 2
        for answer in answers:  # every answer, from either process, the same ranked hits
            assert [doc_id for doc_id, _ in answer] == [h.id for h in hits]
            assert [score for _, score in answer] == pytest.approx([h.score for h in hits], rel=1e-6)


# ---------------------------------------------------------------------------- bounded work (issue 44)
class RecordingRetriever:
    """Records each search's queries (the warm-up aside); the first search waits for ``go`` when ``gate`` is set,
    every search takes ``delay_s``."""

    kind = "fake"
    encoder = None

    def __init__(self, gate: bool = False, delay_s: float = 0.0):
        self.passages = ["p"] * 3
        self.batches: list[list[str]] = []
        self.entered, self.go = threading.Event(), threading.Event()
        self.delay_s = delay_s
        if not gate:
            self.go.set()

    def search(self, queries, k):
        if queries != [WARMUP_QUERY]:
            self.batches.append(list(queries))
            self.entered.set()
            self.go.wait(10)
            time.sleep(self.delay_s)
        return [[Hit(f"id-{q[:8]}", q, 1.0)] for q in queries]


MAXIMAL = [f"q{i:03d}-" + "x" * 2043 for i in range(256)]  # 256 queries of 2048 characters: the largest request


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_one_query_request_waits_for_one_batch_not_for_a_maximal_request():
    fake = RecordingRetriever(gate=True)
    with ServiceThread(fake) as url, ThreadPoolExecutor(2) as pool:
        big = pool.submit(httpx.post, url + "/retrieve", json={"queries": MAXIMAL, "topk": 100}, timeout=60)
        assert fake.entered.wait(10)  # the first slice of the maximal request is being searched
        # the same topk, so the next batch is one search (a batch is searched once per distinct topk)
        small = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["small"], "topk": 100}, timeout=60)
        _wait_until(lambda: httpx.get(url + "/health").json()["queue"] == 256 - len(fake.batches[0]) + 1)
        fake.go.set()
        small, big = small.result(), big.result()
    assert small.status_code == 200 and small.json()["result"][0][0]["id"] == "id-small"
    assert fake.batches[1] == [MAXIMAL[len(fake.batches[0])], "small"]  # next, beside one query of the large one
    assert len(fake.batches[0]) == 4 and all(sum(map(len, b)) <= 8192 for b in fake.batches)  # 4 x 2048 characters
    assert big.status_code == 200 and [row[0]["id"] for row in big.json()["result"]] == [f"id-{q[:8]}" for q in MAXIMAL]


def test_the_queries_of_a_client_that_left_are_not_searched():
    fake = RecordingRetriever(delay_s=0.05)  # 32 slices of the maximal request: 1.6 s
    with ServiceThread(fake) as url:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/retrieve", json={"queries": MAXIMAL, "topk": 3}, timeout=0.3)
        _wait_until(lambda: httpx.get(url + "/health").json()["queue"] == 0)
        time.sleep(0.2)
        searched = sum(len(b) for b in fake.batches)
        assert httpx.post(url + "/retrieve", json={"queries": ["next"]}).status_code == 200
    assert 0 < searched < 256


def test_a_body_over_the_limit_is_refused_before_it_is_read():
    from kunlunlab.retrieval.service import default_max_body_bytes

    limit = default_max_body_bytes(256, 2048)
    with ServiceThread(RecordingRetriever()) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # declares 40 MB, sends 13 bytes
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 40000000\r\n\r\n{\"queries\": [")
            reply = b""
            while chunk := sock.recv(65536):  # the server closes the connection after its answer
                reply += chunk
            reply = reply.decode()
        assert httpx.post(url + "/retrieve", json={"queries": MAXIMAL}, timeout=30).status_code == 200  # fits
    assert reply.startswith("HTTP/1.1 413") and "connection: close" in reply.lower()
    assert f"request body of 40000000 bytes is over the limit of {limit} bytes (max_body_bytes)" in reply


def test_health_states_the_limits(service):
    url, _ = service
    health = httpx.get(url + "/health").json()
    assert health["limits"] == {"max_queries": 256, "max_topk": 100, "max_query_chars": 2048,
                                "max_body_bytes": 256 * (6 * 2048 + 8) + 4096, "max_queue": 1024,
                                "max_batch_queries": 64, "max_batch_chars": 8192}
    assert health["api_key"] is False


def test_the_api_key_is_required_and_the_clients_send_it(monkeypatch):
    with ServiceThread(RecordingRetriever(), api_key="s3cret") as url:
        refused = httpx.post(url + "/retrieve", json={"queries": ["q"]})
        health = httpx.get(url + "/health")  # open, for probes
        given = RetrievalClient(url, api_key="s3cret").retrieve(["q"])
        monkeypatch.setenv(API_KEY_ENV, "s3cret")
        from_env = RemoteRetriever(url).search(["q"], 1)
        monkeypatch.setenv(API_KEY_ENV, "wrong")
        with pytest.raises(RetrievalServiceError, match="HTTP 401"):
            RetrievalClient(url, retries=0).retrieve(["q"])
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in refused.json()["detail"]
    assert health.status_code == 200 and health.json()["api_key"] is True
    assert given[0][0].id == from_env[0][0].id == "id-q"


def test_stopping_refuses_the_queued_requests_and_answers_the_one_in_flight():
    fake = FakeRetriever()
    service = ServiceThread(fake, max_batch_queries=1, batch_window_ms=0)
    url = service.start()
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["slow 0"]}, timeout=30)
        assert fake.entered.wait(10)
        queued = pool.submit(httpx.post, url + "/retrieve", json={"queries": ["q1"]}, timeout=30)
        _wait_until(lambda: httpx.get(url + "/health").json()["queue"] == 1)
        stopper = threading.Thread(target=service.stop)
        stopper.start()  # what the first SIGTERM does (make_server): queued work is refused at once
        refused = queued.result()
        fake.release.set()
        answered = busy.result()
        stopper.join()
    assert refused.status_code == 503 and refused.json()["detail"] == "the service is shutting down"
    assert answered.status_code == 200 and not service.thread.is_alive()


def test_serve_refuses_an_embedder_that_is_not_here_in_one_line(saved_flat, capsys):
    manifest = json.loads((saved_flat / "manifest.json").read_text())
    manifest["embedder"] = "no-such-org/no-such-embedder"
    (saved_flat / "manifest.json").write_text(json.dumps(manifest))
    code = cli_main(["serve-retriever", "--index", str(saved_flat), "--port", str(free_port())])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("kunlunlab serve-retriever: Cannot load embedder 'no-such-org/no-such-embedder'")


@pytest.mark.slow
def test_the_retriever_overload_benchmark_measures_small_requests_beside_maximal_ones():
    """``python -m kunlunlab.bench retriever-overload`` at a tiny size, on the real ``serve-retriever``."""
    from kunlunlab.bench import RetrieverOverloadBenchConfig, bench_retriever_overload

    result = bench_retriever_overload(RetrieverOverloadBenchConfig(duration=4, alone=1, n=300, small_clients=2,
                                                                   big_queries=32, threads=1))
    beside, maximal = result["beside_maximal"], result["maximal"]
    assert beside["ok"] >= 1 and beside["ok"] == beside["requests"] and maximal["errors"] == 0
    assert maximal["ok"] >= 1 and result["sigterm_exit_s"] is not None
