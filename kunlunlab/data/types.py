"""The uniform records every loader produces (FlashRAG-style: one QA type, one passage type)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """FlashRAG/Search-R1 corpus layout: the title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}' if self.title else self.text


@dataclass(frozen=True)
class Hop:
    """One step of a gold reasoning chain: a sub-question, its answer, the passage that holds it."""

    question: str
    answer: str
    passage_id: str | None = None


@dataclass
class QAExample:
    id: str
    question: str
    answers: list[str]
    source: str
    type: str | None = None
    supporting_titles: list[str] = field(default_factory=list)
    supporting_ids: list[str] = field(default_factory=list)
    chain: list[Hop] = field(default_factory=list)
    context: list[Passage] = field(default_factory=list)  # evidence shipped with the question (HotpotQA)
    # A summary-oriented question (paper §2.3: the long-answer mode) carries the gold facts its summary should
    # state; ``answers`` then holds what goes into its box. Empty for a factoid question.
    facts: list[str] = field(default_factory=list)

    @property
    def summary(self) -> bool:
        """Whether the question asks for a summary (answered in ``<long_answer>``) rather than a fact."""
        return bool(self.facts)

    def stage_groups(self) -> list[list[int]]:
        """Which evidence items one (multi-query) search can fetch together: index lists into ``chain`` (into
        ``supporting_titles`` when there is no chain), one per dependency stage, in order. The two compared
        items of a comparison share a stage, as do a bridge comparison's two first-hop pages and then its two
        second-hop pages; every other hop needs the answer of the hop before it (HotpotQA's and 2Wiki's
        bridge, compositional and inference questions)."""
        n = len(self.chain) or len(self.supporting_titles)
        if self.type == "comparison" and n == 2:
            return [[0, 1]]
        if self.type == "bridge_comparison" and n == 4:
            return [[0, 1], [2, 3]]
        return [[i] for i in range(n)]

    def evidence_stages(self) -> list[list[str]]:
        """The gold supporting titles grouped as :meth:`stage_groups` groups the evidence (empty without gold
        titles; a chain hop without a passage is left out)."""
        if not self.chain:
            return [[self.supporting_titles[i] for i in group] for group in self.stage_groups()]
        title_of = dict(zip(self.supporting_ids, self.supporting_titles))
        stages = [[title_of[self.chain[i].passage_id] for i in group if self.chain[i].passage_id in title_of]
                  for group in self.stage_groups()]
        return [stage for stage in stages if stage]


class DataFormatError(ValueError):
    """A data file does not match the layout it claims; the message names the file, line/record and field."""

    def __init__(self, path, problem: str, line: int | None = None, field_name: str | None = None,
                 record: int | None = None):
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if record is not None:
            where += f", record {record}"
        what = f" (field {field_name!r})" if field_name else ""
        super().__init__(f"{where}{what}: {problem}")
        self.path, self.line, self.record, self.field = str(path), line, record, field_name
