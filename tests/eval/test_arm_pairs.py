"""Table 2 sets every trained arm against every other after RL (issue 52: intervals against kunlun and each peer),
paired over (seed, question); a collapsed arm and two arms without a seed in common are said to be so, never a tie."""
from kunlunlab.eval.arms import pairwise_table


def _records(ems, source="answer_tag"):
    return [{"id": f"q{i}", "em": em, "answer_source": source} for i, em in enumerate(ems)]


def test_each_pair_is_row_minus_column_paired_and_collapsed_or_unpaired_arms_are_named():
    records = {
        "peer": {0: {"rl": _records([1, 1, 1, 1, 1, 1, 0, 0, 0, 0])}, 1: {"rl": _records([1, 1, 0, 0, 0, 0, 0, 0, 0, 0])}},
        "kunlun": {0: {"rl": _records([1, 1, 1, 0, 0, 0, 0, 0, 0, 0])}, 1: {"rl": _records([1, 1, 0, 0, 0, 0, 0, 0, 0, 0])}},
        "degenerate": {0: {"rl": _records([1] * 10, source="fallback")}},
        "late": {2: {"rl": _records([0] * 10)}},
        "sft_only": {0: {"sft": _records([1] * 10)}},  # no RL records: not a row
    }
    header, rows, numbers = pairwise_table(records, "kunlun", n_resamples=2000)
    assert header == ["arm − arm →", "kunlun", "degenerate", "late", "peer"]
    cell = {(row[0], arm): value for row in rows for arm, value in zip(header[1:], row[1:])}
    # peer beats kunlun on 3 of the 20 (seed, question) pairs and loses none: +15.0 points
    assert cell["peer", "kunlun"].startswith("+15.0 [") and cell["kunlun", "peer"].startswith("-15.0 [")
    low, high = numbers["peer − kunlun"]["low"], numbers["peer − kunlun"]["high"]
    assert numbers["peer − kunlun"]["n"] == 20 and 0.0 <= low <= 0.15 <= high <= 0.3
    assert cell["kunlun", "kunlun"] == "–"
    assert cell["kunlun", "degenerate"] == cell["degenerate", "peer"] == "collapsed, not compared"
    assert cell["late", "kunlun"] == cell["peer", "late"] == "no seed in common"
    assert set(numbers) == {"peer − kunlun", "kunlun − peer"}
