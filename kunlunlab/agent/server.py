"""``kunlunlab serve-llm``: an OpenAI-compatible ``/v1/completions`` endpoint over the local backend.

It lets several notebooks, the judge and the :class:`~kunlunlab.agent.openai_backend.OpenAIBackend` share one
loaded model, and it is the reference the OpenAI backend is tested against. It speaks the subset of
the API that vLLM's completions endpoint speaks for rollouts: prompts as text or token ids (one or a
batch), ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``, and vLLM's
``include_stop_str_in_output`` / ``return_tokens_as_token_ids`` / ``stop_reason``.
"""
from __future__ import annotations

import threading

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from kunlunlab.agent.backends import SamplingConfig, text_ids
from kunlunlab.agent.transformers_backend import TransformersBackend


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1, le=8192)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = False
    skip_special_tokens: bool = True


def create_app(backend: TransformersBackend) -> FastAPI:
    app = FastAPI(title="kunlunlab LLM", version="1")
    lock = threading.Lock()  # one generation at a time on the local model

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": backend.name, "object": "model"}]}

    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> dict:
        prompts = request.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [text_ids(backend.tokenizer, p) if isinstance(p, str) else list(p) for p in prompts]
        if not ids or any(not p for p in ids):
            raise HTTPException(status_code=422, detail="empty prompt")
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        sampling = SamplingConfig(temperature=request.temperature, top_p=request.top_p, seed=request.seed or 0)
        with lock:
            session = backend.open(ids, sampling)
            out = session.generate(range(len(ids)), request.max_tokens, stop)
        choices = []
        for i in range(len(ids)):
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

    return app


def serve(backend: TransformersBackend, host: str = "127.0.0.1", port: int = 8001) -> None:
    import uvicorn  # deferred: only serving needs the ASGI server

    uvicorn.run(create_app(backend), host=host, port=port, log_level="info")
