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
