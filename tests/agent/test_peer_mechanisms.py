"""No mechanism of this project in a peer's rollout (issue 51): STIE's repeat blocking and the "Search limit" notice
are the search-think protocol's alone. A peer searches a repeated query again, as its repository does, and at its
search limit its trajectory ends without a notice (Search-R1 generation.py ``run_llm_loop``: the last generation
after ``max_turns`` runs no search; R1-Searcher experience_maker.py: the generation at ``t == 8`` ends it)."""
import pytest

from kunlunlab.agent.backends import chat_prompt_ids
from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine
from kunlunlab.models import load_llm
from kunlunlab.retrieval.retriever import Hit
from scripted import ScriptedBackend

QUERY = "founder of Shylcel Holdings"
SEARCH = {  # one search turn of each protocol, for the same query
    "search_think": f"I need the founder.</think>\n<search><query>{QUERY}</query></search>",
    "search_r1": f"<think>I need the founder.</think>\n<search> {QUERY} </search>",
    "research": f"<think> I need the founder. </think> <search> {QUERY} </search>",
    "r1_searcher": f"I need the founder. <|begin_of_query|> {QUERY} <|end_of_query|>",
}
PEERS = ("search_r1", "research", "r1_searcher")
REPEAT_TEXT = "(repeated query: see the earlier results above)"


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


class KeptSearch:
    """A search that records every call's queries and top-k."""

    def __init__(self):
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, queries, k):
        self.calls.append((list(queries), k))
        return [[Hit(f"{q}-{j}", f'"Title {j}"\npassage {j} about {q}', 1.0) for j in range(k)] for q in queries]


def _roll(tokenizer, name: str, turns: list[str], config: RolloutConfig):
    protocol = get_protocol(name)
    search = KeptSearch()
    prompt = chat_prompt_ids(tokenizer, protocol.messages("Who founded Shylcel Holdings?"), protocol.assistant_prefix)
    engine = RolloutEngine(ScriptedBackend(tokenizer, {0: turns}), search, config, name)
    (t,) = engine.run([prompt], ["Who founded Shylcel Holdings?"], prefixes=[protocol.assistant_prefix])
    return t, search


@pytest.mark.parametrize("name", PEERS)
def test_a_peer_searches_a_repeated_query_again(name, tokenizer):
    t, search = _roll(tokenizer, name, [SEARCH[name]] * 3, RolloutConfig(max_searches=2, top_k=2))
    assert search.calls == [([QUERY], 2), ([QUERY], 2)]  # the repeat is searched, not blocked
    assert REPEAT_TEXT not in t.text and "repeated_query" not in t.issues


@pytest.mark.parametrize("name", PEERS)
def test_a_peer_ends_at_its_search_limit_without_this_projects_notice(name, tokenizer):
    t, search = _roll(tokenizer, name, [SEARCH[name]] * 3, RolloutConfig(max_searches=2, top_k=2))
    assert t.finish == "search_limit" and t.n_searches == 2 and len(search.calls) == 2
    assert "Search limit" not in t.text
    assert [s["kind"] for s in t.steps if s["kind"] != "prefix"] == ["model", "result", "model", "result", "model"]


def test_this_projects_protocol_keeps_its_repeat_blocking_and_notice(tokenizer):
    t, search = _roll(tokenizer, "search_think", [SEARCH["search_think"]] * 4, RolloutConfig(max_searches=2, top_k=2))
    assert search.calls == [([QUERY], 2)]  # the second, identical query is blocked and answered from memory
    assert REPEAT_TEXT in t.text and "repeated_query" in t.issues
    assert "Search limit (2) reached. Answer now with what you know." in t.text  # the notice, then the end
    assert t.finish == "search_limit"
