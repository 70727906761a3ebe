"""``kunlunlab serve-llm``: an OpenAI-compatible ``/v1/completions`` endpoint over the local backend.

It lets several notebooks, the judge and the :class:`~kunlunlab.agent.openai_backend.OpenAIBackend` share one
loaded model, and it is the reference the OpenAI backend is tested against. It speaks the subset of
the API that vLLM's completions endpoint speaks for rollouts: prompts as text or token ids (one or a
batch), ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``, and vLLM's
``include_stop_str_in_output`` / ``return_tokens_as_token_ids`` / ``stop_reason``.

The model generates for one request at a time, so the server bounds and cancels that work (issue 44: a client that
gave up on ``max_tokens: 8192`` held the server for 14 minutes, and SIGTERM waited for it):

* the requests wait in one FIFO queue of at most ``max_queue`` behind the one generating; a full queue answers 503
  with ``Retry-After``;
* a request whose client disconnects is cancelled: it leaves the queue, or its generation stops after the current
  token (the ``cancel`` event of :meth:`~kunlunlab.agent.transformers_backend.TransformersSession.generate`);
* limits answered 422 in one line, vLLM's names: ``max_tokens`` at most the server's ``max_tokens``, each prompt's
  tokens plus ``max_tokens`` at most ``max_model_len`` (default: the model's context), at most ``max_prompts``
  prompts, token ids inside the vocabulary; a body over ``max_body_bytes`` is a 413 before it is read;
* the first SIGTERM cancels the generation in flight and answers the waiting requests 503
  (:func:`~kunlunlab.http.server.make_server`);
* ``api_key``: an optional bearer token, as vLLM's ``--api-key`` (``GET /health`` stays open).

``GET /health`` reports the model, the queue, the counters and the limits. The shell (lifespan, drain, key, body
cap, one-line 422s, the 503 with ``Retry-After``) is :mod:`kunlunlab.http.server`, shared with ``serve-retriever``.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from threading import Event

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from kunlunlab.agent.backends import SamplingConfig, text_ids
from kunlunlab.agent.transformers_backend import GenerationCancelled, TransformersBackend
from kunlunlab.http.server import CLIENT_CLOSED_REQUEST, busy, client_gone, make_server, service_app

log = logging.getLogger("uvicorn.error")  # the server's own log, shown at its --log-level


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-2 ** 63, lt=2 ** 64)  # what torch's manual_seed takes
    stop: str | list[str] | None = None
    logprobs: int | None = Field(default=None, ge=0)
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    skip_special_tokens: bool = True


def model_context(backend) -> int | None:
    """The model's context length (``max_position_embeddings``), the default ``max_model_len``; None when unknown."""
    config = getattr(getattr(backend, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)


def vocabulary_size(backend) -> int:
    """Token ids a prompt may hold: the rows of the model's input embeddings (the ids it can generate, too), else
    the tokenizer's length (a stand-in backend without a model)."""
    model = getattr(backend, "model", None)
    if model is not None and hasattr(model, "get_input_embeddings"):
        return int(model.get_input_embeddings().num_embeddings)
    return len(backend.tokenizer)


def check_completion(request: CompletionRequest, tokenizer, vocab: int, max_tokens: int, max_model_len: int,
                     max_prompts: int) -> tuple[list[list[int]], list[str]]:
    """The prompts as token ids and the stop strings, or a 422 naming the limit and the value (vLLM's checks:
    ``max_model_len``, token ids in the vocabulary), so nothing the model cannot take reaches it."""
    def reject(detail: str):
        raise HTTPException(status_code=422, detail=detail)

    prompts = request.prompt
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if not prompts:
        reject("empty prompt: send at least one")
    if len(prompts) > max_prompts:
        reject(f"too many prompts: {len(prompts)} in one request, the limit is {max_prompts} (max_prompts)")
    if request.max_tokens > max_tokens:
        reject(f"max_tokens is {request.max_tokens}, the limit is {max_tokens} (max_tokens)")
    ids = []
    for i, prompt in enumerate(prompts):
        tokens = text_ids(tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            reject(f"prompt {i} is empty")
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            reject(f"prompt {i}: token id {bad} is out of the vocabulary (0 to {vocab - 1})")
        if len(tokens) + request.max_tokens > max_model_len:
            reject(f"prompt {i} is {len(tokens)} tokens and max_tokens {request.max_tokens}: together over the "
                   f"context of {max_model_len} tokens (max_model_len)")
        ids.append(tokens)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if any(not s for s in stop):
        reject("stop strings must be non-empty")
    return ids, stop


class _Job:
    """One request in the queue. ``stop`` is read by the generation thread before each token; ``wake`` wakes the
    request's handler when its turn comes or when it is cancelled (``reason``: "client" or "shutdown")."""

    def __init__(self):
        self.stop, self.wake = Event(), asyncio.Event()
        self.reason: str | None = None

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.stop.set()
        self.wake.set()


class GenerationQueue:
    """One generation at a time on the model (one thread: torch and the session are not shared), the oldest request
    first, at most ``max_queue`` waiting behind it. Every state change happens on the event loop."""

    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.current: _Job | None = None
        self.waiting: deque[_Job] = deque()
        self.closed = False
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation")
        self.counts = {"requests": 0, "completed": 0, "cancelled": 0, "rejected": 0}

    def enter(self, job: _Job) -> None:
        """Queues ``job`` (its turn may be now) or answers 503."""
        if self.closed:
            raise busy("the server is shutting down")
        if self.current is not None and len(self.waiting) >= self.max_queue:
            self.counts["rejected"] += 1
            raise busy(f"queue full: {len(self.waiting)} requests wait behind the one generating (max_queue), "
                       "retry later")
        self.counts["requests"] += 1
        if self.current is None:
            self.current = job
            job.wake.set()
        else:
            self.waiting.append(job)

    def leave(self, job: _Job) -> None:
        """``job`` is done (answered, cancelled or failed): the next request's turn."""
        if job in self.waiting:
            self.waiting.remove(job)
        if self.current is job:
            self.current = self.waiting.popleft() if self.waiting else None
            if self.current is not None:
                self.current.wake.set()

    async def close(self) -> None:
        """The first SIGTERM (``app.state.drain``): no new requests, the generation in flight stops after its
        current token and every request answers 503."""
        self.closed = True
        for job in [self.current, *self.waiting]:
            if job is not None:
                job.cancel("shutdown")

    def stats(self) -> dict:
        return {"generating": self.current is not None, "queue": len(self.waiting), **self.counts}


def _generate(backend, ids: list[list[int]], sampling: SamplingConfig, max_tokens: int, stop: list[str],
              cancel: Event) -> dict:
    """Runs on the generation thread; raises GenerationCancelled when ``cancel`` is set before or during it."""
    if cancel.is_set():
        raise GenerationCancelled("cancelled before it started")
    session = backend.open(ids, sampling)
    return session.generate(range(len(ids)), max_tokens, stop, cancel=cancel)


def create_app(backend: TransformersBackend, *, max_tokens: int | None = None, max_model_len: int | None = None,
               max_prompts: int = 256, max_queue: int = 16, max_body_bytes: int | None = None,
               api_key: str | None = None, served_name: str | None = None) -> FastAPI:
    """``served_name``: the model id ``/v1/models`` lists (None: the backend's name, its path or hub id), as vLLM's
    ``--served-model-name``. ``max_model_len`` (None: the model's context, else 8192) bounds each prompt plus
    ``max_tokens``;
    ``max_tokens`` (None: ``max_model_len``) bounds a request's ``max_tokens``; ``max_body_bytes`` (None: room for
    ``max_prompts`` prompts of ``max_model_len`` token ids)."""
    max_model_len = max_model_len or model_context(backend) or 8192
    max_tokens = max_tokens or max_model_len
    if max_body_bytes is None:
        max_body_bytes = max_prompts * max_model_len * 8 + 65536  # ids written as ", 49151"
    if min(max_tokens, max_model_len, max_prompts, max_queue + 1, max_body_bytes) < 1:
        raise ValueError("max_tokens, max_model_len, max_prompts and max_body_bytes must be >= 1, max_queue >= 0")
    vocab = vocabulary_size(backend)
    queue = GenerationQueue(max_queue)
    limits = {"max_tokens": max_tokens, "max_model_len": max_model_len, "max_prompts": max_prompts,
              "max_queue": max_queue, "max_body_bytes": max_body_bytes}

    async def stop() -> None:
        await queue.close()
        queue.executor.shutdown(wait=False)

    app = service_app("kunlunlab LLM", stop=stop, drain=queue.close, api_key=api_key, max_body_bytes=max_body_bytes)
    app.state.queue = queue

    @app.get("/health")
    async def health() -> dict:
        return {"status": "shutting down" if queue.closed else "ok", "model": backend.name, "limits": limits,
                "api_key": bool(api_key), **queue.stats()}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": served_name or backend.name, "object": "model",
                                            "max_model_len": max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        ids, stop = check_completion(body, backend.tokenizer, vocab, max_tokens, max_model_len, max_prompts)
        sampling = SamplingConfig(temperature=body.temperature, top_p=body.top_p, seed=body.seed or 0)
        job = _Job()
        queue.enter(job)
        gone = asyncio.ensure_future(client_gone(request))
        gone.add_done_callback(lambda task: task.cancelled() or job.cancel("client"))
        out = None
        try:
            await job.wake.wait()
            if job.reason is None:  # the model is this request's
                out = await asyncio.get_running_loop().run_in_executor(
                    queue.executor, _generate, backend, ids, sampling, body.max_tokens, stop, job.stop)
        except GenerationCancelled:  # job.reason says why; answered below
            pass
        except Exception as err:  # the model failed on a valid request: the server's fault, said in one line
            log.exception("generation failed")
            raise HTTPException(status_code=500, detail=f"generation failed: {type(err).__name__}: "
                                                        + " ".join(str(err).split())) from err
        finally:
            gone.cancel()
            queue.leave(job)
        if out is None:
            queue.counts["cancelled"] += 1
            if job.reason == "shutdown":
                raise busy("the server is shutting down")
            log.info("client disconnected: its request was cancelled (waiting or generating)")
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        queue.counts["completed"] += 1
        return _completion(backend, body, out, len(ids))

    return app


def _completion(backend, request: CompletionRequest, out: dict, n: int) -> dict:
    choices = []
    for i in range(n):
        seg = out[i]
        text = seg.text
        if seg.stop_string and not request.include_stop_str_in_output:
            text = text[: text.rfind(seg.stop_string)]
        choice = {"index": i, "text": text, "finish_reason": "length" if seg.finish == "length" else "stop",
                  "stop_reason": seg.stop_string}
        if request.logprobs is not None:
            tokens = ([f"token_id:{t}" for t in seg.token_ids] if request.return_tokens_as_token_ids
                      else [backend.tokenizer.decode([t]) for t in seg.token_ids])
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": seg.logprobs}
        choices.append(choice)
    return {"object": "text_completion", "model": backend.name, "choices": choices}


def serve(backend: TransformersBackend, host: str = "127.0.0.1", port: int = 8001, **limits) -> None:
    """Until SIGINT/SIGTERM; the first one cancels the generation in flight (:func:`create_app`'s ``limits``)."""
    make_server(create_app(backend, **limits), host, port).run()
