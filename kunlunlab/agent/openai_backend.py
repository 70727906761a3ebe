"""The remote generation backend: an OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ``serve-llm``).

It implements the interface of :mod:`kunlunlab.agent.backends` over HTTP, so evaluation and RL rollouts can run
against a generation node instead of the local model (:mod:`kunlunlab.agent.transformers_backend`). A session
re-sends each row's tokens every turn and cannot enforce answer blocks (:meth:`OpenAISession.block_answers`).
A busy server is waited for (:mod:`kunlunlab.http.client`): ``serve-llm`` with its queue full, or vLLM behind a
rate limit, answers 503/429 with ``Retry-After`` and the request is sent again after that wait.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import httpx

from kunlunlab.agent.backends import AnswerBlock, SamplingConfig, Segment, text_ids
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.protocol import STOP_STRINGS
from kunlunlab.http.client import RetryPolicy, ServiceClient
from kunlunlab.models import resolve_llm

API_KEY_ENV = "KUNLUNLAB_LLM_API_KEY"  # the key this backend sends and `serve-llm` expects when none is given


@dataclass
class OpenAIBackend:
    """An OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ``kunlunlab serve-llm``).

    Prompts go as token ids and completions come back as token ids when the server supports vLLM's
    ``return_tokens_as_token_ids``; otherwise the text is tokenised locally (documented fallback:
    then token ids are the local tokenizer's). ``tokenizer`` is the model's tokenizer (name or path).
    ``api_key``: sent as a bearer token (vLLM's and ``serve-llm``'s ``--api-key``); None: ``$KUNLUNLAB_LLM_API_KEY``
    when set, else no header. A request that fails to connect or gets 429/5xx is sent again up to ``retries``
    times, after ``backoff`` seconds doubling each time, or the server's ``Retry-After`` when longer, each wait at
    most ``max_backoff`` (the defaults ride out about 8 s of a server that is down, 9 s of one that asks for a
    second at a time); then one
    :class:`~kunlunlab.agent.errors.GenerationServiceError` names the server and the last status.
    """

    url: str
    model: str | None  # the id the server serves; None: asked of the server (``GET /v1/models``, its first)
    tokenizer_name: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    retries: int = 5
    backoff: float = 0.25
    max_backoff: float = 30.0
    name: str = field(init=False)

    def __post_init__(self):
        from transformers import AutoTokenizer  # deferred: transformers takes seconds to import

        self.service = ServiceClient(self.url, "generation server", error=GenerationServiceError, v1=True,
                                     retry=RetryPolicy.from_retries(self.retries, self.backoff, self.max_backoff),
                                     timeout=self.timeout, api_key=self.api_key, key_env=API_KEY_ENV)
        self.url = self.service.url
        # the tokenizer: the one named, else the model's when one was given, else the embedded default's
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_llm(self.tokenizer_name or self.model))
        if self.model is None:  # vLLM answers 404 to a model id it does not serve: ask it which one it does
            self.model = self.served_model() or "default"
        self.name = self.model

    def served_model(self) -> str | None:
        """The first model id the server lists (``GET /v1/models``, asked once); None when it lists none or does not
        answer (the first completion request then reports the server as it always does)."""
        try:
            response = self.service.http.get(self.url + "/models")
            models = response.json().get("data") or [] if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return models[0].get("id") if models and isinstance(models[0], dict) else None

    def open(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig | None = None) -> "OpenAISession":
        return OpenAISession(self, prompts, sampling or SamplingConfig())

    def complete(self, prompts: list[list[int]], max_tokens: int, stop: Sequence[str],
                 sampling: SamplingConfig) -> list[Segment]:
        payload = {"model": self.model, "prompt": prompts, "max_tokens": max_tokens,
                   "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
                   "stop": list(stop), "logprobs": 1, "include_stop_str_in_output": True,
                   "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        return self._segments(self.service.json("POST", "/completions", payload), len(prompts), stop)

    def _segments(self, data: dict, n: int, stop: Sequence[str]) -> list[Segment]:
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise GenerationServiceError(f"generation server at {self.url} returned {len(choices)} choices for {n} "
                                         "prompts")
        out = []
        for c in choices:
            text = c.get("text", "")
            lp = c.get("logprobs") or {}
            tokens, token_lps = lp.get("tokens") or [], lp.get("token_logprobs") or []
            stop_string = c.get("stop_reason") if isinstance(c.get("stop_reason"), str) else None
            finish = {"stop": "stop", "length": "length"}.get(c.get("finish_reason"), "stop")
            if finish == "stop" and stop_string and not text.endswith(stop_string):
                text += stop_string  # servers that strip the stop string
            if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                ids = [int(t.split(":", 1)[1]) for t in tokens]
                lps = [float(x) if x is not None else 0.0 for x in token_lps]
            else:
                ids = text_ids(self.tokenizer, text)
                mean = sum(x for x in token_lps if x is not None) / max(1, len(token_lps))
                lps = [mean] * len(ids)  # per-token values are not recoverable after re-tokenising
            if finish == "stop" and stop_string is None:
                stop_string = next((s for s in stop if text.endswith(s)), None)
                if stop_string is None:
                    finish = "eos"
            out.append(Segment(ids, lps, text, finish, stop_string))
        return out


class OpenAISession:
    """Keeps each row's full token list and re-sends it each turn (servers cache the shared prefix)."""

    def __init__(self, backend: OpenAIBackend, prompts: Sequence[Sequence[int]], sampling: SamplingConfig):
        self.backend, self.sampling = backend, sampling
        self.ids = {i: list(p) for i, p in enumerate(prompts)}
        self.tokens_processed = 0

    def generate(self, rows: Sequence[int], max_new_tokens: int | dict[int, int],
                 stop: Sequence[str] = STOP_STRINGS) -> dict[int, Segment]:
        rows = list(rows)
        limits = max_new_tokens if isinstance(max_new_tokens, dict) else {r: max_new_tokens for r in rows}
        out: dict[int, Segment] = {}
        by_limit: dict[int, list[int]] = {}
        for r in rows:
            if limits.get(r, 0) > 0:
                by_limit.setdefault(limits[r], []).append(r)
            else:
                out[r] = Segment([], [], "", "length")
        for limit, group in by_limit.items():
            segments = self.backend.complete([self.ids[r] for r in group], limit, stop, self.sampling)
            for r, seg in zip(group, segments):
                self.ids[r].extend(seg.token_ids)
                out[r] = seg
        return out

    def append(self, tokens: dict[int, list[int]]) -> None:
        for r, toks in tokens.items():
            self.ids[r].extend(toks)

    def release(self, rows: Sequence[int]) -> None:
        for r in rows:
            self.ids.pop(r, None)

    def block_answers(self, blocks: dict[int, AnswerBlock | None]) -> bool:
        """Not enforced: returns False. The ``/v1/completions`` API has no constraint that depends on where a row
        stands in its text: ``logit_bias`` biases single tokens for the whole completion (banning ``}`` would
        forbid every answer), and vLLM's ``bad_words`` bans a text everywhere, in the reasoning and the
        queries too, in only the spellings it tokenises. The rollout engine logs the block as unenforced, keeps
        STIE's feedback turn (which names the blocked answers) and marks a round that repeats one."""
        return False
