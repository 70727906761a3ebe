"""Test doubles shared by the rollout, STIE and RDRA tests: a backend that replays scripted turns and a
search function that counts its calls."""
import math

from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.retrieval.retriever import Hit


class ScriptedBackend:
    """Each row replays its scripted turns. A turn is a text (every token gets log-prob -0.5) or a
    ``(text, confidence)`` pair (every token gets log-prob ln(confidence), so the engine's round confidence,
    exp of the mean log-prob, is that confidence). It records what the engine appends."""

    name = "scripted"

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.appended, self.turn_of = {}, {}

    def open(self, prompts, sampling=None):
        outer = self

        class Session:
            def generate(self, rows, max_new_tokens, stop=()):
                out = {}
                for r in rows:
                    k = outer.turn_of.get(r, 0)
                    outer.turn_of[r] = k + 1
                    turn = outer.scripts[r][k]
                    text, logprob = (turn, -0.5) if isinstance(turn, str) else (turn[0], math.log(turn[1]))
                    ids = text_ids(outer.tokenizer, text)
                    limit = max_new_tokens[r] if isinstance(max_new_tokens, dict) else max_new_tokens
                    finish = "length" if len(ids) > limit else "stop"
                    ids = ids[:limit]
                    out[r] = Segment(ids, [logprob] * len(ids), outer.tokenizer.decode(ids), finish)
                return out

            def append(self, tokens):
                for r, ids in tokens.items():
                    outer.appended.setdefault(r, []).append(list(ids))

            def release(self, rows):
                pass

        return Session()


class CountingSearch:
    def __init__(self):
        self.calls = []

    def __call__(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit(f"{q}-{j}", f"passage {j} about {q}", 1.0 - j / 10) for j in range(k)] for q in queries]


def interleaved(model_ids: list[list[int]], env_ids: list[list[int]]) -> tuple[list[int], list[int]]:
    """The completion a rollout should produce: each model turn (mask 1), then what the engine appended after
    it (mask 0)."""
    ids, mask = [], []
    for k, turn in enumerate(model_ids):
        ids += turn
        mask += [1] * len(turn)
        if k < len(env_ids):
            ids += env_ids[k]
            mask += [0] * len(env_ids[k])
    return ids, mask


class CharTokenizer:
    """One id per character (its code point): exact and invertible, no model files. Enough for the engine, the
    protocol parser and the MCTS tests."""

    eos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class PrefixScriptedBackend:
    """Each generated turn is ``script(text_so_far, row)``: a function of the row's whole context (prompt, turns
    and appended blocks, decoded) and its row index in the session. Records the prompts of every ``open`` call
    (``opened``) and counts ``generate`` calls, so tests can check what a caller resumed from and how it batched."""

    name = "prefix-scripted"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.opened, self.generate_calls = [], 0

    def open(self, prompts, sampling=None):
        outer = self
        ids = {i: list(p) for i, p in enumerate(prompts)}
        outer.opened.append([list(p) for p in prompts])

        class Session:
            def generate(self, rows, max_new_tokens, stop=()):
                outer.generate_calls += 1
                out = {}
                for r in rows:
                    toks = text_ids(outer.tokenizer, outer.script(outer.tokenizer.decode(ids[r]), r))
                    limit = max_new_tokens[r] if isinstance(max_new_tokens, dict) else max_new_tokens
                    finish = "length" if len(toks) > limit else "stop"
                    toks = toks[:limit]
                    ids[r].extend(toks)
                    out[r] = Segment(toks, [-0.5] * len(toks), outer.tokenizer.decode(toks), finish)
                return out

            def append(self, tokens):
                for r, toks in tokens.items():
                    ids[r].extend(toks)

            def release(self, rows):
                pass

        return Session()
