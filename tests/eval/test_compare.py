"""Table 2 and the ablation table: paired by question id, EM in percent, differences with paired-bootstrap intervals."""
import pytest

from kunlunlab.eval.compare import ablation_table, compare, paired, table2


def recs(ems, lj=None, prefix="q"):
    return [{"id": f"{prefix}{i}", "em": float(e), "f1": float(e), "lj": lj, "searches": 2} for i, e in enumerate(ems)]


def test_pairs_by_question_id_not_by_position():
    a = recs([1, 0, 1])
    b = list(reversed(recs([0, 0, 1])))
    assert paired(a, b) == ([1.0, 0.0, 1.0], [0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="no question"):
        paired(a, recs([1], prefix="x"))


def test_compare_reports_percent_points_with_an_interval():
    c = compare(recs([1, 1, 1, 1]), recs([0, 0, 0, 0]), n_resamples=500)
    assert (c["n"], c["a"], c["b"], c["diff"], c["low"], c["high"]) == (4, 100.0, 0.0, 100.0, 100.0, 100.0)
    same = compare(recs([1, 0, 1, 0]), recs([1, 0, 1, 0]), n_resamples=500)
    assert same["diff"] == same["low"] == same["high"] == 0.0


def test_table2_layout_best_baseline_and_absent_judge():
    records = {"world": {"naive_rag": recs([1, 0, 0, 0]), "ircot": recs([1, 1, 0, 0]), "kunlun": recs([1, 1, 1, 1])},
               "bamboogle": {"naive_rag": recs([0, 0], lj=1.0), "ircot": recs([0, 1], lj=0.0),
                             "kunlun": recs([1, 1], lj=1.0)}}
    header, rows = table2(records, "kunlun", ["naive_rag", "ircot"], n_resamples=500)
    # bamboogle is searched in a corpus that lacks most of its evidence: its columns say so
    assert header == ["method", "world EM", "world LJ", "world tag %", "bamboogle (corpus lacks most evidence) EM",
                      "bamboogle (corpus lacks most evidence) LJ", "bamboogle (corpus lacks most evidence) tag %"]
    # no record says where its answer came from (single-shot answers): no tag share
    assert rows[0] == ["naive_rag", 25.0, "–", "–", 0.0, 100.0, "–"]
    assert rows[2] == ["kunlun", 100.0, "–", "–", 100.0, 100.0, "–"]
    assert rows[3][2] == "vs ircot" and rows[3][1].startswith("+50.0 [") and rows[3][1].endswith("n=4")
    assert rows[3][5] == "vs ircot" and rows[3][4].startswith("+50.0")


def test_table2_sets_the_peers_apart_with_their_models():
    records = {"world": {"naive_rag": recs([1, 0, 0, 0]), "search_r1": recs([1, 1, 1, 0]), "kunlun": recs([1, 1, 0, 0])}}
    header, rows = table2(records, "kunlun", ["naive_rag"], n_resamples=500, peers=["search_r1"],
                          models={"naive_rag": "base", "search_r1": "runs/sr1", "kunlun": "runs/k"})
    assert header == ["method", "model", "world EM", "world LJ", "world tag %"]
    assert [r[:3] for r in rows[:3]] == [["naive_rag", "base", 25.0], ["search_r1", "runs/sr1", 75.0],
                                          ["kunlun", "runs/k", 50.0]]
    vs_baseline, vs_peer = rows[3], rows[4]
    assert vs_baseline[0].startswith("kunlun − best baseline") and vs_baseline[3] == "vs naive_rag"
    assert vs_baseline[2].startswith("+25.0 [")
    assert vs_peer[0].startswith("kunlun − best peer") and vs_peer[3] == "vs search_r1"
    assert vs_peer[2].startswith("-25.0 [")


def test_ablation_table_reads_intervals_honestly():
    full = recs([1] * 10)
    variants = {"kunlun": full, "−STIE": recs([1] * 10), "−RDRA": recs([0] * 10)}
    header, rows = ablation_table(variants, "kunlun", n_resamples=500, notes={"−RDRA": "fewer searches"})
    by = {r[0]: r for r in rows}
    assert by["kunlun"][5] == "–" and by["kunlun"][6] == "reference"
    assert by["−STIE"][6] == "no measurable effect at this scale"
    assert by["−RDRA"][5] == "-100.0 [-100.0, -100.0]"
    assert by["−RDRA"][6].startswith("the mechanism helps (100.0 EM lost") and by["−RDRA"][6].endswith("fewer searches")


def test_kept_beside_fresh_pairs_only_the_same_questions():
    from kunlunlab.eval.compare import kept_beside_fresh

    def rec(i, q, em, source="answer_tag"):
        return {"id": i, "question": q, "em": em, "f1": em, "searches": 2, "answer_source": source}

    kept = [rec("q0", "A?", 1.0), rec("q1", "B?", 0.0), rec("q2", "C?", 1.0), rec("q3", "D?", 1.0)]
    # q0 and q1 are the kept questions; q2 has the kept id but another text (a world drawn anew): not shared
    fresh = [rec("q0", "A?", 1.0), rec("q1", "B?", 1.0), rec("q2", "other?", 0.0)]
    header, rows = kept_beside_fresh(kept, fresh, "kept", "now", n_resamples=500)
    assert header[-1].startswith("Δ EM")
    assert rows[0][:3] == ["kept", 4, 75.0] and rows[0][-1] == "–"
    assert rows[1][:4] == ["now", 3, 66.7, 66.7]
    # on the two shared questions: now 100, kept 50 -> +50.0, n=2
    assert rows[1][-1].startswith("+50.0 [") and rows[1][-1].endswith("n=2")

    _, rows = kept_beside_fresh(kept, [rec("x", "Z?", 1.0)], "kept", "now")
    assert rows[1][-1] == "no shared question: not paired"
    degenerate = [rec("q0", "A?", 1.0, "fallback"), rec("q1", "B?", 0.0, "fallback")]
    _, rows = kept_beside_fresh(kept, degenerate, "kept", "now")
    assert rows[1][-1] == "a collapsed side: not compared" and "collapsed" in str(rows[1][5])
