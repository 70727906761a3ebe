"""Test doubles shared by the rollout, STIE and RDRA tests: a backend that replays scripted turns, a search
function that counts its calls, and a policy model that runs inside the real local session."""
import math
from types import SimpleNamespace

import torch

from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.retrieval.retriever import Hit


class PassiveSession:
    """The session methods a scripted backend needs no state for: the environment tokens appended after a turn, rows
    released, answer blocks (none applied). A test's ``Session`` subclasses it and writes only ``generate``."""

    def append(self, tokens):
        pass

    def release(self, rows):
        pass

    def block_answers(self, blocks):
        return False


class ScriptedBackend:
    """Each row replays its scripted turns. A turn is a text (every token gets log-prob -0.5) or a
    ``(text, confidence)`` pair (every token gets log-prob ln(confidence), so the engine's round confidence,
    exp of the mean log-prob, is that confidence). It records what the engine appends, and the answer blocks it
    is handed (``blocks``: row -> [(turn index, block)]), which a replay cannot enforce (``block_answers`` says so)."""

    name = "scripted"

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.appended, self.turn_of, self.blocks = {}, {}, {}

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

            def block_answers(self, blocks):
                for r, block in blocks.items():
                    outer.blocks.setdefault(r, []).append((outer.turn_of.get(r, 0), block))
                return False

        return Session()


class ContinuingScriptedBackend:
    """Scripted turns in a session that continues rows one by one and takes new ones, as the local backend's does
    (``sessions_continue``): ``script(prompt_text, turn, row)`` gives row ``row``'s turn ``turn`` as (text, decode
    steps it takes). ``generate(until="any")`` moves a clock on to the first turn end(s) of the rows asked; ``added`` records
    (clock, rows) for every row that joined the open session, ``ended`` (clock, row) for every turn end."""

    name = "continuing-scripted"
    sessions_continue = True

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.clock, self.added, self.ended = 0, [], []

    def open(self, prompts, sampling=None):
        outer = self

        class Session(PassiveSession):
            def __init__(self):
                self.prompt, self.turn, self.left = {}, {}, {}  # row -> its prompt text, turn, steps left in it
                self._take(prompts, range(len(prompts)))

            def _take(self, new_prompts, rows):
                for r, ids in zip(rows, new_prompts):
                    self.prompt[r], self.turn[r] = outer.tokenizer.decode(list(ids)), 0

            def add(self, new_prompts, rows):
                self._take(new_prompts, rows)
                outer.added.append((outer.clock, list(rows)))

            def generate(self, rows, max_new_tokens, stop=(), until="all"):
                for r in rows:
                    self.left.setdefault(r, outer.script(self.prompt[r], self.turn[r], r)[1])
                steps = [self.left[r] for r in rows]
                step = min(steps) if until == "any" else max(steps)
                outer.clock += step
                out = {}
                for r in rows:
                    self.left[r] -= step
                    if self.left[r] > 0:
                        continue
                    text = outer.script(self.prompt[r], self.turn[r], r)[0]
                    del self.left[r]
                    self.turn[r] += 1
                    ids = text_ids(outer.tokenizer, text)
                    out[r] = Segment(ids, [-0.5] * len(ids), outer.tokenizer.decode(ids), "stop")
                    outer.ended.append((outer.clock, r))
                return out

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


class PolicyModel(torch.nn.Module):
    """A stand-in for a causal LM that runs inside the real
    :class:`~kunlunlab.agent.transformers_backend.TransformersSession` (KV cache, masking, sampling), for tests
    of generation constraints: its next-token logits are a function of the row's whole text. ``policy(text)``
    returns ranked ``(turn text, score)`` targets for the turn being written;
    every target that extends what the turn holds so far (the text after the last ``</result>`` block, or after the
    prompt's first line) scores its next token (the first token of its remaining text); all other tokens score 0.
    The row's token history is kept in the session's own cache (ids as float keys), so release, compaction and
    appends act on it as on a real model's."""

    def __init__(self, tokenizer, policy):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the backend reads device and dtype from it
        self.tokenizer, self.policy, self.vocab = tokenizer, policy, len(tokenizer)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, logits_to_keep=1,
                past_key_values=None):
        ids = input_ids.to(torch.float32)[:, None, :, None]
        keys, _ = past_key_values.update(ids, ids, 0)
        # The session's 4D mask says which cached columns each query column sees: a kept column's logits are those
        # of the row's text up to it (its whole history), so a right-padded chunk's last real token reads its own.
        columns = [input_ids.shape[1] - 1] if isinstance(logits_to_keep, int) else logits_to_keep.tolist()
        rows = [torch.stack([self.next_logits(self.tokenizer.decode(
            keys[b, 0, :, 0][attention_mask[b, 0, c]].long().tolist(), skip_special_tokens=False)) for c in columns])
            for b in range(keys.shape[0])]
        return SimpleNamespace(logits=torch.stack(rows))

    def next_logits(self, text: str):
        logits = torch.zeros(self.vocab)
        _, _, turn = text.rpartition("</result>\n") if "</result>\n" in text else text.partition("\n")
        for target, score in self.policy(text):
            if target.startswith(turn) and len(target) > len(turn):
                tid = text_ids(self.tokenizer, target[len(turn):])[0]
                logits[tid] = max(float(logits[tid]), score)
        return logits
