"""Silver evidence chains for questions that come without supporting facts (2WikiMultihopQA dev + its corpus).

The shared 2Wiki dev file holds questions and answers only; its paragraph corpus covers some of them. To
train on those (the issue's "2Wiki questions whose evidence is in the 2Wiki corpus"), each question is linked
to corpus paragraphs by their titles, the way entity-linked distant supervision builds multi-hop chains:

* **question entities**: corpus titles (without a trailing ``(film)``-style qualifier) that occur in the
  normalised question, longest match first;
* **comparison** (two entities, and the question compares the two entities themselves — not their
  directors, parents, …): both paragraphs, when the answer is yes/no or names one of the two;
* **direct** (one entity whose paragraph states the answer): that paragraph;
* **bridge** (one entity): a paragraph whose title occurs in the first paragraph's text and whose text
  states the answer.

A chain is kept only when the answer (any alias) is stated by its last paragraph (or is one of the compared
entities / yes-no), so every trajectory built from it ends at evidence it has shown. Questions whose chain
would need paragraphs the corpus lacks are dropped: on the shared data 48 dev questions link (36 two-hop
bridges, 10 comparisons, 2 direct; direct ones are typed ``bridge``), 40 of them after the held-out first 100. Linked examples get ``supporting_titles`` / ``supporting_ids`` and a
``type`` (``comparison`` or ``bridge``), which is what
:meth:`kunlunlab.training.mixing.TrajectoryBuilder.hotpot` walks.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from kunlunlab.data.answers import normalize_answer
from kunlunlab.data.types import Passage, QAExample

# Comparisons of related entities (the director of each film, both parents, ...) need four paragraphs:
# two entity paragraphs do not decide them, so such questions are not linked as comparisons.
_RELATED = re.compile(r"\b(director|directors|composer|performer|producer|father|mother|spouse|husband|wife|"
                      r"founder|creator|author)\b", re.I)
_MAX_TITLE_WORDS = 12
_CHOICE = re.compile(r",[^,]+ or [^,]+\?\s*$")  # "Which film came out first, A or B?"


def _base_title(title: str) -> str:
    return re.sub(r"\s*\([^()]*\)\s*$", "", title)


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


class TitleIndex:
    """Normalised paragraph titles → paragraphs, and the titles mentioned in a piece of text."""

    def __init__(self, passages: Sequence[Passage], min_chars: int = 4):
        self.passages = list(passages)
        self.by_title: dict[str, list[int]] = {}
        for i, p in enumerate(self.passages):
            key = _norm(_base_title(p.title))
            if len(key) >= min_chars:
                self.by_title.setdefault(key, []).append(i)

    def mentions(self, text: str, exclude: set[str] = frozenset()) -> list[str]:
        """Titles occurring in ``text`` as whole words, maximal spans only, in order of first occurrence."""
        words = _norm(text).split()
        found: list[tuple[int, int, str]] = []
        for start in range(len(words)):
            for end in range(min(len(words), start + _MAX_TITLE_WORDS), start, -1):
                key = " ".join(words[start:end])
                if key in self.by_title and key not in exclude:
                    found.append((start, end, key))
                    break
        kept = [f for f in found if not any(g[0] <= f[0] and f[1] <= g[1] and g != f for g in found)]
        return list(dict.fromkeys(k for _, _, k in kept))


def _names(passage: Passage) -> set[str]:
    return {normalize_answer(passage.title), normalize_answer(_base_title(passage.title))}


def _states(passage: Passage, answers: Sequence[str]) -> bool:
    text = f" {normalize_answer(passage.text)} "
    return any(a and f" {a} " in text for a in (normalize_answer(x) for x in answers))


def link_chain(example: QAExample, index: TitleIndex) -> QAExample | None:
    """``example`` with a silver chain (see the module docstring), or None when the corpus holds none."""
    answers = [normalize_answer(a) for a in example.answers]
    entities = index.mentions(example.question)
    first = [index.passages[i] for key in entities for i in index.by_title[key][:1]]
    if not first:
        return None
    if len(first) >= 2:
        a, b = first[:2]
        names = _names(a) | _names(b)
        decidable = any(x in ("yes", "no") for x in answers) or any(x in names for x in answers)
        if decidable and not _RELATED.search(example.question):
            return _linked(example, [a, b], "comparison")
        return None
    head = first[0]
    if _CHOICE.search(example.question) or any(x in _names(head) for x in answers):
        return None  # a choice between two entities of which the corpus holds one: not decidable
    if _states(head, example.answers):
        return _linked(example, [head], "bridge")
    for key in index.mentions(head.text, exclude={entities[0]}):
        for i in index.by_title[key]:
            if _states(index.passages[i], example.answers):
                return _linked(example, [head, index.passages[i]], "bridge")
    return None


def _linked(example: QAExample, chain: list[Passage], kind: str) -> QAExample:
    return replace(example, type=kind, supporting_titles=[p.title for p in chain],
                   supporting_ids=[p.id for p in chain])


def link_evidence(examples: Sequence[QAExample], passages: Sequence[Passage]) -> list[QAExample]:
    """The examples that link to a silver chain in ``passages`` (the others are dropped)."""
    index = TitleIndex(passages)
    return [linked for ex in examples if (linked := link_chain(ex, index)) is not None]
