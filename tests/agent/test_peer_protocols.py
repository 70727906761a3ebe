"""The peers' protocols replay the peers' own trajectories: prompts, queries, document blocks, answers, the token mask.

The trajectories are the peers' own text: Search-R1's ``example/case.txt`` (second case), R1-Searcher's
``data/eval_results/hotpotqa_qwen.jsonl`` (the William Beaudine question), and for ReSearch, whose repository ships
no rollout, one written in the format its template and rollout code produce (``template.py``, ``vllm_rollout.py``).
The document blocks below are the peers' formatting, written out by hand, never produced by the code under test.
"""
import re

import pytest

from kunlunlab.agent.protocol import RESULT_TEMPLATE, STOP_STRINGS, build_messages, parse_turn
from kunlunlab.agent.protocols import PROTOCOLS, get_protocol
from kunlunlab.agent.rollout import result_block
from kunlunlab.data.types import Passage
from kunlunlab.retrieval.retriever import Hit

# --- Search-R1, example/case.txt (Qwen2.5 instruct): the user turn and the assistant's text, cut where the model stopped
SR1_QUESTION = "the heart muscle is stimulated to contract by electrical impulses which are generated where"
SR1_USER = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. You can search "
    "as many times as your want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
    "the heart muscle is stimulated to contract by electrical impulses which are generated where?\n")
SR1_TURNS = [
    "<think> I remember that the heart's electrical impulses originate from a specific part of the heart, but I need to "
    "confirm which part.</think>\n<search> origin of heart's electrical impulses </search>",
    "From the information provided, it is clear that the heart's electrical impulses are generated in the sinoatrial "
    "(SA) node, which is often referred to as the heart's natural pacemaker. </think>\n\n<answer> sinoatrial (SA) node "
    "</answer>"]
SR1_DOCS = (
    '\n\n<information>Doc 1(Title: "Cardiac pacemaker") Cardiac pacemaker The contraction of cardiac muscle (heart '
    'muscle) in all animals is initiated by electrical impulses known as action potentials. The rate at which these '
    'impulses fire controls the rate of cardiac contraction, that is, the heart rate. The cells that create these '
    'rhythmic impulses, setting the pace for blood pumping, are called pacemaker cells, and they directly control the '
    'heart rate. They make up the cardiac pacemaker, that is, the natural pacemaker of the heart. In most humans, the '
    'concentration of pacemaker cells in the sinoatrial (SA) node is the natural pacemaker, and the resultant rhythm '
    'is a\n'
    'Doc 2(Title: "Electrical conduction system of the heart") Electrical conduction system of the heart The '
    'electrical conduction system of the heart transmits signals generated usually by the sinoatrial node to cause '
    'contraction of the heart muscle. The pacemaking signal generated in the sinoatrial node travels through the right '
    'atrium to the atrioventricular node, along the Bundle of His and through bundle branches to cause contraction of '
    'the heart muscle. This signal stimulates contraction first of the right and left atrium, and then the right and '
    'left ventricles. This process allows blood to be pumped throughout the body. The conduction system consists of '
    'specialised heart muscle cells, and is\n'
    'Doc 3(Title: "Sinoatrial node") Sinoatrial node The sinoatrial node (SA node), also known as sinus node, is a '
    'group of cells located in the wall of the right atrium of the heart. These cells have the ability to '
    'spontaneously produce an electrical impulse (action potential; see below for more details), that travels through '
    'the heart via the electrical conduction system (see figure 1) causing it to contract. In a healthy heart, the SA '
    "node continuously produces action potential, setting the rhythm of the heart and so is known as the heart's "
    'natural pacemaker. The rate of action potential production (and therefore the heart rate)</information>\n\n')

# --- ReSearch (instruct, re_search_template_sys): the passages' contents joined by blank lines, " <result>\n…\n</result>"
RS_TURNS = [
    "<think> I need the director of the film Men of San Quentin first, then his nationality. </think> "
    "<search> Men of San Quentin director </search>",
    " <think> The film was directed by William Beaudine. Now his nationality. </think> "
    "<search> William Beaudine nationality </search>",
    " <think> William Beaudine was an American film director. </think> "
    "<answer> The final answer is \\[ \\boxed{American} \\] </answer>"]
RS_DOCS = [
    ' <result>\n"Men of San Quentin"\nMen of San Quentin is a 1942 American film directed by William Beaudine.\n\n'
    '"Four Shall Die"\nFour Shall Die is a 1940 American supernatural crime film directed by William Beaudine.\n</result>',
    ' <result>\n"William Beaudine"\nWilliam Washington Beaudine (January 15, 1892 – March 18, 1970) was an American '
    'film actor and director.\n</result>']

# --- R1-Searcher, data/eval_results/hotpotqa_qwen.jsonl (Qwen-2.5-7B-Base, after the prompt's "Assistant: <think>")
R1_TURNS = [
    "To solve this question, I need to find out if both William Beaudine and Richard Benjamin are American actors. "
    "\n\nFirst, let's identify the nationality of William Beaudine:\n\n"
    "<|begin_of_query|> William Beaudine nationality<|end_of_query|>",
    "From the search results, I can see that William Beaudine was an American film actor.\n\nNow, let's identify the "
    "nationality of Richard Benjamin:\n\n<|begin_of_query|> Richard Benjamin nationality<|end_of_query|>",
    "From the search results, I can see that Richard Benjamin is an American actor.\n\nSince both William Beaudine and "
    'Richard Benjamin are American actors, the answer to the question is "Yes."</think>\n\n <answer> Yes </answer>']
R1_DOCS = [
    "\n\n<|begin_of_documents|>\n"
    "(1)Title: William Beaudine Text:  William Washington Beaudine (January 15, 1892 – March 18, 1970) was an "
    "American film actor and director.  He was one of Hollywood's most prolific directors, turning out films in "
    "remarkable numbers and in a wide variety of genres.\n"
    "(2)Title: Men of San Quentin Text:  Men of San Quentin is a 1942 American film directed by William Beaudine.\n"
    "(3)Title: The Social Highwayman Text:  The Social Highwayman is a 1926 American silent comedy film directed by "
    "William Beaudine.\n"
    "(4)Title: Four Shall Die Text:  Four Shall Die is a 1940 American supernatural crime film directed by William "
    "Beaudine.\n"
    "(5)Title: William Martin Beauchamp Text:  William Martin Beauchamp (March 25, 1830 – 1925) was an American "
    "ethnologist and Episcopal clergyman.  He published several works on the archeology and ethnology of the "
    "Haudenosaunee (Iroquois) in New York.\n<|end_of_documents|>\n\n",
    "\n\n<|begin_of_documents|>\n"
    "(1)Title: Richard Benjamin Text:  Richard Samuel Benjamin (born May 22, 1938) is an American actor and film "
    "director.\n"
    "(2)Title: Rich Benjamin Text:  Rich Benjamin is an American cultural critic, anthropologist, and author.\n"
    "(3)Title: Stuart Benjamin Text:  Stuart Benjamin (born April 25, 1946) is an American film producer.\n"
    "(4)Title: Chris Benjamin Text:  Christopher (Chris) Benjamin (born May 26, 1975) is a Canadian journalist, "
    "novelist and non-fiction writer.\n"
    "(5)Title: Bernard Benjamin Text:  Bernard Benjamin (8 March 1910 – 15 May 2002) was a noted British health "
    "statistician, actuary and demographer.  He was author or co-author of at least six books and over 100 papers in "
    "learned journals.\n<|end_of_documents|>\n\n"]


def _passages(block: str, pattern: str) -> list[Hit]:
    """The passages a peer's block shows, back as this project's corpus hits (FlashRAG contents ``"Title"\\ntext``)."""
    return [Hit(f"d{i}", Passage(f"d{i}", title, text).contents, 1.0, title)
            for i, (title, text) in enumerate(re.findall(pattern, block, re.M))]


CASES = {  # protocol -> (model turns, document blocks in order, queries, answer, the passages each block shows)
    "search_r1": (SR1_TURNS, [SR1_DOCS], [["origin of heart's electrical impulses"]], "sinoatrial (SA) node",
                  [_passages(SR1_DOCS, r'Doc \d\(Title: "(.*?)"\) (.*?)(?=\nDoc \d|</information>)')]),
    "research": (RS_TURNS, RS_DOCS, [["Men of San Quentin director"], ["William Beaudine nationality"]], "American",
                 [_passages(b, r'^"(.*)"\n(.*)$') for b in RS_DOCS]),
    "r1_searcher": (R1_TURNS, R1_DOCS, [["William Beaudine nationality"], ["Richard Benjamin nationality"]], "Yes",
                    [_passages(b, r"^\(\d\)Title: (.*?) Text:  (.*)$") for b in R1_DOCS]),
}


def _replay(proto, turns, passages):
    """What the rollout engine does with each turn: parse it (the first after the assistant prefix) and append the
    protocol's document block after a search. Returns the spans (text, is_environment), the queries and the answer."""
    spans, queries, answer, blocks = [], [], None, iter(passages)
    for k, text in enumerate(turns):
        turn = proto.parse_turn((proto.assistant_prefix if k == 0 else "") + text)
        spans.append((text, False))
        if turn.kind == "search":
            queries.append(turn.queries)
            spans.append((proto.result_block([next(blocks)], turn.queries, max_chars=None), True))
        else:
            assert turn.kind == "answer", turn
            answer = turn.answer
    return spans, queries, answer


@pytest.mark.parametrize("name", sorted(CASES))
def test_replaying_the_peers_trajectory_rebuilds_it(name):
    proto = get_protocol(name)
    turns, docs, queries, answer, passages = CASES[name]
    assert [len(p) for p in passages] == {"search_r1": [3], "research": [2, 1], "r1_searcher": [5, 5]}[name]
    spans, got_queries, got_answer = _replay(proto, turns, passages)
    assert got_queries == queries and got_answer == answer
    assert [text for text, env in spans if env] == docs  # the peer's own document blocks, character for character
    whole = "".join(text for text, _ in spans)
    assert proto.spans(whole) == spans  # environment and model text separate where the peer's do
    assert proto.final_answer(whole) == answer


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from kunlunlab.models import resolve_llm
    return AutoTokenizer.from_pretrained(resolve_llm(None))


@pytest.mark.parametrize("name", sorted(CASES))
def test_documents_and_only_documents_are_masked(name, tokenizer):
    turns, docs = CASES[name][:2]
    whole = "".join(t + d for t, d in zip(turns, docs + [""]))
    ids, mask = [], []
    for text, env in get_protocol(name).spans(whole):  # as the engine appends: each span tokenized on its own
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [0 if env else 1] * len(piece)
    env_text = tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
    model_text = tokenizer.decode([i for i, m in zip(ids, mask) if m == 1])
    assert env_text == "".join(docs) and model_text == "".join(turns)
    first_turn = tokenizer(turns[0], add_special_tokens=False)["input_ids"]
    assert mask.index(0) == len(first_turn)  # the documents start right after the model's stop string
    assert sum(mask) == sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in turns)
    assert not any(stop in env_text for stop in get_protocol(name).stop_strings)  # closing tags are the model's


def test_prompts_are_the_peers():
    assert get_protocol("search_r1").messages(SR1_QUESTION) == [{"role": "user", "content": SR1_USER}]
    assert get_protocol("search_r1").base_prompt(SR1_QUESTION + "?") == SR1_USER  # base models: the same text, raw
    research = get_protocol("research")
    system, user = research.messages("Who directed Men of San Quentin?")
    assert system["role"] == "system" and system["content"].startswith(
        "You are a helpful assistant that can solve the given question step by step with the help of the wikipedia")
    assert "<answer> The final answer is \\[ \\boxed{answer here} \\] </answer>" in system["content"]
    assert user == {"role": "user", "content": "Who directed Men of San Quentin?"}
    assert research.base_prompt("Who directed Men of San Quentin?").endswith(
        "enclosed within \\boxed{} with latex format. User: Who directed Men of San Quentin?. Assistant:")
    r1 = get_protocol("r1_searcher")
    assert (r1.base_prompt("Q?") + r1.assistant_prefix).endswith(
        '"<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\nUser:Q?\nAssistant: <think>')
    assert r1.messages("Q?")[0]["content"].startswith("You are a helpful assistant.\nGiven a question, you should")
    assert [get_protocol(n).assistant_prefix for n in ("r1_searcher", "research", "search_r1")] == ["<think>", "", ""]


def test_background_is_prepended_and_absent_by_default():
    for name in ("search_r1", "research", "r1_searcher"):
        text = get_protocol(name).messages("Q?", "Some background.")[-1]["content"]
        assert "<background>\nSome background.\n</background>\n" in text and "<background>" not in \
            get_protocol(name).messages("Q?")[-1]["content"]


def test_stop_strings_and_settings_are_the_peers():
    assert get_protocol("search_r1").stop_strings == ("</search>", "</answer>")
    assert get_protocol("research").stop_strings == ("</search>",)
    assert get_protocol("r1_searcher").stop_strings == ("<|end_of_query|>", "</answer>")
    assert [get_protocol(n).top_k for n in ("search_r1", "research", "r1_searcher")] == [3, 5, 3]


def test_search_think_is_this_projects_protocol_unchanged():
    proto = get_protocol("search_think")
    hits = [Hit("a", '"Paris"\n' + "Paris is the capital of France. " * 40, 1.0, "Paris"), Hit("b", '"Lyon"\nA city.', 0.5)]
    assert proto.messages("Q?", "bg") == build_messages("Q?", "bg")
    assert proto.stop_strings == STOP_STRINGS and proto.assistant_prefix == "<think>" and proto.parse_turn is parse_turn
    for groups, queries in (([hits], ["q"]), ([hits, hits[:1]], ["q1", "q2"]), ([["plain text"]], ["q"]), ([[]], ["q"])):
        assert proto.result_block(groups, queries, 600) == result_block(groups, queries, 600)
    assert proto.notice_block("Search limit (8) reached.") == RESULT_TEMPLATE.format(results="Search limit (8) reached.")
    text = ("<search>q</search>" + result_block([hits], ["q"], 600) +
            "<think>ok</think><short_answer>\\boxed{Paris}</short_answer>")
    assert proto.final_answer(text) == "Paris" and proto.format_ok(text)
    assert not proto.format_ok("<short_answer>Paris</short_answer>")
    with pytest.raises(ValueError, match="no base-model prompt"):
        proto.base_prompt("Q?")


def test_long_passages_are_capped_like_the_engine_caps_them():
    hit = Hit("a", '"T"\n' + "x" * 100, 1.0, "T")
    assert get_protocol("search_r1").result_block([[hit]], ["q"], 20) == \
        '\n\n<information>Doc 1(Title: "T") ' + "x" * 16 + "…</information>\n\n"
    assert get_protocol("research").result_block([[hit]], ["q"], 20) == ' <result>\n"T"\n' + "x" * 16 + "…\n</result>"


def test_empty_results_and_notices_use_the_peers_wrapping():
    assert get_protocol("search_r1").result_block([[]], ["q"]) == "\n\n<information></information>\n\n"
    assert get_protocol("research").result_block([[]], ["q"]) == " <result>\n\n</result>"
    assert get_protocol("r1_searcher").result_block([[]], ["q"]) == \
        "\n\n<|begin_of_documents|>\nNone<|end_of_documents|>\n\n"
    assert get_protocol("research").notice_block("Search limit reached.") == " <result>\nSearch limit reached.\n</result>"
    assert get_protocol("r1_searcher").result_block([["12\tTitle: X Text:  Y"]], ["q"]) == \
        "\n\n<|begin_of_documents|>\n(1)Title: X Text:  Y\n<|end_of_documents|>\n\n"  # the corpus id is dropped


@pytest.mark.parametrize("name,text,kind,issue,answer", [
    ("search_r1", "<think>hm</think><search> who is", "incomplete", "unclosed:search", None),
    ("search_r1", "<think>hm</think> I know it.", "none", "no_action", None),
    ("search_r1", "<search>  </search>", "invalid", "empty_query", None),
    ("search_r1", "<answer> Paris </answer><search> x </search>", "answer", None, "Paris"),  # first action counts
    ("search_r1", "<answer> </answer>", "answer", "empty_answer", None),
    ("research", "<think>a</think> <search> q1 </search> <search> q2 </search>", "search", None, None),
    ("research", "<think>a</think> </search>", "invalid", "empty_query", None),
    ("research", "<answer> The answer is Paris </answer>", "answer", "missing_boxed", None),
    ("research", "<answer> \\boxed{Paris}", "answer", "unclosed:answer", None),
    ("research", "<answer> \\boxed{\\text{Paris}} </answer>", "answer", None, "\\text{Paris}"),
    ("research", "<think>a</think> <search> q", "incomplete", "unclosed:search", None),
    ("r1_searcher", "<think>a <|begin_of_query|> <|end_of_query|>", "invalid", "empty_query", None),
    ("r1_searcher", "<think>a <|end_of_query|>", "invalid", "empty_query", None),
    ("r1_searcher", "a</think> <answer> Paris", "answer", "unclosed:answer", None),
    ("r1_searcher", "<think>a <|begin_of_query|> x y", "incomplete", "unclosed:query", None),
    ("r1_searcher", "<think>a", "none", "no_action", None),
    ("r1_searcher", "<think><think>a</think> <answer>Paris</answer>", "answer", "unclosed:think", "Paris"),
])
def test_malformed_turns_have_defined_outcomes(name, text, kind, issue, answer):
    turn = get_protocol(name).parse_turn(text)
    assert turn.kind == kind and (issue in turn.issues if issue else not turn.issues) and turn.answer == answer, turn


def test_queries_are_cleaned_as_the_peers_clean_them():
    r1 = get_protocol("r1_searcher").parse_turn('<think>x <|begin_of_query|> "Paul"\tWalker   cars<|end_of_query|>')
    assert r1.queries == ["Paul Walker cars"]  # quotes removed, white space collapsed (experience_maker.py)
    rs = get_protocol("research").parse_turn("<search> a </search> then <search>  b c </search>")
    assert rs.queries == ["b c"]  # the last search before the last </search> (extract_search_content)


def test_what_follows_an_action_the_peer_cannot_carry_out():
    assert get_protocol("search_r1").invalid_block.startswith("\nMy previous action is invalid.")
    assert set(get_protocol("search_r1").reprompt) == {"invalid", "incomplete", "none"}
    assert get_protocol("research").invalid_block == " <result>\nnothing to search\n</result>"
    assert get_protocol("r1_searcher").invalid_block is None and get_protocol("r1_searcher").reprompt == ()
    text = SR1_TURNS[0] + get_protocol("search_r1").invalid_block + SR1_TURNS[1]
    assert [env for _, env in get_protocol("search_r1").spans(text)] == [False, True, False]


def test_format_checks_are_the_peers():
    sr1 = get_protocol("search_r1")
    assert not sr1.format_ok(SR1_TURNS[0] + SR1_DOCS + SR1_TURNS[1])  # case.txt skips <think> after the documents
    assert sr1.format_ok(SR1_TURNS[0] + SR1_DOCS + "<think> SA node </think>\n<answer> SA node </answer>")
    assert get_protocol("research").format_ok("".join(t + d for t, d in zip(RS_TURNS, RS_DOCS + [""])))
    assert not get_protocol("research").format_ok(RS_TURNS[2] + RS_TURNS[2])  # two answers
    r1_text = "".join(t + d for t, d in zip(R1_TURNS, R1_DOCS + [""]))
    assert get_protocol("r1_searcher").format_ok(r1_text)
    assert not get_protocol("r1_searcher").format_ok(r1_text.replace("Yes", "yes, " + "and " * 10))  # > 10 words


def test_unknown_protocol_names_the_known_ones():
    with pytest.raises(ValueError, match=re.escape(", ".join(sorted(PROTOCOLS)))):
        get_protocol("search_o2")
    # the shipped ones (a recipe added through "Adding an agent" joins them without editing this test)
    assert {"r1_searcher", "research", "search_r1", "search_think", "ur2"} <= set(PROTOCOLS)
