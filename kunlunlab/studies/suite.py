"""The evaluation suite of notebook 06: the trained agent against the baselines on every dataset (Table 2)
and its inference ablations (−RDRA, −STIE, the plain agent, NLR), on questions training never saw.

NLR (§2.4) needs two tiers. With ``nlr`` on, the suite builds them on the synthetic world: the local tier
is a seeded half of the world's passages, the network tier the retrieval service over the whole world
on loopback with ``nlr_latency_ms`` added per request. It trains the routing policy
(:func:`kunlunlab.training.router.train_router`, on the router's own training questions), then runs
``kunlun`` twice on the held-out world questions: with the local half alone (``local ½, no NLR``) and with
the trained router over both tiers (``+NLR``). Their rows sit beside the full-corpus ``kunlun`` row, and
the router's decisions, latency and network errors go to :attr:`SuiteResult.router`.

World questions are the held-out split of the training config the checkpoint was trained with
(:mod:`kunlunlab.data.splits`: none of them is a training question), factoid (``world``) and summary-oriented
(``world_summary``, the long-answer mode: :func:`answer_modes_table` says which mode each method chose); HotpotQA
distractor questions are the held-out part of the shared sample; the other benchmarks are read as they
are (the first ``limit`` questions) and searched in their default corpus. Every method runs on the same
loaded model, and the trained checkpoint's own agent configuration (``kunlunlab_agent.json``: budgets,
top-k, RDRA, STIE, the index kind and embedder) applies to every method, so they are equal across the table
and as trained; a :class:`SuiteConfig` value that is set wins over the checkpoint's
(:func:`suite_eval_config`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kunlunlab.agent.nlr import network_tier
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.data.loaders import load_benchmark, load_corpus
from kunlunlab.data.splits import load_splits
from kunlunlab.eval.compare import ablation_table, table2
from kunlunlab.eval.harness import EvalConfig, evaluate, make_judge_backend, resolve_corpus
from kunlunlab.models import release_host_memory
from kunlunlab.paths import PROJECT_ROOT, shared_data_dir
from kunlunlab.training.config import load_config
from kunlunlab.training.router import RouterTrainConfig, train_router


BASELINES = ("naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1")
DATASETS = ("world", "world_summary", "hotpotqa_distractor", "2wikimultihopqa", "musique", "bamboogle")
WORLD_DATASETS = ("world", "world_summary")  # the synthetic world's factoid and summary-oriented held-out questions
# Inference ablations of the whole agent: name -> EvalConfig overrides.
ABLATIONS = {"−RDRA": {"use_rdra": False}, "−STIE": {"use_stie": False},
             "agent (−RDRA −STIE)": {"method": "agent"}}


@dataclass
class SuiteConfig:
    model: str | None = None          # the trained checkpoint (None: the embedded, untrained model)
    train_config: str = "experiments/configs/training/train_embedded_cpu.json"  # its held-out split
    method: str = "kunlun"
    baselines: tuple[str, ...] = BASELINES
    datasets: tuple[str, ...] = DATASETS
    world_questions: int = 30
    summary_questions: int = 10       # held-out summary-oriented world questions (world_summary: the long mode)
    hotpot_questions: int = 20
    limit: int = 10                   # questions of each other benchmark
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    ablation_datasets: tuple[str, ...] = ("world",)
    nlr: bool = False                 # the NLR rows (a trained router over a local half and a network tier)
    nlr_latency_ms: float = 150.0     # the network tier's added latency per request
    judge: str | None = None          # LJ judge model (None: LJ absent, never self-judged by default)
    judge_url: str | None = None
    index_kind: str | None = None     # None: the checkpoint's (kunlunlab_agent.json), else EvalConfig's (flat)
    embedder: str | None = None       # None: the checkpoint's, else the embedded all-MiniLM-L6-v2 (which
                                      # "all-MiniLM-L6-v2" names explicitly, over a checkpoint's other one)
    device: str = "auto"              # where the checkpoint generates: auto (CUDA when present), cpu, cuda, cuda:N
    retriever_url: str | None = None  # the benchmarks' searches through this service (POST /retrieve); the
                                      # synthetic world keeps its in-process index (its passages are in no service)
    index_dir: str | None = None      # or through this saved index folder (kunlunlab build-index)
    batch_size: int = 20              # questions per generation batch: 20 world questions in one batch took
                                      # 57.9 s against 83.2 s in two of 10 (2-core CPU, 2026-11-25)
    n_resamples: int = 2000           # paired-bootstrap resamples behind every interval of the tables
    seed: int = 0

    def __post_init__(self):
        unknown = set(self.ablations) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablations {sorted(unknown)}; choose from {list(ABLATIONS)}")
        self.baselines, self.datasets = tuple(self.baselines), tuple(self.datasets)
        self.ablations, self.ablation_datasets = tuple(self.ablations), tuple(self.ablation_datasets)


@dataclass
class SuiteResult:
    records: dict[str, dict[str, list[dict]]] = field(default_factory=dict)    # dataset -> method -> records
    ablations: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # dataset -> variant -> records
    summaries: list[dict] = field(default_factory=list)
    router: dict | None = None        # NLR: the router's training summary and its decisions during evaluation
    seconds: float = 0.0


TABLE2_TITLE = "Table 2 (EM / LJ %)"
MODES_TITLE = "Answer modes (long answers %, fact coverage %)"


def ablation_title(dataset: str) -> str:
    return f"Ablations on {dataset}"


def suite_tables(result: SuiteResult, cfg: SuiteConfig) -> dict[str, tuple[list, list[list]]]:
    """Title -> (header, rows): Table 2 of every dataset and one ablation table per ablated dataset, each
    difference with its paired-bootstrap interval. Notebook 06 and ``kunlunlab suite`` both show these, so
    the two report the same numbers for the same records."""
    tables = {TABLE2_TITLE: table2(result.records, cfg.method, cfg.baselines, n_resamples=cfg.n_resamples,
                                   seed=cfg.seed)}
    for dataset, variants in result.ablations.items():
        tables[ablation_title(dataset)] = ablation_table(variants, cfg.method, n_resamples=cfg.n_resamples,
                                                         seed=cfg.seed)
    if "world_summary" in result.records:
        tables[MODES_TITLE] = answer_modes_table(result.records, (*cfg.baselines, cfg.method))
    return tables


def answer_modes_table(records: dict[str, dict[str, list[dict]]], methods) -> tuple[list, list[list]]:
    """How each method chooses between the dual-mode answers (§2.3): the share of ``<long_answer>`` on the
    world's factoid and summary-oriented held-out questions, and on the summary-oriented ones the fact coverage
    of the answer and the EM of the boxed link, with n."""
    def pct(values):
        values = [v for v in values if v is not None]
        return round(100 * sum(values) / len(values), 1) if values else None

    factoid, summary = records.get("world", {}), records.get("world_summary", {})
    header = ["method", "long % (factoid)", "long % (summary)", "fact coverage % (summary)", "EM link (summary)", "n"]
    rows = []
    for method in methods:
        f_recs, s_recs = factoid.get(method, []), summary.get(method, [])
        rows.append([method, pct([float(r.get("answer_mode") == "long") for r in f_recs]),
                     pct([float(r.get("answer_mode") == "long") for r in s_recs]),
                     pct([r.get("fact_coverage") for r in s_recs]), pct([r["em"] for r in s_recs]),
                     f"{len(f_recs)} / {len(s_recs)}"])
    return header, rows


def suite_data(cfg: SuiteConfig) -> dict[str, tuple[list, list | None]]:
    """(questions, corpus or None for the default corpus) per dataset; held-out splits for world and HotpotQA."""
    path = Path(cfg.train_config)
    train_cfg = load_config(path if path.is_absolute() else PROJECT_ROOT / path)
    held = load_splits(train_cfg.splits(world_heldout=cfg.world_questions, hotpot_heldout=cfg.hotpot_questions,
                                        summary_heldout=cfg.summary_questions if "world_summary" in cfg.datasets else 0))
    out: dict[str, tuple[list, list | None]] = {}
    for d in cfg.datasets:
        if d == "world":
            out[d] = (held.heldout, held.passages)
        elif d == "world_summary":
            out[d] = (held.heldout_summary, held.passages)
        elif shared_data_dir() is None:
            continue  # the benchmark folder is absent: the world only (the notebook says so)
        elif d == "hotpotqa_distractor":
            out[d] = (held.hotpot_heldout, held.hotpot_passages)
        else:
            if d == "2wikimultihopqa" and train_cfg.twowiki and cfg.limit > train_cfg.twowiki_heldout:
                raise ValueError(f"2Wiki: the checkpoint trained on 2Wiki dev questions from number "
                                 f"{train_cfg.twowiki_heldout} on; evaluate at most that many (limit={cfg.limit})")
            out[d] = (load_benchmark(d, limit=cfg.limit), None)
    return out


def suite_eval_config(cfg: SuiteConfig):
    """The EvalConfig every row of the suite starts from: the suite's own values, then the checkpoint's agent
    configuration (``kunlunlab_agent.json``) for every field the suite leaves unset (``index_kind`` and
    ``embedder`` None), then EvalConfig's defaults."""
    given = {"method": cfg.method, "judge": cfg.judge, "judge_url": cfg.judge_url, "batch_size": cfg.batch_size,
             "seed": cfg.seed}
    given.update((k, getattr(cfg, k)) for k in ("index_kind", "embedder") if getattr(cfg, k) is not None)
    return EvalConfig.for_checkpoint(cfg.model, **given) if cfg.model else EvalConfig(**given)


def run_suite(cfg: SuiteConfig, out_dir: str | Path, backend=None,
              progress: Callable[[str], None] = print) -> SuiteResult:
    """Evaluates every method on every dataset and the ablations; records go to ``out_dir`` as
    ``<dataset>.<method>.jsonl`` and are returned."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = backend or TransformersBackend(cfg.model, device=cfg.device)
    base = suite_eval_config(cfg)
    judge_backend = make_judge_backend(base, backend)
    result = SuiteResult()

    def run(dataset: str, name: str, examples, passages, **overrides) -> list[dict]:
        config = replace(base, dataset=dataset, limit=len(examples), **overrides)
        path = out_dir / f"{dataset}.{name.replace(' ', '_')}.jsonl"
        t0 = time.perf_counter()
        summary = evaluate(config, path, backend=backend, judge_backend=judge_backend, examples=examples,
                           passages=passages)
        summary.pop("config", None)
        summary["variant"] = name
        result.summaries.append(summary)
        release_host_memory()  # each method's rollout caches go back to the OS before the next method runs
        progress(f"{dataset:20} {name:22} EM {summary['em']:.3f} F1 {summary['f1']:.3f} "
                 f"searches {summary['searches_per_question']:.2f} ({time.perf_counter() - t0:.0f} s)")
        return [json.loads(line) for line in path.read_text().splitlines()]

    remote = {"retriever_url": cfg.retriever_url, "index_dir": cfg.index_dir}
    for dataset, (examples, passages) in suite_data(cfg).items():
        if not examples:
            continue
        where = remote if dataset not in WORLD_DATASETS and (cfg.retriever_url or cfg.index_dir) else {}
        if where:  # the service's or saved index's own corpus: nothing is indexed here
            passages = None
        else:
            passages = passages if passages is not None else resolve_corpus(base, examples)
        per_method = result.records.setdefault(dataset, {})
        for method in (*cfg.baselines, cfg.method):
            per_method[method] = run(dataset, method, examples, passages, method=method, **where)
        if dataset in cfg.ablation_datasets:
            variants = result.ablations.setdefault(dataset, {cfg.method: per_method[cfg.method]})
            for name in cfg.ablations:
                variants[name] = run(dataset, name, examples, passages, **ABLATIONS[name], **where)
        if dataset == "world" and cfg.nlr:
            variants = result.ablations.setdefault(dataset, {cfg.method: per_method[cfg.method]})
            result.router = _nlr_rows(cfg, base, passages, examples, out_dir, variants, run, progress,
                                      result.summaries)
    result.seconds = round(time.perf_counter() - start, 1)
    return result


def _nlr_rows(cfg: SuiteConfig, base, passages, examples, out_dir: Path, variants: dict, run, progress,
              summaries: list[dict]) -> dict:
    """Trains the router on the world of the training config, then evaluates ``kunlun`` on the local half
    alone and with the router over both tiers (see the module docstring)."""
    path = Path(cfg.train_config)
    train_cfg = load_config(path if path.is_absolute() else PROJECT_ROOT / path)
    router_cfg = RouterTrainConfig(world_passages=train_cfg.world_passages, seed=train_cfg.world_seed,
                                   index_kind=base.index_kind, embedder=base.embedder, top_k=base.rollout.top_k,
                                   added_latency_ms=cfg.nlr_latency_ms)
    t0 = time.perf_counter()
    _, training = train_router(router_cfg, out_dir / "router.pt", local_corpus_out=out_dir / "local_half.jsonl")
    progress(f"router trained in {time.perf_counter() - t0:.0f} s: held-out policy recall "
             f"{training['heldout']['policy']['recall']}, always-local {training['heldout']['always_local']['recall']}")
    local = load_corpus(out_dir / "local_half.jsonl")
    by_id = {p.id: p for p in passages}
    local = [by_id.get(p.id, p) for p in local]  # keep titles for retrieval recall
    variants["local ½, no NLR"] = run("world", "local ½, no NLR", examples, local)
    with network_tier(passages, cfg.nlr_latency_ms, embedder=base.embedder, kind=base.index_kind) as url:
        variants["+NLR"] = run("world", "+NLR", examples, local, network_url=url, router=str(out_dir / "router.pt"))
    return {"training": {k: training[k] for k in ("heldout", "train", "local_passages", "network_passages",
                                                  "added_latency_ms", "network_errors", "seconds")},
            "evaluation": summaries[-1].get("router")}
