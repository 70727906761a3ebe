"""LJ: an LLM judge with a fixed prompt; the judge model is a parameter and verdicts are cached on disk.

The paper's LJ score comes from GPT-4o-mini grading each answer against the gold answers.
Here the judge is any model behind one of two routes, with the same fixed prompt (:data:`JUDGE_SYSTEM`,
:data:`JUDGE_USER`), cache and counts:

* ``chat`` (the default with ``--judge-url``): an OpenAI-compatible ``/v1/chat/completions`` endpoint
  (:class:`ChatJudgeBackend`). The server applies the model's chat template, so no tokenizer is needed
  here and a hosted chat model can judge. The API key is read from the environment variable whose
  *name* is ``judge_key_env`` (``--judge-key-env``, default ``OPENAI_API_KEY``); when that variable is
  unset no key is sent (a local server needs none). The server is asked for its model list once
  (``GET /v1/models``) before any question runs, so a wrong URL or key is one error line, not an hour
  of evaluation lost.
* ``completions``: an OpenAI-compatible ``/v1/completions`` server that takes token-id prompts (vLLM,
  SGLang, ``kunlunlab serve-llm``); the prompt is built with the judge model's tokenizer, which must
  load here (``--judge`` is then also a hub id or local path).

Pointing it at a served model::

    # a Qwen model served by vLLM (no key needed on a local server)
    vllm serve Qwen/Qwen2.5-7B-Instruct --port 8002
    kunlunlab eval --dataset bamboogle --judge-url http://localhost:8002 --judge Qwen/Qwen2.5-7B-Instruct

    # a GPT-class model behind OpenAI's API (the paper's judge), the key in OPENAI_API_KEY
    export OPENAI_API_KEY=...
    kunlunlab eval --dataset bamboogle --judge-url https://api.openai.com --judge gpt-4o-mini

    # any other OpenAI-compatible gateway, its key in a variable of your choosing
    kunlunlab eval --dataset bamboogle --judge-url https://gateway.example/v1 --judge my-model \\
        --judge-key-env GATEWAY_KEY

    # the token-id route of earlier runs
    kunlunlab eval --dataset bamboogle --judge-url http://localhost:8002 --judge Qwen/Qwen2.5-7B-Instruct \\
        --judge-api completions

The reply is capped at 4 tokens at temperature 0: a model that thinks before answering (Qwen3 with its
thinking mode on, o-series reasoning models) starts with neither "yes" nor "no" and is counted as
``unparsed``; serve Qwen3 with thinking off or use an instruct model.

Two verdicts need no model: an empty prediction is wrong, and a prediction that exactly matches a
gold answer after normalisation is right (``rule``). Everything else goes to the judge; a reply that
starts with neither "yes" nor "no" counts as "no" and is reported as ``unparsed``. A rate-limited or busy
judge (429/503 with ``Retry-After``) is waited for (:mod:`kunlunlab.http.client`); a judge server that
fails (unreachable or failing after the retries, a refused request, a reply without a message) raises
:class:`JudgeServiceError`: a failure is never turned into a verdict. Verdicts are cached per judge
model name (``<cache>/judge/<model>.jsonl``), keyed by the prompt version, question, golds and
prediction; both routes share it, since they send the same prompt to the same model.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kunlunlab.agent.backends import Backend, SamplingConfig, chat_prompt_ids, generate_once
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.eval.metrics import exact_match
from kunlunlab.http.client import RetryPolicy, ServiceClient
from kunlunlab.paths import cache_dir

JUDGE_PROMPT_VERSION = "lj-v1"
JUDGE_SYSTEM = ("You are a strict grader of question answering. Decide whether the predicted answer means the same "
                "as one of the gold answers. Reply with one word: yes or no.")
JUDGE_USER = "Question: {question}\nGold answer(s): {golds}\nPredicted answer: {prediction}\nIs the prediction correct?"
JUDGE_APIS = ("chat", "completions")
JUDGE_REPLY_TOKENS = 4


class JudgeServiceError(GenerationServiceError, ConnectionError):
    """The judge's server could not be reached, refused the request or answered without a reply text."""


def judge_messages(question: str, golds: Sequence[str], prediction: str) -> list[dict]:
    """The fixed judge prompt as chat messages (both routes send these)."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_USER.format(question=question, golds=" | ".join(golds),
                                                          prediction=prediction)}]


@dataclass
class ChatJudgeBackend:
    """The judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint (see the module docstring).

    ``key_env`` names the environment variable that holds the API key (read once, here). A connection failure
    or HTTP 429/5xx is tried again up to ``retries`` times, after ``backoff`` seconds doubling each time or the
    server's ``Retry-After`` when longer, each wait at most ``max_backoff``; any other HTTP error fails at once."""

    url: str
    model: str
    key_env: str | None = "OPENAI_API_KEY"
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 30.0
    name: str = field(init=False)

    def __post_init__(self):
        if not self.url or not self.model:
            raise ValueError("the chat judge needs judge_url and judge (the served model's name)")
        self.name = self.model
        self.service = ServiceClient(self.url, "judge server", error=JudgeServiceError, v1=True,
                                     retry=RetryPolicy.from_retries(self.retries, self.backoff, self.max_backoff),
                                     timeout=self.timeout, key_env=self.key_env)
        self.url = self.service.url
        self.check()

    def check(self) -> None:
        """One ``GET /v1/models``: the server is up and takes the key (a server without the list, 404, passes)."""
        self.service.check(self.service.request("GET", "/models"), "/models", ok=(200, 404))

    def reply(self, messages: list[dict]) -> str:
        """The judge's reply text to one conversation (temperature 0, at most 4 tokens)."""
        payload = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": JUDGE_REPLY_TOKENS}
        data = self.service.json("POST", "/chat/completions", payload)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        if not isinstance(content, str):
            raise JudgeServiceError(f"judge server at {self.url} answered without a chat message: "
                                    f"{' '.join(json.dumps(data)[:200].split())}")
        return content


def verdict_of(reply: str) -> tuple[float, bool]:
    """(verdict, parsed): "yes…" is right, anything else wrong; parsed unless it starts with neither yes nor no."""
    word = reply.strip().lower()
    return (1.0 if word.startswith("yes") else 0.0), word.startswith(("yes", "no"))


@dataclass
class LLMJudge:
    backend: Backend | ChatJudgeBackend
    cache_path: Path | None = None
    stats: dict = field(default_factory=lambda: {"cached": 0, "judged": 0, "rule": 0, "unparsed": 0})

    def __post_init__(self):
        if self.cache_path is None:
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(self.backend.name))
            self.cache_path = cache_dir() / "judge" / f"{slug}.jsonl"
        self.cache_path = Path(self.cache_path)
        self._cache: dict[str, float] = {}
        if self.cache_path.is_file():
            for line in self.cache_path.read_text().splitlines():
                try:
                    item = json.loads(line)
                    self._cache[item["key"]] = float(item["verdict"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a torn last line from a killed run: that verdict is simply recomputed

    @staticmethod
    def key(question: str, golds: Sequence[str], prediction: str) -> str:
        blob = json.dumps([JUDGE_PROMPT_VERSION, question, list(golds), prediction])
        return hashlib.sha1(blob.encode()).hexdigest()

    def _replies(self, items: Sequence[tuple[str, Sequence[str], str]]) -> list[str]:
        if isinstance(self.backend, ChatJudgeBackend):
            return [self.backend.reply(judge_messages(*item)) for item in items]
        prompts = [chat_prompt_ids(self.backend.tokenizer, judge_messages(*item)) for item in items]
        return [r.text for r in generate_once(self.backend, prompts, JUDGE_REPLY_TOKENS, stop=(),
                                              sampling=SamplingConfig())]

    def judge(self, items: Sequence[tuple[str, Sequence[str], str | None]], batch_size: int = 16) -> list[float]:
        verdicts: list[float | None] = []
        todo: list[int] = []
        for i, (question, golds, prediction) in enumerate(items):
            if not prediction or not prediction.strip():
                verdicts.append(0.0)
                self.stats["rule"] += 1
            elif exact_match(prediction, golds):
                verdicts.append(1.0)
                self.stats["rule"] += 1
            elif self.key(question, golds, prediction) in self._cache:
                verdicts.append(self._cache[self.key(question, golds, prediction)])
                self.stats["cached"] += 1
            else:
                verdicts.append(None)
                todo.append(i)
        if isinstance(self.backend, ChatJudgeBackend):
            batch_size = 1  # one request per item anyway: each verdict reaches the cache as it arrives
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            replies = self._replies([items[i] for i in chunk])
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a") as f:
                for i, reply in zip(chunk, replies):
                    verdict, parsed = verdict_of(reply)
                    if not parsed:
                        self.stats["unparsed"] += 1
                    verdicts[i] = verdict
                    key = self.key(*items[i][:2], items[i][2])
                    self._cache[key] = verdict
                    f.write(json.dumps({"key": key, "verdict": verdict, "reply": reply[:40]}) + "\n")
                    self.stats["judged"] += 1
        return [float(v) for v in verdicts]
