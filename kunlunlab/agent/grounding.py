"""Is a quoted sentence one the agent was shown? Grounding of the evidence a think turn quotes.

With ``mixing.quote_evidence`` the reader states each hop as ``question "quoted sentence" So: answer.``.
A quote is *grounded* when every content word of it (lower-cased word characters, a short list of function
words left out) occurs in one passage the agent had been shown before that turn: the RDRA background or an
earlier ``<result>`` block. The word test, not an exact substring, because the reader re-phrases a sentence
into its training template ("It was directed by X." for "... is a 1918 film directed by X."), which is no
misreading; a quote that adds a word the passage does not hold (a year, a relation: "Her spouse is X" where
the passage says "Her father was X") is not grounded. Limits: the test accepts a quote that re-arranges one
passage's words into a false statement (the father's name as the spouse when the passage names both); in a
multi-query result block a "Query n:" line counts as part of the passage before it (it only adds words).
Every one of the 1206 quotes of the G192 quoted SFT data passes it.

Why it exists: at G192 the quoted reader trained with the search-budget reward skipped searches by quoting
sentences it had never seen (README, "Teaching the reader to quote"); the budget term can be told not to pay
for evidence stated but not seen (``RewardConfig.budget_grounded``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FUNCTION_WORDS = frozenset(
    "a an the it its is was were be been by of in on at to for from with and or as that this he she his her him "
    "they their them who what which when where whose so".split())
_PASSAGE_START = re.compile(r"\n(?=\(\d+\) )")
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)
_QUOTE = re.compile(r'"([^"\n]+)"')
_MODEL_KINDS = ("prefix", "model")


def content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"\w+", text.lower()) if w not in _FUNCTION_WORDS)


def passages(shown_text: str) -> list[frozenset[str]]:
    """The content words of each numbered passage (``(1) "Title"\\ntext``) of a background or result block."""
    return [content_words(p) for p in _PASSAGE_START.split(shown_text) if p.strip()]


@dataclass
class QuoteGrounding:
    quotes: int = 0
    ungrounded: list[str] = field(default_factory=list)

    @property
    def ungrounded_share(self) -> float:
        return len(self.ungrounded) / self.quotes if self.quotes else 0.0


def quote_grounding(steps: list[dict], background: str | None = None) -> QuoteGrounding:
    """The quotes of a trajectory's think turns (``Trajectory.steps``) and those not grounded in the passages
    shown before them. A quote with no content words (e.g. ``"So"``) is not counted."""
    shown = passages(background or "")
    out = QuoteGrounding()
    model_text = ""

    def check(text: str) -> None:
        for think in _THINK.findall(text):
            for quote in _QUOTE.findall(think):
                words = content_words(quote)
                if not words:
                    continue
                out.quotes += 1
                if not any(words <= passage for passage in shown):
                    out.ungrounded.append(quote.strip())

    for step in steps:
        if step.get("kind") in _MODEL_KINDS:
            model_text += step.get("text", "")
            continue
        check(model_text)
        model_text = ""
        shown += passages(step.get("text", ""))
    check(model_text)
    return out


__all__ = ["QuoteGrounding", "content_words", "passages", "quote_grounding"]
