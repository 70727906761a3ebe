"""Adding an agent takes one protocol and nothing else (docs/contributing.md, "Adding an agent"): a protocol
defined here alone, a tiny "bracket" protocol (``[search]…[/search]``, ``[docs]…[/docs]``, ``[answer]…[/answer]``)
with its own SFT turns and an exact-match reward, once registered is a method that runs end to end, an agent the
training config takes, SFT data and a reward the training reads, and a recipe that trains and is evaluated at smoke
size. No registry is edited: each reads the protocol registry, and the protocol leaves every one when the test
ends."""
import json
import re

import pytest

from kunlunlab.agent.backends import chat_prompt_ids
from kunlunlab.agent.methods import METHODS, PEER_METHODS, MethodConfig, make_method
from kunlunlab.agent.protocol import Turn
from kunlunlab.agent.protocols import AgentProtocol, PROTOCOLS, get_protocol, registered
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.data.answers import exact_match
from kunlunlab.eval.harness import EvalConfig, evaluate
from kunlunlab.paths import read_jsonl
from kunlunlab.training.config import AGENT_METHODS, load_config
from kunlunlab.training.peer_data import render, render_all
from kunlunlab.training.peer_rewards import PEER_REWARDS, peer_reward_functions
from kunlunlab.training.rewards import REWARD_KINDS, RewardConfig, reward_functions
from scripted import CountingSearch, ScriptedBackend

SYSTEM = ("Answer the question. To look something up write [search] query [/search]; the documents come back "
          "between [docs] and [/docs]. Give the final answer as [answer] answer [/answer].")
DOCS = "\n[docs]\n{}\n[/docs]\n"


def _parse(text: str) -> Turn:
    """The first closed ``[search]``/``[answer]`` is the turn's action; never raises."""
    m = re.search(r"\[(search|answer)\](.*?)\[/\1\]", text, re.S)
    if m is None:
        opened = [tag for tag in ("search", "answer") if f"[{tag}]" in text]
        return Turn("incomplete", issues=[f"unclosed:{opened[0]}"]) if opened else Turn("none", issues=["no_action"])
    content = m.group(2).strip()
    if m.group(1) == "answer":
        return Turn("answer", answer=content or None, answer_mode="short", issues=[] if content else ["empty_answer"])
    return Turn("search", queries=[content]) if content else Turn("invalid", issues=["empty_query"])


def _final_answer(text: str) -> str | None:
    answers = re.findall(r"\[answer\](.*?)\[/answer\]", text, re.S)
    return answers[-1].strip() if answers else None


def _format_ok(text: str) -> bool:
    """One answer, at the end; every search answered by documents."""
    return text.count("[answer]") == 1 and text.rstrip().endswith("[/answer]") and \
        text.count("[search]") == text.count("[docs]")


def exact_match_reward(text: str, golds) -> float:
    answer = _final_answer(text)
    return float(answer is not None and _format_ok(text) and exact_match(answer, list(golds)) == 1.0)


BRACKET = AgentProtocol(
    name="bracket", source="tests/agent/test_adding_an_agent.py", assistant_prefix="",
    stop_strings=("[/search]", "[/answer]"),
    build_messages=lambda q, bg: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
    build_base_prompt=None,
    format_docs=lambda docs, queries: DOCS.format("\n".join(d for group in docs for d in group) or "(none)"),
    wrap_notice=DOCS.format, parse_turn=_parse, final_answer=_final_answer, format_ok=_format_ok,
    env_pattern=r"\n\[docs\]\n.*?\n\[/docs\]\n", invalid_block=None, reprompt=(), top_k=2, max_searches=3,
    render_search=lambda think, query: f"{think} [search] {query} [/search]",
    render_answer=lambda think, answer: f"{think} [answer] {answer} [/answer]",
    rewards={"bracket": exact_match_reward})

SEARCH_TURN = "I need the founder. [search] founder of Shylcel [/search]"
ANSWER_TURN = "Found. [answer] Qxzzyv [/answer]"


@pytest.fixture
def bracket():
    with registered(BRACKET):
        yield BRACKET
    assert "bracket" not in PROTOCOLS  # nothing leaks into the other tests


@pytest.fixture(scope="module")
def tokenizer():
    from kunlunlab.models import load_llm

    return load_llm()[1]


def test_a_registered_protocol_is_in_every_registry_and_leaves_them_after(bracket):
    assert get_protocol("bracket") is bracket
    assert "bracket" in METHODS and "bracket" in PEER_METHODS and "bracket" in AGENT_METHODS
    assert "bracket" in REWARD_KINDS and PEER_REWARDS["bracket"] is exact_match_reward
    assert METHODS["bracket"].protocol == "bracket" and METHODS["bracket"] is METHODS["bracket"]
    with pytest.raises(ValueError, match="registered already"):
        with registered(AgentProtocol(**{**bracket.__dict__, "rewards": {}})):
            pass
    assert get_protocol("bracket") is bracket


def test_a_peer_protocol_may_not_take_a_methods_name():
    with pytest.raises(ValueError, match="'naive_rag' is a method already"):
        with registered(AgentProtocol(**{**BRACKET.__dict__, "name": "naive_rag", "rewards": {}})):
            pass
    assert "naive_rag" not in PROTOCOLS and METHODS["naive_rag"].name == "naive_rag"


def test_no_registry_keeps_a_protocol_after_its_test():
    assert "bracket" not in PROTOCOLS and "bracket" not in METHODS and "bracket" not in PEER_METHODS
    assert "bracket" not in AGENT_METHODS and "bracket" not in REWARD_KINDS and "bracket" not in PEER_REWARDS


def test_the_new_method_runs_a_search_and_answers_in_its_protocol(bracket, tokenizer):
    backend = ScriptedBackend(tokenizer, {0: [SEARCH_TURN, ANSWER_TURN]})
    searches = CountingSearch()
    method = make_method("bracket", backend, searches, MethodConfig(rollout=RolloutConfig(top_k=2)))
    (out,) = method.run(["Who founded Shylcel?"])
    assert searches.calls == [["founder of Shylcel"]]
    assert out.prediction == "Qxzzyv" and out.searches == 1 and out.trajectory["protocol"] == "bracket"
    assert out.trajectory["answer_source"] == "answer_tag"
    block = bracket.result_block(searches([["founder of Shylcel"]][0], 2), ["founder of Shylcel"])
    assert block.startswith("\n[docs]\n") and block in out.trajectory["text"]
    assert bracket.format_ok(out.trajectory["text"])  # the documents are environment text, masked out
    env = "".join(text for text, is_env in bracket.spans(out.trajectory["text"]) if is_env)
    assert env == block
    prompt = chat_prompt_ids(tokenizer, bracket.messages("Who founded Shylcel?"))
    assert tokenizer.decode(prompt).count(SYSTEM) == 1


def test_the_new_method_is_evaluated_by_the_harness_on_a_tiny_model(bracket, tiny_model, world, questions,
                                                                    tmp_path):
    from kunlunlab.agent.transformers_backend import TransformersBackend

    config = EvalConfig(dataset="world", method="bracket", limit=2, index_kind="bm25", model=tiny_model,
                        rollout=RolloutConfig(max_total_tokens=96, max_turn_tokens=32))
    summary = evaluate(config, tmp_path / "out.jsonl", backend=TransformersBackend(tiny_model), examples=questions[:2],
                       passages=world.passages, progress=False)
    assert summary["n"] == 2 and summary["method"] == "bracket"
    records = read_jsonl(tmp_path / "out.jsonl")
    assert [r["trajectory"]["protocol"] for r in records] == ["bracket", "bracket"]


def test_the_training_config_takes_the_new_agent_with_its_reward(bracket):
    cfg = load_config(None, ["agent.method=bracket", "rewards.kind=bracket", "eval.method=bracket", "top_k=null"])
    assert cfg.agent.protocol == "bracket" and cfg.passages_per_search == 2 and cfg.search_limit(1024) == 3
    with pytest.raises(ValueError, match="does not read"):  # the dual-mode reward reads another protocol
        load_config(None, ["agent.method=bracket", "rewards.kind=kunlun", "eval.method=bracket"])
    with pytest.raises(ValueError, match="eval.method=bracket"):  # a peer's agent is evaluated in its protocol
        load_config(None, ["agent.method=bracket", "rewards.kind=bracket", "eval.method=kunlun"])
    with pytest.raises(ValueError, match="does not read"):  # and its reward reads no other
        load_config(None, ["agent.method=research", "rewards.kind=bracket", "eval.method=research"])


def test_the_sft_data_and_the_reward_are_the_new_protocol_s(bracket, world, questions):
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.training.mixing import MixingConfig, TrajectoryBuilder

    bm25 = build_retriever(world.passages, IndexConfig(kind="bm25"))
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(rdra_background=False, plan_samples=0,
                                                                          stie_feedback_share=0.0),
                                top_k=2, max_result_chars=300)
    originals = [builder.world(ex) for ex in questions[:3]]
    rendered = render_all(originals, bracket, 300)
    assert len(rendered) == 3 and rendered[0] == render(originals[0], bracket, 300)
    for t, ex in zip(rendered, questions[:3]):
        text = "".join(s["text"] for s in t.segments)
        assert "[search]" in text and "\n[docs]\n" in text and "<search>" not in text and "<result>" not in text
        assert bracket.final_answer(text) == ex.answers[0] and bracket.format_ok(text)
        assert all(not s["train"] for s in t.segments if s["role"] == "env")
        assert t.prompt_messages == bracket.messages(ex.question, None) and t.prefix == ""
        (reward,) = peer_reward_functions("bracket")
        assert reward([None], [text], answers=[ex.answers]) == [1.0]
        assert reward([None], [text], answers=[["someone else"]]) == [0.0]
    functions = reward_functions(RewardConfig(kind="bracket", overlong_shaping=False))
    assert [f.__name__ for f in functions] == ["bracket_reward"]


@pytest.mark.slow
def test_the_new_agent_trains_at_smoke_size_and_is_evaluated_in_its_protocol(bracket, tiny_model, tmp_path):
    from kunlunlab.training.pipeline import run_config, train

    cfg = run_config(None, {"agent.method": "bracket", "rewards.kind": "bracket", "eval.method": "bracket",
                            "model": tiny_model, "eval.before": False, "hotpot": False, "eval.summary_questions": 0,
                            "mixing.plan_samples": 0, "mixing.stie_feedback_share": 0.0}, smoke=True)
    train(cfg, tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["steps"]["sft"] > 0 and state["steps"]["dapo"] == 1
    texts = ["".join(s["text"] for s in t["segments"]) for t in read_jsonl(tmp_path / "trajectories.jsonl")]
    assert texts and all("[answer]" in text and "<short_answer>" not in text for text in texts)
    assert any("\n[docs]\n" in text for text in texts)
    log = read_jsonl(tmp_path / "dapo_log.jsonl")
    assert any(k.startswith("rewards/bracket_reward") for row in log for k in row), log
    records = read_jsonl(tmp_path / "eval_after_world.jsonl")
    assert records and all(r["trajectory"]["protocol"] == "bracket" for r in records)
    assert json.loads((tmp_path / "dapo" / "final" / "kunlunlab_agent.json").read_text())["method"] == "bracket"
