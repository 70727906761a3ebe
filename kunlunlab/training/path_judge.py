"""The ``judge`` value source of the process-reward tree search (:mod:`kunlunlab.training.process_rewards`): an
OpenAI-compatible chat endpoint rates a partial reasoning path 0-10, returned as a score in [0, 1]."""
from __future__ import annotations

import re
from typing import Sequence

from kunlunlab.http.client import RetryPolicy, ServiceClient, ServiceError


class JudgeUnavailableError(ServiceError):
    """The judge endpoint could not be reached or answered badly."""


JUDGE_PATH_SYSTEM = ("You grade the partial work of a research assistant that answers a multi-hop question by "
                     "thinking and searching. Reply with one integer from 0 to 10 and nothing else.")
JUDGE_PATH_USER = ("Question: {question}\nGold answer(s): {golds}\n\nThe assistant's work so far (its searches "
                   "and the results it got):\n{path}\n\nHow likely is it that continuing from here reaches the gold "
                   "answer? Reply with one integer from 0 (hopeless) to 10 (certain).")


class PathJudge:
    """Scores partial paths through an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang, …).
    ``transport`` replaces the network (``httpx.MockTransport`` in the tests). A reply without an integer scores
    0 and is counted in ``stats["unparsed"]``. A connection failure or HTTP 429/5xx is tried again up to
    ``retries`` times, after ``backoff`` seconds doubling each time or the server's ``Retry-After`` when longer,
    each wait at most ``max_backoff``; then one :class:`JudgeUnavailableError` names the endpoint."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.25, max_backoff: float = 30.0, max_path_chars: int = 6000, transport=None):
        if not url or not model:
            raise ValueError("the judge value source needs mcts.judge_url and mcts.judge_model")
        hint = (f"; start an OpenAI-compatible server for {model!r} (e.g. `vllm serve {model}`) or set "
                "mcts.value_source to 'gold' or 'rollout'")
        self.service = ServiceClient(url, "path judge", error=JudgeUnavailableError, v1=True, timeout=timeout,
                                     retry=RetryPolicy.from_retries(retries, backoff, max_backoff), api_key=api_key,
                                     hint=hint, transport=transport)
        self.url, self.model, self.max_path_chars = self.service.url, model, max_path_chars
        self.stats = {"judged": 0, "unparsed": 0}

    def score(self, question: str, answers: Sequence[str], path: str) -> float:
        path = path.strip() or "(nothing yet)"
        if len(path) > self.max_path_chars:
            path = "…" + path[-self.max_path_chars:]
        payload = {"model": self.model, "temperature": 0.0, "max_tokens": 8,
                   "messages": [{"role": "system", "content": JUDGE_PATH_SYSTEM},
                                {"role": "user", "content": JUDGE_PATH_USER.format(
                                    question=question, golds=" | ".join(answers), path=path)}]}
        data = self.service.json("POST", "/chat/completions", payload)
        try:
            content = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as err:
            raise JudgeUnavailableError(f"path judge at {self.url} answered without a chat completion: "
                                        f"{str(data)[:200]}") from err
        self.stats["judged"] += 1
        match = re.search(r"\d+(?:\.\d+)?", content)
        if match is None:
            self.stats["unparsed"] += 1
            return 0.0
        return min(10.0, max(0.0, float(match.group()))) / 10.0

    def __call__(self, items: Sequence[tuple[str, Sequence[str], str]]) -> list[float]:
        return [self.score(q, a, p) for q, a, p in items]


__all__ = ["JUDGE_PATH_SYSTEM", "JUDGE_PATH_USER", "JudgeUnavailableError", "PathJudge"]
