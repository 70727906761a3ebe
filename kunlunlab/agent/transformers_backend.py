"""The local generation backend: a transformers model whose session keeps one KV cache per rollout.

It implements the interface of :mod:`kunlunlab.agent.backends` in-process (the OpenAI-compatible one is
:mod:`kunlunlab.agent.openai_backend`); the in-place cache layer it uses is :mod:`kunlunlab.agent.kv_cache`.

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
(:meth:`~kunlunlab.agent.openai_backend.OpenAISession.block_answers`) and says so.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import time
from typing import Sequence

from kunlunlab.agent.backends import AnswerBlock, SamplingConfig, Segment, text_ids
from kunlunlab.agent.kv_cache import growing_cache_class
from kunlunlab.agent.protocol import STOP_STRINGS, open_answer
from kunlunlab.models import load_llm, resolve_device, resolve_inference_dtype

# Stop strings are at most ~16 characters; this many trailing tokens always cover one.
_STOP_WINDOW = 24
# Tokens of a row's text before a generate call that an answer block reads with the call's tokens (a prompt or an
# appended block may end inside an opened answer: "…<short_answer>\\boxed{Saint"); cut after the last turn end.
_LEAD_WINDOW = 32
_TURN_ENDS = STOP_STRINGS + ("</result>",)


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


def _in_dtype(model, dtype: str):
    """``model`` itself when it already has ``dtype``, else a frozen copy in ``dtype`` (135M parameters: ~0.3 s)."""
    import torch  # deferred: torch takes seconds to import; every torch import of this module waits for use

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


class GenerationCancelled(RuntimeError):
    """``generate`` stopped because its ``cancel`` event was set (``serve-llm``: the client left, or the server is
    stopping); what the call generated is dropped and the session must not be used again."""


class TransformersBackend:
    """Local model; ``model``/``tokenizer`` given, or loaded by name (None: the embedded SmolLM2)."""

    def __init__(self, name: str | None = None, model=None, tokenizer=None, device: str | None = None,
                 dtype: str = "auto"):
        """``dtype``: the dtype generation runs in (``auto``: bfloat16 where the hardware multiplies it
        natively, see :func:`kunlunlab.models.resolve_inference_dtype`). A given ``model`` in another dtype
        (a training model in float32) is copied once into that dtype for generation, so a backend is a
        snapshot of the weights at its creation: the DAPO rollout builds a new one for every rollout call."""
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
        import torch  # deferred, as in _in_dtype (transformers too)
        from transformers.generation.logits_process import TopPLogitsWarper  # deferred: as torch above

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
        self.cache = growing_cache_class()()
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
                 stop: Sequence[str] = STOP_STRINGS, cancel=None) -> dict[int, Segment]:
        """``cancel``: a ``threading.Event`` another thread may set; it is read before each token, so a set event
        stops the call within one decode step with :class:`GenerationCancelled` (``serve-llm`` cancels a request
        whose client has left this way, instead of generating up to ``max_tokens`` for nobody)."""
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
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled(f"generation cancelled after {max(len(g) for g in gen.values())} tokens")
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
