"""The retrieval service's client side, without the server's dependencies (FastAPI, pydantic, uvicorn).

:class:`RetrievalClient` adds a timeout and retries (with backoff, honouring ``Retry-After`` on 429/503) and raises
:class:`RetrievalServiceError` with the URL and cause when the service is down or answers in another layout: never a
silent ``None`` or empty list. :class:`RemoteRetriever` is the client behind a
:class:`~kunlunlab.retrieval.retriever.Retriever`'s ``search(queries, k)``, for evaluation and training
(:func:`kunlunlab.retrieval.factory.open_retriever`). The server is :mod:`kunlunlab.retrieval.service`.

Why a module of its own: the agent, the trainer and the evaluation reach the service only as clients, and a GPU node's
image need not hold the server's web stack (issue 42: a fastapi that imports ``opentelemetry`` made the GPU check's
rollout parts fail with ``ModuleNotFoundError`` although no server ran). ``tests/project/test_layers.py`` checks that
importing the agent, training and evaluation modules loads no FastAPI.
"""
from __future__ import annotations

import os
import socket
import time
from contextlib import suppress
from typing import Sequence

import httpx

from kunlunlab.data.loaders import flashrag_passage
from kunlunlab.models import canonical_embedder_name
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.retrieval.store import IndexMismatchError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})  # overload or a restart: worth another try
API_KEY_ENV = "KUNLUNLAB_RETRIEVER_API_KEY"  # the key a client sends and `serve-retriever` expects when none is given


def bearer_headers(api_key: str | None, env: str = API_KEY_ENV) -> dict[str, str]:
    """``Authorization: Bearer`` for ``api_key``, or for the key in ``env`` when ``api_key`` is None; no header when
    neither is set (the servers ask for no key by default). ``api_key=""`` sends none whatever the environment."""
    key = os.environ.get(env) if api_key is None else api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


class RetrievalServiceError(RuntimeError):
    """The retrieval service could not be reached or answered with an error."""


def retry_delay(attempt: int, backoff: float, response: httpx.Response | None = None,
                max_backoff: float = 5.0) -> float:
    """Seconds before retry ``attempt + 1``: exponential backoff, or the server's ``Retry-After`` (in
    seconds) when it asks for longer, both capped at ``max_backoff`` so a bad header cannot stall a caller."""
    delay = backoff * 2 ** attempt
    if response is not None:
        with suppress(ValueError):
            delay = max(delay, float(response.headers.get("retry-after", "")))
    return min(delay, max_backoff)


class RetrievalClient:
    """``api_key``: sent as a bearer token to a ``serve-retriever --api-key`` (None: ``$KUNLUNLAB_RETRIEVER_API_KEY``
    when set, else no header)."""

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.25,
                 max_backoff: float = 5.0, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self._http = httpx.Client(timeout=timeout, headers=bearer_headers(api_key))

    def _request(self, method: str, path: str, payload: dict | None = None) -> httpx.Response:
        """The first answer that is neither a connection failure nor a retryable status, within ``retries + 1``
        attempts; a 4xx is not retried (a bad request will not get better)."""
        last: Exception | None = None
        delay = 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(delay)
            try:
                response = self._http.request(method, self.url + path, json=payload)
            except httpx.HTTPError as err:  # connection refused, reset, timeout, ...
                last, delay = err, retry_delay(attempt, self.backoff, None, self.max_backoff)
                continue
            if response.status_code in RETRY_STATUSES or response.status_code >= 500:
                last = RetrievalServiceError(f"HTTP {response.status_code}: {' '.join(response.text[:200].split())}")
                delay = retry_delay(attempt, self.backoff, response, self.max_backoff)
                continue
            return response
        attempts = self.retries + 1
        cause = str(last) if isinstance(last, RetrievalServiceError) else f"{type(last).__name__}: {last}"
        raise RetrievalServiceError(f"retrieval service at {self.url} is unavailable after {attempts} "
                                    f"attempt{'s' if attempts > 1 else ''}: {cause}")

    def _json(self, response: httpx.Response, path: str):
        if response.status_code != 200:
            raise RetrievalServiceError(f"{self.url}{path} rejected the request "
                                        f"(HTTP {response.status_code}): {response.text[:300]}")
        try:
            return response.json()
        except ValueError as err:
            raise RetrievalServiceError(f"{self.url}{path} answered with a body that is not JSON: "
                                        f"{response.text[:100]!r}") from err

    def _post(self, path: str, payload: dict):
        return self._json(self._request("POST", path, payload), path)

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
        return self._json(self._request("GET", "/health"), "/health")

    def close(self) -> None:
        self._http.close()


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
    ``max_backoff``; a 429/503's ``Retry-After`` is honoured); then one :class:`RetrievalServiceError` names
    the URL and the cause. An HTTP error and a malformed answer are errors, never an empty hit list."""

    encoder = None  # queries are embedded by the service
    kind = "remote"

    def __init__(self, url: str, attempts: int = 3, backoff: float = 0.25, timeout: float = 30.0,
                 max_backoff: float = 5.0, api_key: str | None = None):
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        super().__init__(url, timeout=timeout, retries=attempts - 1, backoff=backoff, max_backoff=max_backoff,
                         api_key=api_key)
        self.info: dict = {}

    def check(self, embedder: str | None = None) -> dict:
        """Before the first search: the service answers and is ready (``GET /health``, tried like a search; a
        Search-R1 server, which has no ``/health``, passes on its 404), and was built with ``embedder`` when one
        is named (:class:`~kunlunlab.retrieval.store.IndexMismatchError` otherwise). Returns the health report
        (``{}`` from a server without one)."""
        response = self._request("GET", "/health")
        if response.status_code == 404:
            self.info = {}
            return self.info
        info = self._json(response, "/health")
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
