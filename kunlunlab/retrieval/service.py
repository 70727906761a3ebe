"""Retrieval over HTTP, in the layout Search-R1-style trainers already speak.

``POST /retrieve`` takes ``{"queries": [...], "topk": k, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (one list per query;
without ``return_scores`` the items are the bare documents, as in Search-R1). All queries of a
request go to the index in one batch. ``GET /health`` reports the index.

:class:`RetrievalClient` adds a timeout and retries and raises :class:`RetrievalServiceError`
with the URL and cause when the service is down: never a silent ``None``.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Sequence

import httpx
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from kunlunlab.retrieval.retriever import Hit, Retriever


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(min_length=1, max_length=4096)
    topk: int = Field(default=3, ge=1, le=1000)
    return_scores: bool = False


def create_app(retriever: Retriever, added_latency_ms: float = 0.0) -> FastAPI:
    """``added_latency_ms`` simulates a slower, wider "network" search tier (used by NLR)."""
    app = FastAPI(title="kunlunlab retriever", version="1")
    lock = threading.Lock()  # indexes that adapt while serving (cluster weights) are not thread-safe

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "kind": retriever.kind, "n": len(retriever.passages),
                "embedder": retriever.encoder.name if retriever.encoder else None}

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict:
        if any(not q.strip() for q in request.queries):
            raise HTTPException(status_code=422, detail="queries must be non-empty strings")
        with lock:
            results = retriever.search(request.queries, request.topk)
        if added_latency_ms:
            time.sleep(added_latency_ms / 1000.0)
        if request.return_scores:
            return {"result": [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in hits]
                               for hits in results]}
        return {"result": [[{"id": h.id, "contents": h.contents} for h in hits] for hits in results]}

    return app


class RetrievalServiceError(RuntimeError):
    """The retrieval service could not be reached or answered with an error."""


class RetrievalClient:
    def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.25):
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self._http = httpx.Client(timeout=timeout)

    def _post(self, path: str, payload: dict) -> dict:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self._http.post(self.url + path, json=payload)
            except httpx.HTTPError as err:  # connection refused, timeout, ...
                last = err
                time.sleep(self.backoff * (2 ** attempt))
                continue
            if response.status_code >= 500:
                last = RetrievalServiceError(f"HTTP {response.status_code}: {response.text[:200]}")
                time.sleep(self.backoff * (2 ** attempt))
                continue
            if response.status_code != 200:  # a bad request will not get better by retrying
                raise RetrievalServiceError(f"{self.url}{path} rejected the request "
                                            f"(HTTP {response.status_code}): {response.text[:300]}")
            return response.json()
        raise RetrievalServiceError(f"retrieval service at {self.url} is unavailable after {self.retries + 1} "
                                    f"attempts: {type(last).__name__}: {last}")

    def retrieve(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        data = self._post("/retrieve", {"queries": list(queries), "topk": topk, "return_scores": True})
        try:
            return [[Hit(item["document"]["id"], item["document"]["contents"], float(item["score"]))
                     for item in hits] for hits in data["result"]]
        except (KeyError, TypeError) as err:
            raise RetrievalServiceError(f"{self.url}/retrieve answered in an unexpected layout: {err}") from err

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Same call shape as :meth:`Retriever.search`, so a remote index can stand in for a local one."""
        return self.retrieve(queries, k)

    def health(self) -> dict:
        try:
            response = self._http.get(self.url + "/health")
            response.raise_for_status()
            return response.json()
        except httpx.HTTPError as err:
            raise RetrievalServiceError(f"retrieval service at {self.url} is unavailable: {err}") from err

    def close(self) -> None:
        self._http.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceThread:
    """Runs the service on loopback in a background thread (notebooks, tests): ``with ServiceThread(r) as url:``."""

    def __init__(self, retriever: Retriever | None = None, port: int | None = None, added_latency_ms: float = 0.0,
                 app: FastAPI | None = None):
        import uvicorn

        if (retriever is None) == (app is None):
            raise ValueError("give either a retriever or an app")
        self.port = port or free_port()
        config = uvicorn.Config(app or create_app(retriever, added_latency_ms), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RetrievalServiceError(f"service did not start on port {self.port}")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, added_latency_ms: float = 0.0) -> None:
    import uvicorn

    uvicorn.run(create_app(retriever, added_latency_ms), host=host, port=port, log_level="info")
