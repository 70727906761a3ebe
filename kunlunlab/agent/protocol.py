"""The search-think protocol: prompt templates and a parser that never raises.

The model writes ``<think>…</think>``, asks with ``<search>…</search>`` (several ``<query>…</query>``
elements inside one search are answered together, as in RAG-R1), receives ``<result>…</result>``
from the environment, and ends with ``<short_answer>\\boxed{…}</short_answer>`` or
``<long_answer>…\\boxed{…}…</long_answer>`` (paper §2.3, the dual-mode answers).

:func:`parse_turn` reads one generated segment (a turn ends at ``</search>``, at an answer's closing
tag, or where generation stopped) and returns a :class:`Turn` whose ``issues`` name every protocol
violation; rewards and the rollout engine decide what each one costs. Defined outcomes:

==========================  =====================================================================
model output                outcome
==========================  =====================================================================
``<search>`` never closed   ``kind="incomplete"``, issue ``unclosed:search``; no retrieval
nested ``<search>``         innermost content is used, issue ``nested:search``
empty query                 ``kind="invalid"``, issue ``empty_query``; no retrieval
answer without ``\\boxed``  the stripped answer text is used, issue ``missing_boxed``
text after the answer       answer kept, issue ``text_after_answer``
answer tag never closed     ``\\boxed`` content used if present, issue ``unclosed:<tag>``
no action at all            ``kind="none"``, issue ``no_action``
==========================  =====================================================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

SYSTEM_PROMPT = (
    "You are a research assistant that answers multi-hop questions by thinking and searching.\n"
    "Think step by step inside <think> </think>. Whenever you lack a fact, search for it with "
    "<search> <query>your query</query> </search>; several <query> elements in one search are answered "
    "together. Search results come back inside <result> </result>. You may search several times.\n"
    "When you know the answer, finish with <short_answer>\\boxed{answer}</short_answer> for a short "
    "factual answer (a name, date, number, yes or no), or <long_answer> summary \\boxed{answer} </long_answer> "
    "when a summary is asked for. Put only the final answer inside \\boxed{}."
)
USER_TEMPLATE = "{background}<question>{question}</question>"
BACKGROUND_TEMPLATE = "<background>\n{background}\n</background>\n"
RESULT_TEMPLATE = "\n<result>\n{results}\n</result>\n"

ANSWER_TAGS = ("short_answer", "long_answer")
STOP_STRINGS = ("</search>", "</short_answer>", "</long_answer>")


@dataclass
class Turn:
    kind: str  # "search" | "answer" | "incomplete" | "invalid" | "none"
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    answer_mode: str | None = None  # "short" | "long"
    think: str = ""
    issues: list[str] = field(default_factory=list)

    @property
    def well_formed(self) -> bool:
        return not self.issues


def build_messages(question: str, background: str | None = None, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    """Chat messages for the model; ``background`` is RDRA's first-stage context."""
    block = BACKGROUND_TEMPLATE.format(background=background.strip()) if background else ""
    return [{"role": "system", "content": system_prompt},
            {"role": "user", "content": USER_TEMPLATE.format(background=block, question=question.strip())}]


def format_results(results: list[list[str]], queries: list[str] | None = None) -> str:
    """The ``<result>`` block appended after a search: numbered passages, grouped per query."""
    lines = []
    for i, docs in enumerate(results):
        if queries and len(queries) > 1:
            lines.append(f"Query {i + 1}: {queries[i]}")
        lines.extend(f"({j + 1}) {doc.strip()}" for j, doc in enumerate(docs))
    return RESULT_TEMPLATE.format(results="\n".join(lines) if lines else "(no results)")


@dataclass(frozen=True)
class OpenAnswer:
    """An answer still being written at the end of a turn's text (:func:`open_answer`)."""

    text: str   # the open ``\\boxed{`` content so far; with no box open, the span's text so far
    depth: int  # braces the open box still needs closed (0: no box open)
    inner: str | None  # the span's text so far when a tag or EOS would make parse_turn read all of it (no box closed)

    def closed_by(self, piece: str) -> str | None:
        """The answer :func:`parse_turn` reads if ``piece`` comes next and ends the answer: the box's content
        when ``piece`` balances the open box's braces; the span's text with tags stripped (the reading of an
        answer without a closed box) when ``piece`` begins a tag, the closing one or any other after which the
        model could close it (EOS: pass ``"<"``). None when ``piece`` leaves the answer open."""
        depth = self.depth
        for j, ch in enumerate(piece):
            if ch == "<" and self.inner is not None:
                return re.sub(r"<[^>]+>", " ", self.inner + piece[:j]).strip()
            if depth:
                depth += (ch == "{") - (ch == "}")
                if depth == 0:
                    return (self.text + piece[:j]).strip()
        return None


def open_answer(text: str) -> OpenAnswer | None:
    """Where a turn's ``text`` stands inside its answer, as :func:`parse_turn` would read it: None outside an
    answer (no answer tag yet, a search first, the answer tag closed, or its last ``\\boxed{…}`` closed);
    else an :class:`OpenAnswer`. Generation constraints on the answer span (STIE's block, eq. 13) use it."""
    first_search = text.find("<search>")
    starts = [(p, tag) for tag in ANSWER_TAGS if (p := text.find(f"<{tag}>")) != -1]
    if not starts:
        return None
    pos, tag = min(starts)
    if first_search != -1 and first_search < pos:
        return None
    inner = text[pos + len(tag) + 2:]
    if f"</{tag}>" in inner:
        return None
    box = inner.rfind("\\boxed{")
    if box == -1:
        return OpenAnswer(inner, 0, inner)
    content, depth = inner[box + len("\\boxed{"):], 1
    for ch in content:
        depth += (ch == "{") - (ch == "}")
        if depth == 0:
            return None  # the last box is closed: the answer it holds was let through when it closed
    # parse_turn falls back to the whole span's text only when no earlier box of it is closed
    return OpenAnswer(content, depth, None if extract_boxed(inner[:box]) is not None else inner)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}``, with nested braces balanced; None if absent or unclosed."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1:j].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier one
    return None


def _blocks(text: str, tag: str) -> tuple[list[str], list[str]]:
    """Closed ``<tag>`` block contents (innermost for nested tags) and issues."""
    issues = []
    opens = len(re.findall(f"<{tag}>", text))
    closes = len(re.findall(f"</{tag}>", text))
    pattern = re.compile(f"<{tag}>((?:(?!<{tag}>).)*?)</{tag}>", re.S)  # innermost
    contents = pattern.findall(text)
    if opens > closes:
        issues.append(f"unclosed:{tag}")
    if re.search(f"<{tag}>(?:(?!</{tag}>).)*<{tag}>", text, re.S):
        issues.append(f"nested:{tag}")
    return contents, issues


def parse_turn(text: str) -> Turn:
    """Reads one generated segment; see the module docstring for every defined outcome."""
    think_blocks, issues = _blocks(text, "think")
    think = "\n".join(b.strip() for b in think_blocks)

    # Whichever action comes first ends the turn.
    first_search = text.find("<search>")
    answer_starts = {tag: text.find(f"<{tag}>") for tag in ANSWER_TAGS}
    answer_starts = {t: p for t, p in answer_starts.items() if p != -1}
    first_answer_tag = min(answer_starts, key=answer_starts.get) if answer_starts else None
    searching = first_search != -1 and (first_answer_tag is None or first_search < answer_starts[first_answer_tag])

    if searching:
        segment = text[first_search:]
        blocks, search_issues = _blocks(segment, "search")
        issues += search_issues
        if not blocks:
            return Turn("incomplete", think=think, issues=issues)
        body = blocks[0]
        queries = [q.strip() for q in re.findall(r"<query>(.*?)</query>", body, re.S)]
        if not queries and "<query>" not in body:
            queries = [body.strip()]
        elif "<query>" in body and body.count("<query>") > body.count("</query>"):
            issues.append("unclosed:query")
        empty = [q for q in queries if not q]
        queries = [q for q in queries if q]
        if empty:
            issues.append("empty_query")
        if not queries:
            return Turn("invalid", think=think, issues=issues)
        return Turn("search", queries=queries, think=think, issues=issues)

    if first_answer_tag is not None:
        tag = first_answer_tag
        segment = text[answer_starts[tag]:]
        close = segment.find(f"</{tag}>")
        if close == -1:
            issues.append(f"unclosed:{tag}")
            inner = segment[len(tag) + 2:]
        else:
            inner = segment[len(tag) + 2:close]
            trailing = segment[close + len(tag) + 3:].strip()
            if trailing:
                issues.append("text_after_answer")
        boxed = extract_boxed(inner)
        if boxed is None:
            issues.append("missing_boxed")
            boxed = re.sub(r"<[^>]+>", " ", inner).strip() or None
        if boxed is not None and not boxed:
            issues.append("empty_answer")
            boxed = None
        return Turn("answer", answer=boxed, answer_mode=tag.split("_")[0], think=think, issues=issues)

    boxed = extract_boxed(text)  # an answer with no tags at all still counts, flagged
    if boxed:
        return Turn("answer", answer=boxed, answer_mode="short", think=think, issues=issues + ["missing_answer_tag"])
    return Turn("none", think=think, issues=issues + ["no_action"])


# --- Baseline templates (Naive Generation, Naive RAG, Iter-RetGen, IRCoT, Search-o1, RDRA planning) ---------------
DIRECT_SYSTEM = ("Answer the question. Think briefly if needed, then give only the final answer inside \\boxed{}, "
                 "for example \\boxed{Paris}.")
DOCS_USER_TEMPLATE = "Documents:\n{docs}\n\nQuestion: {question}"
QUESTION_USER_TEMPLATE = "Question: {question}"
IRCOT_SYSTEM = ("Answer the question by reasoning step by step, one short sentence at a time, using the documents. "
                "When you know the answer, write: So the answer is \\boxed{answer}.")
SEARCH_O1_SYSTEM = (
    "You are a reasoning assistant with the ability to perform web searches to help you answer the user's question "
    "accurately. Whenever you need outside knowledge, write <search> <query>your query</query> </search>; the system "
    "searches, reads the documents it finds and returns the helpful information inside <result> </result>. You can "
    "repeat the search process multiple times. "
    "Reason about the information inside <think> </think>, and once you have all the information you need, write the "
    "final answer as <short_answer>\\boxed{answer}</short_answer>."
)
PLAN_SYSTEM = ("Before answering, plan the research. List the facts that must be looked up to answer the question, "
               "one short search query per line. Do not answer the question.")
PLAN_USER_TEMPLATE = "{background}Question: {question}\nSearch plan:"


def numbered_docs(docs: list[str]) -> str:
    return "\n".join(f"({i + 1}) {d.strip()}" for i, d in enumerate(docs)) or "(no documents)"


def extract_final_answer(text: str) -> str | None:
    """A baseline's answer: the last ``\\boxed{}``, else the phrase after "the answer is", else the first line."""
    boxed = extract_boxed(text)
    if boxed:
        return boxed
    m = re.search(r"answer is[:\s]*(.+?)(?:[.\n]|$)", text, re.I)
    if m:
        return m.group(1).strip() or None
    cleaned = re.sub(r"<[^>]+>", " ", text).strip()
    return cleaned.splitlines()[0].strip() if cleaned else None


_ANSWER_BLOCK = re.compile(r"<(short|long)_answer>(.*?)(?:</\1_answer>|$)", re.S)


def final_answer_block(text: str) -> tuple[str | None, str]:
    """The mode (``"short"`` / ``"long"``, None without an answer tag) and the body of the last answer tag of a
    trajectory's text: which of the dual-mode answers (§2.3) the model chose, and the summary it wrote."""
    blocks = _ANSWER_BLOCK.findall(text or "")
    return (blocks[-1][0], blocks[-1][1]) if blocks else (None, "")
