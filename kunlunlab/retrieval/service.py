"""Retrieval over HTTP, in the layout Search-R1-style trainers already speak.

``POST /retrieve`` takes ``{"queries": [...], "topk": k, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (one list per query;
without ``return_scores`` the items are the bare documents, as in Search-R1). ``GET /health`` reports
the index, readiness, the limits and the batching counters.

Many agents sending one query each is the common load (RL rollouts), and encoding a batch of queries
costs far less per query than encoding them one by one. So requests do not call the retriever
themselves: they join a queue, and one worker (:class:`MicroBatcher`) merges the requests that arrive
within ``batch_window_ms`` into one ``retriever.search`` call and hands each request its own rows.
A batch is bounded in queries and in characters and dealt round-robin between the waiting requests, so a
maximal request (256 queries of 2048 characters) is searched in slices and a one-query request behind it waits for
one slice, not for the whole request (issue 44: it waited 24 s).
The queue is bounded (``max_queue`` queries): past it the service answers 503 with ``Retry-After``
instead of letting latency grow without limit. Requests over the limits (``max_queries``,
``max_topk``, ``max_query_chars``, empty queries) get a 422 that names the limit and the value; a body over
``max_body_bytes`` gets a 413 before it is read. A request whose client disconnects leaves the queue.

The server's shell (the lifespan, the drain at the first SIGTERM, the bearer key and the body cap, one-line 422s,
the 503 with ``Retry-After``) is :mod:`kunlunlab.http.server`, shared with ``kunlunlab serve-llm``
(:mod:`kunlunlab.agent.server`).

The client (:class:`~kunlunlab.retrieval.client.RetrievalClient`, ``RemoteRetriever``) lives in
:mod:`kunlunlab.retrieval.client`, which imports no web framework. :mod:`kunlunlab.bench.loadtest` drives the
service with many clients.
"""
from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from kunlunlab.http.server import CLIENT_CLOSED_REQUEST, ServerThread, busy, client_gone, make_server, service_app
from kunlunlab.retrieval.client import RetrievalServiceError
from kunlunlab.retrieval.retriever import Hit, Retriever

WARMUP_QUERY = "warm-up query"


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int = 3
    return_scores: bool = False


class QueueFull(RuntimeError):
    """More queries wait than the service accepts; the caller should come back later."""


class ShuttingDown(RuntimeError):
    """The service has been told to stop: it takes no new work and fails the work that waits."""


class _Job:
    """One request: its queries, how many of them went into batches (``taken``) and came back (``answered``)."""

    __slots__ = ("queries", "topk", "future", "arrived", "rows", "taken", "answered")

    def __init__(self, queries: list[str], topk: int, future: asyncio.Future, arrived: float):
        self.queries, self.topk, self.future, self.arrived = queries, topk, future, arrived
        self.rows: list[list[Hit] | None] = [None] * len(queries)
        self.taken = self.answered = 0


class MicroBatcher:
    """The retriever's only caller: one worker task merges queued requests into batched searches.

    A request waits at most ``window_s`` after its arrival for others to join it; requests that queued
    up while the previous batch was searched go out at once. A batch holds up to ``max_batch_queries``
    queries and ``max_batch_chars`` characters of them (at least one query), dealt round-robin, one query at a
    time, between the waiting requests in arrival order, and no further once a single request has queries left:
    a large request is searched in slices, and a one-query request that arrives behind it goes out in the next
    batch, beside one more query of the large one, not a whole slice of it. So its wait is bounded by one slice
    (long queries cost more to encode than short ones, hence the character bound). Each batch is searched once per
    distinct ``topk``, on one dedicated thread: the event loop stays free for HTTP, and the retriever (adaptive
    cluster weights, the query cache) never sees two calls at once. ``merge=False`` searches one request's slice at
    a time (the baseline that ``bench service`` compares against).
    """

    def __init__(self, retriever: Retriever, window_s: float = 0.003, max_batch_queries: int = 64,
                 max_queue: int = 1024, merge: bool = True, max_batch_chars: int = 8192):
        self.retriever = retriever
        self.window_s, self.max_batch_queries, self.max_queue = window_s, max_batch_queries, max_queue
        self.max_batch_chars = max_batch_chars
        self.merge = merge
        self.waiting = 0          # queries queued and not yet taken into a batch
        self.searches = 0         # retriever.search calls since start (the warm-up not counted)
        self.searched_queries = 0
        self.requests = 0
        self.ready = False
        self.closed = False
        self._jobs: deque[_Job] = deque()  # requests with queries not yet taken, oldest first
        self._wake: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._worker: asyncio.Task | None = None
        self._in_flight: list[_Job] = []

    async def start(self) -> None:
        """Warm-up search first: an index that cannot answer never makes the service ready."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")
        self._wake = asyncio.Event()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.retriever.search, [WARMUP_QUERY], 1)
        self._worker = asyncio.create_task(self._run())
        self.ready = True

    async def close(self) -> None:
        """Stops taking work and fails every waiting request (503); the batch being searched finishes."""
        self.ready, self.closed = False, True
        for job in self._jobs:
            if not job.future.done():
                job.future.set_exception(ShuttingDown("the service is shutting down"))
        self._jobs.clear()
        self.waiting = 0

    async def stop(self) -> None:
        await self.close()
        if self._worker is not None:
            self._worker.cancel()
            with suppress(asyncio.CancelledError):
                await self._worker
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if self.closed:
            raise ShuttingDown("the service is shutting down")
        # a request alone always fits, so max_queue below max_queries cannot lock a large request out
        if self.waiting and self.waiting + len(queries) > self.max_queue:
            raise QueueFull(f"queue full: {self.waiting} queries waiting, retry later")
        loop = asyncio.get_running_loop()
        job = _Job(queries, topk, loop.create_future(), loop.time())
        self.waiting += len(queries)
        self.requests += 1
        self._jobs.append(job)
        self._wake.set()
        return await job.future  # cancelled (the client left): the worker drops what it has not taken yet

    def _prune(self) -> None:
        """Requests that are answered already (failed, or cancelled by a client that left) leave the queue."""
        if any(job.future.done() for job in self._jobs):
            for job in self._jobs:
                if job.future.done():
                    self.waiting -= len(job.queries) - job.taken
            self._jobs = deque(job for job in self._jobs if not job.future.done())

    async def _next_batch(self) -> list[tuple[_Job, int, int]]:
        """The next batch as (request, first query, end) slices."""
        loop = asyncio.get_running_loop()
        while True:
            self._prune()
            if self._jobs:
                delay = self._jobs[0].arrived + self.window_s - loop.time()
                if not (self.merge and delay > 0 and self.waiting < self.max_batch_queries):
                    break
                await asyncio.sleep(delay)
                continue
            self._wake.clear()
            await self._wake.wait()
        jobs = list(self._jobs) if self.merge else [self._jobs[0]]
        take: dict[_Job, int] = {}
        n = chars = 0
        dealt = True
        while dealt and n < self.max_batch_queries:  # round-robin, one query per request per round
            dealt = False
            for job in jobs:
                i = job.taken + take.get(job, 0)
                if n >= self.max_batch_queries or i == len(job.queries):
                    continue
                size = len(job.queries[i])
                if n and chars + size > self.max_batch_chars:
                    continue
                take[job] = take.get(job, 0) + 1
                n, chars, dealt = n + 1, chars + size, True
            left = sum(job.taken + take.get(job, 0) < len(job.queries) for job in take)
            if len(take) > 1 and left <= 1:  # the others are done: the rest of a large request goes alone next
                break
        batch = []
        for job, k in take.items():
            batch.append((job, job.taken, job.taken + k))
            job.taken += k
        self.waiting -= n
        self._jobs = deque(job for job in self._jobs if job.taken < len(job.queries))
        if not self.merge and jobs[0].taken < len(jobs[0].queries):  # one slice per turn: the rest queues again
            self._jobs.rotate(-1)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            self._in_flight = [job for job, _, _ in batch]
            try:
                await self._serve(batch)
            except asyncio.CancelledError:  # shutting down: nobody will answer these
                for job in self._in_flight:
                    if not job.future.done():
                        job.future.set_exception(ShuttingDown("the service is shutting down"))
                raise
            finally:
                self._in_flight = []

    async def _serve(self, batch: list[tuple[_Job, int, int]]) -> None:
        """One search per distinct topk; each request gets its own slice of the rows, and its answer once every
        slice is back."""
        loop = asyncio.get_running_loop()
        by_topk: dict[int, list[tuple[_Job, int, int]]] = {}
        for piece in batch:
            by_topk.setdefault(piece[0].topk, []).append(piece)
        for topk, group in by_topk.items():
            group = [piece for piece in group if not piece[0].future.done()]  # a client may have left meanwhile
            if not group:
                continue
            queries = [q for job, a, b in group for q in job.queries[a:b]]
            try:
                rows = await loop.run_in_executor(self._executor, self.retriever.search, queries, topk)
            except Exception as err:  # this request fails (HTTP 500), the service goes on
                for job, _, _ in group:
                    if not job.future.done():
                        job.future.set_exception(err)
                continue
            finally:
                self.searches += 1
                self.searched_queries += len(queries)
            start = 0
            for job, a, b in group:
                if not job.future.done():
                    job.rows[a:b] = rows[start:start + b - a]
                    job.answered += b - a
                    if job.answered == len(job.queries):
                        job.future.set_result(job.rows)
                start += b - a

    def stats(self) -> dict:
        return {"queue": self.waiting, "requests": self.requests, "batches": self.searches,
                "mean_batch_queries": round(self.searched_queries / self.searches, 2) if self.searches else 0.0}


def check_request(request: RetrieveRequest, max_queries: int, max_topk: int, max_query_chars: int) -> None:
    """422 with the limit and the offending value: a bad request will not get better by retrying."""
    def reject(detail: str):
        raise HTTPException(status_code=422, detail=detail)

    if not request.queries:
        reject("no queries: send at least one")
    if len(request.queries) > max_queries:
        reject(f"too many queries: {len(request.queries)} in one request, the limit is {max_queries} (max_queries)")
    if not 1 <= request.topk <= max_topk:
        reject(f"topk must be between 1 and {max_topk}, got {request.topk}")
    for i, q in enumerate(request.queries):
        if not q.strip():
            reject(f"query {i} is empty: queries must be non-empty strings")
        if len(q) > max_query_chars:
            reject(f"query {i} is {len(q)} characters long, the limit is {max_query_chars} (max_query_chars)")


def default_max_body_bytes(max_queries: int, max_query_chars: int) -> int:
    """The largest valid request with every character escaped as ``\\uXXXX`` (6 bytes), plus room for the rest."""
    return max_queries * (6 * max_query_chars + 8) + 4096


def create_app(retriever: Retriever, added_latency_ms: float = 0.0, *, micro_batching: bool = True,
               batch_window_ms: float = 3.0, max_batch_queries: int = 64, max_batch_chars: int = 8192,
               max_queue: int = 1024, max_queries: int = 256, max_topk: int = 100, max_query_chars: int = 2048,
               max_body_bytes: int | None = None, api_key: str | None = None) -> FastAPI:
    """``added_latency_ms`` simulates a slower, wider "network" search tier (used by NLR); it delays each
    answer without holding the retriever. The service is ready once a warm-up search has succeeded.
    ``max_body_bytes`` (None: :func:`default_max_body_bytes`) and ``api_key`` (None: no key):
    :class:`~kunlunlab.http.server.RequestGuard`."""
    if max_body_bytes is None:
        max_body_bytes = default_max_body_bytes(max_queries, max_query_chars)
    if batch_window_ms < 0 or min(max_batch_queries, max_batch_chars, max_queue, max_queries, max_topk,
                                  max_query_chars, max_body_bytes) < 1:
        raise ValueError("batch_window_ms must be >= 0 and the batch, queue, request and body limits >= 1")
    batcher = MicroBatcher(retriever, batch_window_ms / 1000.0, max_batch_queries, max_queue, merge=micro_batching,
                           max_batch_chars=max_batch_chars)
    limits = {"max_queries": max_queries, "max_topk": max_topk, "max_query_chars": max_query_chars,
              "max_body_bytes": max_body_bytes, "max_queue": max_queue, "max_batch_queries": max_batch_queries,
              "max_batch_chars": max_batch_chars}

    app = service_app("kunlunlab retriever", start=batcher.start, stop=batcher.stop, drain=batcher.close,
                      api_key=api_key, max_body_bytes=max_body_bytes)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> dict:
        status = "ok" if batcher.ready else "shutting down" if batcher.closed else "starting"
        return {"status": status, "ready": batcher.ready, "kind": retriever.kind,
                "n": len(retriever.passages), "embedder": retriever.encoder.name if retriever.encoder else None,
                "micro_batching": micro_batching, "limits": limits, "api_key": bool(api_key), **batcher.stats()}

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest, request: Request) -> Response:
        check_request(body, max_queries, max_topk, max_query_chars)
        if batcher.closed:
            raise busy("the service is shutting down")
        if not batcher.ready:
            raise busy("service is starting: the warm-up search has not finished")
        search = asyncio.ensure_future(batcher.submit(body.queries, body.topk))
        gone = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({search, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not search.done():  # the client left: what is not searched yet is dropped
            search.cancel()
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        try:
            results = search.result()
        except (QueueFull, ShuttingDown) as err:
            raise busy(str(err)) from err
        except Exception as err:
            raise HTTPException(status_code=500, detail=f"search failed: {type(err).__name__}: {err}") from err
        if added_latency_ms:
            await asyncio.sleep(added_latency_ms / 1000.0)
        if body.return_scores:
            return JSONResponse({"result": [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score}
                                             for h in hits] for hits in results]})
        return JSONResponse({"result": [[{"id": h.id, "contents": h.contents} for h in hits] for hits in results]})

    return app


class ServiceThread(ServerThread):
    """Runs the service over ``retriever`` on loopback in a background thread (notebooks, tests):
    ``with ServiceThread(r) as url:``. ``options`` go to :func:`create_app` (``micro_batching``,
    ``batch_window_ms``, ``max_queue``, ...); a warm-up search that fails raises :class:`RetrievalServiceError`."""

    start_error = RetrievalServiceError

    def __init__(self, retriever: Retriever, port: int | None = None, added_latency_ms: float = 0.0, **options):
        super().__init__(create_app(retriever, added_latency_ms, **options), port)


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, added_latency_ms: float = 0.0,
          **options) -> None:
    """``kunlunlab serve-retriever``: until SIGINT/SIGTERM; the first one refuses the queued requests (503) and
    stops once the batch being searched is answered (:func:`make_server`)."""
    make_server(create_app(retriever, added_latency_ms, **options), host, port).run()
