"""The local KV-cached backend against itself and the OpenAI-compatible backend against the local server."""
import pytest

from kunlunlab.agent.backends import chat_prompt_ids, generate_once, text_ids
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.protocol import build_messages
from kunlunlab.agent.server import create_app
from kunlunlab.agent.transformers_backend import _folded_mask, _shared_prefix_length
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "Name a primary colour."]


@pytest.fixture(scope="module")
def exact():
    """The embedded model in float32, for the tests of token-for-token equality between batch layouts: in bfloat16
    a batch's layout can flip a near-tie, and which ties flip depends on the CPU's kernels (on a 2-core EPYC with
    AVX512-BF16 "Who wrote Hamlet?" batched and alone begin with different tokens)."""
    from kunlunlab.agent.transformers_backend import TransformersBackend

    return TransformersBackend(dtype="float32")


@pytest.fixture(scope="module")
def prompts(backend):
    return [chat_prompt_ids(backend.tokenizer, build_messages(q)) for q in QUESTIONS]


def test_batched_greedy_equals_one_prompt_at_a_time_and_hf_generate(exact, prompts):
    import torch

    assert _shared_prefix_length(prompts) > 32  # the system prompt is prefilled once for the batch
    batched = generate_once(exact, prompts, 24, stop=())
    for prompt, seg in zip(prompts, batched):
        alone = generate_once(exact, [prompt], 24, stop=())[0]
        assert alone.token_ids == seg.token_ids
        assert len(seg.logprobs) == len(seg.token_ids) and all(lp <= 0 for lp in seg.logprobs)
    reference = exact.model.generate(torch.tensor([prompts[0]]), max_new_tokens=len(batched[0].token_ids),
                                       do_sample=False)
    assert reference[0, len(prompts[0]):].tolist() == batched[0].token_ids


def test_appended_tokens_continue_like_a_fresh_prompt_despite_holes(exact, prompts):
    """Rows that wait leave masked holes; appended tokens are prefilled; nothing is re-encoded."""
    session = exact.open(prompts)
    first = session.generate([0, 1, 2], {0: 5, 1: 12, 2: 3}, stop=())  # different lengths leave holes
    extra = {0: text_ids(exact.tokenizer, "\n<result>\n(1) Paris is the capital.\n</result>\n"),
             2: text_ids(exact.tokenizer, " Also,")}
    session.append(extra)
    session.release([1])  # compaction in the middle of a rollout
    second = session.generate([0, 2], 10, stop=())
    for row in (0, 2):
        fresh_prompt = prompts[row] + first[row].token_ids + extra[row]
        fresh = generate_once(exact, [fresh_prompt], 10, stop=())[0]
        assert fresh.token_ids == second[row].token_ids


def test_stop_strings_end_a_row_and_are_kept(backend):
    prompt = chat_prompt_ids(backend.tokenizer, build_messages("Who directed Jaws?"),
                             "<think>I need to look this up.</think>\n<search>")
    seg = generate_once(backend, [prompt], 40)[0]
    assert seg.finish == "stop" and seg.stop_string == "</search>" and seg.text.endswith("</search>")


def test_a_row_told_not_to_stop_at_eos_runs_to_its_limit_through_the_same_tokens(backend):
    """``stop_at_eos=False`` (a throughput comparison's plain side) decodes exactly the tokens it is asked for; up to
    EOS they are the tokens a normal call generates."""
    prompt = chat_prompt_ids(backend.tokenizer, build_messages("Who directed Jaws?"),
                             "<think>I need to look this up.</think>\n<search>")
    eos = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    normal = backend.open([prompt]).generate([0], 40, stop=())[0]
    assert normal.finish == "eos" and normal.token_ids[-1] == eos and len(normal.token_ids) < 40
    through = backend.open([prompt]).generate([0], 40, stop=(), stop_at_eos=False)[0]
    assert through.finish == "length" and len(through.token_ids) == 40
    assert through.token_ids[:len(normal.token_ids)] == normal.token_ids


def test_openai_backend_matches_the_local_backend_through_the_server(backend, prompts):
    with ServerThread(create_app(backend)) as url:
        remote = OpenAIBackend(url, backend.name)
        got = generate_once(remote, prompts[:2], 16, stop=())
        session = remote.open(prompts[:1])
        turn = session.generate([0], 40, stop=("</search>",))
    want = generate_once(backend, prompts[:2], 16, stop=())
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[0].logprobs == pytest.approx(want[0].logprobs, abs=1e-4)
    assert turn[0].token_ids and session.ids[0][len(prompts[0]):] == turn[0].token_ids


def test_openai_backend_without_a_model_id_sends_the_one_the_server_serves(backend):
    """``kunlunlab eval --llm-url URL --model <local path>``: the requests name the server's model id (vLLM
    answers 404 to another), the tokenizer is the local path's."""
    from kunlunlab.models import resolve_llm

    with ServerThread(create_app(backend, served_name="served-as-this")) as url:
        remote = OpenAIBackend(url, None, tokenizer_name=resolve_llm(None))
        assert remote.model == remote.name == "served-as-this"
        assert generate_once(remote, [[104, 105]], 2, stop=())[0].token_ids


def test_openai_backend_reports_a_dead_server_clearly(backend):
    remote = OpenAIBackend(f"http://127.0.0.1:{free_port()}", backend.name, retries=0, timeout=2)
    with pytest.raises(GenerationServiceError, match="generation server"):
        generate_once(remote, [[1, 2, 3]], 4)


def test_decode_steps_write_into_the_cache_in_place(backend, prompts):
    """A decode step writes one column per row into each layer's buffer instead of copying the whole cache."""
    session = backend.open(prompts)
    session.generate([0, 1, 2], 1, stop=())  # the first step may grow the prefill-sized buffer once
    layer = session.cache.layers[0]
    buffer, before = layer.keys.data_ptr(), {r: session.lengths[session.slot_of[r]] for r in range(3)}
    assert layer.keys.shape[-2] > max(before.values()) + 8  # spare room
    segments = session.generate([0, 1, 2], 8, stop=())
    assert layer.keys.data_ptr() == buffer
    assert {r: session.lengths[session.slot_of[r]] for r in range(3)} == \
        {r: before[r] + len(segments[r].token_ids) for r in range(3)}


def test_rows_continue_one_by_one_and_new_rows_take_free_slots(exact, prompts):
    """``until="any"`` returns as soon as one row ends; the others continue later under their first limit, and a
    row added to a finished one's slot generates what it generates alone (continuous batching)."""
    limits = {0: 4, 1: 9, 2: 6}
    session = exact.open(prompts[:2])
    first = session.generate([0, 1], limits, stop=(), until="any")
    assert list(first) == [0] and len(first[0].token_ids) == 4  # row 1 is still generating
    session.release([0])
    session.add([prompts[2]], [2])
    got = dict(first)
    while len(got) < 3:
        got.update(session.generate([r for r in (1, 2) if r not in got], limits, stop=(), until="any"))
    for row in range(3):
        assert got[row].token_ids == generate_once(exact, [prompts[row]], limits[row], stop=())[0].token_ids


def test_rows_with_the_same_prompt_prefill_it_once_and_continue_as_if_alone(exact, prompts):
    """An RL group's samples share their prompt: it is prefilled once, the other rows copy its keys/values, and each
    row generates what that prompt generates alone (greedy) or draws on its own (sampling)."""
    from kunlunlab.agent.backends import SamplingConfig

    batch = [prompts[0], prompts[1], prompts[0], prompts[0]]
    shared = _shared_prefix_length(batch)
    session = exact.open(batch)
    assert session.tokens_processed == shared + (len(prompts[0]) - shared) + (len(prompts[1]) - shared)
    out = session.generate(range(4), 12, stop=())
    alone = [generate_once(exact, [p], 12, stop=())[0].token_ids for p in prompts[:2]]
    assert [out[r].token_ids for r in range(4)] == [alone[0], alone[1], alone[0], alone[0]]
    session.release([1])
    session.add([prompts[2], prompts[2]], [4, 5])  # rows added later with one prompt: one prefill too
    later = session.generate([4, 5], 8, stop=())
    assert later[4].token_ids == later[5].token_ids == generate_once(exact, [prompts[2]], 8, stop=())[0].token_ids
    sampled = exact.open([prompts[0]] * 4, SamplingConfig(temperature=1.0, seed=3)).generate(range(4), 12, stop=())
    assert len({tuple(seg.token_ids) for seg in sampled.values()}) > 1


def test_released_rows_leave_and_the_batch_compacts_without_changing_the_others(exact, prompts):
    session = exact.open(prompts + prompts[:1])
    first = session.generate(range(4), 3, stop=())
    session.release([0, 2])
    second = session.generate([1, 3], 6, stop=())
    assert len(session.lengths) == 2 and sorted(session.slot_of) == [1, 3]  # two slots left, in the rows' order
    for row, prompt in ((1, prompts[1]), (3, prompts[0])):
        alone = generate_once(exact, [prompt], 9, stop=())[0].token_ids
        assert first[row].token_ids + second[row].token_ids == alone


def test_a_model_with_more_outputs_than_tokens_generates():
    """Qwen2.5-7B has 152064 outputs for 151665 tokenizer tokens: the session's logits follow the model's width."""
    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.models import load_llm
    from tiny_training import tiny_llama

    tokenizer = load_llm()[1]
    model = tiny_llama(tokenizer, vocab_size=len(tokenizer) + 64)
    backend = TransformersBackend(model=model, tokenizer=tokenizer, dtype="float32")
    prompts = [text_ids(tokenizer, "Question one\n"), text_ids(tokenizer, "Another, longer question two\n")]
    segments = generate_once(backend, prompts, 5, stop=())
    assert [len(s.token_ids) for s in segments] == [5, 5]
    assert model.lm_head.out_features == len(tokenizer) + 64


def test_shared_prefix_keeps_one_own_token_per_prompt_and_skips_short_ones():
    long = list(range(100))
    assert _shared_prefix_length([long + [7, 8], long + [9]]) == 100
    assert _shared_prefix_length([long, long + [5]]) == 99  # the shorter prompt keeps its last token
    assert _shared_prefix_length([long[:31] + [1], long[:31] + [2]]) == 0  # under 32 tokens: not worth a call
    assert _shared_prefix_length([long + [1]]) == 0  # a single prompt


@pytest.fixture
def fresh_accelerator_state():
    """accelerate keeps one state per process: a trainer that ran earlier in this pytest worker fixed its mixed
    precision, and a new ``Accelerator(mixed_precision="bf16")`` would be refused. Reset before and after."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_a_trainers_float32_policy_generates_in_its_bfloat16_copy_alone(fresh_accelerator_state):
    """GRPO's rollouts get the policy as the trainer left it: accelerate's autocast wrapper and TRL's fused LM head
    patched onto its ``forward``, TRL's keeping the original forward in a closure. The bfloat16 copy the backend
    makes must run its own weights: the float32 policy computes nothing during generation (when it did, every decode
    step cast the float32 weights under autocast, twice as slow), and the copy's layers see bfloat16."""
    import torch
    from accelerate import Accelerator
    from trl.trainer.utils import add_fused_lm_head

    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.models import load_llm
    from tiny_training import tiny_llama

    tokenizer = load_llm()[1]
    policy = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(tiny_llama(tokenizer))
    add_fused_lm_head(policy)
    policy_calls, copy_dtypes = [], []
    backend = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="bfloat16")
    policy.model.layers[0].register_forward_hook(lambda module, args, out: policy_calls.append(1))  # after the copy
    backend.model.model.layers[0].register_forward_pre_hook(
        lambda module, args, kwargs: copy_dtypes.append(args[0].dtype if args else kwargs["hidden_states"].dtype),
        with_kwargs=True)
    segments = generate_once(backend, [text_ids(tokenizer, "Question one\n")], 4, stop=())
    assert len(segments[0].token_ids) == 4
    assert policy_calls == []
    assert copy_dtypes and set(copy_dtypes) == {torch.bfloat16}
    assert next(policy.parameters()).dtype == torch.float32  # the policy itself is left as it was


def test_a_dropped_backend_frees_its_bfloat16_copy_at_once(fresh_accelerator_state):
    """The DAPO rollout makes a bfloat16 copy of the policy at every rollout call and drops it after. Accelerate's
    wrapper keeps the policy's ``forward`` as ``_original_forward``, a method bound to the model: copied, it tied
    the copy to itself, so each copy waited for Python's cycle collector, which a training process rarely runs (8
    DAPO steps of make run's recipe held 8 copies and rose 3.4 -> 6.4 GiB). Dropped, the copy must be freed at
    once, with no collection."""
    import gc
    import weakref

    from accelerate import Accelerator
    from trl.trainer.utils import add_fused_lm_head

    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.models import load_llm
    from tiny_training import tiny_llama

    tokenizer = load_llm()[1]
    policy = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(tiny_llama(tokenizer))
    add_fused_lm_head(policy)
    assert "_original_forward" in vars(policy)  # what ties a copy to itself, as accelerate leaves it
    backend = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="bfloat16")
    generate_once(backend, [text_ids(tokenizer, "Question one\n")], 2, stop=())
    copy_ref = weakref.ref(backend.model)
    gc.disable()
    try:
        del backend
        assert copy_ref() is None
    finally:
        gc.enable()


def test_cpu_sessions_attend_with_grouped_heads_and_generate_what_transformers_sdpa_does(monkeypatch):
    """A CPU backend's model runs SDPA with its key/value heads grouped (no copy of the cache per query group, which
    was half of an evaluation's time) and generates, with appended blocks and rows of different lengths, the same
    tokens and log-probs as transformers' own SDPA attention, which repeats the heads."""
    import torch
    import transformers.integrations.sdpa_attention as sdpa

    from kunlunlab.agent.transformers_backend import GQA_ATTENTION, TransformersBackend
    from kunlunlab.models import load_llm
    from tiny_training import tiny_llama

    tokenizer = load_llm()[1]
    policy = tiny_llama(tokenizer)  # 4 query heads, 2 key/value heads
    grouped = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="bfloat16")
    repeated = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="bfloat16")
    repeated.model.set_attn_implementation("sdpa")
    assert grouped.model.config._attn_implementation == GQA_ATTENTION
    copies = []
    real_repeat = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda states, n: copies.append(n) or real_repeat(states, n))
    slow_calls = []  # a mask with enable_gqa: one query head at a time over the cache (6x slower at a decode step)
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        slow_calls.append(kwargs.get("attn_mask") is not None and kwargs.get("enable_gqa", False))
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    prompts = [text_ids(tokenizer, "Question one\n"), text_ids(tokenizer, "Another, much longer question two\n")]
    block = text_ids(tokenizer, "\n<result>\n(1) Paris is the capital.\n</result>\n")
    out = {}
    for name, backend in (("grouped", grouped), ("repeated", repeated)):
        copies.clear()
        session = backend.open(prompts)
        first = session.generate([0, 1], {0: 6, 1: 11}, stop=())
        session.append({0: block})
        second = session.generate([0, 1], {0: 8, 1: 8}, stop=())
        out[name] = ([first[r].token_ids + second[r].token_ids for r in (0, 1)],
                     [lp for r in (0, 1) for lp in first[r].logprobs + second[r].logprobs], len(copies))
    assert out["grouped"][0] == out["repeated"][0]
    assert out["grouped"][1] == pytest.approx(out["repeated"][1], abs=1e-6)
    assert out["grouped"][2] == 0 and out["repeated"][2] > 0  # transformers' path copies the heads, ours does not
    assert slow_calls and not any(slow_calls)  # ours folds the query groups instead: the fused kernel, no copy


def test_a_borrowed_float32_model_generates_with_grouped_heads_and_keeps_its_own_attention(monkeypatch):
    """A training model already in the generation dtype (float32 on a CPU without native bfloat16) is used as it
    is, not copied: its session still attends with the heads grouped (it ran transformers' repeating SDPA, half
    as fast, in make run's evaluation after training), generates what transformers' attention generates, and
    the model is back on its own attention outside the session's calls (the trainer never sees ours)."""
    import transformers.integrations.sdpa_attention as sdpa

    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.models import load_llm
    from tiny_training import tiny_llama

    tokenizer = load_llm()[1]
    policy = tiny_llama(tokenizer).float()  # 4 query heads, 2 key/value heads; transformers' SDPA
    assert policy.config._attn_implementation == "sdpa"
    copies = []
    real_repeat = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda states, n: copies.append(n) or real_repeat(states, n))
    prompts = [text_ids(tokenizer, "Question one\n"), text_ids(tokenizer, "Another, much longer question two\n")]
    block = text_ids(tokenizer, "\n<result>\n(1) Paris is the capital.\n</result>\n")

    def generate(backend):
        session = backend.open(prompts)
        first = session.generate([0, 1], {0: 6, 1: 11}, stop=())
        assert policy.config._attn_implementation == "sdpa"  # between the session's calls: the model's own
        session.append({0: block})
        second = session.generate([0, 1], {0: 8, 1: 8}, stop=())
        return [first[r].token_ids + second[r].token_ids for r in (0, 1)]

    borrowed = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="float32")
    assert borrowed.model is policy  # not copied
    grouped_tokens = generate(borrowed)
    assert copies == []  # no key/value copy per query group in any of the session's forward calls
    assert policy.config._attn_implementation == "sdpa"
    repeated = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="float32")
    repeated.borrowed_attention = None  # transformers' own attention, as before the switch
    assert generate(repeated) == grouped_tokens
    assert copies  # transformers' path did copy the heads


def test_a_forwards_mask_is_folded_once_into_an_additive_mask_with_the_same_attention():
    """The grouped attention's mask: each query group's rows are the original rows, 0 where a key is seen and -inf
    where not; built once for the forward (the same mask object at every layer gives back the same folded
    tensor) and rebuilt for a new forward's mask; SDPA gives the same output with it as with the boolean one."""
    import torch

    seen = torch.tensor([[[[True, False, False], [True, True, False]]],
                         [[[True, True, False], [True, True, True]]]])  # (batch 2, 1, queries 2, keys 3)
    folded = _folded_mask(seen, q_len=2, groups=3, dtype=torch.bfloat16)
    inf = float("-inf")
    first = torch.tensor([[0.0, inf, inf], [0.0, 0.0, inf]] * 3)
    second = torch.tensor([[0.0, 0.0, inf], [0.0, 0.0, 0.0]] * 3)
    assert folded.shape == (2, 1, 6, 3) and folded.dtype == torch.bfloat16
    assert torch.equal(folded[0, 0].float(), first) and torch.equal(folded[1, 0].float(), second)
    assert _folded_mask(seen, q_len=2, groups=3, dtype=torch.bfloat16) is folded  # the next layer of the forward
    assert _folded_mask(seen.clone(), q_len=2, groups=3, dtype=torch.bfloat16) is not folded  # the next forward

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 1, 6, 8, generator=generator).to(torch.bfloat16) for _ in range(3))
    key, value = key[:, :, :3], value[:, :, :3]
    boolean = seen.expand(-1, -1, 2, -1).repeat(1, 1, 3, 1)
    assert torch.equal(torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=folded),
                       torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=boolean))
