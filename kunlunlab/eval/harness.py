"""One evaluation runner for every method and dataset (FlashRAG-style): ``kunlunlab eval`` and notebook 06.

Datasets: ``world`` (synthetic multi-hop questions over the synthetic world), a benchmark name
(``hotpotqa``, ``hotpotqa_distractor``, ``2wikimultihopqa``, ``musique``, ``bamboogle``) or a path in
any supported layout. The corpus defaults to the dataset's natural closed corpus: the world, the
HotpotQA distractor contexts, the 2Wiki paragraphs; for sets that ship no evidence (HotpotQA,
MuSiQue, Bamboogle in the Search-R1 layout) the union of the 2Wiki paragraphs and the HotpotQA
distractor contexts, an open-corpus setting that does not cover every question.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kunlunlab.data.loaders import BENCHMARK_FILES, corpus_from_examples, load_benchmark, load_corpus, load_qa
from kunlunlab.data.types import Passage, QAExample
from kunlunlab.eval.metrics import cover_em, exact_match, f1, retrieval_recall


@dataclass
class EvalConfig:
    dataset: str = "world"
    method: str = "kunlun"
    limit: int | None = 20
    model: str | None = None        # LLM: None = embedded SmolLM2; hub id or local path
    llm_url: str | None = None      # OpenAI-compatible server instead of a local model
    judge: str | None = "same"      # "same" (the answering model), None/"none" (skip LJ), or a model name
    corpus: str | None = None       # None: the dataset's default corpus (see module docstring)
    index_kind: str = "flat"
    embedder: str | None = None
    batch_size: int = 8
    top_k: int = 3
    world_passages: int = 2000
    seed: int = 0
    max_searches: int = 8
    max_total_tokens: int = 768
    max_turn_tokens: int = 256
    max_result_chars: int = 600
    stie_rounds: int = 2
    stie_collect: bool = False      # generate every STIE round (no early stop), to tune STIE on cached rounds
    network_url: str | None = None  # retrieval service for NLR's network tier
    router: str | None = None       # a trained NLR policy (RoutingPolicy.save); without one: "both"

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be positive, got {self.limit}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


def load_examples(config: EvalConfig) -> tuple[list[QAExample], list[Passage] | None]:
    """(questions, default corpus or None when the corpus must come from elsewhere)."""
    if config.dataset == "world":
        from kunlunlab.data import World, make_questions

        world = World.generate(n_passages=config.world_passages, seed=config.seed)
        return make_questions(world, config.limit or 100, seed=config.seed + 1), world.passages
    if config.dataset in BENCHMARK_FILES:
        examples = load_benchmark(config.dataset, limit=config.limit)
    else:
        path = Path(config.dataset)
        if not path.exists():
            raise FileNotFoundError(f"dataset {config.dataset!r} is neither 'world', a benchmark name "
                                    f"({', '.join(sorted(BENCHMARK_FILES))}) nor an existing file")
        examples = load_qa(path, limit=config.limit)
    if any(ex.context for ex in examples):
        return examples, corpus_from_examples(examples)
    return examples, None


def default_corpus(dataset: str) -> list[Passage]:
    from kunlunlab.paths import shared_data_dir

    root = shared_data_dir()
    if root is None:
        raise FileNotFoundError(f"dataset {dataset!r} needs a corpus: pass --corpus, or provide the benchmark "
                                "data folder (KUNLUNLAB_DATA or ../shared/data)")
    wiki = load_corpus(root / "2wikimultihopqa/corpus.json")
    if dataset in ("2wikimultihopqa", "2wiki"):
        return wiki
    hotpot = load_corpus(root / BENCHMARK_FILES["hotpotqa_distractor"])
    return wiki + hotpot


def build_pipeline(config: EvalConfig, passages: list[Passage], backend=None):
    """(method, retriever, backend) for a config; pass ``backend`` to reuse a loaded model."""
    from kunlunlab.agent.backends import OpenAIBackend, TransformersBackend
    from kunlunlab.agent.methods import MethodConfig, make_method
    from kunlunlab.agent.rollout import RolloutConfig
    from kunlunlab.agent.stie import STIEConfig
    from kunlunlab.agent.stie_tuning import COLLECT_ALL_ROUNDS
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever

    retriever = build_retriever(passages, IndexConfig(kind=config.index_kind, embedder=config.embedder))
    if backend is None:
        backend = (OpenAIBackend(config.llm_url, config.model or "default", tokenizer_name=config.model)
                   if config.llm_url else TransformersBackend(config.model))
    search = retriever.search
    if config.network_url:
        from kunlunlab.agent.nlr import NetworkLocalRouter, RoutingPolicy
        from kunlunlab.retrieval.service import RetrievalClient

        policy = RoutingPolicy.load(config.router) if config.router else None
        search = NetworkLocalRouter(retriever.search, RetrievalClient(config.network_url).search, policy,
                                    fixed_action=None if policy else "both")
    method_config = MethodConfig(top_k=config.top_k,
                                 rollout=RolloutConfig(max_searches=config.max_searches, top_k=config.top_k,
                                                       max_total_tokens=config.max_total_tokens,
                                                       max_turn_tokens=config.max_turn_tokens,
                                                       max_result_chars=config.max_result_chars),
                                 stie=STIEConfig(max_rounds=config.stie_rounds,
                                                 **(COLLECT_ALL_ROUNDS if config.stie_collect else {})))
    return make_method(config.method, backend, search, method_config), retriever, backend


def evaluate(config: EvalConfig, out: str | Path | None = None, backend=None, judge_backend=None,
             examples: list[QAExample] | None = None, passages: list[Passage] | None = None) -> dict:
    """Runs one method over one dataset; writes one JSON record per question to ``out``; returns the summary."""
    start = time.perf_counter()
    if examples is None:
        examples, default = load_examples(config)
        passages = passages or default
    if passages is None:
        passages = load_corpus(config.corpus) if config.corpus else default_corpus(config.dataset)
    method, retriever, backend = build_pipeline(config, passages, backend)
    titles = {p.id: p.title for p in retriever.passages}
    records = []
    for b in range(0, len(examples), config.batch_size):
        batch = examples[b:b + config.batch_size]
        t0 = time.perf_counter()
        outputs = method.run([ex.question for ex in batch])
        per_question = (time.perf_counter() - t0) / len(batch)
        for ex, o in zip(batch, outputs):
            records.append({
                "id": ex.id, "question": ex.question, "golds": ex.answers, "prediction": o.prediction,
                "em": exact_match(o.prediction, ex.answers), "f1": f1(o.prediction, ex.answers),
                "acc": cover_em(o.prediction, ex.answers), "lj": None,
                "retrieval_recall": retrieval_recall([titles.get(d, "") for d in o.doc_ids], ex.supporting_titles),
                "searches": o.searches, "seconds": per_question, "type": ex.type, "trajectory": o.trajectory})
    judge_stats = None
    if config.judge not in (None, "none"):
        from kunlunlab.agent.backends import TransformersBackend
        from kunlunlab.eval.judge import LLMJudge

        judge_backend = judge_backend or (backend if config.judge == "same" else TransformersBackend(config.judge))
        judge = LLMJudge(judge_backend)
        for r, v in zip(records, judge.judge([(r["question"], r["golds"], r["prediction"]) for r in records])):
            r["lj"] = v
        judge_stats = judge.stats
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as f:
            for r in records:
                f.write(json.dumps(r, default=str) + "\n")
    summary = summarize(records)
    recalls = [r["retrieval_recall"] for r in records if r["retrieval_recall"] is not None]
    summary.update(method=config.method, dataset=config.dataset, model=backend.name,
                   retrieval_recall=round(sum(recalls) / len(recalls), 4) if recalls else None,
                   search_errors=len(method.search_errors), judge=judge_stats,
                   wall_seconds=round(time.perf_counter() - start, 1), config=asdict(config))
    return summary


def summarize(records: list[dict]) -> dict:
    n = len(records)

    def mean(key):
        values = [r[key] for r in records if r[key] is not None]
        return round(sum(values) / len(values), 4) if values else None

    return {"n": n, "em": mean("em"), "f1": mean("f1"), "acc": mean("acc"), "lj": mean("lj"),
            "searches_per_question": mean("searches"), "seconds_per_question": mean("seconds")}
