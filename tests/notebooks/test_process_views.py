"""Notebook 07's views and cost columns (kunlunlab.viz.process_views, kunlunlab.studies.training_variants), on
hand-written preference pairs, trees and run folders whose expected values are written out here."""
import json

import plotly.graph_objects as go
import pytest

from kunlunlab.studies.training_variants import COST_HEADER, cost_table, generated_tokens, reference_mismatch, run_costs
from kunlunlab.viz.process_views import (ACTION_PAIRS, dapo_runs_figure, pair_stats, pair_stats_figure,
                                         pair_stats_table, tree_html)

PAIRS = [
    {"chosen_action": "search", "rejected_action": "answer", "depth": 1, "chosen_value": 0.7, "rejected_value": 0.2,
     "gap": 0.5},
    {"chosen_action": "search", "rejected_action": "answer", "depth": 1, "chosen_value": 0.5, "rejected_value": 0.2,
     "gap": 0.3},
    {"chosen_action": "answer", "rejected_action": "search", "depth": 2, "chosen_value": 0.81, "rejected_value": 0.61,
     "gap": 0.2},
    {"chosen_action": "answer", "rejected_action": "answer", "depth": 2, "chosen_value": 0.9, "rejected_value": 0.6},
]


def test_pair_stats_counts_pairs_by_action_pair_and_depth_with_the_mean_gap():
    stats = pair_stats(PAIRS)
    assert stats["pairs"] == 4 and stats["cross_action"] == 3
    assert list(stats["by_action"]) == list(ACTION_PAIRS)
    assert stats["by_action"]["search≻answer"] == {"pairs": 2, "mean_gap": 0.4}
    assert stats["by_action"]["answer≻search"] == {"pairs": 1, "mean_gap": 0.2}
    assert stats["by_action"]["search≻search"] == {"pairs": 0, "mean_gap": None}
    assert stats["by_action"]["answer≻answer"] == {"pairs": 1, "mean_gap": 0.3}  # gap from the two values
    assert stats["by_depth"] == {1: {"pairs": 2, "mean_gap": 0.4}, 2: {"pairs": 2, "mean_gap": 0.25}}


def test_pair_stats_lists_other_action_pairs_and_reads_pair_objects():
    from kunlunlab.training.preferences import PreferencePair

    obj = PreferencePair("t", "q", [1], [2], [3], "p", "c", "r", "search", "none", 3, 0.4, 0.0, True, False)
    stats = pair_stats([obj])
    assert stats["by_action"]["search≻none"] == {"pairs": 1, "mean_gap": 0.4} and stats["by_depth"] == {
        3: {"pairs": 1, "mean_gap": 0.4}}
    header, rows = pair_stats_table(stats)
    assert header == ["by", "group", "pairs", "mean value gap"]
    assert rows[:4] == [["action pair", k, 0, None] for k in ACTION_PAIRS]
    assert rows[4:] == [["action pair", "search≻none", 1, 0.4], ["depth", 3, 1, 0.4]]


def test_pair_stats_figure_shows_the_counts_and_says_when_there_are_none():
    fig = pair_stats_figure(PAIRS)
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert list(bars[0].x) == list(ACTION_PAIRS) and list(bars[0].y) == [2, 1, 0, 1]
    assert list(bars[1].x) == ["1", "2"] and list(bars[1].y) == [2, 2]
    gaps = [t for t in fig.data if isinstance(t, go.Scatter)]
    assert list(gaps[1].y) == [0.4, 0.25]
    empty = pair_stats_figure([])
    assert any("no preference pairs" in a.text for a in empty.layout.annotations)


def _tree():
    answer = {"action": "answer", "depth": 2, "text": "<think>so</think><short_answer>\\boxed{Paris & co}",
              "env_text": "", "queries": [], "doc_ids": [], "answer": "Paris & co", "f1": 1.0, "finish": "answer",
              "issues": [], "reward": 0.81, "estimate": None, "visits": 2, "value": 0.81, "children": []}
    search = {"action": "search", "depth": 1, "text": "<think>look</think><search>who <b>A</b></search>",
              "env_text": "<result>(1) w12: A lives in Paris</result>", "queries": ["who <b>A</b>"],
              "doc_ids": ["w12"], "answer": None, "f1": None, "finish": "", "issues": [], "reward": None,
              "estimate": 0.45, "visits": 2, "value": 0.81, "children": [answer]}
    wrong = {"action": "answer", "depth": 1, "text": "<short_answer>\\boxed{Rome}</short_answer>", "env_text": "",
             "queries": [], "doc_ids": [], "answer": "Rome", "f1": 0.0, "finish": "answer", "issues": ["x"],
             "reward": 0.0, "estimate": None, "visits": 1, "value": 0.0, "children": []}
    root = {"action": "root", "depth": 0, "text": "", "env_text": "", "queries": [], "doc_ids": [], "answer": None,
            "f1": None, "finish": "", "issues": [], "reward": None, "estimate": None, "visits": 3, "value": 0.54,
            "children": [search, wrong]}
    return {"id": "q1", "question": "Where does <A> live?", "answers": ["Paris & co"], "supporting_ids": ["w12"],
            "n_nodes": 4, "root": root}


def test_tree_html_shows_every_step_escaped_with_its_numbers():
    page = tree_html(_tree())
    assert page.count("class='step'") == 4 and "steps explored:</b> 3" in page
    assert "Where does &lt;A&gt; live?" in page and "<A>" not in page
    assert "who &lt;b&gt;A&lt;/b&gt;" in page and "who <b>A</b>" not in page
    assert "SPRE reward 0.810" in page and "estimate 0.450" in page and "visits 3" in page
    assert "<code>w12</code>" in page and "answer “Paris &amp; co” F1 1.00" in page and "Rome" in page
    assert "(1) w12: A lives in Paris" in page and "protocol issues: x" in page
    assert page.count("★") == 1 and "★ depth 1 · <b>search</b>" in page  # the better sibling


def test_tree_html_stops_at_max_depth_and_counts_what_it_left_out():
    page = tree_html(_tree(), max_depth=1)
    assert page.count("class='step'") == 3 and "1 deeper step not shown (max_depth=1)" in page
    assert "Paris &amp; co</div>" not in page
    assert tree_html(_tree(), max_depth=0).count("class='step'") == 1


@pytest.mark.parametrize("bad, says", [
    (None, "got NoneType"), ([1, 2], "got list"), ({"question": "q"}, "no root step"),
    ({"root": {"children": "x"}}, "not a list"), ({"root": {"children": [5]}}, "not an object"),
    ({"root": {"children": [{"children": [{"children": {}}]}]}}, "not a list"),
])
def test_a_malformed_tree_renders_a_message_instead_of_raising(bad, says):
    page = tree_html(bad)
    assert "cannot render this tree" in page and says in page


def test_a_tree_with_odd_values_still_renders():
    tree = _tree()
    tree["root"]["children"][0]["value"] = "n/a"
    tree["root"]["children"][0]["queries"] = "one <q>"
    page = tree_html(tree)
    assert "value n/a" in page and "one &lt;q&gt;" in page and "cannot render" not in page
    assert "must be a non-negative integer" in tree_html(_tree(), max_depth=-1)


def test_dapo_runs_figure_draws_each_run_per_panel():
    rows_a = [{"step": 0, "reward": 0.5, "accuracy": 0.25, "searches": 2.0, "budget": None},
              {"step": 1, "reward": 0.7, "accuracy": 0.5, "searches": 1.5, "budget": None}]
    rows_b = [{"step": 0, "reward": 0.4, "accuracy": 0.25, "searches": 1.0, "budget": 0.5}]
    fig = dapo_runs_figure({"DAPO": rows_a, "DAPO + budget": rows_b})
    by = {(t.name, t.xaxis): t for t in fig.data}
    assert list(by[("DAPO", "x")].x) == [1, 2] and list(by[("DAPO", "x")].y) == [0.5, 0.7]
    assert list(by[("DAPO + budget", "x4")].y) == [0.5] and ("DAPO", "x4") not in by  # no budget term logged
    assert any("no DAPO rollout" in a.text for a in dapo_runs_figure({"DAPO": []}).layout.annotations)


def _folder(path, state, records=None):
    path.mkdir()
    (path / "state.json").write_text(json.dumps(state))
    if records is not None:
        (path / "eval_after_world.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_run_costs_and_cost_table_from_run_folders(tmp_path):
    records = [{"id": "a", "em": 1, "searches": 2, "trajectory": {"mask": [1, 1, 0, 1], "rdra": {"searches": 2}},
                "recall_by_search": [1.0], "search_floor": 2},
               {"id": "b", "em": 0, "searches": 3, "trajectory": {"mask": [1, 0, 0]}}]
    dapo = _folder(tmp_path / "dapo", {"seconds": {"sft": 100.0, "dapo": 40.5}, "steps": {"sft": 9, "dapo": 4}},
                   records)
    searched = _folder(tmp_path / "prl_no_pairs", {"seconds": {}, "prl_mcts_seconds": 12.0})
    prl = _folder(tmp_path / "prl", {"seconds": {"prl": 30.0}, "steps": {"prl": 2}, "prl_mcts_seconds": 10.0},
                  [{"id": "a", "searches": 1, "trajectory": {}}])
    costs = run_costs(dapo)
    assert costs["n"] == 2 and costs["searches_per_question"] == 2.5
    assert costs["agent_searches_per_question"] == 1.5  # (2 - 2 background + 3) / 2
    assert costs["generated_tokens_per_question"] == 2.0 and costs["training_seconds"] == 40.5  # SFT left out
    assert run_costs(searched)["training_seconds"] == 12.0 and run_costs(searched)["n"] is None
    assert run_costs(prl)["training_seconds"] == 30.0 and run_costs(prl)["mcts_seconds"] == 10.0  # MCTS inside prl
    assert run_costs(prl)["generated_tokens_per_question"] is None  # no mask in the trajectory
    header, rows = cost_table({"DAPO": dapo, "ReasonRAG": searched, "PRL": prl}, notes={"ReasonRAG": "not trained"})
    assert header == COST_HEADER
    assert costs["past_stop_per_question"] == 0.0  # only record "a" has a recall curve, complete at R_0
    assert costs["redundant_per_question"] == 0.0
    assert costs["search_floor_per_question"] == 2.0  # record "b" was written without a floor
    assert rows == [["DAPO", 2, 2.5, 2.0, 1.5, 0.0, 0.0, 2.0, 40.5, None, 4, ""],
                    ["ReasonRAG", None, None, None, None, None, None, None, 12.0, 12.0, 0, "not trained"],
                    ["PRL", 1, 1.0, None, 1.0, None, None, None, 30.0, 10.0, 2, ""]]
    with pytest.raises(ValueError, match="unknown held-out set"):
        run_costs(dapo, "musique")


def test_generated_tokens_is_the_mask_sum():
    assert generated_tokens({"trajectory": {"mask": [1, 0, 1, 1]}}) == 3
    assert generated_tokens({"trajectory": None}) is None and generated_tokens({}) is None


def test_reference_mismatch_separates_heldout_keys_from_other_differences():
    ref = {"model": None, "world_seed": 0, "top_k": 1, "sft": {"enabled": True, "train_layers": 12},
           "eval": {"world_questions": 30, "before": True, "method": "kunlun"}, "dapo": {"steps": 4, "enabled": True},
           "mixing": {"x": [1, 2]}}
    variant = {"model": "/r/sft/final", "world_seed": 0, "top_k": 2, "sft": {"enabled": False, "train_layers": 12},
               "eval": {"world_questions": 10, "before": False, "method": "kunlun"},
               "dapo": {"steps": 1, "enabled": False}, "mixing": {"x": (1, 2)}}
    assert reference_mismatch(ref, variant) == (["eval.world_questions"], ["top_k"])
    assert reference_mismatch(ref, ref) == ([], [])
    assert reference_mismatch({"prl": {"questions": 1}}, {"prl": {"questions": 8}}) == ([], [])
