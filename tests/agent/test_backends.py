"""The local KV-cached backend against itself and the OpenAI-compatible backend against the local server."""
import pytest

from kunlunlab.agent.backends import chat_prompt_ids, generate_once, text_ids
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.protocol import build_messages
from kunlunlab.agent.server import create_app
from kunlunlab.agent.transformers_backend import _shared_prefix_length
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "Name a primary colour."]


@pytest.fixture(scope="module")
def prompts(backend):
    return [chat_prompt_ids(backend.tokenizer, build_messages(q)) for q in QUESTIONS]


def test_batched_greedy_equals_one_prompt_at_a_time_and_hf_generate(backend, prompts):
    import torch

    assert _shared_prefix_length(prompts) > 32  # the system prompt is prefilled once for the batch
    batched = generate_once(backend, prompts, 24, stop=())
    for prompt, seg in zip(prompts, batched):
        alone = generate_once(backend, [prompt], 24, stop=())[0]
        assert alone.token_ids == seg.token_ids
        assert len(seg.logprobs) == len(seg.token_ids) and all(lp <= 0 for lp in seg.logprobs)
    reference = backend.model.generate(torch.tensor([prompts[0]]), max_new_tokens=len(batched[0].token_ids),
                                       do_sample=False)
    assert reference[0, len(prompts[0]):].tolist() == batched[0].token_ids


def test_appended_tokens_continue_like_a_fresh_prompt_despite_holes(backend, prompts):
    """Rows that wait leave masked holes; appended tokens are prefilled; nothing is re-encoded."""
    session = backend.open(prompts)
    first = session.generate([0, 1, 2], {0: 5, 1: 12, 2: 3}, stop=())  # different lengths leave holes
    extra = {0: text_ids(backend.tokenizer, "\n<result>\n(1) Paris is the capital.\n</result>\n"),
             2: text_ids(backend.tokenizer, " Also,")}
    session.append(extra)
    session.release([1])  # compaction in the middle of a rollout
    second = session.generate([0, 2], 10, stop=())
    for row in (0, 2):
        fresh_prompt = prompts[row] + first[row].token_ids + extra[row]
        fresh = generate_once(backend, [fresh_prompt], 10, stop=())[0]
        assert fresh.token_ids == second[row].token_ids


def test_stop_strings_end_a_row_and_are_kept(backend):
    prompt = chat_prompt_ids(backend.tokenizer, build_messages("Who directed Jaws?"),
                             "<think>I need to look this up.</think>\n<search>")
    seg = generate_once(backend, [prompt], 40)[0]
    assert seg.finish == "stop" and seg.stop_string == "</search>" and seg.text.endswith("</search>")


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


def test_openai_backend_reports_a_dead_server_clearly(backend):
    remote = OpenAIBackend(f"http://127.0.0.1:{free_port()}", backend.name, retries=0, timeout=2)
    with pytest.raises(GenerationServiceError, match="generation server"):
        generate_once(remote, [[1, 2, 3]], 4)


def test_decode_steps_write_into_the_cache_in_place(backend, prompts):
    """A decode step appends one column to each layer's buffer instead of copying the whole cache (torch.cat)."""
    session = backend.open(prompts)
    session.generate([0, 1, 2], 1, stop=())  # the first step grows the prefill-sized buffer once
    layer = session.cache.layers[0]
    buffer, filled = layer._k.data_ptr(), layer.keys.shape[-2]
    assert layer._k.shape[-2] > filled + 8  # spare room
    steps = max(len(seg.token_ids) for seg in session.generate([0, 1, 2], 8, stop=()).values())
    assert steps > 1 and layer._k.data_ptr() == buffer and layer.keys.shape[-2] == filled + steps


def test_shared_prefix_keeps_one_own_token_per_prompt_and_skips_short_ones():
    long = list(range(100))
    assert _shared_prefix_length([long + [7, 8], long + [9]]) == 100
    assert _shared_prefix_length([long, long + [5]]) == 99  # the shorter prompt keeps its last token
    assert _shared_prefix_length([long[:31] + [1], long[:31] + [2]]) == 0  # under 32 tokens: not worth a call
    assert _shared_prefix_length([long + [1]]) == 0  # a single prompt
