"""Generation backends: one interface for a local transformers model and an OpenAI-compatible server.

A backend opens a :class:`GenerationSession` over a batch of prompts (token ids). The session
generates for any subset of its rows until each row hits a stop string, EOS or its token limit, and
accepts appended tokens per row (the ``<result>`` blocks). The rollout engine drives every method
through this interface, so the same pipeline runs on a laptop CPU and against a vLLM/SGLang node.

This module is the interface that every method, the judge and the trainers are written against (the sampling config,
the :class:`Segment` a call returns, the :class:`AnswerBlock` of STIE's eq. 13, the prompt/token helpers);
the two implementations live in :mod:`kunlunlab.agent.transformers_backend` (a local model, one KV cache
per rollout, answer blocks enforced) and :mod:`kunlunlab.agent.openai_backend` (an OpenAI-compatible server).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from kunlunlab.agent.protocol import STOP_STRINGS
from kunlunlab.configs import non_negative, within


@dataclass
class SamplingConfig:
    temperature: float = non_negative(0.0)  # 0: greedy
    top_p: float = within(1.0, 0, 1, low_open=True)
    seed: int = non_negative(0)

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"invalid sampling config: temperature={self.temperature}, top_p={self.top_p}")


@dataclass(frozen=True)
class AnswerBlock:
    """Answers a row may not generate (again) inside the answer tags: ``answers``, the spellings whose token
    paths are banned, and ``rejects``, true for any answer the row may not end on (enforced as
    :mod:`kunlunlab.agent.transformers_backend`'s docstring describes)."""

    answers: tuple[str, ...]
    rejects: Callable[[str], bool]


@dataclass
class Segment:
    """What one row generated in one call: token ids as sampled, their log-probabilities, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: str  # "stop" (a stop string), "eos", "length"
    stop_string: str | None = None
    interventions: int = 0  # steps where the row's answer block banned the token with the highest logit

    @property
    def mean_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else float("-inf")


class GenerationSession(Protocol):
    def generate(self, rows: Sequence[int], max_new_tokens: int | dict[int, int],
                 stop: Sequence[str] = STOP_STRINGS) -> dict[int, Segment]: ...

    def append(self, tokens: dict[int, list[int]]) -> None: ...

    def release(self, rows: Sequence[int]) -> None: ...

    def block_answers(self, blocks: dict[int, AnswerBlock | None]) -> bool:
        """Sets (None: lifts) each row's answer block for its later ``generate`` calls; returns whether the
        session enforces it (False: it cannot, the caller must say so)."""


class Backend(Protocol):
    name: str
    tokenizer: object

    def open(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig | None = None) -> GenerationSession: ...


def chat_prompt_ids(tokenizer, messages: list[dict], assistant_prefix: str = "") -> list[int]:
    """Token ids of a chat prompt ready for the assistant's turn (optionally with the start of its reply)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text + assistant_prefix, add_special_tokens=False)["input_ids"]


def text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generate_once(backend: Backend, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stop: Sequence[str] = STOP_STRINGS, sampling: SamplingConfig | None = None) -> list[Segment]:
    """Single-turn batched generation (the baselines' workhorse)."""
    if not prompts:
        return []
    session = backend.open(prompts, sampling)
    out = session.generate(range(len(prompts)), max_new_tokens, stop)
    session.release(range(len(prompts)))
    return [out[i] for i in range(len(prompts))]


def mean_confidence(logprobs: Sequence[float]) -> float:
    """Geometric-mean token probability in [0, 1] (exp of the mean log-prob); 0 for no tokens."""
    return math.exp(sum(logprobs) / len(logprobs)) if logprobs else 0.0
