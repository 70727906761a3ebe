"""RDRA (§2.1, eqs. 1-4): the plan's queries (whole plan and lines), the D1/D2 share of the joint context,
and the number of searches actually sent."""
from kunlunlab.agent.rdra import RDRAConfig, joint_context, plan_queries, rdra_contexts
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.retrieval.client import RetrievalServiceError
from scripted import ScriptedBackend


class RecordingSearch:
    def __init__(self):
        self.calls = []

    def __call__(self, queries, k):
        self.calls.append((list(queries), k))
        return [[Hit(f"{q[:12]}#{j}", f"text {j} for {q}", 1.0) for j in range(k)] for q in queries]


def hits(prefix, n):
    return [Hit(f"{prefix}{i}", f"{prefix} passage {i}", 1.0) for i in range(n)]


def test_plan_queries_whole_plan_first_then_lines():
    plan = "1. Who directed The Silent River?\n2. Where was that director born?\nok"
    assert plan_queries(plan, "Q?", limit=2) == [
        "Who directed The Silent River? Where was that director born?",
        "Who directed The Silent River?", "Where was that director born?"]
    assert plan_queries(plan, "Q?", limit=1, whole_plan=False) == ["Who directed The Silent River?"]
    assert plan_queries("ok\n", "The question?", limit=3) == ["The question?"]  # nothing searchable


def test_joint_context_share_and_fill():
    cfg = RDRAConfig(max_docs=5, background_share=0.4)          # 2 slots for D1, 3 for D2
    assert [h.id for h in joint_context(hits("a", 4), hits("b", 4), cfg)] == ["a0", "a1", "b0", "b1", "b2"]
    cfg = RDRAConfig(max_docs=5, background_share=0.8)          # 4 for D1, 1 for D2
    assert [h.id for h in joint_context(hits("a", 4), hits("b", 4), cfg)] == ["a0", "a1", "a2", "a3", "b0"]
    # D2 has only one passage: D1 fills the free slots; duplicates count once
    assert [h.id for h in joint_context(hits("a", 4), hits("a", 2)[1:] + hits("b", 1), RDRAConfig(max_docs=5,
            background_share=0.4))] == ["a0", "a1", "a2", "a3", "b0"]


def test_rdra_counts_the_searches_it_sends(backend):
    plans = ["Who directed Film X?\nWhere was the director born?", "nothing"]
    search = RecordingSearch()
    cfg = RDRAConfig(background_k=2, plan_k=1, max_plan_queries=3, max_docs=3)
    out = rdra_contexts(ScriptedBackend(backend.tokenizer, [[p] for p in plans]), search, ["Q one?", "Q two?"], cfg)
    # stage 1: one query per question; stage 2: whole plan + 2 lines for the first, the question for the second
    assert search.calls[0] == (["Q one?", "Q two?"], 2)
    assert search.calls[1][0] == ["Who directed Film X? Where was the director born?", "Who directed Film X?",
                                  "Where was the director born?", "Q two?"]
    assert [c.searches for c in out] == [1 + 3, 1 + 1]
    assert out[0].plan_queries[0].startswith("Who directed Film X? Where")
    assert len(out[0].doc_ids) == 3 and "Documents:" in out[0].background and out[0].error is None


def test_rdra_dead_service_reasons_without_background(backend):
    def down(queries, k):
        raise RetrievalServiceError("retrieval service at http://127.0.0.1:9 is down")

    out = rdra_contexts(ScriptedBackend(backend.tokenizer, [["Find the film"]]), down, ["Q?"], RDRAConfig())
    assert out[0].doc_ids == [] and "down" in out[0].error


def test_plan_free_rdra_sends_one_search_and_shows_only_the_first_stage(backend):
    """use_plan=False: no planning call (the scripted backend would fail on a generate it was not given),
    the background is the question's own top background_k passages with no plan line, one search each."""
    search = RecordingSearch()
    cfg = RDRAConfig(background_k=2, max_docs=5, use_plan=False)
    out = rdra_contexts(ScriptedBackend(backend.tokenizer, []), search, ["Q one?", "Q two?"], cfg)
    assert search.calls == [(["Q one?", "Q two?"], 2)]
    assert [c.searches for c in out] == [1, 1] and [c.plan for c in out] == ["", ""]
    assert out[0].doc_ids == ["Q one?#0", "Q one?#1"] and out[0].plan_queries == []
    assert out[0].background == "Documents:\n(1) text 0 for Q one?\n(2) text 1 for Q one?"
