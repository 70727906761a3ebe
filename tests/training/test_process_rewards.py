"""ReasonRAG's MCTS + SPRE step preferences (arXiv 2505.14069) on a scripted backend: UCT, SPRE values by hand,
dead branches, pair rules, the three value sources, and expansion resumed from a node's exact token ids in one
batched call across trees."""
import json
import math
import re

import httpx
import pytest

from kunlunlab.agent.backends import text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE
from kunlunlab.agent.rollout import RolloutConfig, result_block
from kunlunlab.http.client import free_port
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.training.path_judge import JudgeUnavailableError, PathJudge
from kunlunlab.training.preferences import preference_pairs, read_preferences, write_preferences, write_trees
from kunlunlab.training.process_rewards import (MCTSConfig, SearchTree, StepNode, StepTreeSearch, gold_coverage,
                                                refresh_values, select_child, spre_reward, uct_score)
from scripted import CharTokenizer, CountingSearch, PrefixScriptedBackend

TOK = CharTokenizer()
RIGHT = "<think>found it</think><short_answer>\\boxed{Paris}</short_answer>"
AGAIN = "<think>again</think><search><query>something else</query></search>"


def search_turn(topic):
    return f"<think>first hop</think><search><query>{topic} author</query></search>"


def wrong_turn(topic):
    return f"<think>guess {topic}</think><short_answer>\\boxed{{Rome}}</short_answer>"


def script(text, row):
    """Turn by number of searches so far; the two samples of an expansion (rows 2j, 2j+1) differ."""
    topic = re.search(r"Question: (\w+)\?", text).group(1)
    n = text.split("<assistant>")[-1].count("</search>")  # searches in the reply (the system prompt shows one)
    if n == 0:
        return [search_turn(topic), wrong_turn(topic)][row % 2]
    if n == 1:
        return [RIGHT, f"<think>more</think><search><query>{topic} birthplace</query></search>"][row % 2]
    return AGAIN  # from the second search on, this branch never answers


def prompt(topic):
    return text_ids(TOK, f"<user>Question: {topic}?</user><assistant><think>")


def make(config=None, **kw):
    backend = PrefixScriptedBackend(TOK, script)
    search = CountingSearch()
    rollout = RolloutConfig(top_k=1, max_turn_tokens=200, max_total_tokens=2000)
    cfg = config or MCTSConfig(iterations=4, children_per_node=2, max_depth=3, c_uct=1.0, alpha=0.9)
    return StepTreeSearch(backend, search, rollout, cfg, **kw), backend, search


def tree_for(ts, topic="alpha"):
    return ts.new_tree(f"Question: {topic}?", ["Paris"], prompt(topic), carry="<think>",
                       supporting_ids=[f"{topic} author-0", f"{topic} birthplace-0"], tree_id=topic)


def kids(node):
    by = {}
    for c in node.children:
        by[c.action + (":" + c.answer if c.answer else "")] = c
    return by


def test_uct_picks_the_right_child_on_hand_set_values():
    parent = StepNode(prefix_ids=[1], visits=10)
    a = StepNode(prefix_ids=[1], value=0.5, visits=5, parent=parent)
    b = StepNode(prefix_ids=[1], value=0.4, visits=1, parent=parent)
    parent.children = [a, b]
    assert uct_score(a, 10, 1.0) == pytest.approx(0.5 + math.sqrt(math.log(10) / 5))
    assert select_child(parent, 1.0) is b          # 0.4 + 1.517 beats 0.5 + 0.679: exploration wins
    assert select_child(parent, 0.0) is a          # no exploration: the higher value wins
    c = StepNode(prefix_ids=[1], value=0.0, visits=0, parent=parent)
    parent.children.append(c)
    assert select_child(parent, 0.0) is c          # an unvisited child is tried first


def test_spre_values_and_visit_weighted_means_by_hand():
    assert spre_reward("Paris", ["Paris"], 2, 0.9) == pytest.approx(0.81)
    assert spre_reward("Paris France", ["Paris"], 1, 0.9) == pytest.approx(0.9 * 2 / 3)  # F1 2/3 at depth 1
    assert spre_reward(None, ["Paris"], 1, 0.9) == 0.0
    root = StepNode(prefix_ids=[0])
    s1 = StepNode(prefix_ids=[0], depth=1, action="search", parent=root)
    a0 = StepNode(prefix_ids=[0], depth=1, action="answer", finish="answer", visits=1, parent=root,
                  value=spre_reward("Paris France", ["Paris"], 1, 0.9))
    right = StepNode(prefix_ids=[0], depth=2, action="answer", finish="answer", visits=3, parent=s1,
                     value=spre_reward("Paris", ["Paris"], 2, 0.9))
    dead = StepNode(prefix_ids=[0], depth=2, action="search", finish="depth", visits=1, value=0.0, parent=s1)
    root.children, s1.children = [s1, a0], [right, dead]
    refresh_values(s1)
    assert (s1.visits, s1.value) == (4, pytest.approx((3 * 0.81 + 0) / 4))
    assert (root.visits, root.value) == (5, pytest.approx((4 * s1.value + 0.6) / 5))


def test_mcts_values_pairs_and_expansion_by_hand(tmp_path):
    ts, backend, search = make()
    tree = tree_for(ts)
    ts.run([tree])
    root = tree.root
    s1, wrong = kids(root)["search"], kids(root)["answer:Rome"]
    right, s2 = kids(s1)["answer:Paris"], kids(s1)["search"]
    # iterations: expand root; expand s1; revisit `right` (terminal); expand s2, whose only child searches at max depth
    assert backend.generate_calls == 3 and len(backend.opened) == 3
    assert wrong.value == 0.0 and wrong.f1 == 0.0 and wrong.depth == 1
    assert right.value == pytest.approx(0.81) and right.visits == 2 and right.reward == pytest.approx(0.81)
    assert s2.estimate == pytest.approx(1.0 * 0.9 ** 3)  # both gold passages retrieved at depth 2: gold source
    assert [c.finish for c in s2.children] == ["depth"] and s2.value == 0.0  # never answers: 0, duplicates merged
    assert ts.stats.merged_duplicates == 1
    assert s1.visits == 3 and s1.value == pytest.approx((2 * 0.81 + 0.0) / 3)
    assert root.visits == 4 and root.value == pytest.approx(3 * s1.value / 4)

    # expansion resumed from the node's exact token ids; the environment block is the engine's
    assert backend.opened[0] == [tree.root.prefix_ids] * 2
    assert backend.opened[1] == [s1.prefix_ids] * 2 and backend.opened[2] == [s2.prefix_ids] * 2
    hits = [Hit("alpha author-0", "passage 0 about alpha author", 1.0)]
    assert s1.env_text == result_block([hits], ["alpha author"], ts.rollout.max_result_chars)
    assert s1.prefix_ids == prompt("alpha") + text_ids(TOK, search_turn("alpha")) + text_ids(TOK, s1.env_text)
    assert s1.step_ids == text_ids(TOK, search_turn("alpha")) and s1.doc_ids == ["alpha author-0"]
    assert s2.env_text.endswith(RESULT_TEMPLATE.format(results=ts.config.force_answer_notice))  # last allowed step next
    assert search.calls == [["alpha author"], ["alpha birthplace"]]

    pairs = preference_pairs([tree])
    assert len(pairs) == 2 and all(p.cross_action for p in pairs)
    top = next(p for p in pairs if p.depth == 1)  # search more (0.54) over a wrong answer now (0)
    assert (top.chosen_action, top.rejected_action) == ("search", "answer")
    assert top.prompt_ids == root.prefix_ids and top.chosen_ids == s1.step_ids and top.rejected_ids == wrong.step_ids
    low = next(p for p in pairs if p.depth == 2)  # answer now (0.81) over searching on (0)
    assert (low.chosen_action, low.rejected_action) == ("answer", "search")
    assert low.prompt_ids == s1.prefix_ids and low.chosen_value == pytest.approx(0.81) and low.rejected_value == 0.0
    assert low.prompt_text == tree.prompt_text + s1.text + s1.env_text

    assert write_preferences(tmp_path / "preferences.jsonl", pairs) == 2
    rows = read_preferences(tmp_path / "preferences.jsonl")
    assert rows[0]["chosen_ids"] == pairs[0].chosen_ids and rows[0]["cross_action"] and "gap" in rows[0]
    write_trees(tmp_path / "trees.jsonl", [tree])
    saved = json.loads((tmp_path / "trees.jsonl").read_text())
    assert saved["root"]["visits"] == 4 and len(saved["root"]["children"]) == 2 and saved["n_nodes"] == 6
    assert {c["action"] for c in saved["root"]["children"]} == {"search", "answer"}


def test_batched_expansion_across_two_trees_is_one_backend_call():
    ts, backend, search = make(MCTSConfig(iterations=1, children_per_node=2, max_depth=3))
    trees = [tree_for(ts, "alpha"), tree_for(ts, "beta")]
    ts.run(trees)
    assert backend.generate_calls == 1 and backend.opened == [[prompt("alpha")] * 2 + [prompt("beta")] * 2]
    assert search.calls == [["alpha author", "beta author"]]  # every query of the turn in one retrieval call
    assert all(len(t.root.children) == 2 for t in trees)


def test_pairs_need_a_gap_of_at_least_001_and_different_contents():
    parent = StepNode(prefix_ids=[7, 8])
    texts = {"a": ("X search", "search", 0.5), "b": ("Y answer", "answer", 0.505), "c": ("X search", "search", 0.1),
             "d": ("Z search", "search", 0.49)}
    nodes = {}
    for name, (text, action, value) in texts.items():
        nodes[name] = StepNode(prefix_ids=[], depth=1, step_ids=text_ids(TOK, text), text=text, action=action,
                               value=value, visits=1, parent=parent)
    parent.children = list(nodes.values())
    tree = SearchTree("t", "q", ["x"], parent)
    got = {(p.chosen_text, p.rejected_text) for p in preference_pairs([tree])}
    # a-b: gap 0.005 < 0.01; a-c: same content; a-d: gap exactly 0.01 counts
    assert got == {("Y answer", "X search"), ("X search", "Z search"), ("Y answer", "Z search"),
                   ("Z search", "X search")}
    assert ("Y answer", "X search") in got  # the cross-action pair (answer now vs search more) is kept
    assert all(p.chosen_action == "search" for p in preference_pairs([tree], cross_action=False))


def test_gold_value_source_on_a_hand_made_path():
    assert gold_coverage(["a", "x", "b"], ["a", "b", "c"]) == pytest.approx(2 / 3)
    assert gold_coverage(["a"], []) is None
    ts, _, _ = make()
    root = StepNode(prefix_ids=[1])
    s1 = StepNode(prefix_ids=[1, 2], depth=1, action="search", doc_ids=["a", "x"], parent=root)
    s2 = StepNode(prefix_ids=[1, 2, 3], depth=2, action="search", doc_ids=["b"], parent=s1)
    tree = SearchTree("t", "q", ["x"], root, supporting_ids=["a", "b", "c"])
    assert ts.gold_value(tree, s1) == pytest.approx(1 / 3 * 0.9 ** 2)
    assert ts.gold_value(tree, s2) == pytest.approx(2 / 3 * 0.9 ** 3)  # the answer could come at depth 3 at best


def test_rollout_value_source_is_spre_over_k_continuations():
    ts, backend, _ = make(MCTSConfig(iterations=1, children_per_node=2, max_depth=3, value_source="rollout",
                                     rollouts_k=2))
    tree = tree_for(ts)
    ts.run([tree])
    s1 = kids(tree.root)["search"]
    # from s1 (depth 1): one continuation answers right at depth 2 (0.81); the other keeps searching (0)
    assert s1.estimate == pytest.approx((0.81 + 0.0) / 2)
    assert backend.opened[1] == [s1.prefix_ids] * 2  # the rollouts resume from the leaf's ids too
    assert ts.stats.rollout_calls == 1


def test_judge_value_source_with_a_fake_endpoint_and_a_clear_error_when_unreachable():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "7"}}]})

    judge = PathJudge("http://judge.test", "judge-model", transport=httpx.MockTransport(handler))
    ts, _, _ = make(MCTSConfig(iterations=1, children_per_node=2, max_depth=3, value_source="judge"), judge=judge)
    tree = tree_for(ts)
    ts.run([tree])
    s1 = kids(tree.root)["search"]
    assert s1.estimate == pytest.approx(0.7 * 0.9 ** 2)
    user = seen[0]["messages"][1]["content"]
    assert "Question: alpha?" in user and "Paris" in user and "passage 0 about alpha author" in user
    dead = PathJudge(f"http://127.0.0.1:{free_port()}", "judge-model", retries=0, timeout=2)
    with pytest.raises(JudgeUnavailableError, match=r"path judge at http://127\.0\.0\.1:\d+/v1 is unavailable after 1 "
                                                    r"attempt: ConnectError.*`vllm serve judge-model`"):
        dead.score("q", ["a"], "path")
    with pytest.raises(ValueError, match="judge_url"):
        make(MCTSConfig(value_source="judge"))[0].judge_values([(tree, s1)])


def test_collect_preferences_writes_both_files_and_reads_them_back_on_resume(tmp_path):
    from kunlunlab.data.types import QAExample
    from kunlunlab.training.preferences import collect_preferences

    ex = QAExample("alpha", "Question: alpha?", ["Paris"], "test", supporting_ids=["alpha author-0",
                                                                                    "alpha birthplace-0"])
    ts, backend, search = make()
    rows = collect_preferences(backend, search, [ex], tmp_path, ts.rollout, ts.config)
    assert len(rows) == 2 and {r["chosen_action"] for r in rows} == {"search", "answer"}
    assert TOK.decode(backend.opened[0][0]).endswith("<assistant><think>")  # the agent's prompt + assistant prefix
    tree = json.loads((tmp_path / "trees.jsonl").read_text())
    assert tree["id"] == "alpha" and json.loads((tmp_path / "mcts_stats.json").read_text())["pairs"] == 2
    calls = backend.generate_calls
    assert collect_preferences(backend, search, [ex], tmp_path, ts.rollout, ts.config) == rows
    assert backend.generate_calls == calls  # resumed from preferences.jsonl, no new search
