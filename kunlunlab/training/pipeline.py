"""The whole progressive-training run, as notebook 04 and ``kunlunlab train --config FILE`` execute it.

    data (world gold chains + HotpotQA, mixed by the schedule) → evaluation before
    → stage 1 SFT (format cold start) → stage 2 DAPO → evaluation after → training_summary.json

The agent is the whole method by default (``agent.method = "kunlun"``): the SFT data carries RDRA's
background block, plan samples and STIE feedback rounds (``mixing``), the DAPO rollouts run RDRA and
STIE, and the evaluation runs ``kunlun``; ``agent.method = "agent"`` trains the search-think protocol
alone (the ablation; its SFT data leaves the whole agent's parts out with ``mixing.rdra_background=false
mixing.plan_samples=0 mixing.stie_feedback_share=0``, as the kept plain-agent runs set). Evaluation runs
the same inference pipeline (``kunlunlab.eval.harness.evaluate``, method ``eval.method``) on held-out
synthetic questions that training never saw and on the held-out half of the HotpotQA distractor sample
(:mod:`kunlunlab.training.evaluation`). Every finished model folder carries ``kunlunlab_agent.json``, the whole
agent configuration it was trained with (:func:`~kunlunlab.training.evaluation.agent_settings`), which
``kunlunlab eval --model <folder>`` applies. Every stage is resumable: a finished stage leaves ``<stage>/final``
and a line in ``state.json``; an interrupted one continues from its last Trainer checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env

from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.rdra import rdra_contexts
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.data.splits import TrainingData, load_splits
from kunlunlab.eval.harness import AGENT_SETTINGS_FILE
from kunlunlab.models import load_llm, release_host_memory, resolve_device, resolve_model_dtype, resolve_train_bf16
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.retrieval.factory import open_retriever
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.retrieval.sharded import peak_rss_mb
from kunlunlab.retrieval.store import load_retriever, save_retriever
from kunlunlab.training.config import (OWN_PROCESS_STAGES as STAGES, TrainConfig, apply_overrides,
                                       config_from_dict, effective_settings, load_config)
from kunlunlab.training.comparison import budget_ledger, write_ledger
from kunlunlab.training.cpu_heap import keep_freed_memory
from kunlunlab.training.dapo import SearchRollout, rl_dataset, run_dapo
from kunlunlab.training.dpo import run_dpo
from kunlunlab.training.evaluation import agent_settings, heldout_evaluation
from kunlunlab.training.geometry import BatchPlan, batch_plan, world_size_from_env
from kunlunlab.training.mixing import RealSource, TrajectoryBuilder, TrajectoryExample, data_stats, mix, schedule
from kunlunlab.training.own_process import run_in_own_process
from kunlunlab.training.preferences import collect_preferences, read_preferences
from kunlunlab.training.peer_data import render_all
from kunlunlab.training.records import build_summary, write_log
from kunlunlab.training.sft import freeze_for_sft, run_sft, sft_dataset

log = logging.getLogger(__name__)

# The test suite's size. The evaluation after training answers two world questions only: the HotpotQA and
# long-answer evaluations (half of each smoke evaluation's time) run in the tests that check them, which set them.
# Every stage trains in this process: a smoke stage trains in a second or two and a child process of its own spent
# ~15 s importing torch, transformers and TRL before it (three children: 46 s of notebook 08's 61 s smoke comparison
# on a 2-core EPYC); how a run uses processes does not change what it trains (config.PROCESS_ONLY_FIELDS), and the
# child-process path has its own test (tests/training/test_own_process.py).
SMOKE_OVERRIDES = {
    "own_process_stages": [],
    "train_questions": 24, "world_passages": 600,
    "mixing.epochs": 2, "mixing.turning_epoch": 1, "mixing.samples_per_epoch": 4,
    "sft.max_steps": 2, "sft.batch_size": 2, "sft.save_steps": 1, "sft.train_layers": 2,
    "dapo.steps": 1, "dapo.updates_per_generation": 1, "dapo.prompts_per_step": 1, "dapo.num_generations": 2,
    "dapo.max_total_tokens": 160,
    "dapo.max_turn_tokens": 32, "dapo.max_resample": 0,
    "eval.world_questions": 2, "eval.hotpot_questions": 0, "eval.summary_questions": 0, "eval.max_total_tokens": 160,
    "eval.max_turn_tokens": 32,
    "agent.rdra.plan_tokens": 16, "agent.stie.max_rounds": 2, "mixing.plan_samples": 1,
    "mixing.stie_feedback_share": 0.5,
}

NO_PAIRS = "PRL: the tree search produced no preference pairs"  # notebook 07 skips such a variant


def run_config(config: str | Path | None, overrides: dict | list[str] | None = None,
               smoke: bool = False) -> TrainConfig:
    """The training config notebook 04 and ``kunlunlab train`` run: a JSON file (a path as given, else
    relative to the repository root; None for the dataclass defaults) with overrides (``{"sft.learning_rate":
    1e-4}`` or ``["sft.learning_rate=1e-4"]``); ``smoke`` shrinks it to the test suite's size, the user's
    overrides still winning."""

    path = None if config is None else Path(config)
    if path is not None and not path.is_absolute() and not path.is_file():
        path = PROJECT_ROOT / path
    cfg = load_config(path, overrides)
    if smoke:
        cfg = config_from_dict(apply_overrides(apply_overrides(cfg.to_dict(), SMOKE_OVERRIDES), overrides))
    return cfg


def rl_prompt_pool(cfg: TrainConfig, data: TrainingData) -> list:
    """DAPO's prompt pool: the world's training questions and ``data.rl_prompts``' at ``rl_prompts_share`` of
    the pool (TRL's sampler draws uniformly from it, so that is each batch's expected share); 1.0: the real
    questions alone, 0.0 or no file: the world's alone."""
    share, real, world = cfg.data.rl_prompts_share, list(data.rl_train), list(data.train)
    if not real or share == 0.0:
        return world
    if share == 1.0:
        return real
    n_real = min(len(real), round(share / (1.0 - share) * len(world)))
    if n_real < len(real):
        return world + real[:n_real]
    return world[:round(len(real) * (1.0 - share) / share)] + real


class RunState:
    """``state.json``: which stages finished, their seconds and steps, and the evaluations already made."""
    def __init__(self, run_dir: Path, writer: bool = True):
        self.path, self.writer = run_dir / "state.json", writer
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, key, default=None):
        return self.data.get(key, default)

    def set(self, key, value) -> None:
        self.data[key] = value
        if not self.writer:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def mix_training_data(cfg: TrainConfig, data: TrainingData, retriever=None, real_search=None, build=None) -> list:
    """The mixed SFT trajectories of a training config (eqs. 14–16) with real retrieval: the world's gold
    chains and the HotpotQA training half, with RDRA backgrounds, plan samples and STIE feedback rounds as
    ``cfg.mixing`` asks. Notebook 02 shows exactly what notebook 04 trains on by calling this.
    ``real_search``: the search of the configured retrieval service or saved index (``cfg.retrieval``), used
    for every real source instead of an index built here over its corpus. Result blocks hold the run's
    ``top_k`` passages of ``max_result_chars``, as its rollouts do; ``cfg.seed`` draws the mix. A peer's agent
    (``agent.method`` search_r1, research, r1_searcher) gets the same trajectories written in its own protocol
    (:mod:`kunlunlab.training.peer_data`). ``build(passages, name)``: how a real source's index is built (default:
    here; a training run shares one between its processes, :func:`shared_retriever`)."""
    mixing = cfg.mixing
    index = IndexConfig(kind=cfg.index_kind, embedder=cfg.embedder)
    build = build or (lambda passages, name: build_retriever(passages, index))
    retriever = retriever or build_retriever(data.passages, index)
    sizes = {"top_k": cfg.passages_per_search, "max_result_chars": cfg.max_result_chars}
    builder = TrajectoryBuilder(retriever.search, data.passages, mixing, cfg.agent.rdra, **sizes)
    sources = []
    rl_name = Path(cfg.data.rl_prompts).stem if cfg.data.rl_prompts else "rl_prompts"
    rl_sft = [ex for ex in data.rl_train if ex.supporting_titles and ex.context]  # a gold chain to walk
    for name, questions, passages, share in (("hotpotqa", data.hotpot_train, data.hotpot_passages, mixing.hotpot_share),
                                             ("2wikimultihopqa", data.twowiki_train, data.twowiki_passages,
                                              mixing.twowiki_share),
                                             (rl_name, rl_sft, data.rl_passages, cfg.data.sft_share)):
        if questions and share > 0:  # each real source is searched in its own corpus, or through the service
            search = real_search or build(passages, name).search
            sources.append(RealSource(name, TrajectoryBuilder(search, passages, mixing, cfg.agent.rdra, **sizes),
                                      questions, share))
    trajectories = mix(builder, data.train, mixing, sources, seed=cfg.seed)
    return render_all(trajectories, get_protocol(cfg.agent.protocol), cfg.max_result_chars)


def read_trajectories(path: Path) -> list[TrajectoryExample]:
    """The mixed trajectories :meth:`TrainingRun.mix` wrote, read back."""
    return [TrajectoryExample.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line]


def rollout_config(cfg: TrainConfig) -> RolloutConfig:
    """The agent's budgets in training rollouts (DAPO's and the PRL tree search's): the run's top-k and searches
    where it states them (a comparison's budget, every arm alike), else its protocol's declared ones."""
    return RolloutConfig(max_searches=cfg.search_limit(cfg.dapo.max_total_tokens),
                         max_turn_tokens=cfg.dapo.max_turn_tokens, max_total_tokens=cfg.dapo.max_total_tokens,
                         top_k=cfg.passages_per_search, max_result_chars=cfg.max_result_chars)


def hand_over(trained, final: Path) -> None:
    """Names ``final`` (where ``trained`` was just saved) as the model's origin: the next stage starts from it, and
    TRL's GRPOTrainer builds its KL reference from ``config._name_or_path``, which after in-process training still
    named the base model (step-1 KL 0.84 and 0.93 in Table 2's Search-R1 and ReSearch arms, against 0.0 for an arm
    that loaded its SFT checkpoint from disk). ``training.dpo`` hands DPO its reference as a copy instead."""
    trained.config._name_or_path = str(final)


def training_plan(cfg: TrainConfig, world_size: int | None = None, check_hardware: bool = True) -> BatchPlan:
    """The run's resolved batch geometry, device and dtype (:mod:`kunlunlab.training.geometry`), computed without
    loading anything: what ``kunlunlab train --dry-run`` prints. ``world_size``: training processes (default: this
    launch's ``WORLD_SIZE``). ``check_hardware=False`` plans for hardware this machine lacks (``device: cuda`` in
    a recipe, read on a laptop): the device is then reported as configured."""
    if check_hardware or cfg.device in ("auto", "cpu"):
        device = resolve_device(cfg.device)
    else:
        device = cfg.device
    dtype = cfg.model_dtype
    if dtype == "auto":
        dtype = resolve_model_dtype(dtype, device) if check_hardware or not device.startswith("cuda") else "bfloat16"
    return batch_plan(cfg.dapo, world_size or world_size_from_env(), model_dtype=dtype, device=device,
                      lora=cfg.lora.enabled, gradient_checkpointing=cfg.gradient_checkpointing,
                      deepspeed=cfg.deepspeed)


class RunFolderConflict(ValueError):
    """The run folder holds a run of another configuration."""

def check_run_folder(cfg: TrainConfig, run_dir: Path) -> None:
    """Refuses a folder whose ``train_config.json`` differs from ``cfg`` in effect: resuming there would
    silently hand back the other run's models and overwrite its config. A folder written before a key moved or
    with other values in fields both configs leave inert (:func:`~kunlunlab.training.config.effective_settings`)
    holds the same run and resumes."""
    saved = run_dir / "train_config.json"
    if not saved.is_file():
        return
    want = json.loads(json.dumps(cfg.to_dict()))
    try:
        have = json.loads(saved.read_text())
    except json.JSONDecodeError as err:
        raise RunFolderConflict(f"{saved} is not readable JSON ({err}); use another run folder") from err
    if have == want:
        return
    try:
        same = effective_settings(config_from_dict(have, str(saved))) == effective_settings(cfg)
    except (TypeError, ValueError):  # keys or values this version no longer reads: not the same run
        same = False
    if not same:
        changed = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        raise RunFolderConflict(f"{run_dir} holds a training run of another config (differs in {changed}, "
                                f"config hash {config_hash(have)} there vs {config_hash(want)}); pass a new run "
                                "folder, or the same config to resume")


def config_hash(config: dict) -> str:

    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


class TrainingRun:
    """One training run folder and its stages, callable one at a time (notebook 04 shows each with its
    curves) or all in order by :func:`train`:

        run = TrainingRun(cfg, run_dir)       # data, retriever and model; refuses a folder of another config
        run.evaluate("before"); run.mix(); run.sft(); run.dapo(); run.evaluate("after"); run.finish()

    Every stage resumes: a finished one is read back from ``state.json`` and ``<stage>/final``. A stage in
    ``cfg.own_process_stages`` trains in a child process (:mod:`kunlunlab.training.own_process`) and is then read
    back the same way; ``in_child``: this is that child, which trains the stage here."""
    def __init__(self, cfg: TrainConfig, run_dir: str | Path, progress: Callable[[str], None] | None = None,
                 sft_callbacks: list | None = None, dapo_callbacks: list | None = None, in_child: bool = False,
                 start_model: str | Path | None = None):
        """``start_model``: the model to load instead of ``cfg.model`` (a stage's child process starts from the
        final model of the run's last finished stage, :func:`trained_model` with ``before``)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.plan = training_plan(cfg)  # an inconsistent batch geometry stops here, before anything loads
        self.own_process_stages = set() if in_child else set(cfg.own_process_stages)
        if self.own_process_stages and (sft_callbacks or dapo_callbacks):
            raise ValueError("own_process_stages: a stage in its own process cannot call this process's trainer "
                             "callbacks; set own_process_stages=[] to pass callbacks")
        if self.own_process_stages and self.plan.world_size > 1:
            raise ValueError(f"own_process_stages: a run of {self.plan.world_size} processes (accelerate) trains "
                             "each stage in its launched processes; set own_process_stages=[]")
        self.device = self.plan.device
        self.say = progress or (lambda msg: log.info(msg))
        self.sft_callbacks, self.dapo_callbacks = sft_callbacks, dapo_callbacks
        self.run_dir.mkdir(parents=True, exist_ok=True)
        check_run_folder(cfg, self.run_dir)
        self.main_process = _is_main_process()
        if self.main_process:  # under accelerate the other processes read it meanwhile (check_run_folder):
            _write_atomic(self.run_dir / "train_config.json", json.dumps(cfg.to_dict(), indent=2))  # whole or absent
        self.state = RunState(self.run_dir, writer=self.main_process)
        self.state.set("config_hash", config_hash(json.loads(json.dumps(cfg.to_dict()))))
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        if self.device == "cpu":
            keep_freed_memory(cfg.heap_keep_gb)
        torch.manual_seed(cfg.seed)
        self.data = load_splits(cfg.splits())
        self.say(f"data: {len(self.data.train)} training and {len(self.data.heldout)} held-out synthetic questions, "
                 f"{len(self.data.hotpot_train)}/{len(self.data.hotpot_heldout)} HotpotQA train/held-out"
                 + (f", {len(self.data.twowiki_train)} 2Wiki questions with silver chains" if cfg.twowiki else ""))
        # the embedder and an exact index on this process's device (a GPU under accelerate: its own)
        self.index = IndexConfig(kind=cfg.index_kind, embedder=cfg.embedder,
                                 device=self.device if self.device.startswith("cuda") else "cpu")
        self.retriever = shared_retriever(self.data.passages, self.index, self.run_dir / "index" / "world")
        self._eval_indexes: dict = {}  # other corpora's evaluation retrievers, by held-out set
        self.real_retriever = real_retriever(cfg)  # cfg.retrieval's service or saved index, else None
        self.model, self.tok = load_llm(str(start_model) if start_model else cfg.model, dtype=self.plan.model_dtype,
                                        device=self.device)
        self.evaluations: dict[str, dict] = {}
        self.trajectories: list | None = None
        self.stats_rows: list[dict] = []
        self._read_state_records()
        self._frozen = False

    def _read_state_records(self) -> None:
        """The stages' seconds, steps and peaks as ``state.json`` holds them (again after a child process wrote it)."""
        self.timings = self.state.get("seconds", {})
        self.steps = self.state.get("steps", {})
        self.peaks = self.state.get("peak_gpu_gb", {})  # stage or evaluation -> its peak GPU memory (None on a CPU)
        # stage or evaluation -> the peak RSS of the process that ran it, up to its end
        self.host_peaks = self.state.get("peak_host_gb", {})

    def evaluate(self, tag: str) -> dict:
        """EM / F1 / format compliance of the current model on the held-out world and HotpotQA questions."""
        cached = self.state.get(f"eval_{tag}")
        if cached:
            self.evaluations[tag] = cached
            return cached
        t0 = time.perf_counter()
        self._reset_peak()
        # under accelerate every process evaluates its share of the questions
        result = heldout_evaluation(self.model, self.tok, self.cfg, self.data, self.run_dir, tag, _process_share(),
                                    self.eval_index)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        self._record_peak(f"eval_{tag}")
        release_host_memory()  # the rollouts' caches, before the next stage allocates its own
        self.state.set(f"eval_{tag}", result)
        log_scalars(self.cfg.report_to, self.run_dir / "runs" / "eval", f"eval_{tag}", result)
        w = result["world"]
        self.say(f"eval {tag}: world EM {w['em']} F1 {w['f1']} format {w['format_compliance']}")
        self.evaluations[tag] = result
        return result

    def eval_index(self, passages, name: str):
        """The retriever an evaluation searches ``passages`` with: the run's own over the world, else one built once
        per launch (:func:`shared_retriever`) and kept for the next evaluation."""
        if passages is self.data.passages:
            return self.retriever
        if name not in self._eval_indexes:
            self._eval_indexes[name] = shared_retriever(passages, self.index, self.run_dir / "index" / f"eval_{name}")
        return self._eval_indexes[name]

    def mix(self) -> list:
        """The SFT trajectories, mixed by the schedule of eqs. 14–16 (``trajectories.jsonl``, ``schedule.json``)."""
        self.trajectories = mix_training_data(
            self.cfg, self.data, self.retriever, self.real_retriever.search if self.real_retriever else None,
            build=lambda passages, name: shared_retriever(passages, self.index, self.run_dir / "index" / name))
        if self.main_process:  # every process mixes the same data; one writes it (two truncated each other's)
            with (self.run_dir / "trajectories.jsonl").open("w") as f:
                for t in self.trajectories:
                    f.write(json.dumps(t.to_dict()) + "\n")
            (self.run_dir / "schedule.json").write_text(json.dumps(schedule(self.cfg.mixing), indent=2))
        self.stats_rows = data_stats(self.trajectories, self.tok)
        self.say(f"mixed {len(self.trajectories)} trajectories over {self.cfg.mixing.epochs} epochs")
        return self.trajectories

    def _reset_peak(self) -> None:
        """A stage's or evaluation's peak GPU memory is its own: the counter restarts where it starts."""
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()

    def _record_peak(self, name: str) -> None:
        """``state.json``'s ``peak_gpu_gb``: what ``name`` held at most on this process's GPU (None on a CPU), and
        ``peak_host_gb``: this process's peak resident memory from its start to ``name``'s end (``ru_maxrss``,
        never reset, as GNU time reads it): the stage after which it last rises set the process's peak (issue 54:
        which stage of notebook 04 passes 8 GB)."""
        cuda = self.device.startswith("cuda")
        self.peaks[name] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
        self.host_peaks[name] = round(peak_rss_mb() / 1024, 2)
        self.state.set("peak_gpu_gb", self.peaks)
        self.state.set("peak_host_gb", self.host_peaks)

    def _freeze(self) -> int:
        """Full-parameter training freezes as ``sft.train_layers`` says; with LoRA peft freezes the base weights
        and trains the adapters only."""
        self._frozen = True
        if self.cfg.lora.enabled:
            return 0
        return freeze_for_sft(self.model, self.cfg.sft.train_layers)

    def _load(self, folder: Path):
        return load_llm(str(folder), dtype=self.plan.model_dtype, device=self.device)

    def _trainer_options(self) -> dict:
        """What every stage's TRL trainer shares: precision, DeepSpeed, checkpointing, LoRA, trackers."""
        cfg = self.cfg
        return {"bf16": resolve_train_bf16(cfg.bf16, self.device), "deepspeed": cfg.deepspeed,
                "gradient_checkpointing": cfg.gradient_checkpointing, "peft_config": cfg.lora.peft_config(),
                "report_to": cfg.report_to}

    def _release(self, trainer, trained, final: Path) -> None:
        """Lets go of the trainer's engine and hands ``trained`` (the unwrapped model, a LoRA adapter already
        merged by :meth:`_finish_stage`) to the next stage, which trains a fresh adapter on it. Under DeepSpeed
        the next stage starts from the saved model instead: a second engine on the module the first one wrapped
        would find the first one's gradient hooks still on its parameters."""
        trainer.accelerator.free_memory()
        if self.cfg.deepspeed:
            self.model, self.tok = self._load(final)
            self._frozen = False
        else:
            self.model = trained

    def _finish_stage(self, stage: str, trainer, final: Path, t0: float) -> None:
        """The final model (with LoRA: the weights with the adapter merged), the Trainer log, seconds and steps,
        and the stage marked done in state.json; the stage's ``checkpoint-*`` folders (model and optimizer state,
        there only to resume an interrupted stage) are removed; then the trainer is released (:meth:`_release`)."""
        trained = trainer.accelerator.unwrap_model(trainer.model)
        if self.cfg.lora.enabled:  # the whole merged model, not the adapter alone, so eval reads it as any model
            trained = trained.merge_and_unload()
            if self.main_process:
                trained.save_pretrained(str(final))
        else:
            trainer.save_model(str(final))  # the Trainer saves on the main process only
        hand_over(trained, final)
        trainer.accelerator.wait_for_everyone()  # the model is whole on disk before any process reads it back
        if self.main_process:  # likewise the rest: under accelerate all processes wrote the same files at once
            self.tok.save_pretrained(str(final))
            (final / AGENT_SETTINGS_FILE).write_text(json.dumps(agent_settings(self.cfg), indent=2))
            write_log(self.run_dir / f"{stage}_log.jsonl", trainer.state.log_history)
        self.timings[stage] = round(time.perf_counter() - t0, 1)
        self._record_peak(stage)
        self.steps[stage] = trainer.state.global_step
        self.state.set("seconds", self.timings)
        self.state.set("steps", self.steps)
        self.state.set(f"{stage}_done", True)
        if self.main_process:  # a finished stage resumes from its final model: the checkpoints are dead weight
            for checkpoint in (self.run_dir / stage).glob("checkpoint-*"):
                shutil.rmtree(checkpoint)
        self.say(f"{stage.upper()} done: {self.steps[stage]} steps in {self.timings[stage]} s")
        self._release(trainer, trained, final)
        # The stage methods hand the trainer straight in, so this frame holds the last reference: dropped here,
        # its optimizer state and the stage's freed activations go back to the system before the next stage.
        del trainer, trained
        release_host_memory()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def sft(self) -> None:
        """Stage 1, format cold start: TRL ``SFTTrainer`` on the mixed trajectories (loss on model tokens only)."""
        cfg = self.cfg
        if not cfg.sft.enabled:
            return
        if self.trajectories is None:
            self.mix()
        final = self.run_dir / "sft" / "final"
        self._train_in_own_process("sft")
        if self.state.get("sft_done"):
            self.model, self.tok = self._load(final)
            self._freeze()
            return
        trainable = self._freeze()
        t0 = time.perf_counter()
        self._reset_peak()
        self.model.train()
        dataset = sft_dataset(self.tok, self.trajectories, cfg.sft.max_length, cfg.sft.batch_size, cfg.seed)
        lora = cfg.lora
        trained = (f"LoRA adapters r={lora.r} on {lora.target_modules}, base weights frozen" if lora.enabled
                   else f"{trainable / 1e6:.1f}M trainable parameters")
        self.say(f"SFT on {len(dataset)} trajectories, {trained}")
        self._finish_stage("sft", run_sft(self.model, self.tok, dataset, cfg.sft, self.run_dir / "sft", cfg.seed,
                                          callbacks=self.sft_callbacks, **self._trainer_options()), final, t0)

    def _resumed(self, stage: str) -> bool:
        """A stage after SFT that already finished: its final model is loaded and True returned. Otherwise the
        model is frozen as SFT froze it (when SFT did not run in this process) and False returned. A stage of
        ``own_process_stages`` is trained in its child process first, then read back."""
        self._train_in_own_process(stage)
        if self.state.get(f"{stage}_done"):
            self.model, self.tok = self._load(self.run_dir / stage / "final")
            return True
        if not self._frozen:
            self._freeze()
        return False

    def _train_in_own_process(self, stage: str) -> None:
        """``stage``, when it is one of ``own_process_stages`` and unfinished, trained by a child process; this
        process lets go of its model first (the caller reads the stage's final model back)."""
        if stage not in self.own_process_stages or self.state.get(f"{stage}_done"):
            return
        self.model = None
        release_host_memory()
        run_in_own_process(self.run_dir, stage, self.say)
        self.state = RunState(self.run_dir, writer=self.main_process)
        self._read_state_records()

    def train_stage_here(self, stage: str) -> None:
        """The child's side: ``stage`` trained in this process from the model it was made with
        (``trained_model(run_dir, before=stage)``); SFT on the trajectories the parent mixed
        (``trajectories.jsonl``)."""
        if stage == "sft":
            self.trajectories = read_trajectories(self.run_dir / "trajectories.jsonl")
        getattr(self, stage)()

    def _rollout_config(self):
        return rollout_config(self.cfg)

    def prl(self) -> None:
        """Optional stage (``cfg.prl``): ReasonRAG's process supervision — MCTS over the current model's steps on
        the first ``prl.questions`` training questions (RDRA backgrounds in the prompts for the whole agent),
        SPRE values, step preference pairs (``prl/preferences.jsonl``, ``prl/trees.jsonl``), then DPO."""
        cfg = self.cfg
        if not cfg.prl.enabled or self._resumed("prl"):
            return
        final, t0 = self.run_dir / "prl" / "final", time.perf_counter()
        self._reset_peak()
        self.model.eval()
        examples = self.data.train[:cfg.prl.questions]
        prefs = self.run_dir / "prl" / "preferences.jsonl"
        if prefs.is_file():  # the tree search finished before an interruption: its pairs are read back
            rows = read_preferences(prefs)
        else:
            backend = TransformersBackend(model=self.model, tokenizer=self.tok, dtype=cfg.inference_dtype)
            backgrounds = None
            if cfg.agent.whole:
                questions = [ex.question for ex in examples]
                contexts = rdra_contexts(backend, self.retriever.search, questions, cfg.agent.rdra)
                backgrounds = {q: c.background for q, c in zip(questions, contexts)}
            rows = collect_preferences(backend, self.retriever.search, examples, self.run_dir / "prl", self._rollout_config(),
                                       cfg.prl.mcts, progress=self.say, backgrounds=backgrounds)
            self.state.set("prl_mcts_seconds", round(time.perf_counter() - t0, 1))
        self.say(f"PRL: {len(rows)} step preference pairs from {len(examples)} trees")
        if not cfg.prl.dpo.enabled:  # collect the pairs only (e.g. to inspect the trees first)
            return
        if not rows:
            raise RuntimeError(f"{NO_PAIRS} (every sibling scored the same); "
                               "raise prl.mcts.iterations / children_per_node or start from a trained model")
        self.model.train()
        self._finish_stage("prl", run_dpo(self.model, self.tok, rows, cfg.prl.dpo, self.run_dir / "prl", cfg.seed,
                                          **self._trainer_options()), final, t0)

    def dapo(self) -> None:
        """Stage 2: DAPO through TRL's ``GRPOTrainer``, rollouts by the agent (RDRA + STIE for ``kunlun``)."""
        cfg, data = self.cfg, self.data
        if not cfg.dapo.enabled or self._resumed("dapo"):
            return
        final, t0 = self.run_dir / "dapo" / "final", time.perf_counter()
        self._reset_peak()
        self.model.train()
        whole = cfg.agent.whole
        pool = rl_prompt_pool(cfg, data)
        real = {q.question for q in data.rl_train} & {q.question for q in pool}
        real_search = self.real_retriever.search if self.real_retriever else None
        if real and real_search is None:  # the real prompts' own paragraphs, else the world's index (no evidence)
            real_search = (shared_retriever(data.rl_passages, self.index, self.run_dir / "index" / "rl_prompts")
                           .search if data.rl_passages else None)
        rollout = SearchRollout(self.retriever.search, self.tok, {q.question: q.answers for q in pool},
                                self._rollout_config(), cfg.dapo, cfg.rewards, log_path=self.run_dir / "dapo_rollouts.jsonl",
                                rdra=cfg.agent.rdra if whole else None, stie=cfg.agent.stie if whole else None,
                                supporting={q.question: list(q.supporting_ids) for q in pool},
                                inference_dtype=cfg.inference_dtype,
                                routes={q: real_search for q in real} if real_search else None,
                                facts={q.question: list(q.facts) for q in pool if q.facts},
                                protocol=cfg.agent.protocol)
        dataset = rl_dataset([q.question for q in pool], [q.answers for q in pool])
        self._finish_stage("dapo", run_dapo(self.model, self.tok, dataset, rollout, cfg.dapo, cfg.rewards,
                                            self.run_dir / "dapo", cfg.seed, callbacks=self.dapo_callbacks,
                                            world_size=self.plan.world_size, **self._trainer_options()), final, t0)

    def finish(self) -> dict:
        """``training_summary.json`` from the evaluations before and after and the stages' seconds and steps."""
        if not self.main_process:
            return {}
        if self.trajectories is None and self.cfg.sft.enabled:  # a run without SFT mixes no SFT data
            self.mix()
        before = self.evaluations.get("before") or (self.evaluate("before") if self.cfg.eval.before else {})
        after = self.evaluations.get("after") or self.evaluate("after")
        summary = build_summary(self.cfg, before, after, self.timings, self.steps, self.trajectories, self.stats_rows)
        summary["peak_gpu_gb"] = self.peaks
        summary["peak_host_gb"] = self.host_peaks
        if "sft" in self.evaluations:  # RL's own effect: the same questions after SFT and after RL
            summary["after_sft"] = {name: {k: v for k, v in part.items() if not isinstance(v, (list, dict))}
                                    for name, part in self.evaluations["sft"].items() if isinstance(part, dict)}
        (self.run_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
        write_ledger(self.run_dir, budget_ledger(self.cfg, self.trajectories, self.run_dir / "dapo_rollouts.jsonl"))
        return summary


def train(cfg: TrainConfig, run_dir: str | Path, progress: Callable[[str], None] | None = None,
          sft_callbacks: list | None = None, dapo_callbacks: list | None = None) -> dict:
    """Runs (or resumes) every stage in order; returns and writes ``training_summary.json``."""
    run = TrainingRun(cfg, run_dir, progress, sft_callbacks, dapo_callbacks)
    if cfg.eval.before:
        run.evaluate("before")
    if cfg.sft.enabled:
        run.mix()
    run.sft()
    if cfg.eval.after_sft and cfg.sft.enabled and (cfg.prl.enabled or cfg.dapo.enabled):
        run.evaluate("sft")
    run.prl()
    run.dapo()
    run.evaluate("after")
    return run.finish()


def trained_model(run_dir: str | Path, before: str | None = None) -> Path | None:
    """The final model of a training run folder: the last stage that finished (DAPO, PRL, SFT), else None.
    ``before``: the last that finished before that stage, the model it starts from (None: the base model)."""
    stages = STAGES if before is None else STAGES[:STAGES.index(before)]
    for stage in reversed(stages):
        final = Path(run_dir) / stage / "final"
        if (final / "config.json").is_file():
            return final
    return None


def real_retriever(cfg: TrainConfig):
    """The retrieval service or saved index of ``cfg.retrieval`` (checked now: a service that is down stops the
    run here, after its retries, with one line naming it), or None when neither is configured."""
    source = cfg.retrieval
    if not source.configured:
        return None
    return open_retriever(source.url, source.index_dir, attempts=source.attempts, backoff=source.backoff,
                          timeout=source.timeout)


def _process_share() -> tuple[int, int]:
    """(process index, processes) of this launch (``accelerate launch``/``torchrun`` set ``RANK``/``WORLD_SIZE``)."""
    return int(os.environ.get("RANK", 0)), world_size_from_env()


def log_scalars(report_to: list[str], log_dir: Path, prefix: str, result: dict) -> None:
    """An evaluation's numbers as TensorBoard scalars beside the trainers' event files (``report_to`` names
    tensorboard); the jsonl/JSON records stay the reference."""
    if "tensorboard" not in report_to or not _is_main_process():
        return
    from torch.utils.tensorboard import SummaryWriter  # deferred: only runs that track with TensorBoard need it

    writer = SummaryWriter(str(log_dir))
    try:
        for dataset, numbers in result.items():
            if not isinstance(numbers, dict):
                continue
            for key in ("em", "f1", "acc", "format_compliance", "searches"):
                if numbers.get(key) is not None:
                    writer.add_scalar(f"{prefix}/{dataset}/{key}", numbers[key], 0)
    finally:
        writer.close()


def _partial_state() -> PartialState:
    # cpu as the trainers set it (use_cpu without CUDA; ACCELERATE_USE_CPU): under a CPU-only `accelerate
    # launch`, PartialState(cpu=False) finds no backend, calls the state "not distributed" and gives every
    # rank process index 0, so every rank took itself for the main one and wrote and evaluated as such
    cpu = not torch.cuda.is_available() or parse_flag_from_env("ACCELERATE_USE_CPU")
    return PartialState(cpu=cpu)


def _is_main_process() -> bool:
    return _partial_state().is_main_process


def shared_retriever(passages, index: IndexConfig, folder: Path):
    """An in-process index built once per launch: alone, built here; under ``accelerate launch`` the main process
    builds it into ``folder`` (embedding the corpus on its device) while the others wait, then every process loads
    it, no passage embedded twice. Before, each of 7 ranks encoded the corpus itself on the same CPU cores."""
    if world_size_from_env() <= 1:
        return build_retriever(passages, index)
    state = _partial_state()
    if state.is_main_process and not (folder / "manifest.json").is_file():
        save_retriever(build_retriever(passages, index), folder)
    state.wait_for_everyone()
    return load_retriever(folder, passages=passages, index_config=index)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


__all__ = ["AGENT_SETTINGS_FILE", "SMOKE_OVERRIDES", "RunFolderConflict", "hand_over", "mix_training_data",
           "rollout_config", "run_config", "TrainingRun", "trained_model", "train"]
