"""The views of notebooks 01-03 (kunlunlab.viz.data_views), on small hand-made inputs whose expected values are
written out or computed here from the equations."""
import re

import numpy as np
import pytest

from kunlunlab.retrieval.evaluation import IndexRow
from kunlunlab.training.mixing import MixingConfig, TrajectoryExample, schedule
from kunlunlab.studies.reward_cases import REWARD_CASES
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.viz.data_views import (cluster_allocation_figure, cluster_weights_figure, epoch_table_html,
                                      example_trajectories, index_rows_html, mixed_trajectory_html, mixing_summary,
                                      reward_explanation_html, reward_rankings, schedule_table_html, segment_kind)


def cells(html_text: str) -> list[list[str]]:
    """The table's rows (header excluded) as lists of cell texts."""
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", html_text)[1:]]


def trajectory(quality="hq", noise=(), source="world", partial=False, kind="trajectory", epoch=0):
    segments = [{"role": "model", "text": "I need: <x>?</think>\n<search> <query>x</query> </search>", "train": True},
                {"role": "env", "text": "\n<result>\n(1) a & b\n</result>\n", "train": False},
                {"role": "model", "text": "<think>wrong turn</think>", "train": False},
                {"role": "env", "text": "<result>feedback</result>", "train": False, "feedback": True},
                {"role": "model", "text": "<think>ok</think>\n<short_answer>\\boxed{A}</short_answer>", "train": True}]
    return TrajectoryExample("Who is <b>A</b>?", ["A", "A2"], segments, background="bg <i>text</i>", source=source,
                             quality=quality, noise=list(noise), qtype="bridge", epoch=epoch, partial=partial, kind=kind)


def test_segment_kinds_and_the_trajectory_html():
    t = trajectory(quality="noisy", noise=["wrong_hop"], epoch=2)
    assert [segment_kind(s) for s in t.segments] == ["trained", "result", "masked", "feedback", "trained"]
    page = mixed_trajectory_html(t, title="noisy: wrong_hop")
    assert re.findall(r"data-kind='(\w+)'", page) == ["prompt", "trained", "result", "masked", "feedback", "trained"]
    # every text is escaped, the prefix "<think>" included
    assert "Who is &lt;b&gt;A&lt;/b&gt;?" in page and "<b>A</b>" not in page
    assert "&lt;think&gt;</pre>" in page and "a &amp; b" in page and "bg &lt;i&gt;text&lt;/i&gt;" in page
    assert "<b>noisy: wrong_hop</b>" in page and "epoch 2" in page and "noise: wrong_hop" in page
    assert "A | A2" in page and "first turn only" not in page
    assert "first turn only" in mixed_trajectory_html(trajectory(partial=True))


def test_example_trajectories_pick_one_of_each_kind_preferring_a_single_noise():
    both = trajectory("noisy", ["distractor", "background"])
    background = trajectory("noisy", ["background"])
    hq, hotpot = trajectory(), trajectory(source="hotpotqa")
    first, plan, wrong = trajectory(partial=True), trajectory(kind="plan"), trajectory("noisy", ["wrong_hop"])
    picks = example_trajectories([both, first, hq, background, plan, wrong, hotpot, trajectory()])
    assert list(picks) == ["high quality (world)", "high quality (hotpotqa)", "noisy: distractor", "noisy: wrong_hop",
                           "noisy: background", "first turn only", "plan sample"]
    assert picks["high quality (world)"] is hq and picks["noisy: background"] is background
    assert picks["noisy: distractor"] is both and picks["first turn only"] is first and picks["plan sample"] is plan


def test_mixing_summary_counts_per_epoch_and_means():
    stats = [
        {"epoch": 1, "quality": "hq", "noise": "none", "source": "world", "searches": 2, "tokens": 100, "partial": False},
        {"epoch": 0, "quality": "noisy", "noise": "distractor", "source": "world", "searches": 3, "tokens": 150,
         "partial": False},
        {"epoch": 0, "quality": "hq", "noise": "none", "source": "hotpotqa", "searches": 1, "tokens": 50, "partial": False},
        {"epoch": 0, "quality": "noisy", "noise": "distractor+background", "source": "world", "searches": 4,
         "tokens": 201, "partial": False},
        {"epoch": 1, "quality": "hq", "noise": "none", "source": "world", "searches": 1, "tokens": 20, "partial": True},
    ]
    s = mixing_summary(stats)
    assert list(s["per_epoch"]) == ["0", "1"]
    assert s["per_epoch"]["0"] == {"noisy": 2, "hq": 1, "noise:distractor": 1, "noise:none": 1,
                                   "noise:distractor+background": 1}
    assert s["per_epoch"]["1"] == {"hq": 2, "noise:none": 2}
    assert s["mean_tokens"] == {"hq": round((100 + 50 + 20) / 3, 1), "noisy": 175.5}
    assert s["mean_searches"] == round(11 / 5, 2) and s["trajectories"] == 5 and s["first_turn_samples"] == 1
    assert s["sources"] == {"world": 4, "hotpotqa": 1}
    no_tokens = mixing_summary([{k: v for k, v in r.items() if k != "tokens"} | {"chars": 10} for r in stats])
    assert "mean_tokens" not in no_tokens and no_tokens["mean_chars"] == {"hq": 10.0, "noisy": 10.0}
    table = cells(epoch_table_html(s["per_epoch"]))
    # columns: epoch, hq, noisy, then the noise kinds sorted
    assert table == [["0", "1", "2", "1", "1", "1"], ["1", "2", "0", "0", "0", "2"]]


def test_schedule_table_follows_equations_14_to_16():
    cfg = MixingConfig(epochs=5, turning_epoch=3, hq_share_start=0.5, hq_shape=2.0, noise_start=0.2, noise_end=0.8,
                       samples_per_epoch=10)
    table = cells(schedule_table_html(schedule(cfg)))
    for e, row in enumerate(table):
        progress = min(1.0, e / 3)
        p_hq = 0.5 + 0.5 * progress ** 2
        rho = 0.2 + 0.6 * progress
        assert float(row[0]) == e
        assert float(row[1]) == pytest.approx(p_hq, abs=1e-3) and float(row[3]) == pytest.approx(1 - p_hq, abs=1e-3)
        assert int(row[2]) == round(10 * p_hq) and int(row[4]) == 10 - round(10 * p_hq)
        assert float(row[5]) == pytest.approx(rho, abs=1e-3)


def test_reward_explanation_reads_the_response():
    malformed = next(c for c in REWARD_CASES if c["name"] == "malformed")
    page = reward_explanation_html(malformed["text"], "Someone Else | Henrik Queishyxskeil", RewardConfig())
    row = cells(page)[0]
    # eq. 17 with the case's components (format 0.4, length 1, accuracy 1 against the second alias)
    assert row[0] == "your response" and row[1] == "short" and row[2:5] == ["0.40", "1.00", "1.00"]
    assert float(row[-1]) == pytest.approx(0.2 * 0.4 + 0.1 * 1 + 1.0 * 1)
    # the unclosed <query> makes the search turn unparseable: no search is counted
    assert "issues: unclosed:query, unclosed:think, searches: 0" in page
    hostile = reward_explanation_html("<think>x</think>\n<short_answer>\\boxed{<b>}</short_answer>", ["<b>"])
    assert "<code>&#x27;&lt;b&gt;&#x27;</code>" in hostile and "issues: none" in hostile


def test_reward_rankings_follow_the_weighted_totals():
    cases = [c for c in REWARD_CASES if c["name"] in ("correct", "wrong", "malformed", "missing box")]

    def total(case, w_f, w_l, w_a):  # eq. 17 from the components each case is known to get
        e = case["expect"]
        return w_f * e["format"] + w_l * e["length"] + w_a * e["accuracy"]

    settings = {"default": {}, "format-heavy": {"w_format": 1.5, "w_accuracy": 0.5}}
    got = reward_rankings(settings, RewardConfig(), cases)
    for label, (w_f, w_a) in {"default": (0.2, 1.0), "format-heavy": (1.5, 0.5)}.items():
        expected = sorted(cases, key=lambda c: total(c, w_f, 0.1, w_a), reverse=True)
        assert got[label] == [c["name"] for c in expected]
    # the flip the notebook points at: malformed beats wrong by default, not with format-heavy weights
    assert got["default"].index("malformed") < got["default"].index("wrong")
    assert got["format-heavy"].index("wrong") < got["format-heavy"].index("malformed")


def test_cluster_views():
    rows = [{"rank": 0, "cluster": 7, "size": 90, "score": 0.8, "weight": 1.0, "probability": 0.9, "quota": 90.0,
             "scanned": True, "cap": 90},
            {"rank": 1, "cluster": 3, "size": 80, "score": 0.5, "weight": 2.0, "probability": 0.0999, "quota": 9.99,
             "scanned": True, "cap": 10},
            {"rank": 2, "cluster": 5, "size": 70, "score": 0.1, "weight": 0.5, "probability": 0.0001, "quota": 0.01,
             "scanned": False, "cap": 0}]
    fig = cluster_allocation_figure(rows)
    scanned, skipped = fig.data
    assert scanned.name == "scanned" and list(scanned.y) == [90.0, 9.99] and list(scanned.x) == ["#0 (c7)", "#1 (c3)"]
    assert skipped.name == "not scanned" and list(skipped.y) == [0.01]
    assert fig.layout.yaxis.type == "log" and fig.layout.shapes[0].y0 == 1.0
    weights = np.array([0.5, 2.0, 1.0, 4.0])
    fig = cluster_weights_figure(weights, (0.25, 4.0))
    assert list(fig.data[0].y) == [4.0, 2.0, 1.0, 0.5]
    assert sorted(s.y0 for s in fig.layout.shapes) == [0.25, 1.0, 4.0]


def test_index_rows_table():
    rows = [IndexRow("exact Flat", None, None, 1.5, 1.0, 1536.0, 0.0, "flat"),
            IndexRow("IVF-PQ", "nprobe", 4.0, 0.0123, 0.61234, 67.84, 0.0, "ivfpq")]
    assert cells(index_rows_html(rows)) == [["exact Flat", "default", "1.5", "1", "1536", "0"],
                                            ["IVF-PQ", "nprobe=4", "0.012", "0.612", "67.8", "0"]]
