"""The peers' protocols run through the shared rollout engine and through ``kunlunlab eval --method <peer>``: a
turn stops at the peer's stop strings, its query is searched, the documents come back in the peer's block as
environment tokens (mask 0), Search-R1's re-prompt follows a turn without an action, and the answer is the one the
peer's own extraction reads. The end-to-end test serves each protocol from a stand-in OpenAI-compatible server,
as a released checkpoint would be served by vLLM."""
import json

import pytest
from fastapi import FastAPI, Request

from kunlunlab.agent.backends import chat_prompt_ids, text_ids
from kunlunlab.agent.protocols import SEARCH_R1_INVALID, get_protocol
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.cli import main
from kunlunlab.http.server import ServerThread
from kunlunlab.models import load_llm, resolve_llm
from scripted import CountingSearch, ScriptedBackend

ANSWER = "Qxzzyv"  # no gold answer of the world: the prediction can only come from the served turns
TURNS = {  # (a search turn, the answer turn), as each peer's model writes them
    "search_r1": ("<think>I need the founder.</think>\n<search> founder of Shylcel Holdings </search>",
                  f"<think>The document names him.</think>\n<answer> {ANSWER} </answer>"),
    "research": ("<think> I need the founder. </think> <search> founder of Shylcel Holdings </search>",
                 f"<think> Found. </think> <answer> The final answer is \\[ \\boxed{{{ANSWER}}} \\] </answer>"),
    "r1_searcher": ("I need the founder. <|begin_of_query|> founder of Shylcel Holdings <|end_of_query|>",
                    f"The documents name him.</think>\n\n<answer> {ANSWER} </answer>"),
}
DOCS_SHOWN = {"search_r1": "<information>Doc 1(Title:", "research": " <result>\n",
              "r1_searcher": "<|begin_of_documents|>\n(1)"}


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


@pytest.mark.parametrize("name", sorted(TURNS))
def test_a_peer_trajectory_runs_through_the_engine_in_its_own_protocol(name, tokenizer):
    protocol = get_protocol(name)
    search, answer = TURNS[name]
    backend = ScriptedBackend(tokenizer, {0: [search, answer]})
    searches = CountingSearch()
    prompt = chat_prompt_ids(tokenizer, protocol.messages("Who founded Shylcel Holdings?"), protocol.assistant_prefix)
    engine = RolloutEngine(backend, searches, RolloutConfig(top_k=2, max_result_chars=300), name)
    (t,) = engine.run([prompt], ["Who founded Shylcel Holdings?"], prefixes=[protocol.assistant_prefix])
    assert searches.calls == [["founder of Shylcel Holdings"]]
    block = protocol.result_block(searches([["founder of Shylcel Holdings"]][0], 2), ["founder of Shylcel Holdings"],
                                  300)
    assert backend.appended[0] == [text_ids(tokenizer, block)]  # the peer's document block, appended as tokens
    assert t.answer == ANSWER and t.finish == "answer" and t.n_searches == 1
    assert protocol.final_answer(t.text[len(protocol.assistant_prefix):]) == ANSWER
    env = [k for k, m in enumerate(t.mask) if m == 0]
    assert tokenizer.decode([t.completion_ids[k] for k in env]) == tokenizer.decode(text_ids(tokenizer, block))


def test_search_r1_reprompts_a_turn_without_an_action_as_its_generation_loop_does(tokenizer):
    backend = ScriptedBackend(tokenizer, {0: ["<think>Hmm.</think> I am not sure.", TURNS["search_r1"][1]]})
    prompt = chat_prompt_ids(tokenizer, get_protocol("search_r1").messages("Q?"))
    (t,) = RolloutEngine(backend, CountingSearch(), RolloutConfig(), "search_r1").run([prompt], ["Q?"])
    assert backend.appended[0] == [text_ids(tokenizer, SEARCH_R1_INVALID)] and t.answer == ANSWER
    # the other protocols end such a sample, as their repositories do
    backend = ScriptedBackend(tokenizer, {0: ["<think> Hmm. </think> I am not sure."]})
    (t,) = RolloutEngine(backend, CountingSearch(), RolloutConfig(), "research").run([prompt], ["Q?"])
    assert t.finish == "no_action" and t.answer is None


def _stand_in(name: str, tokenizer, seen: list) -> FastAPI:
    """An OpenAI-compatible ``/v1/completions`` speaking ``name``'s protocol: the answer turn once the prompt shows
    the peer's document block, else the search turn; it honours the stop strings as vLLM does."""
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "peer-model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.append(body)
        choices = []
        for i, ids in enumerate(body["prompt"]):
            text = TURNS[name][1] if DOCS_SHOWN[name] in tokenizer.decode(ids) else TURNS[name][0]
            stop = next((s for s in body["stop"] if s in text), None)
            choices.append({"index": i, "text": text, "finish_reason": "stop", "stop_reason": stop})
        return {"choices": choices}

    return app


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TURNS))
def test_kunlunlab_eval_runs_a_served_peer_checkpoint_in_its_protocol(name, tokenizer, tmp_path, capsys):
    seen: list = []
    out = tmp_path / "records.jsonl"
    with ServerThread(_stand_in(name, tokenizer, seen)) as url:
        code = main(["eval", "--dataset", "world", "--method", name, "--limit", "3", "--index-kind", "bm25",
                     "--llm-url", url, "--model", resolve_llm(None), "--out", str(out)])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prediction"] for r in records] == [ANSWER] * 3
    assert all(r["searches"] == 1 for r in records)
    protocol = get_protocol(name)
    assert all(r["trajectory"]["protocol"] == name and r["trajectory"]["answer_source"] == "answer_tag"
               for r in records)
    first = tokenizer.decode(seen[0]["prompt"][0])
    assert protocol.messages("x")[0]["content"][:80] in first  # the peer's own system prompt or instruction
    assert sorted(seen[0]["stop"]) == sorted(protocol.stop_strings)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 3
