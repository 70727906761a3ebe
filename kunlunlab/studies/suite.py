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
model it belongs on (Table 2 as the paper builds it, :func:`row_models`): the trained method on its checkpoint,
the prompt baselines on the backbone that checkpoint was trained from (the untrained instruct model by default:
run on a fine-tuned agent checkpoint they measure its mismatch with their prompts, not the method), and each
peer's trained recipe (``models``) on its own checkpoint. The trained checkpoint's agent configuration
(``kunlunlab_agent.json``: budgets, top-k, RDRA, STIE, the index kind and embedder) applies to every row, so the
budgets and the retrieval are equal across the table; a :class:`SuiteConfig` value that is set wins over the
checkpoint's (:func:`suite_eval_config`). One model is loaded at a time.

Every row streams its records into its own file and resumes there (:func:`kunlunlab.eval.harness.evaluate`
with ``resume``): rerunning a suite into the same folder keeps every finished question and evaluates the rest.
``suite_config.json`` in the folder says what its rows measure; a suite of another config is refused there
before the model loads (:func:`check_suite_folder`), except for the fields that choose rows (baselines,
datasets, ablations, NLR), so adding a row to a finished folder runs only that row. A rerun keeps the NLR
router trained before (``router.pt``, ``router_training.json``): its training measures latencies, so a new one
would route differently from the records already there.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from kunlunlab.agent.methods import METHODS, PROMPT_BASELINES
from kunlunlab.agent.nlr import network_tier
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.configs import build_dataclass, choice, non_negative, positive
from kunlunlab.data.loaders import load_benchmark, load_corpus
from kunlunlab.data.splits import load_splits
from kunlunlab.eval.compare import ablation_table, table2
from kunlunlab.eval.harness import EvalConfig, evaluate, make_judge_backend, resolve_corpus
from kunlunlab.eval.metrics import collapsed
from kunlunlab.eval.records import ENDPOINT_FIELDS, RecordsConflict, read_records
from kunlunlab.models import release_host_memory
from kunlunlab.paths import PROJECT_ROOT, shared_data_dir
from kunlunlab.retrieval.retriever import INDEX_KINDS
from kunlunlab.training.config import load_config
from kunlunlab.training.router import RouterTrainConfig, train_router


BASELINES = PROMPT_BASELINES  # the prompt baselines of Table 2, every one by default
DATASETS = ("world", "world_summary", "hotpotqa_distractor", "2wikimultihopqa", "musique", "bamboogle")
WORLD_DATASETS = ("world", "world_summary")  # the synthetic world's factoid and summary-oriented held-out questions
# The agent's budgets a suite may set on every row (SuiteConfig.rollout)
ROLLOUT_BUDGETS = ("max_searches", "max_turn_tokens", "max_total_tokens", "top_k", "max_result_chars")
# Inference ablations of the whole agent: name -> EvalConfig overrides.
ABLATIONS = {"−RDRA": {"use_rdra": False}, "−STIE": {"use_stie": False},
             "agent (−RDRA −STIE)": {"method": "agent"}}


@dataclass
class SuiteConfig:
    model: str | None = None          # the trained checkpoint (None: the embedded, untrained model)
    # The prompt baselines' model: None, the backbone the checkpoint was trained from (train_config's `model`: the
    # embedded instruct model by default); "checkpoint", the trained checkpoint itself; else a hub id or path
    baseline_model: str | None = None
    # More rows, each a method on its own model: a peer's trained recipe on its checkpoint
    # ({"search_r1": "runs/sr1/dapo/final"}); a baseline named here runs on that model instead
    models: dict[str, str] = field(default_factory=dict)
    train_config: str = "experiments/configs/training/train_embedded_cpu.json"  # its held-out split
    method: str = choice("kunlun", METHODS)
    baselines: tuple[str, ...] = choice(BASELINES, METHODS)
    datasets: tuple[str, ...] = DATASETS
    world_questions: int = non_negative(30)
    summary_questions: int = non_negative(10)  # held-out summary-oriented world questions (world_summary: the long mode)
    hotpot_questions: int = non_negative(20)
    limit: int = positive(10)         # questions of each other benchmark
    ablations: tuple[str, ...] = choice(tuple(ABLATIONS), ABLATIONS)
    ablation_datasets: tuple[str, ...] = ("world",)
    nlr: bool = False                 # the NLR rows (a trained router over a local half and a network tier)
    nlr_latency_ms: float = non_negative(150.0)  # the network tier's added latency per request
    judge: str | None = None          # LJ judge model (None: LJ absent, never self-judged by default)
    judge_url: str | None = None
    index_kind: str | None = choice(None, INDEX_KINDS)  # None: the checkpoint's (kunlunlab_agent.json), else EvalConfig's (flat)
    embedder: str | None = None       # None: the checkpoint's, else the embedded all-MiniLM-L6-v2 (which
                                      # "all-MiniLM-L6-v2" names explicitly, over a checkpoint's other one)
    device: str = "auto"              # where the checkpoint generates: auto (CUDA when present), cpu, cuda, cuda:N
    retriever_url: str | None = None  # the benchmarks' searches through this service (POST /retrieve); the
                                      # synthetic world keeps its in-process index (its passages are in no service)
    index_dir: str | None = None      # or through this saved index folder (kunlunlab build-index)
    # the agent's budgets on every row (RolloutConfig fields: {"max_total_tokens": 160, "max_turn_tokens": 32});
    # those left out: the checkpoint's (kunlunlab_agent.json), else RolloutConfig's
    rollout: dict[str, int] = field(default_factory=dict)
    batch_size: int = positive(20)    # questions per generation batch: 20 world questions in one batch took
                                      # 57.9 s against 83.2 s in two of 10 (2-core CPU, 2026-11-25)
    n_resamples: int = positive(2000)  # paired-bootstrap resamples behind every interval of the tables
    seed: int = non_negative(0)

    def __post_init__(self):
        unknown = set(self.ablations) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablations {sorted(unknown)}; choose from {list(ABLATIONS)}")
        unknown = set(self.models) - set(METHODS)
        if unknown:
            raise ValueError(f"models: unknown methods {sorted(unknown)}; choose from {sorted(METHODS)}")
        if self.method in self.models:
            raise ValueError(f"models: {self.method} is the suite's method, which runs on `model`")
        unknown = set(self.rollout) - set(ROLLOUT_BUDGETS)
        if unknown:
            raise ValueError(f"rollout: unknown budgets {sorted(unknown)}; choose from {list(ROLLOUT_BUDGETS)}")
        RolloutConfig(**self.rollout)  # its own range checks, in one line
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


def peer_rows(cfg: SuiteConfig) -> list[str]:
    """The methods ``models`` adds beside the baselines: the peers' trained recipes."""
    return [m for m in cfg.models if m not in cfg.baselines]


def row_models(cfg: SuiteConfig) -> dict[str, str | None]:
    """Method -> the model its row runs on (None: the embedded instruct model): the baselines on the backbone
    (:attr:`SuiteConfig.baseline_model`), the peers on their checkpoints, the method on ``model``."""
    if cfg.baseline_model == "checkpoint":
        backbone = cfg.model
    elif cfg.baseline_model is not None:
        backbone = cfg.baseline_model
    else:
        path = Path(cfg.train_config)
        backbone = load_config(path if path.is_absolute() else PROJECT_ROOT / path).model
    rows = {b: cfg.models.get(b, backbone) for b in cfg.baselines}
    rows.update((m, cfg.models[m]) for m in peer_rows(cfg))
    rows[cfg.method] = cfg.model
    return rows


def model_label(model: str | None) -> str:
    return "SmolLM2-135M-Instruct (embedded)" if model is None else str(model)


def suite_tables(result: SuiteResult, cfg: SuiteConfig) -> dict[str, tuple[list, list[list]]]:
    """Title -> (header, rows): Table 2 of every dataset and one ablation table per ablated dataset, each
    difference with its paired-bootstrap interval. Notebook 06 and ``kunlunlab suite`` both show these, so
    the two report the same numbers for the same records."""
    models = {m: model_label(path) for m, path in row_models(cfg).items()}
    tables = {TABLE2_TITLE: table2(result.records, cfg.method, cfg.baselines, n_resamples=cfg.n_resamples,
                                   seed=cfg.seed, peers=peer_rows(cfg), models=models)}
    for dataset, variants in result.ablations.items():
        tables[ablation_title(dataset)] = ablation_table(variants, cfg.method, n_resamples=cfg.n_resamples,
                                                         seed=cfg.seed)
    if "world_summary" in result.records:
        tables[MODES_TITLE] = answer_modes_table(result.records, (*cfg.baselines, *peer_rows(cfg), cfg.method))
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
    if cfg.rollout:  # only the budgets it names: the checkpoint's others stay
        given["rollout"] = dict(cfg.rollout)
    return EvalConfig.for_checkpoint(cfg.model, **given) if cfg.model else build_dataclass(EvalConfig, given, "suite")


SUITE_CONFIG_FILE = "suite_config.json"
# SuiteConfig fields that choose rows (each row's file checks itself) or say how the suite runs and reports:
# a rerun into a folder may change them
SUITE_FREE_FIELDS = ("baselines", "datasets", "ablations", "ablation_datasets", "nlr", "device", "batch_size",
                     "n_resamples")


def suite_identity(cfg: SuiteConfig) -> dict:
    """What a suite's rows measure, as JSON: ``cfg`` less :data:`SUITE_FREE_FIELDS`, each service as whether it
    is used (a restarted one may come back at another URL)."""
    identity = json.loads(json.dumps(asdict(cfg), default=str))
    for name in SUITE_FREE_FIELDS:
        identity.pop(name)
    for name in set(ENDPOINT_FIELDS) & set(identity):
        identity[name] = identity[name] is not None
    return identity


def suite_records(out_dir: str | Path) -> dict[Path, int]:
    """The records files of a suite folder (those with a sidecar) and how many complete records each holds."""
    out_dir = Path(out_dir)
    files = sorted(Path(str(p)[:-len(".config.json")]) for p in out_dir.glob("*.jsonl.config.json"))
    return {f: len(read_records(f)[0]) for f in files}


def check_suite_folder(cfg: SuiteConfig, out_dir: str | Path) -> None:
    """Refuses a folder whose records a suite of another config wrote (:class:`RecordsConflict`, naming what
    differs); else saves ``cfg``'s identity there. A folder without records takes any config."""
    out_dir = Path(out_dir)
    saved_path, wanted = out_dir / SUITE_CONFIG_FILE, suite_identity(cfg)
    kept = sum(suite_records(out_dir).values())
    if kept and saved_path.is_file():
        try:
            saved = json.loads(saved_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RecordsConflict(f"{saved_path} is not readable JSON ({err}); pass another --out, or delete "
                                  f"{out_dir} to start over") from err
        changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        if changed:
            what = "; ".join(f"{k}: {saved.get(k)!r} there, {wanted.get(k)!r} now" for k in changed)
            raise RecordsConflict(f"{out_dir} holds {kept} records of a suite of another config ({what}); pass "
                                  f"another --out, or delete {out_dir} to start over")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = saved_path.with_name(saved_path.name + ".tmp")
    tmp.write_text(json.dumps(wanted, indent=1), encoding="utf-8")
    tmp.replace(saved_path)


def run_suite(cfg: SuiteConfig, out_dir: str | Path, backend=None,
              progress: Callable[[str], None] = print, resume: bool = True) -> SuiteResult:
    """Evaluates every method on every dataset and the ablations; records go to ``out_dir`` as
    ``<dataset>.<method>.jsonl``, each question as it finishes, and are returned. ``resume``: keep the finished
    records of an earlier run into ``out_dir`` (see the module docstring); without it every row starts over."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    if resume:
        check_suite_folder(cfg, out_dir)  # before the model loads: a refusal costs nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    base = suite_eval_config(cfg)
    result = SuiteResult()
    rows = row_models(cfg)
    data = {d: v for d, v in suite_data(cfg).items() if v[0]}
    remote = {"retriever_url": cfg.retriever_url, "index_dir": cfg.index_dir}
    corpora = {}
    for dataset, (examples, passages) in data.items():
        where = remote if dataset not in WORLD_DATASETS and (cfg.retriever_url or cfg.index_dir) else {}
        # the service's or saved index's own corpus: nothing is indexed here
        corpora[dataset] = (where, None if where else passages if passages is not None else resolve_corpus(base,
                                                                                                           examples))
        result.records[dataset] = {}
    by_model: dict[str | None, list[str]] = {}
    for method, model in rows.items():  # one model loaded at a time, the trained checkpoint's rows last
        by_model.setdefault(model, []).append(method)
    by_model[cfg.model] = by_model.pop(cfg.model)

    for model, methods in by_model.items():
        group_backend = backend if (backend is not None and model == cfg.model) else \
            TransformersBackend(model, device=cfg.device)
        judge_backend = make_judge_backend(base, group_backend)

        def run(dataset: str, name: str, examples, passages, **overrides) -> list[dict]:
            config = replace(base, dataset=dataset, limit=len(examples), model=model, **overrides)
            path = out_dir / f"{dataset}.{name.replace(' ', '_')}.jsonl"
            t0 = time.perf_counter()
            summary = evaluate(config, path, backend=group_backend, judge_backend=judge_backend, examples=examples,
                               passages=passages, resume=resume)
            summary.pop("config", None)
            summary["variant"] = name
            summary["model"] = model_label(model)
            records = read_records(path)[0]
            summary["collapsed"] = collapsed(records)  # most answers by fallback extraction: not a result
            result.summaries.append(summary)
            release_host_memory()  # each method's rollout caches go back to the OS before the next method runs
            kept = f", {summary['resumed']} resumed" if summary["resumed"] else ""
            progress(f"{dataset:20} {name:22} EM {summary['em']:.3f} F1 {summary['f1']:.3f} "
                     f"searches {summary['searches_per_question']:.2f} ({time.perf_counter() - t0:.0f} s{kept})"
                     + (" COLLAPSED: most answers by fallback extraction" if summary["collapsed"] else ""))
            return records

        for dataset, (examples, _) in data.items():
            where, passages = corpora[dataset]
            for method in methods:
                result.records[dataset][method] = run(dataset, method, examples, passages, method=method, **where)
            if model != cfg.model:
                continue
            if dataset in cfg.ablation_datasets:
                variants = result.ablations.setdefault(dataset, {cfg.method: result.records[dataset][cfg.method]})
                for name in cfg.ablations:
                    variants[name] = run(dataset, name, examples, passages, **ABLATIONS[name], **where)
            if dataset == "world" and cfg.nlr:
                variants = result.ablations.setdefault(dataset, {cfg.method: result.records[dataset][cfg.method]})
                result.router = _nlr_rows(cfg, base, passages, examples, out_dir, variants, run, progress, resume,
                                          result.summaries)
        if group_backend is not backend:
            del group_backend, judge_backend
            release_host_memory()
    for dataset, per_method in result.records.items():  # the table's order: baselines, peers, the method
        result.records[dataset] = {m: per_method[m] for m in rows if m in per_method}
    result.seconds = round(time.perf_counter() - start, 1)
    return result


ROUTER_TRAINING_FILE = "router_training.json"  # the router's training summary, beside router.pt


def _nlr_rows(cfg: SuiteConfig, base, passages, examples, out_dir: Path, variants: dict, run, progress,
              resume: bool, summaries: list[dict]) -> dict:
    """Trains the router on the world of the training config, then evaluates ``kunlun`` on the local half
    alone and with the router over both tiers (see the module docstring). ``resume``: the router a run into
    ``out_dir`` trained before is kept, because its training measures latencies and would not come out the same:
    the +NLR records already there were routed by it."""
    router, local_path, trained = out_dir / "router.pt", out_dir / "local_half.jsonl", out_dir / ROUTER_TRAINING_FILE
    if resume and router.is_file() and local_path.is_file() and trained.is_file():
        training = json.loads(trained.read_text(encoding="utf-8"))
        progress(f"router: the one trained before ({router}), kept for the rows that resume")
    else:
        path = Path(cfg.train_config)
        train_cfg = load_config(path if path.is_absolute() else PROJECT_ROOT / path)
        router_cfg = RouterTrainConfig(world_passages=train_cfg.world_passages, seed=train_cfg.world_seed,
                                       index_kind=base.index_kind, embedder=base.embedder, top_k=base.rollout.top_k,
                                       added_latency_ms=cfg.nlr_latency_ms)
        t0 = time.perf_counter()
        _, training = train_router(router_cfg, router, local_corpus_out=local_path)
        training = {k: training[k] for k in ("heldout", "train", "local_passages", "network_passages",
                                             "added_latency_ms", "network_errors", "seconds")}
        trained.write_text(json.dumps(training, indent=1, default=str), encoding="utf-8")  # after router.pt: both
        progress(f"router trained in {time.perf_counter() - t0:.0f} s: held-out policy recall "
                 f"{training['heldout']['policy']['recall']}, always-local "
                 f"{training['heldout']['always_local']['recall']}")
    local = load_corpus(local_path)
    by_id = {p.id: p for p in passages}
    local = [by_id.get(p.id, p) for p in local]  # keep titles for retrieval recall
    variants["local ½, no NLR"] = run("world", "local ½, no NLR", examples, local)
    with network_tier(passages, cfg.nlr_latency_ms, embedder=base.embedder, kind=base.index_kind) as url:
        variants["+NLR"] = run("world", "+NLR", examples, local, network_url=url, router=str(router))
    return {"training": training, "evaluation": summaries[-1].get("router")}
