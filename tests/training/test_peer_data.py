"""The cold start of a peer's recipe: the same mixed trajectories written in the peer's protocol. Read back with the
peer's own parser and answer extraction, each rendered trajectory asks the original's queries, shows the documents
each search retrieved in the peer's block, ends at the gold answer and keeps retrieved tokens out of the loss."""
import random
import re

import pytest

from kunlunlab.agent.protocols import get_protocol
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.training.mixing import MixingConfig, TrajectoryBuilder, mix, tokenize_trajectory
from kunlunlab.training.peer_data import render, render_all

PEERS = ("search_r1", "research", "r1_searcher")
PLAIN = {"rdra_background": False, "plan_samples": 0, "stie_feedback_share": 0.0}


@pytest.fixture(scope="module")
def builder(world):
    bm25 = build_retriever(world.passages, IndexConfig(kind="bm25"))
    return TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), top_k=2, max_result_chars=300)


@pytest.fixture(scope="module")
def tokenizer():
    from kunlunlab.models import load_llm

    return load_llm()[1]


def _queries(t):
    """The original trajectory's queries, in order (a multi-query search contributes each)."""
    return [q for seg in t.segments if seg["role"] == "model" for q in re.findall(r"<query>(.*?)</query>", seg["text"])]


@pytest.mark.parametrize("name", PEERS)
def test_a_rendered_trajectory_reads_back_as_the_original_in_the_peer_s_protocol(name, builder, questions):
    protocol = get_protocol(name)
    multi = next(ex for ex in questions if any(len(s) > 1 for s in ex.stage_groups()))  # parallel hops included
    for ex in [multi, *questions[:6]]:
        original = builder.world(ex)
        peer = render(original, protocol, 300)
        turns = [protocol.parse_turn(seg["text"] if k else protocol.assistant_prefix + seg["text"])
                 for k, seg in enumerate(s for s in peer.segments if s["role"] == "model")]
        assert [t.kind for t in turns[:-1]] == ["search"] * (len(turns) - 1) and turns[-1].kind == "answer"
        assert [q for t in turns for q in t.queries] == [q.strip() for q in _queries(original)]
        assert turns[-1].answer == ex.answers[0] and not any(t.issues for t in turns)
        assert protocol.final_answer("".join(s["text"] for s in peer.segments)) == ex.answers[0]
        # each search's documents are the ones the original retrieved, in the peer's own block
        env = [s for s in original.segments if s["role"] == "env"]
        blocks = [s["text"] for s in peer.segments if s["role"] == "env"]
        expected = [protocol.result_block([docs], [q], 300) for seg in env for q, docs in zip(seg["queries"],
                                                                                             seg["docs"])]
        assert blocks == expected
        assert peer.prompt_messages == protocol.messages(ex.question, original.background)
        assert peer.prefix == protocol.assistant_prefix and peer.end_with_eos


@pytest.mark.parametrize("name", PEERS)
def test_the_peer_s_format_check_passes_a_rendered_trajectory(name, builder, questions):
    protocol = get_protocol(name)
    for ex in questions[:6]:
        peer = render(builder.world(ex), protocol, 300)
        text = protocol.assistant_prefix + "".join(s["text"] for s in peer.segments)
        completion = text[len(protocol.assistant_prefix):] if name == "r1_searcher" else text
        assert protocol.format_ok(completion + ("<|im_end|>" if name == "research" else "")), (name, completion)


@pytest.mark.parametrize("name", PEERS)
def test_retrieved_tokens_stay_out_of_the_loss(name, builder, questions, tokenizer):
    protocol = get_protocol(name)
    peer = render(builder.world(questions[0]), protocol, 300)
    row = tokenize_trajectory(tokenizer, peer)
    trained = tokenizer.decode([i for i, m in zip(row["input_ids"], row["completion_mask"]) if m])
    for seg in peer.segments:
        if seg["role"] == "env":
            assert seg["text"].strip()[:40] not in trained
    assert row["completion_mask"][-1] == 1 and row["input_ids"][-1] == tokenizer.eos_token_id


def test_noisy_mixtures_render_with_masked_turns_kept_masked(builder, questions):
    trajectories = mix(builder, questions, MixingConfig(**PLAIN, epochs=2, turning_epoch=1, samples_per_epoch=16,
                                                        first_turn_samples=2), seed=0)
    assert any(not s["train"] for t in trajectories for s in t.segments if s["role"] == "model")  # wrong hops
    for name in PEERS:
        rendered = render_all(trajectories, get_protocol(name), 300)
        assert len(rendered) == len(trajectories)
        for original, peer in zip(trajectories, rendered):
            masked = sum(not s["train"] for s in original.segments if s["role"] == "model")
            assert sum(not s["train"] for s in peer.segments if s["role"] == "model") >= masked
    assert render_all(trajectories, get_protocol("search_think"), 300) == trajectories
