"""The agent protocols by name: this project's search-think protocol and the peers' (Search-R1, ReSearch, R1-Searcher).

A peer's checkpoint behaves as in its own repository only with the prompt, document block and turn boundaries its
training saw; its recipe retrains here only with its own parsing and answer extraction. So each
:class:`AgentProtocol` carries, as the peer's code does it: chat messages (and a base-model prompt), the assistant
prefix, stop strings, the document block appended after a search (tags included), a turn parser that never raises
(returning :class:`~kunlunlab.agent.protocol.Turn`), the answer the peer's evaluation extracts and its format check.
What ``result_block``, ``notice_block`` and ``invalid_block`` return is environment text (mask 0), as every peer
masks its documents out of the loss (Search-R1 ``info_mask``, ReSearch ``result_mask``, R1-Searcher ``retrieve_mask``).

Read at (prompts quoted verbatim, since a checkpoint depends on every character; the code is written here; each
function names the peer function it follows): github PeterGriffinJin/Search-R1 @a14dc3a, Agent-RL/ReSearch branch
``re-search`` @4bdb872 (``main`` is now ReCall), RUCAIBox/R1-Searcher @631167c. ``background`` (RDRA's context) is
no peer's: None gives the peer's prompt exactly; a background goes before the question as this project's
``<background>`` block, so an RDRA ablation shows every protocol the same context. Departures: the parsers' tables
and docs/method.md ("The peers' protocols and rewards").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from kunlunlab.agent.protocol import (BACKGROUND_TEMPLATE, RESULT_TEMPLATE, STOP_STRINGS, Turn, build_messages,
                                      format_results, parse_turn)

SEARCH_LIMIT_BEHAVIOURS = ("notice", "end")  # AgentProtocol.at_search_limit


@dataclass(frozen=True)
class AgentProtocol:
    """``parse_turn(text)`` reads one turn (the first after ``assistant_prefix``); ``final_answer`` and ``format_ok``
    a whole completion (after the prompt, prefix excluded, documents included: the peers' reward "response").
    ``invalid_block``: what the peer appends after a turn of a ``reprompt`` kind (None: it ends the trajectory).
    ``top_k``, ``max_searches``: the peer's training settings (None: no limit but the token budget), what a rollout
    runs unless a comparison states its own budget (:meth:`passages_per_search`, :meth:`search_limit`).
    ``blocks_repeats``: STIE's repeat blocking of an earlier query (this project's; no peer has it).
    ``at_search_limit``: a search past ``max_searches``: ``"notice"`` (this project's notice, the sample ends at the
    second) or ``"end"`` (the search is not run and the trajectory ends, as the peers' loops end)."""

    name: str
    source: str
    assistant_prefix: str
    stop_strings: tuple[str, ...]
    build_messages: Callable[[str, str | None], list[dict]]
    build_base_prompt: Callable[[str, str | None], str] | None  # None: the protocol has no base-model prompt
    format_docs: Callable[[list, list[str]], str]  # passage texts (capped) and the queries -> the appended block
    wrap_notice: Callable[[str], str]
    parse_turn: Callable[[str], Turn]
    final_answer: Callable[[str], str | None]
    format_ok: Callable[[str], bool]
    env_pattern: str  # matches every environment block in a completion
    invalid_block: str | None
    reprompt: tuple[str, ...]
    top_k: int
    max_searches: int | None
    blocks_repeats: bool = False
    at_search_limit: str = "end"

    def __post_init__(self):
        if self.at_search_limit not in SEARCH_LIMIT_BEHAVIOURS:
            raise ValueError(f"at_search_limit must be one of {SEARCH_LIMIT_BEHAVIOURS}, got {self.at_search_limit!r}")

    def passages_per_search(self, override: int | None = None) -> int:
        """The top-k a rollout runs: a comparison's ``override`` (the same for every arm), else the protocol's own."""
        return self.top_k if override is None else override

    def search_limit(self, override: int | None, token_budget: int) -> int:
        """The searches per question a rollout allows: a comparison's ``override``, else the protocol's own; a
        protocol without a limit (ReSearch: only the response length bounds it) gets ``token_budget``, which no
        rollout reaches (every search costs generated tokens)."""
        if override is not None:
            return override
        return token_budget if self.max_searches is None else self.max_searches

    def messages(self, question: str, background: str | None = None) -> list[dict]:
        """Chat messages as the peer builds them for an instruct model (the chat template adds the rest)."""
        return self.build_messages(question, background)

    def base_prompt(self, question: str, background: str | None = None) -> str:
        """The raw prompt for a base model, without ``assistant_prefix``; ValueError where there is none."""
        if self.build_base_prompt is None:
            raise ValueError(f"the {self.name} protocol has no base-model prompt; use messages() with a chat template")
        return self.build_base_prompt(question, background)

    def result_block(self, hits_per_query: list[list], queries: list[str], max_chars: int | None = None) -> str:
        """The environment text after a search: ``Hit`` objects (or plain strings), each capped at ``max_chars`` as
        ``rollout.result_block`` caps them (None or 0: uncapped; the peers cap none but by token budget)."""
        docs = [[h if isinstance(h, str) else _cap(h.contents, max_chars) for h in hits] for hits in hits_per_query]
        return self.format_docs(docs, list(queries))

    def notice_block(self, text: str) -> str:
        """An environment notice (search limit, service unavailable) inside the peer's document tags."""
        return self.wrap_notice(text)

    def spans(self, text: str) -> list[tuple[str, bool]]:
        """A completion cut into (text, is_environment) spans by ``env_pattern``; joined they give ``text`` back."""
        parts = re.split(f"({self.env_pattern})", text, flags=re.S)
        return [(part, k % 2 == 1) for k, part in enumerate(parts) if part]


def _cap(contents: str, max_chars: int | None) -> str:
    return contents if not max_chars or len(contents) <= max_chars else contents[:max_chars] + "…"


def _with_background(question: str, background: str | None) -> str:
    return (BACKGROUND_TEMPLATE.format(background=background.strip()) if background else "") + question


def _think(text: str) -> tuple[str, list[str]]:
    """Closed ``<think>`` blocks joined, and ``unclosed:think`` when an opening tag has no closing one."""
    blocks = re.findall(r"<think>(.*?)</think>", text, re.S)
    issues = ["unclosed:think"] if text.count("<think>") > text.count("</think>") else []
    return "\n".join(b.strip() for b in blocks), issues


def _answer_turn(answer: str | None, think: str, issues: list[str]) -> Turn:
    if answer is not None and not answer.strip():
        return Turn("answer", answer=None, answer_mode="short", think=think, issues=issues + ["empty_answer"])
    return Turn("answer", answer=answer.strip() if answer else None, answer_mode="short", think=think, issues=issues)


# ----------------------------------------------------------------------------------------------- search_think
def _search_think_turns(text: str) -> list[Turn]:
    """Every model turn of a completion, split as ``training.rewards.parse_completion`` splits it."""
    pieces = [p.replace("<|im_end|>", "") for p in re.split(r"<result>.*?(?:</result>|$)", text, flags=re.S)]
    segments = [s for p in pieces for s in re.split(r"(?<=</search>)", p) if s.strip()]
    return [parse_turn(s) for s in segments]


def _search_think_answer(text: str) -> str | None:
    answers = [t for t in _search_think_turns(text) if t.kind == "answer"]
    return answers[-1].answer if answers else None


def _search_think_format(text: str) -> bool:
    """``rewards.format_compliant(parse_completion(text))``: an answer tag with its box, and no issue in any turn
    (``no_action`` counts only in the last turn)."""
    turns = _search_think_turns(text)
    issues = [i for k, t in enumerate(turns) for i in t.issues if i != "no_action" or k == len(turns) - 1]
    answers = [t for t in turns if t.kind == "answer"]
    return bool(answers) and answers[-1].answer is not None and answers[-1].answer_mode is not None and not issues


# ----------------------------------------------------------------------------------------------- Search-R1
SEARCH_R1_INSTRUCTION = (  # scripts/data_process/nq_search.py make_prefix(template_type="base"), also infer.py
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. ")
_SR1_WRAP = "\n\n<information>{}</information>\n\n"  # execute_predictions
SEARCH_R1_INVALID = (  # generation.py execute_predictions: what follows a turn with no closed action
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n")


def _search_r1_prompt(question: str, background: str | None) -> str:
    question = question.strip()
    if not question.endswith("?"):  # qa_search_train_merge.py / infer.py append the question mark
        question += "?"
    block = BACKGROUND_TEMPLATE.format(background=background.strip()) if background else ""
    return f"{SEARCH_R1_INSTRUCTION}{block}Question: {question}\n"


def _search_r1_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``_passages2string``: ``Doc i(Title: <first line>) <other lines>``, one a line, the whole block stripped and
    wrapped as ``execute_predictions`` wraps it. The title keeps the FlashRAG quotes (``Doc 1(Title: "X")``)."""
    lines = []
    for contents in (d for group in docs for d in group):
        first, _, rest = contents.partition("\n")
        lines.append(f"Doc {len(lines) + 1}(Title: {first}) {rest}\n")
    return _SR1_WRAP.format("".join(lines).strip())


def _search_r1_parse(text: str) -> Turn:
    """``postprocess_predictions``: the first closed ``<search>``/``<answer>`` is the action. No closed action:
    ``incomplete`` (``unclosed:<tag>``) or ``none`` (``no_action``), both re-prompted by the peer; an empty search:
    ``invalid``, ``empty_query`` (departure: the peer searches ""); an empty answer: no answer, ``empty_answer``."""
    think, issues = _think(text)
    m = re.search(r"<(search|answer)>(.*?)</\1>", text, re.S)
    if m is None:
        opened = sorted((text.find(f"<{t}>"), t) for t in ("search", "answer") if f"<{t}>" in text)
        if opened:
            return Turn("incomplete", think=think, issues=issues + [f"unclosed:{opened[0][1]}"])
        return Turn("none", think=think, issues=issues + ["no_action"])
    content = m.group(2).strip()
    if m.group(1) == "answer":
        return _answer_turn(content, think, issues)
    if not content:
        return Turn("invalid", think=think, issues=issues + ["empty_query"])
    return Turn("search", queries=[content], think=think, issues=issues)


def _search_r1_answer(text: str) -> str | None:
    """``qa_em.extract_solution``: the last ``<answer>`` of the sequence. The peer reads prompt + response and needs
    two matches because its instruction holds ``<answer> Beijing </answer>``; over the completion one suffices."""
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    return matches[-1].strip() if matches else None


_SEARCH_R1_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_SEARCH_R1_STEPS = {("start", "<think>"): "in_think", ("information", "<think>"): "in_think",
                    ("in_think", "</think>"): "after_think", ("after_think", "<search>"): "in_search",
                    ("in_search", "</search>"): "after_search", ("after_search", "<information>"): "in_information",
                    ("in_information", "</information>"): "information", ("after_think", "<answer>"): "in_answer",
                    ("in_answer", "</answer>"): "end"}


def search_r1_valid_sequence(text: str) -> tuple[bool, str]:
    """``qa_em_format.is_valid_sequence`` on a completion: balanced tags, then
    think (search information think)* answer with only white space between the blocks."""
    for tag in ("think", "search", "information", "answer"):
        if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
            return False, f"unbalanced {tag}"
    state = "start"
    for part in _SEARCH_R1_TAG.split(text):
        if not part.strip():
            continue
        if _SEARCH_R1_TAG.fullmatch(part):
            state = _SEARCH_R1_STEPS.get((state, part), "")
            if not state:
                return False, f"unexpected tag {part}"
        elif not state.startswith("in_"):
            return False, f"text between tags in state {state}"
    return (True, "valid") if state == "end" else (False, f"ended in state {state}")


# ----------------------------------------------------------------------------------------------- ReSearch
_RESEARCH_RULES = (  # src/verl/utils/dataset/template.py, the part both templates share
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags respectively, "
    "and the search query and result are enclosed within <search> </search> and <result> </result> tags respectively. "
    "For example, <think> This is the reasoning process. </think> <search> search query here </search> "
    "<result> search result here </result> <think> This is the reasoning process. </think> "
    "<answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. "
    "In the last part of the answer, the final exact answer is enclosed within \\boxed{} with latex format.")
_RS_WRAP = " <result>\n{}\n</result>"
RESEARCH_SYSTEM = (  # re_search_template_sys (instruct models, apply_chat=True)
    "You are a helpful assistant that can solve the given question step by step with the help of the wikipedia "
    "search tool. Given a question, you need to first think about the reasoning process in the mind and then provide "
    "the answer. During thinking, you can invoke the wikipedia search tool to search for fact information about "
    "specific topics if needed. " + _RESEARCH_RULES)
RESEARCH_BASE = (  # re_search_template (base models), up to its "User: {prompt}. Assistant:"
    "A conversation between User and Assistant. The user asks a question, and the assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. During "
    "thinking, the assistant can invoke the wikipedia search tool to search for fact information about specific "
    "topics if needed. " + _RESEARCH_RULES)


def _research_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``vLLMRolloutWithSearch.batch_search``: the passages' ``contents`` joined by blank lines, stripped, appended
    as `` <result>\\n…\\n</result>`` (the same in ``ReSearchPipeline.run_item``)."""
    return _RS_WRAP.format("\n\n".join(d for group in docs for d in group).strip())


def research_boxed(part: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(part))``; None where the peer's call raises (it then scores 0)."""
    if "\\boxed " in part:
        return part.split("\\boxed ")[-1].split("$")[0]
    start = part.rfind("\\boxed")
    if start < 0:
        return None  # a \fbox{} fails remove_boxed's assertion
    depth = 0
    for i in range(start, len(part)):
        depth += (part[i] == "{") - (part[i] == "}")
        if part[i] == "}" and depth == 0:
            boxed = part[start:i + 1]
            return boxed[len("\\boxed{"):-1] if boxed.startswith("\\boxed{") else None
    return None


def _research_parse(text: str) -> Turn:
    """A turn ends at ``</search>`` (the only stop string) or EOS; the query is the last ``<search>`` before the last
    ``</search>`` (``extract_search_content``), the answer the first ``<answer>…</answer>``'s last ``\\boxed``. An empty
    query: ``invalid``, ``empty_query`` (training searches "", evaluation says "nothing to search": ``invalid_block``);
    no usable box or no ``</answer>``: no answer (``missing_boxed``, ``unclosed:answer``; the peer's pred is "")."""
    think, issues = _think(text)
    end = text.rfind("</search>")
    if end != -1:
        start = text.rfind("<search>", 0, end)
        query = text[start + len("<search>"):end].strip() if start != -1 else ""
        if not query:
            return Turn("invalid", think=think, issues=issues + ["empty_query"])
        return Turn("search", queries=[query], think=think, issues=issues)
    if "<answer>" in text:
        m = re.search(r"<answer>(.*?)</answer>", text, re.S)
        if m is None:
            return Turn("answer", answer_mode="short", think=think, issues=issues + ["unclosed:answer"])
        boxed = research_boxed(m.group(1))
        return _answer_turn(boxed, think, issues + ([] if boxed is not None else ["missing_boxed"]))
    if "<search>" in text:
        return Turn("incomplete", think=think, issues=issues + ["unclosed:search"])
    return Turn("none", think=think, issues=issues + ["no_action"])


def _research_answer(text: str) -> str | None:
    """``ReSearchPipeline.run_item``: the first ``<answer>…</answer>`` of the response, its last box (None where the
    peer's prediction is "": no answer, no usable box; an over-length response the caller must rule out)."""
    m = re.search(r"<answer>(.*?)</answer>", text.strip(), re.S)
    boxed = research_boxed(m.group(1)) if m else None
    return boxed.strip() if boxed is not None else None


def research_format(text: str) -> tuple[bool, str]:
    """``re_search.validate_format`` on the response: think tags paired and present, exactly one answer, every
    search followed by its result, a ``\\boxed{`` and a ``}`` inside the answer."""
    if text.count("<think>") != text.count("</think>"):
        return False, "<think> </think> not paired"
    if text.count("<think>") == 0:
        return False, "<think> or </think> not found"
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return False, "<answer> or </answer> not found"
    pos = 0
    while (search := text.find("<search>", pos)) != -1:
        result, search_end = text.find("<result>", search), text.find("</search>", search)
        result_end = text.find("</result>", result)
        if -1 in (result, search_end, result_end):
            return False, "search/result tags are incomplete"
        if not search < search_end < result < result_end:
            return False, "search/result tags are nested in the wrong order"
        pos = result_end
    start, end = text.find("<answer>"), text.find("</answer>")
    if start > end:
        return False, "<answer> must be before </answer>"
    if "\\boxed{" not in text[start:end] or "}" not in text[start:end]:
        return False, "answer is missing \\boxed{} format"
    return True, "format is correct"


# ----------------------------------------------------------------------------------------------- R1-Searcher
BEGIN_QUERY, END_QUERY = "<|begin_of_query|>", "<|end_of_query|>"
BEGIN_DOCS, END_DOCS = "<|begin_of_documents|>", "<|end_of_documents|>"
_R1_FORMAT = ('The output format of reasoning process and final answer are enclosed within <think> </think> and '
              '<answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final '
              'answer here </answer>".\n')
R1_SEARCHER_SYSTEM = (  # prompts_dataset.py, apply_chat_template branch (Llama-3.1-8B-Instruct)
    "You are a helpful assistant.\nGiven a question, you should answer it by first thinking about the reasoning "
    "process in the mind and then providing the final answer.\n" + _R1_FORMAT +
    'During the thinking process, **you can perform searching for uncertain knowledge** if necessary with the format '
    'of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)<|end_of_query|>". '
    '**A query must involve only a single triple**.\nThen, the search system will provide you with the retrieval '
    'information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".')
R1_SEARCHER_BASE = (  # prompts_dataset.py, base-model branch (Qwen-2.5-7B-Base), up to "User:{question}"
    "The User asks a question, and the Assistant solves it.\nThe Assistant first thinks about the reasoning process "
    "in the mind and then provides the User with the final answer.\n" + _R1_FORMAT +
    'During the thinking process, **the Assistant can perform searching** for uncertain knowledge if necessary with '
    'the format of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)'
    '<|end_of_query|>". **A query must involve only a single triple**.\nThen, the search system will provide the '
    'Assistant with the retrieval information with the format of "<|begin_of_documents|> ...search results... '
    '<|end_of_documents|>".\n\n')
R1_SEARCHER_EVAL_BASE = (  # evaluation/eval_search_loacl.py base_prompt_v0 (README: --prompt_type v0), up to "User:"
    "The User asks a question, and the Assistant solves it.\nThe Assistant first thinks about the reasoning process "
    "in the mind and then provides the User with the final answer.\n" + _R1_FORMAT +
    'During the thinking process, the Assistant can perform searching for uncertain knowledge if necessary with the '
    'format of "<|begin_of_query|> search query (only keywords) here <|end_of_query|>". **A query must involve only a '
    'single triple**.\nThen, the system will provide the Assistant with helpful information with the format of '
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\n')


def _r1_doc(contents: str) -> str:
    """A FlashRAG passage (``"Title"\\ntext``) as R1-Searcher's training corpus lays its passages out (the HotpotQA
    abstracts TSV: ``Title: X Text:  Y``, two spaces, as in every passage of data/eval_results/hotpotqa_qwen.jsonl);
    a passage without a title line stays as it is."""
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first[0] == first[-1] == '"':
        return f"Title: {first[1:-1]} Text:  {rest.lstrip()}"
    return contents


def _r1_docs(docs: list[list[str]], queries: list[str]) -> str:
    """``experience_maker.py``: ``(j)<passage>\\n`` per passage (a leading corpus id removed), ``None`` when there is
    none, between the document tags."""
    flat = [re.sub(r"^\d+\s+", "", _r1_doc(d)) for group in docs for d in group]
    return _r1_notice("".join(f"({j + 1}){d}\n" for j, d in enumerate(flat)) or "None")


def _r1_notice(text: str) -> str:
    """Departure: the peer appends ``<|end_of_query|>\\n\\n`` itself and trains on it (its mask starts at the
    documents tag); here the model generated ``<|end_of_query|>`` (a stop string) and the ``\\n\\n`` is environment."""
    return f"\n\n{BEGIN_DOCS}\n{text}{END_DOCS}\n\n"


def _r1_parse(text: str) -> Turn:
    """A turn ends at ``<|end_of_query|>`` (training) or ``</answer>`` (evaluation stops there too); the query follows
    the last ``<|begin_of_query|>``, quotes removed and white space collapsed as in training. An empty query or no
    begin tag: ``invalid``, ``empty_query`` (the peer ends the trajectory); ``<answer>`` never closed: no answer,
    ``unclosed:answer`` (evaluation: "shot_down")."""
    think, issues = _think(text)
    q_end, a_end = text.find(END_QUERY), text.find("</answer>")
    if q_end != -1 and (a_end == -1 or q_end < a_end):
        head = text[:q_end]
        query = " ".join(head.split(BEGIN_QUERY)[-1].replace('"', "").split()) if BEGIN_QUERY in head else ""
        # the prefix's <think> stays open across searches (one think span closes before the answer): no issue
        issues = [i for i in issues if i != "unclosed:think"]
        if not query:
            return Turn("invalid", think=think, issues=issues + ["empty_query"])
        return Turn("search", queries=[query], think=think, issues=issues)
    if "<answer>" in text:
        tail = text.split("<answer>")[-1]
        if "</answer>" not in tail:
            return Turn("answer", answer_mode="short", think=think, issues=issues + ["unclosed:answer"])
        return _answer_turn(tail.split("</answer>")[0], think, issues)
    if BEGIN_QUERY in text:
        return Turn("incomplete", think=think, issues=issues + ["unclosed:query"])
    return Turn("none", think=think, issues=issues + ["no_action"])


def _r1_answer(text: str) -> str | None:
    """The reward servers' ``extract_answer_math``: the text between the last ``<answer>`` and ``</answer>``."""
    if "<answer>" not in text or "</answer>" not in text.split("<answer>")[-1]:
        return None
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def r1_searcher_checks(text: str) -> dict[str, bool]:
    """The format conditions of R1-Searcher's reward servers, on the solution (the text after the prompt's
    ``<think>``), each True when met: ``docs_balanced`` (the seven tag counts agree, ``(1)`` opening each block),
    ``searched`` (at least one such block), ``think_answer_once`` (no ``<think>``, one ``</think>``, one answer),
    ``answer_clean`` (no query or document tag inside the answer), ``answer_short`` (at most 10 words),
    ``no_assistant`` (neither "Assistant" nor "assistant", documents included), ``no_chinese`` (outside documents)."""
    counts = [text.count(t) for t in (f"{BEGIN_DOCS}\n", f"{END_DOCS}\n\n", BEGIN_QUERY, END_QUERY, BEGIN_DOCS,
                                      END_DOCS, f"{BEGIN_DOCS}\n(1)")]
    answer = text.split("<answer>")[-1].split("</answer>")[0].strip()
    outside = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", text, flags=re.S)
    return {"docs_balanced": len(set(counts)) == 1, "searched": len(set(counts)) == 1 and counts[0] >= 1,
            "think_answer_once": text.count("<think>") == 0 and text.count("</think>") == 1
            and text.count("<answer>") == 1 and text.count("</answer>") == 1,
            "answer_clean": "begin_of_query" not in answer and "begin_of_documents" not in answer,
            "answer_short": len(answer.split()) <= 10,
            "no_assistant": "Assistant" not in text and "assistant" not in text,
            "no_chinese": not any("\u4e00" <= ch <= "\u9fff" for ch in outside)}


def _r1_format(text: str) -> bool:
    """The stage-2 reward's format check (``train/reward_server_qwen_zero.py``): every condition but ``searched``."""
    return all(ok for check, ok in r1_searcher_checks(text).items() if check != "searched")


# ----------------------------------------------------------------------------------------------- the registry
PROTOCOLS: dict[str, AgentProtocol] = {p.name: p for p in (
    AgentProtocol(
        name="search_think", source="kunlunlab/agent/protocol.py (this project, paper §2.3)",
        assistant_prefix="<think>", stop_strings=STOP_STRINGS, build_messages=build_messages, build_base_prompt=None,
        format_docs=format_results, wrap_notice=lambda text: RESULT_TEMPLATE.format(results=text),
        parse_turn=parse_turn, final_answer=_search_think_answer, format_ok=_search_think_format,
        env_pattern=r"\n<result>\n.*?\n</result>\n",
        invalid_block=RESULT_TEMPLATE.format(results="(empty query: nothing was searched)"), reprompt=("invalid",),
        top_k=3, max_searches=8, blocks_repeats=True, at_search_limit="notice"),
    # the peers: no repeat blocking; past the search limit the trajectory ends, no notice (Search-R1:
    # generation.py run_llm_loop, whose last generation after max_turns runs execute_predictions(do_search=False)
    # and appends nothing; R1-Searcher: experience_maker.py, whose generation at t == 8 is kept as it is and ends;
    # ReSearch: vllm_rollout.py has no limit but the response length)
    AgentProtocol(
        name="search_r1", source="PeterGriffinJin/Search-R1@a14dc3a search_r1/llm_agent/generation.py, "
        "scripts/data_process/nq_search.py, verl/utils/reward_score/qa_em.py",
        assistant_prefix="", stop_strings=("</search>", "</answer>"),
        build_messages=lambda q, bg: [{"role": "user", "content": _search_r1_prompt(q, bg)}],
        build_base_prompt=_search_r1_prompt, format_docs=_search_r1_docs, wrap_notice=_SR1_WRAP.format,
        parse_turn=_search_r1_parse, final_answer=_search_r1_answer,
        format_ok=lambda text: search_r1_valid_sequence(text)[0],
        env_pattern=r"\n\n<information>.*?</information>\n\n|" + re.escape(SEARCH_R1_INVALID),
        invalid_block=SEARCH_R1_INVALID, reprompt=("invalid", "incomplete", "none"), top_k=3, max_searches=4),
    AgentProtocol(
        name="research", source="Agent-RL/ReSearch@4bdb872 (branch re-search) src/verl/utils/dataset/template.py, "
        "src/verl/workers/rollout/vllm_rollout/vllm_rollout.py, src/verl/utils/reward_score/re_search.py",
        assistant_prefix="", stop_strings=("</search>",),
        build_messages=lambda q, bg: [{"role": "system", "content": RESEARCH_SYSTEM},
                                      {"role": "user", "content": _with_background(q, bg)}],
        build_base_prompt=lambda q, bg: f"{RESEARCH_BASE} User: {_with_background(q, bg)}. Assistant:",
        format_docs=_research_docs, wrap_notice=_RS_WRAP.format, parse_turn=_research_parse,
        final_answer=_research_answer, format_ok=lambda text: research_format(text)[0],
        env_pattern=r" <result>\n.*?\n</result>", invalid_block=_RS_WRAP.format("nothing to search"),
        reprompt=("invalid",), top_k=5, max_searches=None),
    AgentProtocol(
        name="r1_searcher", source="RUCAIBox/R1-Searcher@631167c OpenRLHF-RAG/openrlhf/datasets/prompts_dataset.py, "
        "OpenRLHF-RAG/openrlhf/trainer/ppo_utils/experience_maker.py, train/reward_server_*.py",
        assistant_prefix="<think>", stop_strings=(END_QUERY, "</answer>"),
        build_messages=lambda q, bg: [{"role": "system", "content": R1_SEARCHER_SYSTEM},
                                      {"role": "user", "content": _with_background(q, bg)}],
        build_base_prompt=lambda q, bg: f"{R1_SEARCHER_BASE}User:{_with_background(q, bg)}\nAssistant: ",
        format_docs=_r1_docs, wrap_notice=_r1_notice, parse_turn=_r1_parse, final_answer=_r1_answer,
        format_ok=_r1_format, env_pattern=r"\n\n<\|begin_of_documents\|>\n.*?<\|end_of_documents\|>\n\n",
        invalid_block=None, reprompt=(), top_k=3, max_searches=8),
)}


def get_protocol(name: str) -> AgentProtocol:
    """The protocol called ``name``; a ValueError naming the known ones otherwise."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown agent protocol {name!r}; known: {', '.join(sorted(PROTOCOLS))}") from None


__all__ = ["AgentProtocol", "PROTOCOLS", "get_protocol", "r1_searcher_checks", "research_boxed",
           "research_format", "search_r1_valid_sequence"]
