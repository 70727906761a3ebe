"""The rollout engine: exact token mask, one retrieval call per turn, limits, and a dead search service."""
import pytest

from kunlunlab.agent.backends import chat_prompt_ids, text_ids
from kunlunlab.agent.protocol import build_messages
from kunlunlab.agent.rollout import NewSample, RolloutConfig, RolloutEngine
from kunlunlab.retrieval.client import RetrievalClient, free_port
from scripted import ContinuingScriptedBackend, CountingSearch, ScriptedBackend, interleaved


SCRIPTS = [
    ["<think>first hop</think><search><query>alpha film</query></search>",
     "<think>second</think><search><query>beta person</query><query>gamma city</query></search>",
     "<short_answer>\\boxed{Delta}</short_answer>"],
    ["<think>x</think><search><query>omega</query></search>", "<short_answer>\\boxed{Omega}</short_answer>"],
    ["I just answer: \\boxed{42}"],
]


@pytest.fixture
def tokenizer(backend):
    return backend.tokenizer


def test_mask_is_exact_and_all_queries_of_a_turn_go_in_one_call(tokenizer):
    search = CountingSearch()
    backend = ScriptedBackend(tokenizer, SCRIPTS)
    trajs = RolloutEngine(backend, search, RolloutConfig(top_k=2)).run([[1, 2], [3], [4]], ["q0", "q1", "q2"])
    assert search.calls == [["alpha film", "omega"], ["beta person", "gamma city"]]
    for i, t in enumerate(trajs):
        model_ids = [text_ids(tokenizer, s) for s in SCRIPTS[i]]
        env_ids = backend.appended.get(i, [])
        assert (t.completion_ids, t.mask) == interleaved(model_ids, env_ids)
        assert sum(t.mask) == sum(len(x) for x in model_ids)
    assert trajs[0].answer == "Delta" and trajs[0].n_searches == 2 and trajs[0].finish == "answer"
    assert trajs[0].queries == [["alpha film"], ["beta person", "gamma city"]]
    assert trajs[0].doc_ids[1] == ["beta person-0", "beta person-1", "gamma city-0", "gamma city-1"]
    assert "passage 0 about gamma city" in trajs[0].text and "Query 2: gamma city" in trajs[0].text
    assert trajs[2].answer == "42" and "missing_answer_tag" in trajs[2].issues
    assert trajs[0].rounds[0].answer == "Delta" and trajs[0].rounds[0].doc_ids[-1] == "gamma city-1"


def test_search_limit_repeated_queries_and_budget(tokenizer):
    loop = ["<search><query>same thing</query></search>"] * 6
    backend = ScriptedBackend(tokenizer, [loop, ["<search>" + "word " * 400]])
    search = CountingSearch()
    trajs = RolloutEngine(backend, search, RolloutConfig(max_searches=2, max_total_tokens=300)).run(
        [[1], [2]], ["a", "b"])
    assert search.calls == [["same thing"]]  # the repeat is blocked, not searched again
    assert "repeated_query" in trajs[0].issues and trajs[0].n_searches == 2
    assert trajs[0].finish == "search_limit" and "Search limit (2) reached" in trajs[0].text
    assert trajs[1].finish == "budget" and len(trajs[1].completion_ids) <= 300


def test_a_dead_search_service_gives_a_defined_fallback(tokenizer, caplog):
    dead = RetrievalClient(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0, backoff=0)
    backend = ScriptedBackend(tokenizer, [SCRIPTS[1]])
    traj = RolloutEngine(backend, dead.search).run([[1]], ["q"])[0]
    assert traj.answer == "Omega" and traj.search_errors and "unavailable" in traj.search_errors[0]
    assert "(search unavailable:" in traj.text
    assert any("search failed" in r.message for r in caplog.records)


def test_real_model_rollout_masks_exactly_the_result_tokens(backend, world, world_retriever, questions):
    qs = [q.question for q in questions[:3]]
    prefix = "<think>I need to look this up.</think>\n<search>"
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), prefix) for q in qs]
    engine = RolloutEngine(backend, world_retriever.search, RolloutConfig(max_total_tokens=200, max_turn_tokens=48))
    trajs = engine.run(prompts, qs, prefixes=[prefix] * 3)
    assert engine.stats.retrieval_calls >= 1
    for t in trajs:
        assert len(t.mask) == len(t.completion_ids) <= 200
        result_steps = [s for s in t.steps if s["kind"] == "result"]
        if result_steps:
            ids = text_ids(backend.tokenizer, result_steps[0]["text"])
            start = next(i for i in range(len(t.mask)) if t.mask[i] == 0)
            assert t.completion_ids[start:start + len(ids)] == ids
            assert t.mask[start:start + len(ids)] == [0] * len(ids)
            assert all(m == 1 for m in t.mask[:start])


def test_a_full_batch_of_continuing_rows_gives_each_sample_its_own_trajectory(backend, world_retriever, questions,
                                                                              monkeypatch):
    """Two rows at a time over four questions: samples continue one by one and finished ones hand their slot to the
    next question, yet each trajectory is the one the question gets alone (greedy). One token a decode step: with
    drafts, rows ending their turns on the same step are searched together (test_draft_lookup.py covers drafts)."""
    monkeypatch.setattr(backend, "draft_tokens", 0)
    qs = [q.question for q in questions[:4]]
    prefix = "<think>I need to look this up.</think>\n<search>"
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), prefix) for q in qs]
    config = RolloutConfig(max_total_tokens=200, max_turn_tokens=48, result_suffix=prefix)
    engine = RolloutEngine(backend, world_retriever.search, config)
    together = engine.run(prompts, qs, prefixes=[prefix] * 4, max_batch=2)
    assert engine.stats.retrieval_calls >= 4  # searches as samples reach them, not once per lock-step turn
    for prompt, q, t in zip(prompts, qs, together):
        alone = RolloutEngine(backend, world_retriever.search, config).run([prompt], [q], prefixes=[prefix])[0]
        assert t.completion_ids == alone.completion_ids and t.mask == alone.mask and t.finish == alone.finish


def test_each_samples_queries_go_to_its_own_search_one_call_per_search_and_turn(tokenizer):
    world, real = CountingSearch(), CountingSearch()
    backend = ScriptedBackend(tokenizer, SCRIPTS)
    trajs = RolloutEngine(backend, world, RolloutConfig(top_k=1)).run([[1, 2], [3], [4]], ["q0", "q1", "q2"],
                                                                      searches=[None, real, None])
    assert world.calls == [["alpha film"], ["beta person", "gamma city"]]
    assert real.calls == [["omega"]]
    assert trajs[1].doc_ids == [["omega-0"]] and trajs[1].answer == "Omega"
    with pytest.raises(ValueError, match="2 searches for 3 prompts"):
        RolloutEngine(backend, world).run([[1], [2], [3]], ["a", "b", "c"], searches=[None, None])


def test_samples_a_feed_adds_join_the_running_batch_as_rows_free_up(tokenizer):
    """A quick sample finishes at step 2 of a batch whose slowest turn takes 10: the sample the feed adds then
    takes its row at once (not after the batch), searches its own search and ends up last in the result."""
    turns = {"quick": [("<short_answer>\\boxed{A}</short_answer>", 2)],
             "slow": [("<short_answer>\\boxed{B}</short_answer>", 10)],
             "added": [("<search><query>gamma</query></search>", 3), ("<short_answer>\\boxed{C}</short_answer>", 1)]}
    backend = ContinuingScriptedBackend(tokenizer, lambda prompt, turn, row: turns[prompt][turn])
    own, asked = CountingSearch(), []

    def feed(trajs, done):
        asked.append((len(trajs), list(done)))
        return [NewSample(text_ids(tokenizer, "added"), "q-added", "", own)] if done == [0] else []

    prompts = [text_ids(tokenizer, "quick"), text_ids(tokenizer, "slow")]
    trajs = RolloutEngine(backend, CountingSearch(), RolloutConfig(top_k=1)).run(prompts, ["q-quick", "q-slow"],
                                                                                 feed=feed)
    assert [t.question for t in trajs] == ["q-quick", "q-slow", "q-added"]
    assert [t.answer for t in trajs] == ["A", "B", "C"]
    assert backend.added == [(2, [2])]  # joined when the quick one ended, in its row
    assert (6, 2) in backend.ended and (10, 1) in backend.ended  # the added sample was done before the slow one
    assert own.calls == [["gamma"]] and trajs[2].doc_ids == [["gamma-0"]]
    assert asked[0] == (2, [0]) and sorted(i for _, done in asked for i in done) == [0, 1, 2]
    with pytest.raises(ValueError, match="no feed"):
        RolloutEngine(ScriptedBackend(tokenizer, SCRIPTS), CountingSearch()).run([[1]], ["q"], feed=feed)
