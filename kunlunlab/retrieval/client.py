"""The retrieval service's client side, without the server's dependencies (FastAPI, pydantic, uvicorn).

:class:`RetrievalClient` sends its requests through :class:`~kunlunlab.http.client.ServiceClient` (a timeout, retries
with backoff that honour ``Retry-After`` on 429/503) and raises :class:`RetrievalServiceError` with the URL and cause
when the service is down or answers in another layout: never a silent ``None`` or empty list. :class:`RemoteRetriever`
is the client behind a :class:`~kunlunlab.retrieval.retriever.Retriever`'s ``search(queries, k)``, for evaluation
and training (:func:`kunlunlab.retrieval.factory.open_retriever`). The server is :mod:`kunlunlab.retrieval.service`.

Why a module of its own: the agent, the trainer and the evaluation reach the service only as clients, and a GPU node's
image need not hold the server's web stack (issue 42: a fastapi that imports ``opentelemetry`` made the GPU check's
rollout parts fail with ``ModuleNotFoundError`` although no server ran). ``tests/project/test_layers.py`` checks that
importing the agent, training and evaluation modules loads no FastAPI.
"""
from __future__ import annotations

from typing import Sequence

from kunlunlab.data.loaders import flashrag_passage
from kunlunlab.http import client as http_client
from kunlunlab.http.client import RETRY_STATUSES, RetryPolicy, ServiceClient, ServiceError, free_port, retry_delay
from kunlunlab.models import canonical_embedder_name
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.retrieval.store import IndexMismatchError

API_KEY_ENV = "KUNLUNLAB_RETRIEVER_API_KEY"  # the key a client sends and `serve-retriever` expects when none is given


def bearer_headers(api_key: str | None, env: str = API_KEY_ENV) -> dict[str, str]:
    """:func:`kunlunlab.http.client.bearer_headers` with the retrieval service's key variable by default (the load
    test's clients send it)."""
    return http_client.bearer_headers(api_key, env)


class RetrievalServiceError(ServiceError):
    """The retrieval service could not be reached or answered with an error."""


class RetrievalClient:
    """``retries`` after the first try, waiting ``backoff`` seconds and doubling, at most ``max_backoff`` (a
    429/503's ``Retry-After`` is honoured up to it). ``api_key``: sent as a bearer token to a ``serve-retriever
    --api-key`` (None: ``$KUNLUNLAB_RETRIEVER_API_KEY`` when set, else no header)."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.25,
                 max_backoff: float = 5.0, api_key: str | None = None):
        self.service = ServiceClient(url, "retrieval service", error=RetrievalServiceError, timeout=timeout,
                                     retry=RetryPolicy.from_retries(retries, backoff, max_backoff), api_key=api_key,
                                     key_env=API_KEY_ENV)
        self.url = self.service.url

    def _post(self, path: str, payload: dict):
        return self.service.json("POST", path, payload)

    def retrieve(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """One hit list per query, in the service's order. An answer without one list of ``{document: {id,
        contents}, score}`` items per query is an error, never an empty or shortened result."""
        queries = list(queries)
        data = self._post("/retrieve", {"queries": queries, "topk": topk, "return_scores": True})
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries) or not all(isinstance(r, list) for r in result):
            got = f"{len(result)} results" if isinstance(result, list) else f"no 'result' list ({str(data)[:100]})"
            raise RetrievalServiceError(f"{self.url}/retrieve answered {got} for {len(queries)} queries: expected "
                                        "one list of hits per query")
        try:
            return [[_hit(item) for item in row] for row in result]
        except (KeyError, TypeError, ValueError) as err:
            raise RetrievalServiceError(f"{self.url}/retrieve answered in an unexpected layout: "
                                        f"{type(err).__name__}: {err}") from err

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Same call shape as :meth:`Retriever.search`, so a remote index can stand in for a local one."""
        return self.retrieve(queries, k)

    def health(self) -> dict:
        return self.service.json("GET", "/health")

    def close(self) -> None:
        self.service.close()


def _hit(item: dict) -> Hit:
    """A hit from one Search-R1 result item; the title is read from the FlashRAG contents (``"Title"\ntext``)."""
    document = item["document"]
    contents = document["contents"]
    if not isinstance(contents, str):
        raise TypeError(f"document contents is {type(contents).__name__}, not text")
    passage = flashrag_passage(document["id"], contents)
    return Hit(passage.id, contents, float(item["score"]), passage.title)


class RemoteRetriever(RetrievalClient):
    """A retrieval service in place of a :class:`~kunlunlab.retrieval.retriever.Retriever`: the same
    ``search(queries, k)`` (one ranked hit list per query), answered by ``kunlunlab serve-retriever`` or any
    server that speaks Search-R1's ``POST /retrieve``. The corpus is embedded and searched there: this
    process embeds no passage (:func:`kunlunlab.retrieval.encoder.passages_embedded` stays put).

    Each request is tried up to ``attempts`` times, waiting ``backoff`` seconds and doubling (at most
    ``max_backoff``; a 429/503's ``Retry-After`` is honoured up to it); then one :class:`RetrievalServiceError`
    names the URL and the cause. An HTTP error and a malformed answer are errors, never an empty hit list."""

    encoder = None  # queries are embedded by the service
    kind = "remote"

    def __init__(self, url: str, attempts: int = 3, backoff: float = 0.25, timeout: float = 30.0,
                 max_backoff: float = 5.0, api_key: str | None = None):
        RetryPolicy(attempts)  # attempts < 1 is refused here, in the knob's own name
        super().__init__(url, timeout=timeout, retries=attempts - 1, backoff=backoff, max_backoff=max_backoff,
                         api_key=api_key)
        self.info: dict = {}

    def check(self, embedder: str | None = None) -> dict:
        """Before the first search: the service answers and is ready (``GET /health``, tried like a search; a
        Search-R1 server, which has no ``/health``, passes on its 404), and was built with ``embedder`` when one
        is named (:class:`~kunlunlab.retrieval.store.IndexMismatchError` otherwise). Returns the health report
        (``{}`` from a server without one)."""
        response = self.service.request("GET", "/health")
        if response.status_code == 404:
            self.info = {}
            return self.info
        info = self.service.json_of(response, "/health")
        if not isinstance(info, dict) or not info.get("ready", True):
            raise RetrievalServiceError(f"retrieval service at {self.url} is not ready: {str(info)[:200]}")
        served = info.get("embedder")
        if embedder is not None and served is not None and canonical_embedder_name(embedder) != served:
            raise IndexMismatchError(f"the retrieval service at {self.url} embeds with {served!r}, not "
                                     f"{canonical_embedder_name(embedder)!r}")
        self.info = info
        return info

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not queries:
            return []
        return self.retrieve(queries, k)


__all__ = ["API_KEY_ENV", "RETRY_STATUSES", "RemoteRetriever", "RetrievalClient", "RetrievalServiceError",
           "bearer_headers", "free_port", "retry_delay"]
