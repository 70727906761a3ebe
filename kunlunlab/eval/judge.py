"""LJ: an LLM judge with a fixed prompt; the judge model is a parameter and verdicts are cached on disk.

Two verdicts need no model: an empty prediction is wrong, and a prediction that exactly matches a
gold answer after normalisation is right. Everything else goes to the judge, batched; a reply that
starts with neither "yes" nor "no" counts as "no" and is reported as ``unparsed``.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kunlunlab.agent.backends import Backend, SamplingConfig, chat_prompt_ids, generate_once
from kunlunlab.eval.metrics import exact_match
from kunlunlab.paths import cache_dir

JUDGE_PROMPT_VERSION = "lj-v1"
JUDGE_SYSTEM = ("You are a strict grader of question answering. Decide whether the predicted answer means the same "
                "as one of the gold answers. Reply with one word: yes or no.")
JUDGE_USER = "Question: {question}\nGold answer(s): {golds}\nPredicted answer: {prediction}\nIs the prediction correct?"


@dataclass
class LLMJudge:
    backend: Backend
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
        tok = self.backend.tokenizer
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            prompts = [chat_prompt_ids(tok, [{"role": "system", "content": JUDGE_SYSTEM},
                                             {"role": "user", "content": JUDGE_USER.format(
                                                 question=items[i][0], golds=" | ".join(items[i][1]),
                                                 prediction=items[i][2])}]) for i in chunk]
            replies = generate_once(self.backend, prompts, 4, stop=(), sampling=SamplingConfig())
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a") as f:
                for i, reply in zip(chunk, replies):
                    word = reply.text.strip().lower()
                    verdict = 1.0 if word.startswith("yes") else 0.0
                    if not (word.startswith("yes") or word.startswith("no")):
                        self.stats["unparsed"] += 1
                    verdicts[i] = verdict
                    key = self.key(*items[i][:2], items[i][2])
                    self._cache[key] = verdict
                    f.write(json.dumps({"key": key, "verdict": verdict, "reply": reply.text[:40]}) + "\n")
                    self.stats["judged"] += 1
        return [float(v) for v in verdicts]
