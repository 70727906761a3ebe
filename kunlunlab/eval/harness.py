"""One evaluation runner for every method and dataset (FlashRAG-style): ``kunlunlab eval`` and notebook 06.

Datasets: ``world`` (synthetic multi-hop questions over the synthetic world), a benchmark name
(``hotpotqa``, ``hotpotqa_distractor``, ``2wikimultihopqa``, ``musique``, ``bamboogle``) or a path in
any supported layout. The corpus defaults to the dataset's natural closed corpus: the world, the
HotpotQA distractor contexts, the 2Wiki paragraphs; for sets that ship no evidence (HotpotQA,
MuSiQue, Bamboogle in the Search-R1 layout) the union of the 2Wiki paragraphs and the HotpotQA
distractor contexts, an open-corpus setting that does not cover every question. An explicit
``corpus`` always wins.

The LLM judge (LJ)
------------------
LJ is only meaningful when the judge is not the model under test, so by default there is no
judge: every record's ``lj`` and the summary's ``lj`` are ``None`` and the summary says
``"judge": null``. Configure one of

* a served model at ``judge_url``, ``judge`` its served name: by default (``judge_api="chat"``) any
  OpenAI-compatible ``/v1/chat/completions`` endpoint, hosted GPT-class models included, with the API
  key read from the environment variable named by ``judge_key_env``; ``judge_api="completions"`` is the
  token-id ``/v1/completions`` route, for which ``judge`` must also be a hub id or local path whose
  tokenizer loads here. :mod:`kunlunlab.eval.judge` shows both for a served Qwen and a GPT-class model::

      vllm serve Qwen/Qwen2.5-7B-Instruct --port 8002
      kunlunlab eval --dataset bamboogle --judge-url http://localhost:8002 --judge Qwen/Qwen2.5-7B-Instruct
* a local model: ``judge`` = hub id (already in the Hugging Face cache) or checkpoint path, loaded
  with :class:`~kunlunlab.agent.transformers_backend.TransformersBackend`.
* ``judge="same"``: explicit opt-in to let the answering model grade itself. The summary marks it
  ``"self_judged": true``; such numbers are not comparable with an external judge's. Naming the
  answering model itself as the judge is marked the same way.

Answer sources
--------------
The rollout methods (``search_o1``, ``agent``, ``kunlun``) mark each answer with
``trajectory["answer_source"]``: ``"answer_tag"`` when the model closed with an answer tag,
``"fallback"`` when the answer was extracted from free text. The single-shot baselines never emit
answer tags; their answers come from the same free-text extraction, so they count as
``"fallback"``. The summary splits EM by source (``em_tagged``, ``em_fallback``) so that a gain that
comes from following the protocol shows as such.

Trained checkpoints
-------------------
A checkpoint folder from the training pipeline carries ``kunlunlab_agent.json`` with the whole agent
configuration it was trained under: method, RDRA/STIE switches, RDRA's sizes (``rdra``), STIE's
thresholds and round budget (``stie``), the retrieval (``index_kind``, ``embedder``, ``top_k``,
``max_result_chars``) and the token and search budgets. :func:`with_checkpoint_settings` and
:meth:`EvalConfig.for_checkpoint` apply them field by field wherever the caller did not set a value
explicitly: explicit value > checkpoint settings > ``EvalConfig`` default (``rdra.plan_k`` given keeps
the checkpoint's other RDRA sizes). Files written before the whole configuration was carried hold only
some keys (STIE as ``stie_rounds``, no retrieval kind); they load, and what they lack stays the default.
The checkpoint's ``index_kind`` and ``embedder`` describe an index built here: with ``retriever_url`` or
``index_dir`` the service or saved index brings its own, and they are not applied.

Records on disk, and resuming
-----------------------------
:func:`evaluate` appends each finished question's record to ``out`` as it finishes (:mod:`kunlunlab.eval.records`
says how they are stored, what their sidecar ``<out>.config.json`` holds and when a rerun may keep them). With
``resume=True`` (``kunlunlab eval`` and the suite) a rerun into the same ``out`` keeps the complete records there
and evaluates only the questions after them; one of another evaluation is refused
(:class:`~kunlunlab.eval.records.RecordsConflict`), as ``kunlunlab train`` refuses a run folder of another config.
The judge grades each batch before it is written, so a record on disk is final. A resumed run's records, in
question order, and its summary are an uninterrupted run's, except for what counts this run's calls only:
``wall_seconds``, ``search_errors``, the judge's ``stats`` and the router's summary (``resumed`` says how many
records were read back). Its batches keep the uninterrupted run's boundaries (a batch's padding can move a local
model's logits): only a batch cut short (a torn line, Ctrl-C between two writes) is finished on its own, and
another batch size regroups the rest.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Collection

from tqdm.auto import tqdm

from kunlunlab.agent.methods import MethodConfig, METHODS, PEER_METHODS, PROMPT_KINDS, make_method
from kunlunlab.agent.nlr import NetworkLocalRouter, RoutingPolicy
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.protocol import final_answer_block
from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.rdra import RDRAConfig
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.agent.search_o1 import ReasonInDocumentsConfig
from kunlunlab.agent.stie import COLLECT_ALL_ROUNDS, STIEConfig
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.configs import build_dataclass, choice, leaf_paths, non_negative, positive
from kunlunlab.data import World, make_questions
from kunlunlab.data.questions import summary_questions
from kunlunlab.data.loaders import BENCHMARK_FILES, corpus_from_examples, load_benchmark, load_corpus, load_qa
from kunlunlab.data.types import Passage, QAExample
from kunlunlab.eval.judge import ChatJudgeBackend, LLMJudge
from kunlunlab.eval.records import RecordWriter, evaluation_identity, kept_records
from kunlunlab.eval.metrics import (FALLBACK, cover_em, evidence_search_floor, exact_match, f1, fact_coverage,
                                    retrieval_recall, summarize, title_recall_curve)
from kunlunlab.models import INFERENCE_DTYPES
from kunlunlab.paths import shared_data_dir
from kunlunlab.retrieval.factory import open_retriever
from kunlunlab.retrieval.retriever import INDEX_KINDS, Hit, IndexConfig, Retriever
from kunlunlab.retrieval.client import RemoteRetriever, RetrievalClient, RetrievalServiceError


SELF_JUDGE = "same"               # EvalConfig.judge value: the answering model grades itself (opt-in)
AGENT_SETTINGS_FILE = "kunlunlab_agent.json"
CONTINUOUS_BATCHES = 8  # batches per call of a continuous method (the agents): its rows stay busy across them
AGENT_SETTING_TYPES: dict[str, type | tuple[type, ...]] = {
    "method": str, "top_k": int, "max_result_chars": int, "max_turn_tokens": int, "max_total_tokens": int,
    "max_searches": int, "use_rdra": bool, "use_stie": bool, "rdra": dict, "stie": dict,
    "index_kind": str, "embedder": (str, type(None)),
    "stie_rounds": int}  # files written before "stie" carried all of STIE: its round budget alone
# The whole sub-configs a file carries as objects: each key inside must be a field of the config.
AGENT_SETTING_SECTIONS: dict[str, type] = {"rdra": RDRAConfig, "stie": STIEConfig}
RETRIEVAL_SETTINGS = ("index_kind", "embedder")  # an index built here; not applied with a service or saved index


# Where each key of kunlunlab_agent.json lands in EvalConfig (the file keeps its flat, documented keys).
AGENT_SETTING_PATHS: dict[str, str] = {
    "method": "method", "use_rdra": "use_rdra", "use_stie": "use_stie", "rdra": "rdra", "stie": "stie",
    "index_kind": "index_kind", "embedder": "embedder",
    "top_k": "rollout.top_k", "max_result_chars": "rollout.max_result_chars",
    "max_turn_tokens": "rollout.max_turn_tokens", "max_total_tokens": "rollout.max_total_tokens",
    "max_searches": "rollout.max_searches", "stie_rounds": "stie.max_rounds"}


@dataclass
class EvalConfig:
    dataset: str = "world"
    method: str = choice("kunlun", METHODS)
    limit: int | None = positive(20)
    model: str | None = None        # LLM: None = embedded SmolLM2; hub id or local path
    llm_url: str | None = None      # OpenAI-compatible server instead of a local model
    judge: str | None = None        # None: no LJ; a model (hub id / path, or served name with judge_url); "same"
    judge_url: str | None = None    # OpenAI-compatible server that serves the judge model
    judge_api: str = choice("chat", ("chat", "completions"))  # judge_url's route: "chat" (/v1/chat/completions) or "completions" (token ids)
    judge_key_env: str = "OPENAI_API_KEY"  # NAME of the environment variable with the judge's API key (chat)
    corpus: str | None = None       # None: the dataset's default corpus (see module docstring)
    retriever_url: str | None = None  # the main retrieval through this service (POST /retrieve); no corpus here
    index_dir: str | None = None    # the main retrieval from this saved index folder (build-index --out)
    index_kind: str = choice("flat", INDEX_KINDS)  # the index built here; not used with retriever_url or index_dir
    embedder: str | None = None
    batch_size: int = positive(8)
    dtype: str = choice("auto", INFERENCE_DTYPES)  # generation dtype; auto: bfloat16 where the hardware has it (2x on AMX CPUs)
    device: str = "auto"            # where a local model generates: auto (CUDA when present), cpu, cuda, cuda:N
    world_passages: int = positive(2000)
    seed: int = non_negative(0)
    # the agent's budgets (searches, tokens per turn and per trajectory, passages per search, characters per
    # passage) and STIE's thresholds and round budget: the agent's own configs, not copies of their fields
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    stie: STIEConfig = field(default_factory=STIEConfig)
    prompt: str = choice("auto", PROMPT_KINDS)  # a peer's method: its chat messages ("chat"), its base-model prompt
                                    # raw ("base", a released base-model checkpoint's), or "auto" (chat where the
                                    # model's tokenizer has a chat template, else base)
    use_rdra: bool = True           # kunlun only: the RDRA background step (off: an ablation)
    use_stie: bool = True           # kunlun only: STIE over answer rounds (off: an ablation)
    rdra: RDRAConfig = field(default_factory=RDRAConfig)  # kunlun only: RDRA's retrieval and planning sizes
    # search_o1 only: Search-o1's Reason-in-Documents step (the condensed analysis's token budget, steps kept)
    reason_in_documents: ReasonInDocumentsConfig = field(default_factory=ReasonInDocumentsConfig)
    stie_collect: bool = False      # generate every STIE round (no early stop), to tune STIE on cached rounds
    network_url: str | None = None  # retrieval service for NLR's network tier
    router: str | None = None       # a trained NLR policy (RoutingPolicy.save); without one: "both"

    def __post_init__(self):
        if self.judge is not None and self.judge.strip().lower() in ("", "none"):
            self.judge = None  # "none" is the CLI / notebook spelling of "no judge"
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose from {sorted(METHODS)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be positive, got {self.limit}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.judge_api not in ("chat", "completions"):
            raise ValueError(f"judge_api must be 'chat' or 'completions', got {self.judge_api!r}")
        if self.judge_url and self.judge in (None, SELF_JUDGE):
            raise ValueError("judge_url needs judge: the served judge model's name (with judge_api=completions "
                             "a hub id or path whose tokenizer loads here)")
        if self.retriever_url and self.index_dir:
            raise ValueError("retriever_url and index_dir both name the main retrieval: give one")
        if self.retriever_url and self.corpus:
            raise ValueError("corpus is not used with retriever_url: the service searches its own corpus")

    @classmethod
    def for_checkpoint(cls, model: str, **overrides) -> "EvalConfig":
        """A config for a trained checkpoint: its ``kunlunlab_agent.json`` settings, then ``overrides``.
        A sub-config override may be partial: ``rollout={"top_k": 5}`` overrides ``top_k`` and keeps the
        checkpoint's other budgets; a dataclass (``stie=STIEConfig(...)``) replaces all of it."""
        values = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in overrides.items()}
        config = build_dataclass(cls, {"model": model, **values}, "EvalConfig.for_checkpoint")
        return with_checkpoint_settings(config, explicit=leaf_paths(values))


class AgentSettingsError(ValueError):
    """A checkpoint's ``kunlunlab_agent.json`` is unreadable or holds unexpected keys or types."""


def load_agent_settings(model: str | Path | None) -> dict:
    """The agent settings a trained checkpoint was saved with; ``{}`` for hub ids and plain folders.

    Only ``AGENT_SETTING_TYPES`` keys are accepted, each with its type, and inside ``rdra`` / ``stie`` only
    their config's fields: an unknown key is an error rather than something dropped, so a setting the
    evaluation cannot apply never goes unnoticed.
    """
    if model is None or not Path(model).is_dir():
        return {}
    path = Path(model) / AGENT_SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise AgentSettingsError(f"{path}: invalid JSON: {err.msg} (line {err.lineno})") from err
    except UnicodeDecodeError as err:
        raise AgentSettingsError(f"{path}: not UTF-8 text: {err}") from err
    if not isinstance(settings, dict):
        raise AgentSettingsError(f"{path}: expected a JSON object, got {type(settings).__name__}")
    unknown = sorted(set(settings) - set(AGENT_SETTING_TYPES))
    if unknown:
        raise AgentSettingsError(f"{path}: unknown keys {unknown}; expected keys among {sorted(AGENT_SETTING_TYPES)}")
    for key, value in settings.items():
        kind = AGENT_SETTING_TYPES[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            name = " or ".join("null" if k is type(None) else k.__name__ for k in (kind if isinstance(kind, tuple)
                                                                                  else (kind,)))
            raise AgentSettingsError(f"{path}: {key!r} must be {name}, got {value!r}")
        if key in AGENT_SETTING_SECTIONS:
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(AGENT_SETTING_SECTIONS[key])})
            if unknown:
                raise AgentSettingsError(f"{path}: {key!r} has unknown keys {unknown}")
    if "stie_rounds" in settings and "max_rounds" in settings.get("stie", {}):
        raise AgentSettingsError(f"{path}: 'stie_rounds' and 'stie.max_rounds' both give STIE's round budget")
    return settings


def _is_explicit(path: str, explicit: Collection[str]) -> bool:
    """``path`` (e.g. ``rollout.top_k``) was given by the user: itself, a parent (``rollout``) or, for a whole
    sub-config such as ``rdra``, one of its fields (``rdra.plan_k``)."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in explicit for i in range(1, len(parts) + 1)) or \
        any(e.startswith(path + ".") for e in explicit)


def apply_agent_settings(config: EvalConfig, settings: dict, explicit: Collection[str] = frozenset(),
                         source: str = AGENT_SETTINGS_FILE) -> EvalConfig:
    """``config`` with agent settings (``kunlunlab_agent.json``'s keys) applied to every field whose path
    (``AGENT_SETTING_PATHS``; inside ``rdra`` / ``stie`` each field's own, e.g. ``stie.delta1``) is not in
    ``explicit``.

    ``use_rdra`` / ``use_stie`` describe the checkpoint's own method (a plain-``agent`` checkpoint saves them
    off): when the user names another method they are not applied, so ``--method kunlun`` on such a
    checkpoint runs RDRA and STIE instead of silently running the plain agent. ``index_kind`` / ``embedder``
    are not applied where ``config`` searches a service or a saved index, which bring their own."""
    other_method = _is_explicit("method", explicit) and settings.get("method", config.method) != config.method
    remote = bool(config.retriever_url or config.index_dir)
    updates = {}
    for key, value in settings.items():
        if (other_method and key in ("use_rdra", "use_stie")) or (remote and key in RETRIEVAL_SETTINGS):
            continue
        path = AGENT_SETTING_PATHS[key]
        leaves = {f"{path}.{k}": v for k, v in value.items()} if key in AGENT_SETTING_SECTIONS else {path: value}
        updates.update((p, v) for p, v in leaves.items() if not _is_explicit(p, explicit))
    try:
        return _with_paths(config, updates)
    except (TypeError, ValueError) as err:  # a value of the right JSON type that the config refuses
        raise AgentSettingsError(f"{source}: bad settings: {err}") from err


def _with_paths(config, updates: dict):
    """``config`` (a dataclass) with each dotted path of ``updates`` set, nested configs replaced, not mutated."""
    top, nested = {}, {}
    for path, value in updates.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    top.update((head, _with_paths(getattr(config, head), sub)) for head, sub in nested.items())
    return replace(config, **top)


def with_checkpoint_settings(config: EvalConfig, explicit: Collection[str] = frozenset()) -> EvalConfig:
    """``config`` with its model's checkpoint settings applied to every field not named in ``explicit``
    (field paths such as ``method``, ``rollout.top_k``, ``stie.max_rounds``, ``rdra``); then a peer's method gets
    its protocol's declared top-k and searches where neither sets them, so a released peer checkpoint runs with the
    budget it was trained for (:meth:`~kunlunlab.agent.protocols.AgentProtocol.search_limit`)."""
    settings = load_agent_settings(config.model)
    source = str(Path(config.model or ".") / AGENT_SETTINGS_FILE)
    config = apply_agent_settings(config, settings, explicit, source=source)
    if config.method not in PEER_METHODS:
        return config
    protocol = get_protocol(config.method)
    declared = {"top_k": protocol.top_k, "max_searches": protocol.search_limit(None, config.rollout.max_total_tokens)}
    return apply_agent_settings(config, {k: v for k, v in declared.items() if k not in settings}, explicit, source)


def load_examples(config: EvalConfig) -> tuple[list[QAExample], list[Passage] | None]:
    """(questions, default corpus or None when the corpus must come from elsewhere)."""
    if config.dataset in ("world", "world_summary"):  # factoid or summary-oriented questions of the world
        world = World.generate(n_passages=config.world_passages, seed=config.seed)
        if config.dataset == "world_summary":
            return summary_questions(world, config.limit or 100, seed=config.seed + 1), world.passages
        return make_questions(world, config.limit or 100, seed=config.seed + 1), world.passages
    if config.dataset in BENCHMARK_FILES:
        examples = load_benchmark(config.dataset, limit=config.limit)
    else:
        path = Path(config.dataset)
        if not path.exists():
            raise FileNotFoundError(f"dataset {config.dataset!r} is neither 'world', 'world_summary', a benchmark name "
                                    f"({', '.join(sorted(BENCHMARK_FILES))}) nor an existing file")
        examples = load_qa(path, limit=config.limit)
    if any(ex.context for ex in examples):
        return examples, corpus_from_examples(examples)
    return examples, None


def default_corpus(dataset: str) -> list[Passage]:

    root = shared_data_dir()
    if root is None:
        raise FileNotFoundError(f"dataset {dataset!r} needs a corpus: pass --corpus, or provide the benchmark "
                                "data folder (KUNLUNLAB_DATA or ../shared/data)")
    wiki = load_corpus(root / "2wikimultihopqa/corpus.json")
    if dataset in ("2wikimultihopqa", "2wiki"):
        return wiki
    hotpot = load_corpus(root / BENCHMARK_FILES["hotpotqa_distractor"])
    return wiki + hotpot


def resolve_corpus(config: EvalConfig, examples: list[QAExample],
                   default: list[Passage] | None = None) -> list[Passage] | None:
    """The passages to search: ``config.corpus`` if given (with ``index_dir``: checked against the index's
    corpus), else None with ``retriever_url`` or ``index_dir`` (the service's or the saved index's own
    corpus), else ``default``, the questions' own evidence, or :func:`default_corpus`."""
    if config.corpus:
        return load_corpus(config.corpus)
    if config.retriever_url or config.index_dir:
        return None
    if default is not None:
        return default
    if any(ex.context for ex in examples):
        return corpus_from_examples(examples)
    return default_corpus(config.dataset)


def load_data(config: EvalConfig) -> tuple[list[QAExample], list[Passage] | None]:
    """(questions, corpus) for a config; every data error surfaces here, before any model loads. The corpus
    is None where the retrieval brings its own (``retriever_url``, ``index_dir``)."""
    examples, default = load_examples(config)
    return examples, resolve_corpus(config, examples, default)


def make_backend(config: EvalConfig):
    """The answering model: a served one when ``llm_url`` is set, else a local one."""
    if config.llm_url:
        # --model names the served id and the tokenizer; without it, the id the server serves (asked) and the
        # embedded default's tokenizer
        return OpenAIBackend(config.llm_url, config.model, tokenizer_name=config.model)
    return TransformersBackend(config.model, device=config.device, dtype=config.dtype)


def make_judge_backend(config: EvalConfig, backend):
    """The LJ judge for a config, or None when none is configured (see the module docstring).

    ``judge="same"``, or naming the answering model itself, reuses ``backend`` instead of loading
    the model twice; :func:`evaluate` then labels the verdicts self-judged.
    """
    if config.judge is None:
        return None
    if config.judge_url and config.judge_api == "chat":

        return ChatJudgeBackend(config.judge_url, config.judge, key_env=config.judge_key_env)
    if config.judge_url:
        return OpenAIBackend(config.judge_url, config.judge)
    if config.judge == SELF_JUDGE or config.judge in (config.model, backend.name):
        return backend
    return TransformersBackend(config.judge, device=config.device, dtype=config.dtype)


class EvalRetrievalError(RuntimeError):
    """The evaluation's own retrieval service failed: the agents' fallback (answer without documents) would
    turn a dead service into a score, so the evaluation stops instead."""


class ServiceSearch:
    """The main retrieval of an evaluation through a service: :class:`RemoteRetriever`'s search, with the title
    of every passage it returned remembered (for retrieval recall; the corpus is not here) and a failure, after
    the client's retries, raised as :class:`EvalRetrievalError`, which no agent catches."""
    def __init__(self, remote: RemoteRetriever):
        self.remote = remote
        self.titles: dict[str, str] = {}

    @property
    def service_index(self) -> dict:
        """The searched index as the service reported it when checked: part of the records' identity."""
        return {k: self.remote.info.get(k) for k in ("kind", "n", "embedder")}

    def search(self, queries, k: int = 5) -> list[list[Hit]]:
        try:
            hits = self.remote.search(queries, k)
        except RetrievalServiceError as err:
            raise EvalRetrievalError(str(err)) from err
        for row in hits:
            self.titles.update((h.id, h.title) for h in row)
        return hits


def open_eval_retriever(config: EvalConfig, passages: list[Passage] | None) -> Retriever | ServiceSearch:
    """The main retriever of an evaluation (:func:`~kunlunlab.retrieval.factory.open_retriever`): the service
    at ``retriever_url`` (checked now; a :class:`ServiceSearch`), the saved index at ``index_dir`` (``passages``,
    if given, must be its corpus), or an index of ``index_kind`` built over ``passages``."""
    retriever = open_retriever(config.retriever_url, config.index_dir, passages,
                               IndexConfig(kind=config.index_kind, embedder=config.embedder))
    return ServiceSearch(retriever) if isinstance(retriever, RemoteRetriever) else retriever


def passage_titles(retriever: Retriever | ServiceSearch) -> dict[str, str]:
    """Passage id -> title for the passages an evaluation can have seen."""
    if isinstance(retriever, ServiceSearch):
        return retriever.titles
    return {p.id: p.title for p in retriever.passages}


def build_pipeline(config: EvalConfig, passages: list[Passage] | None, backend=None, retriever=None):
    """(method, retriever, backend) for a config; pass ``backend`` to reuse a loaded model and ``retriever``
    (:func:`open_eval_retriever`) to reuse an opened one."""
    retriever = retriever if retriever is not None else open_eval_retriever(config, passages)
    if backend is None:
        backend = make_backend(config)
    search = retriever.search
    if config.network_url:

        policy = RoutingPolicy.load(config.router) if config.router else None
        search = NetworkLocalRouter(retriever.search, RetrievalClient(config.network_url).search, policy,
                                    fixed_action=None if policy else "both")
    stie = replace(config.stie, **COLLECT_ALL_ROUNDS) if config.stie_collect else config.stie
    method_config = MethodConfig(top_k=config.rollout.top_k, rollout=config.rollout, rdra=config.rdra, stie=stie,
                                 use_rdra=config.use_rdra, use_stie=config.use_stie,
                                 reason_in_documents=config.reason_in_documents, max_batch=config.batch_size,
                                 prompt=config.prompt)
    return make_method(config.method, backend, search, method_config), retriever, backend


def model_text(trajectory: dict) -> str:
    """What the model wrote in a record's trajectory: the agent's whole text, or a baseline's model steps."""
    if trajectory.get("text") is not None:
        return trajectory["text"]
    return "".join(step.get("text", "") for step in trajectory.get("steps", []) if step.get("kind") == "model")


def router_summary(search) -> dict | None:
    """The NLR router's own statistics (decisions per action, latency, network errors), if it reports any."""
    summary = getattr(search, "summary", None)
    return summary() if callable(summary) else None


def _record(ex: QAExample, o, titles: dict[str, str], seconds: float) -> dict:
    """One question's record: the answer's metrics, retrieval recall, the search counters and the trajectory."""
    mode, body = final_answer_block(model_text(o.trajectory))
    return {"id": ex.id, "question": ex.question, "golds": ex.answers, "prediction": o.prediction,
            "em": exact_match(o.prediction, ex.answers), "f1": f1(o.prediction, ex.answers),
            "acc": cover_em(o.prediction, ex.answers), "lj": None,
            "answer_source": o.trajectory.get("answer_source", FALLBACK),
            "retrieval_recall": retrieval_recall([titles.get(d, "") for d in o.doc_ids], ex.supporting_titles),
            "recall_by_search": title_recall_curve(o.trajectory, titles, ex.supporting_titles),
            "search_floor": evidence_search_floor(o.trajectory, titles, ex),
            "answer_mode": mode, "fact_coverage": fact_coverage(body or o.prediction, ex.facts),
            "searches": o.searches, "seconds": seconds, "type": ex.type, "trajectory": o.trajectory}


def evaluate(config: EvalConfig, out: str | Path | None = None, backend=None, judge_backend=None,
             examples: list[QAExample] | None = None, passages: list[Passage] | None = None,
             progress: bool = True, retriever=None, resume: bool = False) -> dict:
    """Runs one method over one dataset; appends one JSON record per question to ``out`` as each batch
    finishes; returns the summary. ``progress`` shows a bar per batch (tqdm: a widget in Jupyter, a text line
    elsewhere).

    ``resume``: keep the complete records already in ``out`` and evaluate only the questions after them (see
    "Records on disk" above; :class:`~kunlunlab.eval.records.RecordsConflict` when they are another
    evaluation's); without it ``out`` starts over. ``backend`` / ``judge_backend`` reuse loaded models;
    ``examples`` / ``passages`` skip loading data; ``retriever`` (:func:`open_eval_retriever`) reuses an opened
    one. With ``retriever_url`` a search that fails after the client's retries raises :class:`EvalRetrievalError`;
    the records before it stay in ``out``.
    """
    start = time.perf_counter()
    if examples is None:
        examples, default = load_examples(config)
        passages = passages if passages is not None else resolve_corpus(config, examples, default)
    elif passages is None and retriever is None:  # an opened retriever brings its own corpus
        passages = resolve_corpus(config, examples)
    method, retriever, backend = build_pipeline(config, passages, backend, retriever)
    titles = passage_titles(retriever)
    kept: list[dict] = []
    writer = None
    if out is not None:
        out = Path(out)
        if resume:
            kept, size = kept_records(config, out, examples, retriever)
            if kept and out.stat().st_size > size:  # a torn last line: cut it off before appending
                os.truncate(out, size)
        writer = RecordWriter(out, evaluation_identity(config, retriever) if resume else None, append=bool(kept))
    if judge_backend is None:
        judge_backend = make_judge_backend(config, backend)
    judge = LLMJudge(judge_backend) if judge_backend is not None else None
    records = list(kept)
    bar = tqdm(total=len(examples), initial=len(kept), desc=f"{config.method} · {config.dataset}", unit="q",
               disable=not progress, leave=False)
    try:
        # the uninterrupted run's batch boundaries: a resumed run's first batch is the rest of the one it cut. A
        # continuous method (the agents) gets CONTINUOUS_BATCHES batches per call and keeps batch_size rows busy
        # over them, a finished question's row taking the next one (records are written per call)
        step = config.batch_size * (CONTINUOUS_BATCHES if method.continuous else 1)
        for b in range(0, len(examples), step):
            batch = examples[max(b, len(kept)):b + step]
            if not batch:
                continue
            t0 = time.perf_counter()
            outputs = method.run([ex.question for ex in batch])
            per_question = (time.perf_counter() - t0) / len(batch)
            new = [_record(ex, o, titles, per_question) for ex, o in zip(batch, outputs)]
            if judge is not None:  # before the write: a record on disk is final
                for r, v in zip(new, judge.judge([(r["question"], r["golds"], r["prediction"]) for r in new])):
                    r["lj"] = v
            lines = [json.dumps(r, default=str) for r in new]
            if writer is not None:
                writer.write(lines)
            records += [json.loads(line) for line in lines]  # as read back on resuming: the same summary
            bar.update(len(batch))
    finally:
        bar.close()  # before the caller's error line, which then starts a line of its own
        if writer is not None:
            writer.close()
    if writer is not None:
        writer.finish()
    judge_info = None
    if judge is not None:
        self_judged = judge_backend is backend or judge_backend.name == backend.name
        judge_info = {"model": judge_backend.name, "url": config.judge_url, "self_judged": self_judged,
                      "stats": judge.stats}
        if self_judged:
            judge_info["note"] = "LJ graded by the answering model itself; not comparable with an external judge"
    summary = summarize(records)
    recalls = [r["retrieval_recall"] for r in records if r["retrieval_recall"] is not None]
    summary.update(method=config.method, dataset=config.dataset, model=backend.name,
                   retrieval_recall=round(sum(recalls) / len(recalls), 4) if recalls else None,
                   search_errors=len(method.search_errors), judge=judge_info, resumed=len(kept),
                   wall_seconds=round(time.perf_counter() - start, 1), config=asdict(config))
    if config.network_url:
        summary["router"] = router_summary(method.search)
    return summary
