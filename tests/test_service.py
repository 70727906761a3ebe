import httpx
import pytest

from kunlunlab.retrieval import IndexConfig, build_retriever
from kunlunlab.retrieval.service import RetrievalClient, RetrievalServiceError, ServiceThread, free_port


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
