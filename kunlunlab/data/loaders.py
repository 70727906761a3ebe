"""Readers for the layouts the field distributes; every one yields :class:`QAExample` / :class:`Passage`.

QA layouts (detected from the file, or forced with ``layout=``):

* ``hotpot``: official HotpotQA JSON list with ``context`` and ``supporting_facts``
* ``searchr1``: Search-R1 / veRL jsonl (``prompt``, ``reward_model.ground_truth``, ``extra_info``)
* ``2wiki``: 2WikiMultihopQA JSON list (``question``, ``answer`` as a string or alias list)
* ``flashrag``: FlashRAG jsonl (``id``, ``question``, ``golden_answers``)

Corpus layouts: FlashRAG jsonl (``id``, ``contents``), a JSON list of ``{title, text}``, and the
union of HotpotQA contexts. A malformed file raises :class:`DataFormatError` naming file, line and field.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from kunlunlab.data.types import DataFormatError, Passage, QAExample
from kunlunlab.data.world import World
from kunlunlab.paths import shared_data_dir

QA_LAYOUTS = ("hotpot", "searchr1", "2wiki", "flashrag")

# Benchmark name -> file under the shared data folder.
BENCHMARK_FILES = {
    "hotpotqa": "hotpotqa/test.jsonl",
    "hotpotqa_distractor": "hotpotqa/hotpot_dev_distractor_sample.json",
    "2wikimultihopqa": "2wikimultihopqa/dev.json",
    "musique": "musique/test.jsonl",
    "bamboogle": "bamboogle/test.jsonl",
}


# ---------------------------------------------------------------------------- raw records
def _records(path: Path) -> Iterator[tuple[dict, dict]]:
    """(record, location) pairs from a JSON list or a jsonl file; location feeds error messages.

    A jsonl file is read line by line (a corpus of any size streams from disk); a JSON list is parsed whole."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        first = ""
        while not first:
            chunk = fh.read(4096)
            if not chunk:
                return  # empty file
            first = chunk.lstrip()[:1]
        fh.seek(0)
        if first == "[":
            text = fh.read()
            try:
                items = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataFormatError(path, f"invalid JSON: {err.msg}", line=err.lineno) from err
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise DataFormatError(path, f"expected an object, got {type(item).__name__}", record=i)
                yield item, {"record": i}
            return
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(path, f"invalid JSON: {err.msg}", line=lineno) from err
            if not isinstance(item, dict):
                raise DataFormatError(path, f"expected an object, got {type(item).__name__}", line=lineno)
            yield item, {"line": lineno}


def _field(item: dict, name: str, path: Path, where: dict, kinds: tuple[type, ...] = (str,)) -> Any:
    if name not in item:
        raise DataFormatError(path, "missing field", field_name=name, **where)
    value = item[name]
    if not isinstance(value, kinds):
        raise DataFormatError(path, f"expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}",
                              field_name=name, **where)
    return value


def _answers(value: Any, path: Path, where: dict, field_name: str) -> list[str]:
    """Gold answers come as a string, a list of aliases, or Search-R1's ``{"target": [...]}``."""
    if isinstance(value, dict) and "target" in value:
        value = value["target"]
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(a, (str, int, float)) for a in value):
        raise DataFormatError(path, "expected a non-empty answer string or list of strings",
                              field_name=field_name, **where)
    return [str(a) for a in value]


def detect_layout(item: dict) -> str | None:
    if "context" in item and "supporting_facts" in item:
        return "hotpot"
    if "prompt" in item and "reward_model" in item:
        return "searchr1"
    if "golden_answers" in item:
        return "flashrag"
    if "question" in item and "answer" in item:
        return "2wiki"
    return None


# ---------------------------------------------------------------------------- QA
def _parse_qa(item: dict, layout: str, path: Path, where: dict, index: int, source: str) -> QAExample:
    if layout == "hotpot":
        question = _field(item, "question", path, where)
        answers = _answers(_field(item, "answer", path, where, (str, list)), path, where, "answer")
        context = _field(item, "context", path, where, (list,))
        passages = []
        for j, para in enumerate(context):
            if not (isinstance(para, list) and len(para) == 2 and isinstance(para[0], str) and isinstance(para[1], list)):
                raise DataFormatError(path, f"context[{j}] must be [title, [sentences...]]", field_name="context", **where)
            passages.append(Passage(id=para[0], title=para[0], text="".join(para[1]).strip()))
        facts = _field(item, "supporting_facts", path, where, (list,))
        titles = list(dict.fromkeys(f[0] for f in facts if isinstance(f, list) and f))
        qid = item.get("_id") or f"{source}-{index}"
        return QAExample(id=str(qid), question=question, answers=answers, source=source, type=item.get("type"),
                         supporting_titles=titles, supporting_ids=titles, context=passages)
    if layout == "searchr1":
        reward = _field(item, "reward_model", path, where, (dict,))
        if "ground_truth" not in reward:
            raise DataFormatError(path, "missing field", field_name="reward_model.ground_truth", **where)
        answers = _answers(reward["ground_truth"], path, where, "reward_model.ground_truth")
        extra = item.get("extra_info") or {}
        question = extra.get("question")
        if not isinstance(question, str):
            prompt = _field(item, "prompt", path, where, (list,))
            users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            if not users or not isinstance(users[-1], str):
                raise DataFormatError(path, "no user message with the question", field_name="prompt", **where)
            question = users[-1]
        qid = f"{item.get('data_source', source)}-{extra.get('index', index)}"
        return QAExample(id=str(qid), question=question.strip(), answers=answers,
                         source=str(item.get("data_source", source)))
    if layout == "flashrag":
        question = _field(item, "question", path, where)
        answers = _answers(_field(item, "golden_answers", path, where, (list, str)), path, where, "golden_answers")
        return QAExample(id=str(item.get("id", f"{source}-{index}")), question=question, answers=answers,
                         source=source, type=(item.get("metadata") or {}).get("type"))
    if layout == "2wiki":
        question = _field(item, "question", path, where)
        answers = _answers(_field(item, "answer", path, where, (str, list)), path, where, "answer")
        qid = item.get("_id", item.get("test_id", index))
        return QAExample(id=f"{source}-{qid}", question=question, answers=answers, source=source, type=item.get("type"))
    raise ValueError(f"unknown QA layout {layout!r}; choose from {QA_LAYOUTS}")


def load_qa(path: str | Path, limit: int | None = None, layout: str | None = None,
            source: str | None = None) -> list[QAExample]:
    """Reads any supported QA layout into :class:`QAExample` records (first ``limit`` only, if given)."""
    path = Path(path)
    source = source or path.parent.name or path.stem
    out: list[QAExample] = []
    for index, (item, where) in enumerate(_records(path)):
        if limit is not None and len(out) >= limit:
            break
        found = layout or detect_layout(item)
        if found is None:
            raise DataFormatError(path, f"unrecognised QA layout (keys {sorted(item)}); expected one of {QA_LAYOUTS}",
                                  **where)
        layout = found  # one layout per file: later records are checked against it
        out.append(_parse_qa(item, layout, path, where, index, source))
    return out


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[QAExample]:
    """A named benchmark from the shared data folder (``hotpotqa``, ``2wikimultihopqa``, ``musique``, ...)."""
    if name not in BENCHMARK_FILES:
        raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARK_FILES)}")
    root = Path(data_dir) if data_dir else shared_data_dir()
    if root is None:
        raise FileNotFoundError("no benchmark data folder: set KUNLUNLAB_DATA or place the data at ../shared/data")
    return load_qa(root / BENCHMARK_FILES[name], limit=limit, source=name)


# ---------------------------------------------------------------------------- corpora
def _split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` is ``"Title"\\ntext``; titles are optional."""
    head, sep, rest = contents.partition("\n")
    if sep and head.startswith('"') and head.endswith('"') and len(head) >= 2:
        return head[1:-1], rest
    return "", contents


def flashrag_passage(pid: str | int, contents: str) -> Passage:
    """A passage from a FlashRAG ``{id, contents}`` record (title on the first line, in quotes, if any)."""
    return Passage(str(pid), *_split_contents(contents))


def load_corpus(path: str | Path, limit: int | None = None) -> list[Passage]:
    """Reads FlashRAG jsonl (``id, contents``), a ``{title, text}`` JSON list, or HotpotQA contexts."""
    out: list[Passage] = []
    for passage in iter_corpus(path):
        if limit is not None and len(out) >= limit:
            break
        out.append(passage)
    return out


def iter_corpus(path: str | Path) -> Iterator[Passage]:
    """The passages of a corpus file in order, one at a time: a FlashRAG jsonl corpus streams from disk
    (what ``kunlunlab build-index --engine stream|ray`` reads); the JSON-list layouts are parsed whole."""
    path = Path(path)
    seen: set[str] = set()
    for index, (item, where) in enumerate(_records(path)):
        if "contents" in item:
            contents = _field(item, "contents", path, where)
            yield flashrag_passage(_field(item, "id", path, where, (str, int)), contents)
        elif "text" in item:
            title = item.get("title", "")
            if not isinstance(title, str):
                raise DataFormatError(path, "expected str", field_name="title", **where)
            yield Passage(str(item.get("id", index)), title, _field(item, "text", path, where))
        elif "context" in item and "supporting_facts" in item:
            for para in _parse_qa(item, "hotpot", path, where, index, "hotpot").context:
                if para.id not in seen:
                    seen.add(para.id)
                    yield para
        else:
            raise DataFormatError(path, f"unrecognised corpus layout (keys {sorted(item)}); expected "
                                  "{id, contents}, {title, text} or HotpotQA records", **where)


def corpus_from_examples(examples: list[QAExample]) -> list[Passage]:
    """The closed corpus formed by the union of the examples' shipped contexts (HotpotQA distractor)."""
    seen: dict[str, Passage] = {}
    for ex in examples:
        for para in ex.context:
            seen.setdefault(para.id, para)
    return list(seen.values())


NAMED_CORPORA = {"hotpotqa_distractor": "hotpotqa/hotpot_dev_distractor_sample.json", "2wiki": "2wikimultihopqa/corpus.json"}


def load_named_corpus(corpus: str, n: int = 2000, seed: int = 0) -> list[Passage]:
    """``world`` (the synthetic world with ``n`` passages), a named benchmark corpus (``NAMED_CORPORA``, from
    the benchmark data folder) or a corpus file in any supported layout: what ``kunlunlab build-index
    --corpus`` and notebook 01 accept."""
    if corpus == "world":
        return World.generate(n_passages=n, seed=seed).passages
    if corpus in NAMED_CORPORA:
        root = shared_data_dir()
        if root is None:
            raise FileNotFoundError(f"corpus {corpus!r} needs the benchmark data folder (KUNLUNLAB_DATA or ../shared/data)")
        return load_corpus(root / NAMED_CORPORA[corpus])
    path = Path(corpus)
    if not path.exists():
        raise FileNotFoundError(f"corpus {corpus!r} is neither 'world', one of {sorted(NAMED_CORPORA)}, nor an "
                                "existing file")
    return load_corpus(path)
