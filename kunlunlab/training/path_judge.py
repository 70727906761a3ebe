"""The ``judge`` value source of the process-reward tree search (:mod:`kunlunlab.training.process_rewards`): an
OpenAI-compatible chat endpoint rates a partial reasoning path 0-10, returned as a score in [0, 1]."""
from __future__ import annotations

import re
from typing import Sequence

import httpx


class JudgeUnavailableError(RuntimeError):
    """The judge endpoint could not be reached or answered badly."""


JUDGE_PATH_SYSTEM = ("You grade the partial work of a research assistant that answers a multi-hop question by "
                     "thinking and searching. Reply with one integer from 0 to 10 and nothing else.")
JUDGE_PATH_USER = ("Question: {question}\nGold answer(s): {golds}\n\nThe assistant's work so far (its searches "
                   "and the results it got):\n{path}\n\nHow likely is it that continuing from here reaches the gold "
                   "answer? Reply with one integer from 0 (hopeless) to 10 (certain).")


class PathJudge:
    """Scores partial paths through an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang, …).
    ``transport`` replaces the network (``httpx.MockTransport`` in the tests). A reply without an integer scores
    0 and is counted in ``stats["unparsed"]``."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 60.0, retries: int = 1,
                 max_path_chars: int = 6000, transport=None):
        if not url or not model:
            raise ValueError("the judge value source needs mcts.judge_url and mcts.judge_model")
        self.url = url.rstrip("/")
        if not self.url.endswith("/v1"):
            self.url += "/v1"
        self.model, self.retries, self.max_path_chars = model, retries, max_path_chars
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self.stats = {"judged": 0, "unparsed": 0}

    def score(self, question: str, answers: Sequence[str], path: str) -> float:
        path = path.strip() or "(nothing yet)"
        if len(path) > self.max_path_chars:
            path = "…" + path[-self.max_path_chars:]
        payload = {"model": self.model, "temperature": 0.0, "max_tokens": 8,
                   "messages": [{"role": "system", "content": JUDGE_PATH_SYSTEM},
                                {"role": "user", "content": JUDGE_PATH_USER.format(
                                    question=question, golds=" | ".join(answers), path=path)}]}
        last: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                response = self.http.post(self.url + "/chat/completions", json=payload)
            except httpx.HTTPError as err:
                last = err
                continue
            if response.status_code == 200:
                try:
                    content = response.json()["choices"][0]["message"]["content"] or ""
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise JudgeUnavailableError(f"judge {self.url} answered without a chat completion: "
                                                f"{response.text[:200]}") from err
                self.stats["judged"] += 1
                match = re.search(r"\d+(?:\.\d+)?", content)
                if match is None:
                    self.stats["unparsed"] += 1
                    return 0.0
                return min(10.0, max(0.0, float(match.group()))) / 10.0
            last = RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            if response.status_code < 500:
                break
        raise JudgeUnavailableError(
            f"judge endpoint {self.url} unreachable or failing ({last}); start an OpenAI-compatible server for "
            f"{self.model!r} (e.g. `vllm serve {self.model}`) or set mcts.value_source to 'gold' or 'rollout'")

    def __call__(self, items: Sequence[tuple[str, Sequence[str], str]]) -> list[float]:
        return [self.score(q, a, p) for q, a, p in items]


__all__ = ["JUDGE_PATH_SYSTEM", "JUDGE_PATH_USER", "JudgeUnavailableError", "PathJudge"]
