"""Generation backends: one interface for a local transformers model and an OpenAI-compatible server.

A backend opens a :class:`GenerationSession` over a batch of prompts (token ids). The session
generates for any subset of its rows until each row hits a stop string, EOS or its token limit, and
accepts appended tokens per row (the ``<result>`` blocks). The rollout engine drives every method
through this interface, so the same pipeline runs on a laptop CPU and against a vLLM/SGLang node.

The local session keeps one KV cache for the whole multi-turn rollout: appended tokens are
prefilled into that cache and never re-encoded, rows that wait for others leave masked holes in
the attention mask (their positions do not advance), and finished rows are compacted out of the
batch. This is why a multi-turn rollout runs at close to the speed of plain batched generation.

Answer blocks (:meth:`TransformersSession.block_answers`, fed by the rollout engine from STIE's eq. 13): a
row may be given an :class:`AnswerBlock`. While the row is inside an answer span (``<short_answer>`` /
``<long_answer>``, :func:`~kunlunlab.agent.protocol.open_answer`), two sets of tokens are masked on the
device before sampling:

1. the bad-words constraint of the blocked spellings: inside a ``\\boxed{``, the last token of each
   spelling's token path (with and without a leading space) where the box's content so far is the rest of
   that path, as transformers' ``NoBadWordsLogitsProcessor`` bans a sequence's last token. The model's own earlier answers took these
   paths, so a repeat is turned away before its words are complete, while it can still choose another
   answer ("Saint" stays open to "Saint Louis" when "Saint Petersburg" is blocked);
2. the closure guard for every other spelling: a token that would end the answer (a ``}`` balancing the
   box's braces; before any box, one that begins a tag, or EOS) on an answer ``AnswerBlock.rejects``.
   So no spelling of a blocked answer can be completed, whatever the tokenisation; a model that has written
   one inside the box must continue it into an answer the block lets through.

Rows without a block cost nothing per step (no decode, no mask). The OpenAI-compatible session cannot apply it
(:meth:`OpenAISession.block_answers`) and says so.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from kunlunlab.agent.protocol import STOP_STRINGS, open_answer

# Stop strings are at most ~16 characters; this many trailing tokens always cover one.
_STOP_WINDOW = 24
# Tokens of a row's text before a generate call that an answer block reads with the call's tokens (a prompt or an
# appended block may end inside an opened answer: "…<short_answer>\\boxed{Saint"); cut after the last turn end.
_LEAD_WINDOW = 32
_TURN_ENDS = STOP_STRINGS + ("</result>",)


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"invalid sampling config: temperature={self.temperature}, top_p={self.top_p}")


@dataclass(frozen=True)
class AnswerBlock:
    """Answers a row may not generate (again) inside the answer tags: ``answers``, the spellings whose token
    paths are banned, and ``rejects``, true for any answer the row may not end on (see the module docstring)."""

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


def _eos_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return ids


def _answer_closers(tokenizer, eos_ids: set[int]) -> list[tuple[str, list[int]]]:
    """Every token that can end an answer, grouped by its text: those whose text holds a ``}`` (closing a
    ``\\boxed{``) or a ``<`` (beginning the answer's closing tag), and EOS (as ``"<"``: the text ends there).
    One decode of the vocabulary (49k tokens: ~0.6 s), done on a backend's first answer block."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    groups: dict[str, list[int]] = {}
    for i, piece in enumerate(pieces):
        if i in eos_ids:
            groups.setdefault(piece if "<" in piece else "<", []).append(i)
        elif "}" in piece or "<" in piece:
            groups.setdefault(piece, []).append(i)
    return list(groups.items())


def _find_stop(tokenizer, ids: list[int], stop: Sequence[str]) -> str | None:
    if not stop:
        return None
    tail = tokenizer.decode(ids[-_STOP_WINDOW:], skip_special_tokens=False)
    for s in stop:
        if s in tail:
            return s
    return None


# Below this many shared tokens, prefilling the prefix once does not pay for the extra model call.
_MIN_SHARED_PREFIX = 32


def _shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, keeping at least one token of each prompt for its own chunk (0 when
    fewer than ``_MIN_SHARED_PREFIX`` or a single prompt)."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    first, n = prompts[0], 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= _MIN_SHARED_PREFIX else 0


@functools.cache
def _growing_cache_class():
    """A ``DynamicCache`` whose layers append in place (built lazily: transformers is a heavy import).

    transformers' ``DynamicLayer`` appends a token with ``torch.cat``, which copies the whole cache of every
    layer at every decode step; at 20 rows and 1000 cached tokens that copy was 60-80 % of a CPU decode step
    (torch profiler, 2026-11-25). Here each layer keeps its keys/values in a buffer with spare room (+50 %),
    so a step writes one column and a copy happens only when the buffer grows (amortised O(1) per token).
    The model sees a view of the filled part, the same values as ``DynamicLayer`` would hand it.
    """
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import Cache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            self._k = self._v = None
            self._k_len = self._v_len = 0
            self.is_initialized = True

        @staticmethod
        def _grown(buffer, need: int):
            b, h, length, d = buffer.shape
            bigger = buffer.new_empty((b, h, max(need + 64, need * 3 // 2), d))
            bigger[:, :, :length] = buffer
            return bigger

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, need = self._k_len, self._k_len + key_states.shape[-2]
            if self._k is None:
                self._k, self._v = key_states.contiguous(), value_states.contiguous()
            else:
                if need > self._k.shape[-2]:
                    self._k = self._grown(self._k[:, :, :start], need)
                    self._v = self._grown(self._v[:, :, :start], need)
                self._k[:, :, start:need] = key_states
                self._v[:, :, start:need] = value_states
            self._k_len = self._v_len = need
            return self.keys, self.values

        # keys/values as DynamicLayer names them (each with its own filled length, as they are set one after the
        # other), so DynamicLayer's crop/reset and the session's column drop work on them unchanged
        @property
        def keys(self):
            return self._k[:, :, :self._k_len] if self._k is not None else torch.empty(0)

        @keys.setter
        def keys(self, value):
            self._k, self._k_len = (None, 0) if value is None or value.numel() == 0 else (value, value.shape[-2])

        @property
        def values(self):
            return self._v[:, :, :self._v_len] if self._v is not None else torch.empty(0)

        @values.setter
        def values(self, value):
            self._v, self._v_len = (None, 0) if value is None or value.numel() == 0 else (value, value.shape[-2])

        def batch_select_indices(self, indices) -> None:
            if self._k is not None:
                self._k, self._v = self._k[indices], self._v[indices]

    class GrowingCache(DynamicCache):
        def __init__(self):
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    return GrowingCache


def _in_dtype(model, dtype: str):
    """``model`` itself when it already has ``dtype``, else a frozen copy in ``dtype`` (135M parameters: ~0.3 s)."""
    import copy

    import torch

    target = getattr(torch, dtype)
    if next(model.parameters()).dtype == target:
        return model
    grads = {n: p.grad for n, p in model.named_parameters()}
    for p in model.parameters():  # the copy needs no gradients; they are put back on the original
        p.grad = None
    try:
        copied = copy.deepcopy(model)
    finally:
        for n, p in model.named_parameters():
            p.grad = grads[n]
    copied.to(target).requires_grad_(False).eval()
    return copied


def _attention_kernels(device, left_padded: bool):
    """The SDPA kernels a session's forward may use. For a left-padded chunk on the CPU only the math kernel:
    torch 2.13's CPU flash kernel, which transformers 5.24 picks for a boolean mask, returned wrong attention for
    a row whose chunk is left-padded after a shared prefix (the batched greedy answer of the second of three
    prompts differed from the same prompt alone and from ``generate``: tests/agent/test_backends.py). The math kernel
    and eager attention agree with both. Appended chunks are right-padded and one-token decode steps have no
    padding inside the chunk: both keep the default kernel, which agrees there (same tests) and runs a
    rollout ~1.7x faster on this CPU (bench rollout). On a GPU the kernels are left to torch."""
    if device.type != "cpu" or not left_padded:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel  # deferred like every torch import of this module

    return sdpa_kernel([SDPBackend.MATH])


class TransformersBackend:
    """Local model; ``model``/``tokenizer`` given, or loaded by name (None: the embedded SmolLM2)."""

    def __init__(self, name: str | None = None, model=None, tokenizer=None, device: str | None = None,
                 dtype: str = "auto"):
        """``dtype``: the dtype generation runs in (``auto``: bfloat16 where the hardware multiplies it
        natively, see :func:`kunlunlab.models.resolve_inference_dtype`). A given ``model`` in another dtype
        (a training model in float32) is copied once into that dtype for generation, so a backend is a
        snapshot of the weights at its creation: the DAPO rollout builds a new one for every rollout call."""
        from kunlunlab.models import load_llm, resolve_device, resolve_inference_dtype

        if model is None or tokenizer is None:
            target = resolve_device(device or "cpu")
            model, tokenizer = load_llm(name, dtype=resolve_inference_dtype(dtype, target), device=target)
        else:
            model = _in_dtype(model, resolve_inference_dtype(dtype, str(next(model.parameters()).device)))
        self.model, self.tokenizer = model, tokenizer
        # transformers 5.x renamed forward's ``past_key_values`` to ``cache`` (the old name warns and goes in 5.40);
        # the GPU extra pins an older 5.x that vLLM supports, so the name is read from the model's signature
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes kwargs on
        self.cache_kwarg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.name = name or "smollm2-135m-instruct"
        self.eos_ids = _eos_ids(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._closers: list[tuple[str, list[int]]] | None = None

    def answer_closers(self) -> list[tuple[str, list[int]]]:
        """:func:`_answer_closers` of this backend's tokenizer, computed once, when first needed."""
        if self._closers is None:
            self._closers = _answer_closers(self.tokenizer, self.eos_ids)
        return self._closers

    @property
    def device(self):
        return next(self.model.parameters()).device

    def open(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig | None = None) -> "TransformersSession":
        return TransformersSession(self, prompts, sampling or SamplingConfig())


class TransformersSession:
    """A batch of rows sharing one KV cache; see the module docstring."""

    def __init__(self, backend: TransformersBackend, prompts: Sequence[Sequence[int]], sampling: SamplingConfig):
        import torch
        from transformers.generation.logits_process import TopPLogitsWarper

        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.backend, self.sampling = backend, sampling
        self.torch = torch
        self.top_p = TopPLogitsWarper(sampling.top_p) if sampling.top_p < 1.0 else None
        # Sampling, the attention mask and the positions live on the model's device; each generated token costs
        # one host copy of the batch's chosen ids and log-probs (for the stop strings), never of the logits.
        self.device = backend.device
        self.generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        self.slots = list(range(len(prompts)))  # slot -> row id; compaction removes slots
        # row -> its answer block and the banned token paths of its spellings, (text before the last token, last token)
        self.blocks: dict[int, tuple[AnswerBlock, list[tuple[str, int]]]] = {}
        self.block_check_s = 0.0  # host time spent finding the blocks' banned tokens (bench answer-block)
        self.leads = {i: list(p[-_LEAD_WINDOW:]) for i, p in enumerate(prompts)}  # each row's last fed tokens
        self.cache = _growing_cache_class()()
        shared = _shared_prefix_length(prompts)
        if shared:
            # The prefix every prompt shares (system prompt and chat template, ~180 tokens of ~420 in an
            # evaluation batch) is prefilled once and copied to every row; the rest follows as an appended chunk.
            self.mask = torch.ones((1, shared), dtype=torch.long, device=self.device)
            self.positions = torch.tensor([shared], device=self.device)
            self._forward(torch.tensor([list(prompts[0][:shared])]), self.mask, torch.arange(shared)[None])
            self.tokens_processed = shared
            self._repeat_rows(len(prompts))
            self.next_logits = None
            self.append({i: list(p[shared:]) for i, p in enumerate(prompts)})
            return
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), backend.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        self.mask = mask.to(self.device)
        self.positions = self.mask.sum(1)  # next position id of each slot
        self.next_logits = self._forward(ids, self.mask, (self.mask.cumsum(1) - 1).clamp(min=0))
        self.tokens_processed = int(mask.sum())

    def _repeat_rows(self, n: int) -> None:
        """The single row of the cache (and mask, positions) copied to ``n`` rows."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.expand(n, -1, -1, -1).contiguous()
            layer.values = layer.values.expand(n, -1, -1, -1).contiguous()
        self.mask = self.mask.expand(n, -1).clone()
        self.positions = self.positions.expand(n).clone()

    # -- model calls -------------------------------------------------------------------------------------------
    def _forward(self, ids, chunk_mask, position_ids, last=None):
        """Feeds a chunk for every slot; returns each slot's logits at its last real position of the chunk:
        the chunk's last column (left padding, decode steps) or, for a right-padded chunk, column ``last[slot]``."""
        torch = self.torch
        device = self.device
        keep = 1
        if last is not None:  # only the distinct last columns reach the vocabulary projection
            columns, which = torch.unique(last, return_inverse=True)
            keep = columns.to(device)
        with torch.no_grad(), _attention_kernels(device, left_padded=last is None and ids.shape[1] > 1):
            out = self.backend.model(input_ids=ids.to(device), attention_mask=self.mask,
                                     position_ids=position_ids.to(device), use_cache=True, logits_to_keep=keep,
                                     **{self.backend.cache_kwarg: self.cache})
        if last is None:
            return out.logits[:, -1, :].float()
        return out.logits[torch.arange(len(last), device=device), which.to(device), :].float()

    def _slot(self, row: int) -> int:
        return self.slots.index(row)

    def _answer_bans(self, active: dict[int, int], gen: dict[int, list[int]]) -> tuple[list[int], list[int]]:
        """(slots, token ids) the answer blocks ban at this step: for each active row with a block that is inside
        an answer span, the last tokens of the blocked spellings' paths and the tokens that would end the answer
        as one its block rejects (module docstring)."""
        slots, ids = [], []
        for slot, row in active.items():
            if row not in self.blocks:
                continue
            block, paths = self.blocks[row]
            text = self.backend.tokenizer.decode(self.leads[row] + gen[row], skip_special_tokens=False)
            cut = max(text.rfind(end) + len(end) if end in text else 0 for end in _TURN_ENDS)
            state = open_answer(text[cut:])
            if state is None:
                continue
            for before, last in paths if state.depth else ():  # token paths: inside a box only
                if state.text == before:
                    slots.append(slot)
                    ids.append(last)
            verdicts: dict[str, bool] = {}  # closers sharing the answer they would end share its verdict
            for piece, token_ids in self.backend.answer_closers():
                answer = state.closed_by(piece)
                if answer is None:
                    continue
                if answer not in verdicts:
                    verdicts[answer] = bool(answer) and block.rejects(answer)
                if verdicts[answer]:
                    slots.extend([slot] * len(token_ids))
                    ids.extend(token_ids)
        return slots, ids

    def _sample(self, logits, bans: tuple[list[int], list[int]] | None = None):
        """The next token of every slot and its log-probability. ``bans`` (slots, token ids) are masked to -inf
        on the device before choosing; the log-probabilities stay the model's own, unmasked (as vLLM's default
        ``raw_logprobs``), so STIE's confidence and the RL ratio see the policy. Returns (chosen, log-probs,
        the slots whose highest-logit token was banned, or None without bans)."""
        torch = self.torch
        logprobs = torch.log_softmax(logits, dim=-1)
        scores, intervened = logits, None
        if bans and bans[0]:
            rows = torch.tensor(bans[0], device=self.device)
            cols = torch.tensor(bans[1], device=self.device)
            scores = logits.index_put((rows, cols), torch.tensor(float("-inf"), device=self.device))
            intervened = rows[logits.argmax(-1)[rows] == cols]
        if self.sampling.temperature == 0:
            chosen = scores.argmax(-1)
        else:
            scores = scores / self.sampling.temperature
            if self.top_p is not None:
                scores = self.top_p(None, scores)
            chosen = torch.multinomial(torch.softmax(scores, -1), 1, generator=self.generator).squeeze(-1)
        return chosen, logprobs.gather(-1, chosen[:, None]).squeeze(-1), intervened

    # -- the session interface ---------------------------------------------------------------------------------
    def generate(self, rows: Sequence[int], max_new_tokens: int | dict[int, int],
                 stop: Sequence[str] = STOP_STRINGS) -> dict[int, Segment]:
        torch = self.torch
        rows = list(rows)
        limits = max_new_tokens if isinstance(max_new_tokens, dict) else {r: max_new_tokens for r in rows}
        active = {self._slot(r): r for r in rows if limits.get(r, 0) > 0}
        gen: dict[int, list[int]] = {r: [] for r in rows}
        lps: dict[int, list[float]] = {r: [] for r in rows}
        finish: dict[int, tuple[str, str | None]] = {r: ("length", None) for r in rows}
        interventions = dict.fromkeys(rows, 0)
        n = len(self.slots)
        while active:
            bans = None
            if self.blocks:
                t0 = time.perf_counter()
                bans = self._answer_bans(active, gen)
                self.block_check_s += time.perf_counter() - t0
            chosen, logprob, intervened = self._sample(self.next_logits, bans)
            if intervened is not None:
                for slot in set(intervened.tolist()):
                    interventions[self.slots[slot]] += 1
            live = torch.zeros(n, dtype=torch.bool, device=self.device)
            live[torch.tensor(list(active), device=self.device)] = True
            step_mask = live.long()[:, None]
            step_ids = torch.where(live, chosen, self.backend.pad_id)[:, None]
            chosen_host, logprob_host = chosen.tolist(), logprob.tolist()  # the step's one host copy
            for slot, row in active.items():
                gen[row].append(chosen_host[slot])
                lps[row].append(logprob_host[slot])
            done = []
            for slot, row in active.items():
                token = gen[row][-1]
                hit = None if token in self.backend.eos_ids else _find_stop(self.backend.tokenizer, gen[row], stop)
                if token in self.backend.eos_ids:
                    finish[row] = ("eos", None)
                elif hit:
                    finish[row] = ("stop", hit)
                elif len(gen[row]) >= limits[row]:
                    finish[row] = ("length", None)
                else:
                    continue
                done.append(slot)
            # Every generated token enters the cache, the last one included: the next call continues from it.
            self.mask = torch.cat([self.mask, step_mask], dim=1)
            logits = self._forward(step_ids, step_mask, self.positions[:, None].clone())
            fed = step_mask[:, 0].bool()
            self.next_logits[fed] = logits[fed]
            self.positions += step_mask[:, 0]
            self.tokens_processed += len(active)
            for slot in done:
                del active[slot]
        for r in rows:
            self.leads[r] = (self.leads[r] + gen[r])[-_LEAD_WINDOW:]
        tok = self.backend.tokenizer
        return {r: Segment(gen[r], lps[r], tok.decode(gen[r], skip_special_tokens=False), *finish[r],
                           interventions=interventions[r]) for r in rows}

    def block_answers(self, blocks: dict[int, AnswerBlock | None]) -> bool:
        """Sets each row's answer block (None lifts it): from the next ``generate`` on, the row cannot end an
        answer that its block rejects (module docstring). The answer span is read from the row's text since its
        last turn end (a stop string or ``</result>``) among the last 32 tokens fed before the call (so a
        prompt ending in ``<short_answer>\\boxed{`` counts) and the tokens of the call. Always enforced here:
        returns True."""
        tok = self.backend.tokenizer
        for row, block in blocks.items():
            if block is None:
                self.blocks.pop(row, None)
                continue
            paths = set()
            for answer in block.answers:
                for spelling in (answer.strip(), " " + answer.strip()):
                    ids = text_ids(tok, spelling)
                    if ids:
                        paths.add((tok.decode(ids[:-1], skip_special_tokens=False), ids[-1]))
            self.blocks[row] = (block, sorted(paths))
        return True

    def append(self, tokens: dict[int, list[int]]) -> None:
        """Prefills each row's appended tokens into the cache, right-padded within the chunk (the padding
        columns stay masked, holes that later steps skip; see :func:`_attention_kernels` for why not left)."""
        torch = self.torch
        tokens = {r: t for r, t in tokens.items() if t}
        if not tokens:
            return
        for row, toks in tokens.items():
            self.leads[row] = (self.leads[row] + list(toks))[-_LEAD_WINDOW:]
        n, width = len(self.slots), max(len(t) for t in tokens.values())
        ids = torch.full((n, width), self.backend.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros((n, width), dtype=torch.long)
        last = torch.zeros(n, dtype=torch.long)
        for row, toks in tokens.items():
            slot = self._slot(row)
            ids[slot, :len(toks)] = torch.tensor(toks, dtype=torch.long)
            chunk_mask[slot, :len(toks)] = 1
            last[slot] = len(toks) - 1
        chunk_mask = chunk_mask.to(self.device)
        position_ids = self.positions[:, None] + (chunk_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)
        logits = self._forward(ids, chunk_mask, position_ids, last=last)
        fed = chunk_mask.sum(1) > 0
        if self.next_logits is None:  # the first chunk after a shared prefix feeds every row
            self.next_logits = logits
        self.next_logits[fed] = logits[fed]
        self.positions += chunk_mask.sum(1)
        self.tokens_processed += int(chunk_mask.sum())

    def release(self, rows: Sequence[int]) -> None:
        """Rows that are done leave the batch (their cache rows are dropped), so later steps cost less."""
        for row in rows:
            self.blocks.pop(row, None)
            self.leads.pop(row, None)
        gone = set(rows) & set(self.slots)
        if not gone:
            return
        keep = [i for i, r in enumerate(self.slots) if r not in gone]
        self.slots = [self.slots[i] for i in keep]
        if not keep:
            self.cache = None
            return
        index = self.torch.tensor(keep, dtype=self.torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions, self.next_logits = self.mask[index], self.positions[index], self.next_logits[index]
        # Columns masked in every remaining row carry no information: drop them from mask and cache alike.
        live = self.mask.sum(0) > 0
        if not bool(live.all()):
            self._drop_columns(live)

    def _drop_columns(self, live) -> None:
        index = live.nonzero().squeeze(-1)
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, index, :]
            layer.values = layer.values[:, :, index, :]
        self.mask = self.mask[:, index]


@dataclass
class OpenAIBackend:
    """An OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ``kunlunlab serve-llm``).

    Prompts go as token ids and completions come back as token ids when the server supports vLLM's
    ``return_tokens_as_token_ids``; otherwise the text is tokenised locally (documented fallback:
    then token ids are the local tokenizer's). ``tokenizer`` is the model's tokenizer (name or path).
    """

    url: str
    model: str
    tokenizer_name: str | None = None
    api_key: str | None = None
    timeout: float = 120.0
    retries: int = 2
    name: str = field(init=False)

    def __post_init__(self):
        import httpx
        from transformers import AutoTokenizer

        from kunlunlab.models import resolve_llm

        self.name = self.model
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_llm(self.tokenizer_name or self.model))
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.http = httpx.Client(timeout=self.timeout, headers=headers)
        self.url = self.url.rstrip("/")
        if not self.url.endswith("/v1"):
            self.url += "/v1"

    def open(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig | None = None) -> "OpenAISession":
        return OpenAISession(self, prompts, sampling or SamplingConfig())

    def complete(self, prompts: list[list[int]], max_tokens: int, stop: Sequence[str],
                 sampling: SamplingConfig) -> list[Segment]:
        import httpx

        from kunlunlab.agent.errors import GenerationServiceError

        payload = {"model": self.model, "prompt": prompts, "max_tokens": max_tokens,
                   "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed,
                   "stop": list(stop), "logprobs": 1, "include_stop_str_in_output": True,
                   "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        last = None
        for attempt in range(self.retries + 1):
            try:
                response = self.http.post(self.url + "/completions", json=payload)
            except httpx.HTTPError as err:  # connection refused, timeouts
                last = err
                continue
            if response.status_code == 200:
                return self._segments(response.json(), len(prompts), stop)
            last = RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
            if response.status_code < 500:
                break
        raise GenerationServiceError(f"generation server {self.url} failed: {last}")

    def _segments(self, data: dict, n: int, stop: Sequence[str]) -> list[Segment]:
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != n:
            from kunlunlab.agent.errors import GenerationServiceError

            raise GenerationServiceError(f"server returned {len(choices)} choices for {n} prompts")
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


def mean_confidence(logprobs: Sequence[float]) -> float:
    """Geometric-mean token probability in [0, 1] (exp of the mean log-prob); 0 for no tokens."""
    return math.exp(sum(logprobs) / len(logprobs)) if logprobs else 0.0
