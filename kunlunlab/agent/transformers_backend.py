"""The local generation backend: a transformers model whose session keeps one KV cache per rollout.

It implements the interface of :mod:`kunlunlab.agent.backends` in-process (the OpenAI-compatible one is
:mod:`kunlunlab.agent.openai_backend`); the in-place cache layer it uses is :mod:`kunlunlab.agent.kv_cache`.

The local session keeps its rows in the slots of one ragged KV cache (:mod:`kunlunlab.agent.kv_cache`): each
row's tokens fill its own columns without holes, appended tokens are prefilled for their rows alone and never
re-encoded, a row can finish its segment and continue (``generate(until="any")``) while the others keep
generating, and a finished row's slot takes the next question (:meth:`TransformersSession.add`). Every decode step
runs all slots as one batch; on a CPU a step costs about the same at 2 rows as at 20 (per-layer overhead), so
keeping the batch full is what brings a multi-turn rollout to the speed of plain batched generation. A step also
scores up to ``draft_tokens`` tokens a row looked up in the row's own text (:mod:`kunlunlab.agent.draft_lookup`)
and keeps those the row's sampler would have drawn (:meth:`TransformersSession._draft_step`): the `kunlun` evaluation
of 40 world questions took 63.8 s against 81.1 s one token a step (docs/reference.md).

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
from kunlunlab.agent.draft_lookup import NgramDrafts
from kunlunlab.agent.kv_cache import FeedPlan, ragged_cache_class
from kunlunlab.agent.packed_linear import pack_linears
from kunlunlab.agent.protocol import STOP_STRINGS, open_answer
from kunlunlab.models import load_llm, resolve_device, resolve_inference_dtype

# Stop strings are at most ~16 characters; this many trailing tokens always cover one.
_STOP_WINDOW = 24
# Tokens of a row's text before a generate call that an answer block reads with the call's tokens (a prompt or an
# appended block may end inside an opened answer: "…<short_answer>\\boxed{Saint"); cut after the last turn end.
_LEAD_WINDOW = 32
# Drafts checked per decode step (:mod:`kunlunlab.agent.draft_lookup`). A step of SmolLM2-135M scoring 3 columns a row
# cost 1.42x one column at 8 and at 20 rows (2-core EPYC, bf16, ~800 cached tokens; 5 columns: 1.85x, 2.09x), and 2
# drafts took 2.05 tokens a step, 4 drafts 2.60, on 40 held-out world questions (docs/reference.md).
DRAFT_TOKENS = 2
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
    # Trainers patch ``forward`` on the instance (accelerate's autocast wrapper, TRL's fused LM head), and TRL's
    # patch keeps the original model's forward in a closure that deepcopy does not follow: the copy would run the
    # float32 training weights under autocast (every linear layer casting its weight at every decode step: a DAPO
    # step's rollouts took twice as long, docs/reference.md) and, after training, in float32. Generation needs none
    # of them: the copy runs its class's forward. Accelerate also keeps the wrapped forward as ``_original_forward``,
    # a method bound to the model: copied, it bound the copy to itself, a cycle only Python's rarely run collector
    # frees, so every rollout call's copy stayed resident (8 DAPO steps: 8 copies, 3.4 -> 6.4 GiB). Every method
    # bound to its own module goes: the copy is freed when the backend is dropped.
    for module in copied.modules():
        for name, value in list(vars(module).items()):
            if name == "forward" or getattr(value, "__self__", None) is module:
                del module.__dict__[name]
    copied.to(target).requires_grad_(False).eval()
    return copied


def inverse_cdf_sample(probs, generator):
    """One token per row of ``probs`` by inverse transform sampling: the first token whose cumulative probability
    (in float64) passes one uniform number per row. The same distribution as ``torch.multinomial(probs, 1)``, and a
    token of probability zero (cut by top-p, banned) is never drawn; but on a CPU ``torch.multinomial`` took 1.2 ms a
    row over SmolLM2's 49,152 tokens (9.3 ms at 8 rows: a fifth of a DAPO rollout's decode step), this 0.24 ms for the
    8 rows (2-core EPYC, 2026-12-04). Draws differ from ``torch.multinomial``'s under the same seed (one uniform a row
    instead of its own consumption of the generator); a session's draws are still fixed by its seed."""
    import torch  # deferred, as in _in_dtype

    cdf = probs.double().cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


GQA_ATTENTION = "kunlunlab_sdpa_gqa"  # the attention a CPU session's model runs (:func:`_grouped_query_attention`)


def _sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
              **kwargs):
    """transformers' SDPA attention with the key/value heads left grouped. Given a mask (the session's ragged 4D
    mask, at every call), transformers repeats every layer's cached keys and values once per query group before
    SDPA (CUDA's fused kernels need that); on a CPU that copy of the whole cache was half of an evaluation's time
    (SmolLM2: 3 key/value heads for 9 query heads; at 40 rows and 1,500 cached tokens 44 ms a layer against 2.9 ms
    grouped). With a mask the query groups of a key/value head are folded into the query-length axis (query
    ``(b, kv_heads * groups, q, d)`` viewed as ``(b, kv_heads, groups * q, d)``, the mask repeated per group), so
    SDPA sees one query head per key/value head: the same CPU flash kernel as with ``enable_gqa`` (torch.profiler),
    which then multiplies each key/value head's cache with its query heads at once instead of with one query head
    at a time; 6x faster at a decode step (8 rows, 700 cached tokens: 3.19 ms a layer against 0.51 ms, 2-core
    EPYC; docs/reference.md). The same numbers either way (``tests/agent/test_backends.py``)."""
    import torch  # deferred, as in _in_dtype

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_len, dim = query.shape
    if groups > 1 and attention_mask is not None and attention_mask.shape[1] == 1:
        mask = _folded_mask(attention_mask, q_len, groups, query.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, heads // groups, groups * q_len, dim), key, value, attn_mask=mask, dropout_p=dropout,
            scale=scaling).view(batch, heads, q_len, dim)
        return out.transpose(1, 2).contiguous(), None
    causal = q_len > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


_FOLDED_MASK: tuple | None = None  # (a forward's mask, (query length, groups, dtype), its folded additive form)


def _folded_mask(mask, q_len: int, groups: int, dtype):
    """``mask`` as :func:`_sdpa_gqa` gives it to SDPA: repeated per folded query group and, if boolean, additive
    (0 / -inf) in the query dtype; built once for the forward pass whose layers all pass the same ``mask``
    object. Built per layer, the repeat and SDPA's own boolean-to-additive ``where`` (which it runs at every
    call) cost 1.5 of a 61 s evaluation (torch.profiler, 2-core EPYC); the additive mask also runs the kernel
    faster than the boolean one (20 rows, 9 queries, 1,000 cached tokens: 2.66 against 2.95 ms a layer), with
    the same output (``tests/agent/test_backends.py``). The memo holds the last forward's mask (kept alive by it,
    so its identity cannot be taken by a new one)."""
    import torch  # deferred, as in _in_dtype

    global _FOLDED_MASK
    key = (q_len, groups, dtype)
    memo = _FOLDED_MASK
    if memo is not None and memo[0] is mask and memo[1] == key:
        return memo[2]
    folded = mask if q_len == 1 else mask.expand(-1, -1, q_len, -1).repeat(1, 1, groups, 1)
    if folded.dtype == torch.bool:
        folded = torch.zeros(folded.shape, dtype=dtype, device=folded.device).masked_fill_(~folded, float("-inf"))
    _FOLDED_MASK = (mask, key, folded)
    return folded


def _grouped_query_attention(model) -> str | None:
    """The attention ``model`` should generate with: :func:`_sdpa_gqa` (registered under :data:`GQA_ATTENTION`)
    where it helps, on a CPU, for a model with fewer key/value heads than query heads that runs transformers' SDPA;
    None elsewhere (on CUDA, SDPA with a mask and grouped heads falls back to its slowest kernel)."""
    from transformers import AttentionInterface  # deferred, as torch above
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if not hasattr(model, "set_attn_implementation"):  # not a transformers model (a test's own module): as it is
        return None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if (next(model.parameters()).device.type != "cpu" or not heads or not kv_heads or kv_heads >= heads
            or getattr(model.config, "_attn_implementation", None) != "sdpa"):
        return None
    AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)  # the masks transformers builds itself (generate)
    return GQA_ATTENTION


@contextlib.contextmanager
def _attention_during(model, attention: str | None):
    """``model`` runs ``attention`` inside the block and its own implementation again after it (0.4 ms a switch for
    SmolLM2). For a model the backend borrows (a training model already in the generation dtype: every model on a
    CPU without native bfloat16): switched for good, it would train with an attention written for inference."""
    if attention is None:
        yield
        return
    own = model.config._attn_implementation
    model.set_attn_implementation(attention)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


class GenerationCancelled(RuntimeError):
    """``generate`` stopped because its ``cancel`` event was set (``serve-llm``: the client left, or the server is
    stopping); what the call generated is dropped and the session must not be used again."""


class TransformersBackend:
    """Local model; ``model``/``tokenizer`` given, or loaded by name (None: the embedded SmolLM2)."""

    sessions_continue = True  # a session continues rows one by one and takes new ones (the rollout engine reads it)

    def __init__(self, name: str | None = None, model=None, tokenizer=None, device: str | None = None,
                 dtype: str = "auto", draft_tokens: int = DRAFT_TOKENS):
        """``dtype``: the dtype generation runs in (``auto``: bfloat16 where the hardware multiplies it
        natively, see :func:`kunlunlab.models.resolve_inference_dtype`). A given ``model`` in another dtype
        (a training model in float32) is copied once into that dtype for generation, so a backend is a
        snapshot of the weights at its creation: the DAPO rollout builds a new one for every rollout call.
        ``draft_tokens``: tokens looked up in a row's own text and checked in the same forward pass as each sampled
        token (:mod:`kunlunlab.agent.draft_lookup`; 0: one token a decode step)."""
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
        self.draft_tokens = draft_tokens
        given = None
        if model is None or tokenizer is None:
            target = resolve_device(device or "cpu")
            model, tokenizer = load_llm(name, dtype=resolve_inference_dtype(dtype, target), device=target)
        else:
            given = model
            model = _in_dtype(model, resolve_inference_dtype(dtype, str(next(model.parameters()).device)))
        # The backend's own model (loaded, or its copy in the generation dtype) switches for good. A model handed
        # over as it is (a training model already in the generation dtype) keeps its own attention outside the
        # session's forward calls (:func:`_attention_during`); it generated with transformers' SDPA before, at half
        # the speed (make run's evaluation after training in float32, 2-core EPYC: 20.3 against 42.3 model tokens/s
        # on the same 20 questions, the same tokens).
        attention = _grouped_query_attention(model)
        self.borrowed_attention = None
        if attention is not None and model is given:
            self.borrowed_attention = attention
        elif attention is not None:
            model.set_attn_implementation(attention)
        # a model the backend owns multiplies on oneDNN's packed weights where that is the same arithmetic (CPU,
        # bfloat16): about half a decode step's linear time (:mod:`kunlunlab.agent.packed_linear`); a borrowed
        # training model is left as it is
        self.packed_linears = pack_linears(model) if model is not given else 0
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


class _Partial:
    """A row's segment in progress: what it generated so far in the current ``generate`` segment, its limit and
    whether EOS ends it."""

    __slots__ = ("limit", "ids", "logprobs", "interventions", "eos_ends")

    def __init__(self, limit: int, eos_ends: bool = True):
        self.limit, self.ids, self.logprobs, self.interventions = limit, [], [], 0
        self.eos_ends = eos_ends


class TransformersSession:
    """Rows in the slots of one ragged KV cache; see the module docstring."""

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
        self.slot_of: dict[int, int] = {}  # row -> its slot in the cache
        self.lengths: list[int] = []  # slot -> tokens in its cache columns (0: free)
        self.free: list[int] = []
        self.cache = ragged_cache_class()(0)
        self.next_logits = None  # slot -> logits after its last fed token
        self.partial: dict[int, _Partial] = {}  # rows with a segment in progress (``generate(until="any")``)
        # row -> its answer block and the banned token paths of its spellings, (text before the last token, last token)
        self.blocks: dict[int, tuple[AnswerBlock, list[tuple[str, int]]]] = {}
        self.block_check_s = 0.0  # host time spent finding the blocks' banned tokens (bench answer-block)
        self.leads: dict[int, list[int]] = {}  # each row's last fed tokens
        self.drafts: dict[int, NgramDrafts] = {}  # row -> its tokens so far, indexed for draft lookup
        self.excluded: dict[int, int] = {}  # row -> the draft its last step rejected (kept out of its next draw)
        self.decode_steps = 0
        self.tokens_processed = 0
        self.prefix: tuple[list[int], list] | None = None  # the shared prompt prefix and its keys/values
        shared = _shared_prefix_length(prompts)
        if shared:
            # The prefix every prompt shares (system prompt and chat template, ~180 tokens of ~420 in an
            # evaluation batch) is prefilled once; rows added later that start with it get a copy too.
            slot = self._take_slots(1)[0]
            self._feed([slot], [list(prompts[0][:shared])])
            self.prefix = (list(prompts[0][:shared]), self.cache.snapshot(slot, shared))
            self.lengths[slot] = 0
            self.free.append(slot)
        self.add(prompts, range(len(prompts)))

    # -- slots ----------------------------------------------------------------------------------------------------
    def _take_slots(self, n: int) -> list[int]:
        """``n`` free slots, the batch grown when there are too few (new slots empty)."""
        self.free.sort()
        taken, self.free = self.free[:n], self.free[n:]
        grow = n - len(taken)
        if grow:
            old = len(self.lengths)
            self.cache.resize_slots(slots=old + grow)
            self.lengths += [0] * grow
            taken += list(range(old, old + grow))
        return taken

    def _compact(self) -> None:
        """Drops the free slots from the batch (decode steps run every slot), keeping the others' order."""
        keep = sorted(self.slot_of.values())
        index = {old: new for new, old in enumerate(keep)}
        keep_t = self.torch.tensor(keep, dtype=self.torch.long, device=self.device)
        self.cache.resize_slots(keep=keep_t)
        self.lengths = [self.lengths[s] for s in keep]
        self.next_logits = self.next_logits[keep_t]
        self.slot_of = {row: index[s] for row, s in self.slot_of.items()}
        self.free = []

    def add(self, prompts: Sequence[Sequence[int]], rows: Sequence[int]) -> None:
        """New rows ``rows`` with their prompts take free slots (continuous batching: a finished row's slot goes to
        the next question); prompts that start with the session's shared prefix get its keys/values copied and
        only the rest prefilled. Rows added together with the same prompt (an RL group's samples) prefill it once:
        the others get a copy of its keys/values and next-token logits, and sample on from there on their own."""
        rows = list(rows)
        if len(rows) != len(prompts) or any(r in self.slot_of for r in rows) or any(len(p) == 0 for p in prompts):
            raise ValueError("add needs one non-empty prompt per new row id")
        if not rows:
            return
        slots = self._take_slots(len(rows))
        fed, feeds, copied = [], [], []
        first_with: dict[tuple[int, ...], int] = {}  # prompt -> the slot that prefills it
        same_as: dict[int, int] = {}  # slot -> the slot whose prompt it repeats
        for row, slot, prompt in zip(rows, slots, prompts):
            self.slot_of[row] = slot
            self.leads[row] = list(prompt[-_LEAD_WINDOW:])
            prompt = list(prompt)
            if self.backend.draft_tokens:
                self.drafts[row] = NgramDrafts(prompt)
            key = tuple(prompt)
            if key in first_with:
                same_as[slot] = first_with[key]
                continue
            first_with[key] = slot
            if self.prefix and len(prompt) > len(self.prefix[0]) and prompt[:len(self.prefix[0])] == self.prefix[0]:
                copied.append(slot)
                self.lengths[slot] = len(self.prefix[0])
                prompt = prompt[len(self.prefix[0]):]
            else:
                self.lengths[slot] = 0
            fed.append(slot)
            feeds.append(prompt)
        if copied:
            self.cache.copy_prefix(self.prefix[1], self.torch.tensor(copied, device=self.device), len(self.prefix[0]))
        self._feed(fed, feeds)
        self._copy_slots(same_as)

    def _copy_slots(self, same_as: dict[int, int]) -> None:
        """Each slot of ``same_as`` becomes a copy of its source slot: keys/values, length and next-token logits."""
        by_source: dict[int, list[int]] = {}
        for slot, source in same_as.items():
            by_source.setdefault(source, []).append(slot)
        for source, targets in by_source.items():
            length = self.lengths[source]
            index = self.torch.tensor(targets, dtype=self.torch.long, device=self.device)
            self.cache.copy_slot(source, index, length)
            self.next_logits[index] = self.next_logits[source].clone()
            for slot in targets:
                self.lengths[slot] = length

    # -- model calls -------------------------------------------------------------------------------------------
    def _forward(self, ids, slots, starts: list[int], keep):
        """Feeds ``ids`` (rows x width, right-padded) to ``slots`` (None: every slot), each row at its slot's first
        free column ``starts``; a row's query at column c sees its own columns up to c (the 4D mask built here).
        Returns the logits of the columns ``keep`` (an int: the last ones; a tensor: those columns)."""
        torch = self.torch
        device = self.device
        width = ids.shape[1]
        starts_t = torch.tensor(starts, dtype=torch.long, device=device)
        kv_len = max(starts) + width
        positions = starts_t[:, None] + torch.arange(width, device=device)
        mask = (torch.arange(kv_len, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        slots_t = None if slots is None else torch.tensor(slots, dtype=torch.long, device=device)
        rows = (torch.arange(len(starts), device=device) if slots_t is None else slots_t)[:, None]
        self.cache.plan = FeedPlan(slots_t, rows.expand(-1, width), positions, width, kv_len)
        with torch.no_grad(), _attention_during(self.backend.model, self.backend.borrowed_attention):
            out = self.backend.model(input_ids=ids.to(device), attention_mask=mask, position_ids=positions,
                                     use_cache=True, logits_to_keep=keep, **{self.backend.cache_kwarg: self.cache})
        return out.logits

    def _logit_rows(self, logits) -> None:
        """``next_logits`` with a row per slot, as wide as the model's output (its vocabulary can be larger than
        the tokenizer's: Qwen2.5-7B has 152064 outputs for 151665 tokens)."""
        missing = len(self.lengths) - (0 if self.next_logits is None else self.next_logits.shape[0])
        if missing > 0:
            extra = self.torch.zeros((missing, logits.shape[-1]), device=self.device)
            self.next_logits = extra if self.next_logits is None else self.torch.cat([self.next_logits, extra])

    def _feed(self, slots: list[int], chunks: list[list[int]]) -> None:
        """Prefills each slot's chunk (a prompt, an appended block) for those slots alone; sets their next logits."""
        torch = self.torch
        width = max(len(c) for c in chunks)
        ids = torch.full((len(slots), width), self.backend.pad_id, dtype=torch.long)
        last = torch.zeros(len(slots), dtype=torch.long)
        for i, chunk in enumerate(chunks):
            ids[i, :len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            last[i] = len(chunk) - 1
        columns, which = torch.unique(last, return_inverse=True)  # only distinct last columns reach the vocabulary
        logits = self._forward(ids, slots, [self.lengths[s] for s in slots], columns.to(self.device))
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        self._logit_rows(logits)
        self.next_logits[index] = logits[torch.arange(len(slots), device=self.device), which.to(self.device)].float()
        for slot, chunk in zip(slots, chunks):
            self.lengths[slot] += len(chunk)
        self.tokens_processed += sum(len(c) for c in chunks)

    def _decode_step(self, step_ids: list[int], fed: list[int]) -> None:
        """One token for every slot (a step runs the whole batch; a slot not in ``fed`` computes nothing that
        is kept: its write lands past its length and is overwritten by its next real token)."""
        torch = self.torch
        ids = torch.tensor(step_ids, dtype=torch.long)[:, None]
        logits = self._forward(ids, None, self.lengths, 1)
        index = torch.tensor(fed, dtype=torch.long, device=self.device)
        self._logit_rows(logits)
        self.next_logits[index] = logits[index, -1, :].float()
        for slot in fed:
            self.lengths[slot] += 1
        self.tokens_processed += len(fed)
        self.decode_steps += 1

    def _answer_bans(self, active: dict[int, int]) -> tuple[list[int], list[int]]:
        """(slots, token ids) the answer blocks ban at this step: for each active row with a block that is inside
        an answer span, the last tokens of the blocked spellings' paths and the tokens that would end the answer
        as one its block rejects (module docstring)."""
        slots, ids = [], []
        for slot, row in active.items():
            if row not in self.blocks:
                continue
            block, paths = self.blocks[row]
            text = self.backend.tokenizer.decode(self.leads[row] + self.partial[row].ids, skip_special_tokens=False)
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

    def _sample(self, logits, bans: tuple[list[int], list[int]] | None = None,
                excluded: tuple[list[int], list[int]] | None = None):
        """The next token of every slot and its log-probability. ``bans`` (slots, token ids) are masked to -inf
        on the device before choosing; the log-probabilities stay the model's own, unmasked (as vLLM's default
        ``raw_logprobs``), so STIE's confidence and the RL ratio see the policy. Returns (chosen, log-probs,
        the slots whose highest-logit token was banned, or None without bans). ``excluded`` (slots, token ids): a
        draft the slot's last step rejected, kept out of this draw (module docstring); never an intervention."""
        torch = self.torch
        logprobs = torch.log_softmax(logits, dim=-1)
        scores, intervened = logits, None
        if excluded and excluded[0]:
            scores = scores.index_put((torch.tensor(excluded[0], device=self.device),
                                       torch.tensor(excluded[1], device=self.device)),
                                      torch.tensor(float("-inf"), device=self.device))
        if bans and bans[0]:
            rows = torch.tensor(bans[0], device=self.device)
            cols = torch.tensor(bans[1], device=self.device)
            scores = scores.index_put((rows, cols), torch.tensor(float("-inf"), device=self.device))
            intervened = rows[logits.argmax(-1)[rows] == cols]
        if self.sampling.temperature == 0:
            chosen = scores.argmax(-1)
        else:
            scores = scores / self.sampling.temperature
            if self.top_p is not None:
                scores = self.top_p(None, scores)
            chosen = inverse_cdf_sample(torch.softmax(scores, -1), self.generator)
        return chosen, logprobs.gather(-1, chosen[:, None]).squeeze(-1), intervened

    # -- the session interface ---------------------------------------------------------------------------------
    def generate(self, rows: Sequence[int], max_new_tokens: int | dict[int, int],
                 stop: Sequence[str] = STOP_STRINGS, cancel=None, until: str = "all",
                 stop_at_eos: bool = True) -> dict[int, Segment]:
        """Generates for ``rows`` until each hits a stop string, EOS or its limit (``until="all"``), or until at
        least one of them has (``until="any"``: the others keep their segment in progress, and a later call that
        names them continues it under the limit it started with). Returns the segments of the rows that finished.
        ``cancel``: a ``threading.Event`` another thread may set; it is read before each token, so a set event
        stops the call within one decode step with :class:`GenerationCancelled` (``serve-llm`` cancels a request
        whose client has left this way, instead of generating up to ``max_tokens`` for nobody).
        ``stop_at_eos=False``: EOS is a token like any other and each row runs to its limit (vLLM's ``ignore_eos``),
        so a throughput comparison decodes exactly the token counts it names (``bench rollout``'s plain side)."""
        if until not in ("all", "any"):
            raise ValueError(f"until must be 'all' or 'any', got {until!r}")
        rows = list(rows)
        limits = max_new_tokens if isinstance(max_new_tokens, dict) else {r: max_new_tokens for r in rows}
        if self.free and len(self.free) * 2 >= len(self.lengths):
            self._compact()
        out: dict[int, Segment] = {}
        for r in rows:
            if r not in self.partial:
                self.partial[r] = _Partial(limits.get(r, 0), eos_ends=stop_at_eos)
            if self.partial[r].limit <= 0:
                out[r] = self._finish(r, "length", None)
        active = {self.slot_of[r]: r for r in rows if r not in out}
        while active and not (until == "any" and out):
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled(f"generation cancelled after "
                                          f"{max(len(self.partial[r].ids) for r in active.values())} tokens")
            bans = None
            if self.blocks:
                t0 = time.perf_counter()
                bans = self._answer_bans(active)
                self.block_check_s += time.perf_counter() - t0
            excluded = [(slot, self.excluded.pop(row)) for slot, row in active.items() if row in self.excluded]
            chosen, logprob, intervened = self._sample(self.next_logits, bans,
                                                       ([s for s, _ in excluded], [t for _, t in excluded]))
            if intervened is not None:
                for slot in set(intervened.tolist()):
                    if slot in active:
                        self.partial[active[slot]].interventions += 1
            chosen_host, logprob_host = chosen.tolist(), logprob.tolist()  # the step's one host copy
            step_ids = [self.backend.pad_id] * len(self.lengths)
            finished, drafts = [], {}
            for slot, row in active.items():
                token, part = chosen_host[slot], self.partial[row]
                step_ids[slot] = token
                ended = self._take(row, token, logprob_host[slot], stop)
                if ended:
                    finished.append((slot, row, *ended))
                elif row in self.drafts and row not in self.blocks:  # an answer block's bans read each token
                    draft = self.drafts[row].draft(min(self.backend.draft_tokens, part.limit - len(part.ids)))
                    if draft:
                        drafts[slot] = draft
            # Every generated token enters the cache, the last one included: the next call continues from it.
            if drafts:
                self._draft_step(step_ids, active, drafts, finished, stop)
            else:
                self._decode_step(step_ids, list(active))
            for slot, row, why, hit in finished:
                del active[slot]
                out[row] = self._finish(row, why, hit)
        return out

    def _take(self, row: int, token: int, logprob: float, stop: Sequence[str]) -> tuple[str, str | None] | None:
        """Appends a generated token to the row's segment; (why, stop string) when the segment ends with it."""
        part = self.partial[row]
        part.ids.append(token)
        part.logprobs.append(logprob)
        if row in self.drafts:
            self.drafts[row].extend((token,))
        if part.eos_ends and token in self.backend.eos_ids:
            return "eos", None
        hit = _find_stop(self.backend.tokenizer, part.ids, stop)
        if hit:
            return "stop", hit
        if len(part.ids) >= part.limit:
            return "length", None
        return None

    def _draft_step(self, step_ids: list[int], active: dict[int, int], drafts: dict[int, list[int]],
                    finished: list, stop: Sequence[str]) -> None:
        """A decode step that also scores each slot's drafts: every slot is fed its sampled token and its drafts
        (right-padded to the widest) in one forward pass; then, draft by draft, the token the row's sampler draws
        from the logits before the draft is compared with it, and the row keeps the drafts up to the first one its
        draw differs from. Greedy, that is the tokens one-at-a-time decoding would choose; sampling, a draft d is
        kept with probability p(d) and otherwise the next draw comes from p without d (``excluded``): speculative
        sampling with a draft of probability one (Leviathan et al. 2023, Chen et al. 2023), the same distribution.
        Columns past a row's kept tokens hold keys/values that its next tokens overwrite (its length says where)."""
        torch = self.torch
        width = 1 + max(len(d) for d in drafts.values())
        ids = torch.full((len(self.lengths), width), self.backend.pad_id, dtype=torch.long)
        ids[:, 0] = torch.tensor(step_ids, dtype=torch.long)
        for slot, draft in drafts.items():
            ids[slot, 1:1 + len(draft)] = torch.tensor(draft, dtype=torch.long)
        logits = self._forward(ids, None, self.lengths, torch.arange(width, device=self.device))
        self._logit_rows(logits)
        order = list(drafts)
        # every draft position of every slot, drawn in one call (a row's later draws go unused after a miss)
        slots_t = torch.tensor([s for s in order for _ in drafts[s]], dtype=torch.long, device=self.device)
        cols_t = torch.tensor([j for s in order for j in range(len(drafts[s]))], dtype=torch.long, device=self.device)
        chosen, logprob, _ = self._sample(logits[slots_t, cols_t].float())
        picks, logprobs = chosen.tolist(), logprob.tolist()
        kept = dict.fromkeys(active, 0)
        at = 0
        for slot in order:
            row = active[slot]
            for j, token in enumerate(drafts[slot]):
                if picks[at + j] != token:
                    self.excluded[row] = token
                    break
                kept[slot] += 1
                ended = self._take(row, token, logprobs[at + j], stop)
                if ended:
                    finished.append((slot, row, *ended))
                    break
            at += len(drafts[slot])
        index = torch.tensor(list(kept), dtype=torch.long, device=self.device)
        columns = torch.tensor(list(kept.values()), dtype=torch.long, device=self.device)
        self.next_logits[index] = logits[index, columns, :].float()
        for slot, n in kept.items():
            self.lengths[slot] += 1 + n
        self.tokens_processed += sum(1 + n for n in kept.values())
        self.decode_steps += 1

    def _finish(self, row: int, why: str, hit: str | None) -> Segment:
        part = self.partial.pop(row)
        self.leads[row] = (self.leads[row] + part.ids)[-_LEAD_WINDOW:]
        text = self.backend.tokenizer.decode(part.ids, skip_special_tokens=False)
        return Segment(part.ids, part.logprobs, text, why, hit, interventions=part.interventions)

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
        """Prefills each row's appended tokens into its own slot's columns, for those rows alone."""
        tokens = {r: list(t) for r, t in tokens.items() if t}
        if not tokens:
            return
        if any(r in self.partial for r in tokens):
            raise ValueError("append to a row whose segment is still in progress")
        for row, toks in tokens.items():
            self.leads[row] = (self.leads[row] + toks)[-_LEAD_WINDOW:]
            if row in self.drafts:
                self.drafts[row].extend(toks)
        self._feed([self.slot_of[r] for r in tokens], list(tokens.values()))

    def release(self, rows: Sequence[int]) -> None:
        """Rows that are done leave the batch: their slots are free for :meth:`add` (when half the batch is still
        free at the next ``generate``, the batch is compacted, so later decode steps cost less)."""
        for row in rows:
            self.blocks.pop(row, None)
            self.leads.pop(row, None)
            self.partial.pop(row, None)
            self.drafts.pop(row, None)
            self.excluded.pop(row, None)
            slot = self.slot_of.pop(row, None)
            if slot is not None:
                self.lengths[slot] = 0
                self.free.append(slot)
