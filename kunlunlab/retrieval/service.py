"""Retrieval over HTTP, in the layout Search-R1-style trainers already speak.

``POST /retrieve`` takes ``{"queries": [...], "topk": k, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (one list per query;
without ``return_scores`` the items are the bare documents, as in Search-R1). ``GET /health`` reports
the index, readiness and the batching counters.

Many agents sending one query each is the common load (RL rollouts), and encoding a batch of queries
costs far less per query than encoding them one by one. So requests do not call the retriever
themselves: they join a queue, and one worker (:class:`MicroBatcher`) merges the requests that arrive
within ``batch_window_ms`` into one ``retriever.search`` call and hands each request its own rows.
The queue is bounded (``max_queue`` queries): past it the service answers 503 with ``Retry-After``
instead of letting latency grow without limit. Requests over the limits (``max_queries``,
``max_topk``, ``max_query_chars``, empty queries) get a 422 that names the limit and the value.

The client (:class:`~kunlunlab.retrieval.client.RetrievalClient`, ``RemoteRetriever``) lives in
:mod:`kunlunlab.retrieval.client`, which imports no web framework. :mod:`kunlunlab.bench.loadtest` drives the
service with many clients.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from kunlunlab.retrieval.client import RetrievalServiceError, free_port
from kunlunlab.retrieval.retriever import Hit, Retriever

WARMUP_QUERY = "warm-up query"


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int = 3
    return_scores: bool = False


class QueueFull(RuntimeError):
    """More queries wait than the service accepts; the caller should come back later."""


class _Job:
    __slots__ = ("queries", "topk", "future", "arrived")

    def __init__(self, queries: list[str], topk: int, future: asyncio.Future, arrived: float):
        self.queries, self.topk, self.future, self.arrived = queries, topk, future, arrived


class MicroBatcher:
    """The retriever's only caller: one worker task merges queued requests into batched searches.

    A request waits at most ``window_s`` after its arrival for others to join it; requests that queued
    up while the previous batch was searched go out at once. A batch holds up to ``max_batch_queries``
    queries (a larger request goes alone) and is searched once per distinct ``topk``, on one dedicated
    thread: the event loop stays free for HTTP, and the retriever (adaptive cluster weights, the query
    cache) never sees two calls at once. ``merge=False`` searches one request at a time (the baseline
    that ``bench service`` compares against).
    """

    def __init__(self, retriever: Retriever, window_s: float = 0.003, max_batch_queries: int = 64,
                 max_queue: int = 1024, merge: bool = True):
        self.retriever = retriever
        self.window_s, self.max_batch_queries, self.max_queue = window_s, max_batch_queries, max_queue
        self.merge = merge
        self.waiting = 0          # queries queued and not yet taken into a batch
        self.searches = 0         # retriever.search calls since start (the warm-up not counted)
        self.searched_queries = 0
        self.requests = 0
        self.ready = False
        self._queue: asyncio.Queue[_Job] | None = None
        self._carry: _Job | None = None  # taken from the queue but did not fit the previous batch
        self._executor: ThreadPoolExecutor | None = None
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        """Warm-up search first: an index that cannot answer never makes the service ready."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")
        self._queue = asyncio.Queue()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.retriever.search, [WARMUP_QUERY], 1)
        self._worker = asyncio.create_task(self._run())
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        if self._worker is not None:
            self._worker.cancel()
            with suppress(asyncio.CancelledError):
                await self._worker
        pending = [self._carry] if self._carry else []
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for job in pending:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the service is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        # a request alone always fits, so max_queue below max_queries cannot lock a large request out
        if self.waiting and self.waiting + len(queries) > self.max_queue:
            raise QueueFull(f"queue full: {self.waiting} queries waiting, retry later")
        loop = asyncio.get_running_loop()
        job = _Job(queries, topk, loop.create_future(), loop.time())
        self.waiting += len(queries)
        self.requests += 1
        self._queue.put_nowait(job)
        return await job.future

    async def _next_batch(self) -> list[_Job]:
        loop = asyncio.get_running_loop()
        first = self._carry or await self._queue.get()
        self._carry = None
        jobs, n = [first], len(first.queries)
        if self.merge:
            delay = first.arrived + self.window_s - loop.time()
            if delay > 0 and self.waiting < self.max_batch_queries:
                await asyncio.sleep(delay)
            while n < self.max_batch_queries and not self._queue.empty():
                job = self._queue.get_nowait()
                if n + len(job.queries) > self.max_batch_queries:
                    self._carry = job
                    break
                jobs.append(job)
                n += len(job.queries)
        self.waiting -= n
        return jobs

    async def _run(self) -> None:
        while True:
            jobs = await self._next_batch()
            try:
                await self._serve(jobs)
            except asyncio.CancelledError:  # shutting down: nobody will answer these
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("the service is shutting down"))
                raise

    async def _serve(self, jobs: list[_Job]) -> None:
        """One search per distinct topk; each request gets its own slice of the rows."""
        loop = asyncio.get_running_loop()
        by_topk: dict[int, list[_Job]] = {}
        for job in jobs:
            by_topk.setdefault(job.topk, []).append(job)
        for topk, group in by_topk.items():
            queries = [q for job in group for q in job.queries]
            try:
                rows = await loop.run_in_executor(self._executor, self.retriever.search, queries, topk)
            except Exception as err:  # this batch fails (HTTP 500), the service goes on
                for job in group:
                    if not job.future.done():
                        job.future.set_exception(err)
                continue
            finally:
                self.searches += 1
                self.searched_queries += len(queries)
            start = 0
            for job in group:
                if not job.future.done():  # a request may have been cancelled meanwhile
                    job.future.set_result(rows[start:start + len(job.queries)])
                start += len(job.queries)

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


def create_app(retriever: Retriever, added_latency_ms: float = 0.0, *, micro_batching: bool = True,
               batch_window_ms: float = 3.0, max_batch_queries: int = 64, max_queue: int = 1024,
               max_queries: int = 256, max_topk: int = 100, max_query_chars: int = 2048) -> FastAPI:
    """``added_latency_ms`` simulates a slower, wider "network" search tier (used by NLR); it delays each
    answer without holding the retriever. The service is ready once a warm-up search has succeeded."""
    if batch_window_ms < 0 or min(max_batch_queries, max_queue, max_queries, max_topk, max_query_chars) < 1:
        raise ValueError("batch_window_ms must be >= 0 and the batch, queue and request limits >= 1")
    batcher = MicroBatcher(retriever, batch_window_ms / 1000.0, max_batch_queries, max_queue, merge=micro_batching)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="kunlunlab retriever", version="1", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok" if batcher.ready else "starting", "ready": batcher.ready, "kind": retriever.kind,
                "n": len(retriever.passages), "embedder": retriever.encoder.name if retriever.encoder else None,
                "micro_batching": micro_batching, **batcher.stats()}

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> JSONResponse:
        check_request(request, max_queries, max_topk, max_query_chars)
        if not batcher.ready:
            raise HTTPException(status_code=503, detail="service is starting: the warm-up search has not finished",
                                headers={"Retry-After": "1"})
        try:
            results = await batcher.submit(request.queries, request.topk)
        except QueueFull as err:
            raise HTTPException(status_code=503, detail=str(err), headers={"Retry-After": "1"}) from err
        except Exception as err:
            raise HTTPException(status_code=500, detail=f"search failed: {type(err).__name__}: {err}") from err
        if added_latency_ms:
            await asyncio.sleep(added_latency_ms / 1000.0)
        if request.return_scores:
            return JSONResponse({"result": [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score}
                                             for h in hits] for hits in results]})
        return JSONResponse({"result": [[{"id": h.id, "contents": h.contents} for h in hits] for hits in results]})

    return app


class ServiceThread:
    """Runs the service on loopback in a background thread (notebooks, tests): ``with ServiceThread(r) as url:``.

    ``options`` go to :func:`create_app` (``micro_batching``, ``batch_window_ms``, ``max_queue``, ...)."""

    def __init__(self, retriever: Retriever | None = None, port: int | None = None, added_latency_ms: float = 0.0,
                 app: FastAPI | None = None, **options):
        import uvicorn  # deferred: only serving needs the ASGI server

        if (retriever is None) == (app is None):
            raise ValueError("give either a retriever or an app")
        self.port = port or free_port()
        config = uvicorn.Config(app or create_app(retriever, added_latency_ms, **options), host="127.0.0.1",
                                port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with suppress(SystemExit):  # uvicorn exits when the startup (warm-up) fails; start() reports it
            self.server.run()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RetrievalServiceError(f"service did not start on port {self.port} (see the log above: "
                                            "a failed warm-up search or a port in use)")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, added_latency_ms: float = 0.0,
          **options) -> None:
    import uvicorn  # deferred: only serving needs the ASGI server

    uvicorn.run(create_app(retriever, added_latency_ms, **options), host=host, port=port, log_level="info")
