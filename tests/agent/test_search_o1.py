"""Search-o1's Reason-in-Documents: what the condensation call is given, that the chain continues with the
condensed text and not the raw passages, one batched call per turn, budgets, and the embedded model end to end."""
import re
from types import SimpleNamespace

from kunlunlab.agent.methods import MethodConfig, make_method
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.agent.search_o1 import (NO_INFORMATION, ReasonInDocumentsConfig, extract_information,
                                       previous_reasoning, reason_in_documents)
from kunlunlab.agent.server import create_app
from kunlunlab.configs import apply_overrides, build_dataclass
from kunlunlab.eval.harness import EvalConfig, build_pipeline
from kunlunlab.eval.metrics import title_recall_curve
from kunlunlab.retrieval.retriever import Hit
from kunlunlab.http.server import ServerThread
from kunlunlab.retrieval.client import RetrievalServiceError
from scripted import CharTokenizer, CountingSearch, PrefixScriptedBackend

CHAIN = {  # row -> (first turn, turn after a result); the method's assistant prefix "<think>" opens each reply
    0: ("I need the director.\nThen his mother.</think>\n<search> <query>director of Film A</query> </search>",
        "Ann directed it.</think>\n<short_answer>\\boxed{Ann Lee}</short_answer>"),
    1: ("Two facts.</think>\n<search><query>birth of Bo</query><query>birth of Cy</query></search>",
        "Bo was first.</think>\n<short_answer>\\boxed{Bo}</short_answer>"),
    2: ("I know this.</think>\n<short_answer>\\boxed{Paris}</short_answer>", None),
}


class Script:
    """Chain rows follow CHAIN; a condensation prompt (it carries the instruction) is answered "CONDENSED
    <its query>". Records every chain context and every condensation prompt it saw."""

    def __init__(self):
        self.chain_contexts, self.condense_prompts = [], []

    def __call__(self, text, row):
        if "**Task Instruction:**" in text:
            self.condense_prompts.append(text)
            return "CONDENSED " + re.search(r"\*\*Current Search Query:\*\*\n(.*)\n", text).group(1)
        self.chain_contexts.append((row, text))
        first, then = CHAIN[row]
        return then if "<result>" in text.split("<assistant>", 1)[1] else first  # the system prompt names it too


def run_scripted(search, reason=None, rollout=None):
    script = Script()
    backend = PrefixScriptedBackend(CharTokenizer(), script)
    config = MethodConfig(rollout=rollout or RolloutConfig(top_k=2),
                          reason_in_documents=reason or ReasonInDocumentsConfig())
    method = make_method("search_o1", backend, search, config)
    return method.run(["Who is the mother of the director of Film A?", "Who was born first?", "Capital?"]), \
        backend, script, method


def test_condensation_sees_reasoning_query_and_documents_and_the_chain_sees_only_its_analysis():
    search = CountingSearch()
    outs, backend, script, method = run_scripted(search)
    assert search.calls == [["director of Film A", "birth of Bo", "birth of Cy"]]
    # one chain session, then one condensation call for all three (sample, query) pairs of the turn
    assert len(backend.opened) == 2 and len(backend.opened[1]) == 3 and len(script.condense_prompts) == 3
    assert method.last_stats.condense_calls == 1 and method.last_stats.condensed == 3
    first = script.condense_prompts[0]
    assert ("**Previous Reasoning Steps:**\nStep 1: <think>I need the director.\n\nStep 2: Then his mother.</think>"
            "\n\nStep 3: <search> <query>director of Film A</query> </search>\n") in first
    assert "**Current Search Query:**\ndirector of Film A\n" in first
    assert "**Document 1:**\npassage 0 about director of Film A\n**Document 2:**\npassage 1 about director of Film A" \
        in first
    assert "Who is the mother" not in first  # Search-o1 gives the reasoning, not the question
    assert first.endswith("<assistant>**Final Information**\n\n")  # the header opens the reply
    assert "**Current Search Query:**\nbirth of Cy\n" in script.condense_prompts[2]
    # the chain's next turn continues from the analysis; the raw passages never enter it
    second = [text for row, text in script.chain_contexts if row == 0][1]
    assert second.endswith("</search>\n<result>\nCONDENSED director of Film A\n</result>\n")
    assert "passage 0 about" not in second
    multi = [text for row, text in script.chain_contexts if row == 1][1]
    assert multi.endswith("<result>\nQuery 1: birth of Bo\nCONDENSED birth of Bo\nQuery 2: birth of Cy\n"
                          "CONDENSED birth of Cy\n</result>\n")
    assert [o.prediction for o in outs] == ["Ann Lee", "Bo", "Paris"]
    assert [o.searches for o in outs] == [1, 1, 0]


def test_the_record_keeps_raw_documents_beside_the_condensed_text_and_recall_still_reads_it():
    outs, _, _, _ = run_scripted(CountingSearch())
    t = outs[0].trajectory
    assert outs[0].doc_ids == ["director of Film A-0", "director of Film A-1"]
    assert t["doc_ids"] == [["director of Film A-0", "director of Film A-1"]]
    result = [s for s in t["steps"] if s["kind"] == "result"]
    assert len(result) == 1
    assert result[0]["text"] == "\n<result>\nCONDENSED director of Film A\n</result>\n"
    assert result[0]["documents"] == ("\n<result>\n(1) passage 0 about director of Film A\n"
                                      "(2) passage 1 about director of Film A\n</result>\n")
    assert result[0]["analyses"] == ["CONDENSED director of Film A"]
    assert result[0]["analysis_tokens"] == [len("CONDENSED director of Film A")]  # one id per character
    assert result[0]["reasoning"].startswith("Step 1: <think>I need the director.")
    # the completion holds exactly the model turns (mask 1) and the condensed block (mask 0)
    env = "\n<result>\nCONDENSED director of Film A\n</result>\n"
    assert "".join(map(chr, t["completion_ids"])) == CHAIN[0][0] + env + CHAIN[0][1]
    assert t["mask"] == [1] * len(CHAIN[0][0]) + [0] * len(env) + [1] * len(CHAIN[0][1])
    assert t["answer_source"] == "answer_tag" and t["finish"] == "answer"
    titles = {"director of Film A-0": "Film A", "director of Film A-1": "Film B"}
    assert title_recall_curve(t, titles, ["Film A", "Ann Lee"]) == [0.0, 0.5]


def test_the_analysis_budget_caps_each_condensation():
    outs, _, _, _ = run_scripted(CountingSearch(), reason=ReasonInDocumentsConfig(max_tokens=12))
    assert "<result>\nCONDENSED di\n</result>" in outs[0].trajectory["text"]  # 12 characters, one id each


def test_no_hits_repeats_and_a_dead_search_need_no_condensation():
    class Sparse(CountingSearch):
        def __call__(self, queries, k):
            self.calls.append(list(queries))
            return [[] if q == "birth of Cy" else [Hit(f"{q}-0", f"passage about {q}", 1.0)] for q in queries]

    outs, backend, script, _ = run_scripted(Sparse())
    assert len(script.condense_prompts) == 2  # "birth of Cy" found nothing: no prompt for it
    assert f"Query 2: birth of Cy\n{NO_INFORMATION}\n</result>" in outs[1].trajectory["text"]
    assert outs[1].trajectory["steps"][2]["analyses"] == ["CONDENSED birth of Bo", None]

    def dead(queries, k):
        raise RetrievalServiceError("service down")

    outs, backend, script, method = run_scripted(dead)
    assert script.condense_prompts == [] and len(backend.opened) == 1
    assert "(search unavailable: service down)" in outs[0].trajectory["text"]
    assert method.search_errors == ["service down", "service down"]


def test_repeated_queries_and_the_search_limit_get_notices():
    loop = "</think>\n<search><query>Same Thing</query></search>"
    script_calls = []

    def script(text, row):
        if "**Task Instruction:**" in text:
            script_calls.append(text)
            return "CONDENSED"
        return loop.replace("Same Thing", "same  THING") if "<result>" in text.split("<assistant>", 1)[1] else loop

    backend = PrefixScriptedBackend(CharTokenizer(), script)
    search = CountingSearch()
    method = make_method("search_o1", backend, search,
                         MethodConfig(rollout=RolloutConfig(top_k=1, max_searches=2, max_total_tokens=600)))
    t = method.run(["q"])[0].trajectory
    assert search.calls == [["Same Thing"]] and len(script_calls) == 1  # the repeat (case and spacing aside) is neither searched nor read
    assert "You searched this query before" in t["text"] and "repeated_query" in t["issues"]
    assert "The search limit (2) is reached" in t["text"] and t["finish"] == "search_limit"


def test_previous_reasoning_keeps_first_last_four_and_search_steps():
    steps = [{"kind": "prefix", "text": "<think>"},
             {"kind": "model", "text": "a\nb\n<search><query>q</query></search>"},
             {"kind": "result", "text": "\n<result>\nfound\nit\n</result>\n"},
             {"kind": "model", "text": "c\nd\ne\nf\ng"}]
    assert previous_reasoning(steps, keep_last=4) == (
        "Step 1: <think>a\n\n...\n\nStep 3: <search><query>q</query></search>\n\n"
        "Step 4: <result> found it </result>\n\n...\n\nStep 6: d\n\nStep 7: e\n\nStep 8: f\n\nStep 9: g")
    assert previous_reasoning(steps[:2], keep_last=4) == (
        "Step 1: <think>a\n\nStep 2: b\n\nStep 3: <search><query>q</query></search>")


def test_extract_information_follows_the_final_information_header():
    assert extract_information("Notes.\n**Final Information**\n\nBo was born\nin 1901.", False) == \
        "Bo was born in 1901."
    assert extract_information("Bo was born in 1901.", False) == NO_INFORMATION  # Search-o1: no header, no info
    assert extract_information("Bo was born in 1901.<|im_end|>", True, "<|im_end|>") == "Bo was born in 1901."
    assert extract_information("**Final Information**\n</result><search>x</search>", False) == "x"
    assert extract_information("  \n", True) == NO_INFORMATION


def test_condensation_through_an_openai_compatible_server_matches_the_local_model(backend, world, questions,
                                                                                 world_retriever):
    jobs = [(f"Step 1: <think>I need to know this.</think> <search> <query>{q.question}</query> </search>",
             q.question, hits)
            for q, hits in zip(questions[:2], world_retriever.search([q.question for q in questions[:2]], 2))]
    config = ReasonInDocumentsConfig(max_tokens=12)
    local, calls = reason_in_documents(backend, jobs, config, 300)
    with ServerThread(create_app(backend)) as url:
        remote, _ = reason_in_documents(OpenAIBackend(url, backend.name), jobs, config, 300)
    assert calls == 1 and [a.reply for a in remote] == [a.reply for a in local]
    assert all(0 < a.tokens <= 12 and a.information for a in local)


def test_embedded_model_smoke_on_two_world_questions(backend, questions, world_retriever):
    """The untrained model rarely searches on its own; a reply opened with a search makes it search once."""
    config = MethodConfig(rollout=RolloutConfig(top_k=2, max_turn_tokens=48, max_total_tokens=256, max_searches=1),
                          reason_in_documents=ReasonInDocumentsConfig(max_tokens=32),
                          assistant_prefix="<think>I should search first.</think>\n<search> <query>")
    method = make_method("search_o1", backend, world_retriever.search, config)
    outs = method.run([q.question for q in questions[:2]])
    assert method.last_stats.condense_calls >= 1
    for out in outs:
        t = out.trajectory
        assert out.searches >= 1 and len(t["doc_ids"]) == out.searches
        first = next(s for s in t["steps"] if s["kind"] == "result")
        query = first["queries"][0]
        want = [h.id for h in world_retriever.search([query], 2)[0]]
        assert t["doc_ids"][0] == want  # the raw documents are recorded
        assert first["documents"].count("\n(") == 2 and first["analyses"][0] is not None
        assert first["analysis_tokens"][0] <= 32
        assert first["text"] not in first["documents"]  # the chain got the analysis, not the result block
        assert len(t["mask"]) == len(t["completion_ids"])


def test_eval_configs_reason_in_documents_budget_reaches_the_method():
    """`kunlunlab eval --set reason_in_documents.max_tokens=64` sets the condensed analysis's budget."""

    config = build_dataclass(EvalConfig, apply_overrides({"dataset": "world", "method": "search_o1",
                                                          "index_kind": "bm25"},
                                                         ["reason_in_documents.max_tokens=64"]))
    method, _, _ = build_pipeline(config, None, backend=SimpleNamespace(tokenizer=None, name="stub"),
                                  retriever=SimpleNamespace(search=None))
    assert method.config.reason_in_documents.max_tokens == 64
