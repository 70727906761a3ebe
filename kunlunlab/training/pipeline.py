"""The whole progressive-training run, as notebook 04 and ``kunlunlab train --config FILE`` execute it.

    data (world gold chains + HotpotQA, mixed by the schedule) → evaluation before
    → stage 1 SFT (format cold start) → stage 2 DAPO → evaluation after → training_summary.json

The agent is the whole method by default (``agent.method = "kunlun"``): the SFT data carries RDRA's
background block, plan samples and STIE feedback rounds (``mixing``), the DAPO rollouts run RDRA and
STIE, and the evaluation runs ``kunlun``; ``agent.method = "agent"`` trains the search-think protocol
alone (the ablation). Evaluation runs the same inference pipeline (``kunlunlab.eval.harness.evaluate``,
method ``eval.method``) on held-out synthetic questions that training never saw and on the held-out
half of the HotpotQA distractor sample. Every finished model folder carries ``kunlunlab_agent.json``,
the agent settings it was trained with, which ``kunlunlab eval --model <folder>`` applies. Every stage is resumable: a finished stage leaves ``<stage>/final`` and a line in
``state.json``; an interrupted one continues from its last Trainer checkpoint.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from kunlunlab.eval.harness import AGENT_SETTINGS_FILE  # the file `kunlunlab eval --model` reads
from kunlunlab.training.config import TrainConfig

log = logging.getLogger(__name__)

SMOKE_OVERRIDES = {
    "train_questions": 24, "world_passages": 600,
    "mixing.epochs": 2, "mixing.turning_epoch": 1, "mixing.samples_per_epoch": 4,
    "sft.max_steps": 2, "sft.batch_size": 2, "sft.save_steps": 1, "sft.train_layers": 2,
    "dapo.steps": 1, "dapo.prompts_per_step": 1, "dapo.num_generations": 2, "dapo.max_total_tokens": 160,
    "dapo.max_turn_tokens": 32, "dapo.max_resample": 0,
    "eval.world_questions": 2, "eval.hotpot_questions": 1, "eval.max_total_tokens": 160, "eval.max_turn_tokens": 32,
    "agent.rdra.plan_tokens": 16, "agent.stie.max_rounds": 2, "mixing.plan_samples": 1,
    "mixing.stie_feedback_share": 0.5,
}


@dataclass
class TrainingData:
    world: object
    passages: list
    train: list                 # QAExample, synthetic training questions
    heldout: list               # QAExample, synthetic evaluation questions (disjoint from train)
    hotpot_train: list
    hotpot_heldout: list
    hotpot_passages: list


def load_training_data(cfg: TrainConfig) -> TrainingData:
    from kunlunlab.data import World, make_questions
    from kunlunlab.data.loaders import corpus_from_examples, load_benchmark
    from kunlunlab.paths import shared_data_dir

    world = World.generate(n_passages=cfg.world_passages, seed=cfg.world_seed)
    train = make_questions(world, cfg.train_questions, seed=cfg.question_seed, id_prefix="train")
    seen = {q.question for q in train}
    pool = make_questions(world, cfg.eval.world_questions * 2 + 20, seed=cfg.heldout_seed, id_prefix="heldout")
    heldout = [q for q in pool if q.question not in seen][:cfg.eval.world_questions]
    hotpot_train, hotpot_heldout, hotpot_passages = [], [], []
    if cfg.hotpot and shared_data_dir() is not None:
        examples = load_benchmark("hotpotqa_distractor")
        cut = int(len(examples) * cfg.hotpot_train_fraction)
        hotpot_train, hotpot_heldout = examples[:cut], examples[cut:][:cfg.eval.hotpot_questions]
        hotpot_passages = corpus_from_examples(examples)
    elif cfg.hotpot:
        log.warning("HotpotQA distractor sample not found (KUNLUNLAB_DATA or ../shared/data): training on the "
                    "synthetic world only")
    return TrainingData(world, world.passages, train, heldout, hotpot_train, hotpot_heldout, hotpot_passages)


def _format_compliance(records: list[dict]) -> float | None:
    from kunlunlab.training.rewards import format_compliant, parse_completion

    texts = [r["trajectory"].get("text") for r in records if isinstance(r.get("trajectory"), dict)]
    texts = [t for t in texts if t is not None]
    if not texts:
        return None
    return round(sum(format_compliant(parse_completion(t)) for t in texts) / len(texts), 4)


def evaluate_model(model, tokenizer, cfg: TrainConfig, examples, passages, dataset: str, out: Path) -> dict:
    """EM / F1 / format compliance of the current model with the evaluation pipeline."""
    from kunlunlab.agent.backends import TransformersBackend
    from kunlunlab.eval.harness import EvalConfig, evaluate

    if not examples:
        return {}
    model.eval()
    backend = TransformersBackend(model=model, tokenizer=tokenizer)
    backend.name = cfg.model or "smollm2-135m-instruct"
    settings = {**agent_settings(cfg), "rdra": cfg.agent.rdra}
    ec = EvalConfig(dataset=dataset, limit=len(examples), judge=None, index_kind=cfg.index_kind, embedder=cfg.embedder,
                    batch_size=cfg.eval.batch_size, seed=cfg.world_seed, **settings)
    summary = evaluate(ec, out, backend=backend, examples=examples, passages=passages)
    records = [json.loads(line) for line in Path(out).read_text().splitlines()]
    return {"n": summary["n"], "em": summary["em"], "f1": summary["f1"], "acc": summary["acc"],
            "em_tagged": summary.get("em_tagged"), "em_fallback": summary.get("em_fallback"),
            "n_tagged": summary.get("n_tagged"), "n_fallback": summary.get("n_fallback"),
            "format_compliance": _format_compliance(records), "searches": summary["searches_per_question"],
            "seconds": summary["wall_seconds"]}


def agent_settings(cfg: TrainConfig) -> dict:
    """The inference settings a checkpoint was trained for (written beside its weights as
    ``kunlunlab_agent.json``; ``kunlunlab eval --model <folder>`` applies them unless told otherwise)."""
    return {"method": cfg.eval.method, "top_k": cfg.top_k, "max_result_chars": cfg.max_result_chars,
            "max_turn_tokens": cfg.eval.max_turn_tokens, "max_total_tokens": cfg.eval.max_total_tokens,
            "max_searches": 8, "stie_rounds": cfg.agent.stie.max_rounds,
            "use_rdra": cfg.eval.method == "kunlun", "use_stie": cfg.eval.method == "kunlun",
            "rdra": asdict(cfg.agent.rdra)}


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


def train(cfg: TrainConfig, run_dir: str | Path, progress: Callable[[str], None] | None = None,
          sft_callbacks: list | None = None, dapo_callbacks: list | None = None) -> dict:
    """Runs (or resumes) every stage; returns and writes ``training_summary.json``."""
    import torch

    from kunlunlab.agent.rollout import RolloutConfig
    from kunlunlab.training.mixing import TrajectoryBuilder, data_stats, mix, schedule
    from kunlunlab.models import load_llm
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.training.dapo import SearchRollout, rl_dataset, run_dapo
    from kunlunlab.training.sft import freeze_for_sft, run_sft, sft_dataset

    say = progress or (lambda msg: log.info(msg))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    main_process = _is_main_process()
    state = RunState(run_dir, writer=main_process)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    data = load_training_data(cfg)
    say(f"data: {len(data.train)} training and {len(data.heldout)} held-out synthetic questions, "
        f"{len(data.hotpot_train)}/{len(data.hotpot_heldout)} HotpotQA train/held-out")
    retriever = build_retriever(data.passages, IndexConfig(kind=cfg.index_kind, embedder=cfg.embedder))
    model, tok = load_llm(cfg.model)

    def evaluate_all(tag: str) -> dict:
        cached = state.get(f"eval_{tag}")
        if cached or not main_process:  # under accelerate, only the main process evaluates
            return cached or {}
        t0 = time.perf_counter()
        result = {"world": evaluate_model(model, tok, cfg, data.heldout, data.passages, "world",
                                          run_dir / f"eval_{tag}_world.jsonl")}
        if data.hotpot_heldout:
            result["hotpotqa_distractor"] = evaluate_model(model, tok, cfg, data.hotpot_heldout, data.hotpot_passages,
                                                           "hotpotqa_distractor", run_dir / f"eval_{tag}_hotpot.jsonl")
        result["seconds"] = round(time.perf_counter() - t0, 1)
        state.set(f"eval_{tag}", result)
        w = result["world"]
        say(f"eval {tag}: world EM {w['em']} F1 {w['f1']} format {w['format_compliance']}")
        return result

    before = evaluate_all("before")

    # ---- data mixing (eqs. 14-16)
    mixing = cfg.mixing
    from dataclasses import replace

    mixing = replace(mixing, top_k=cfg.top_k, max_result_chars=cfg.max_result_chars, seed=cfg.seed)
    builder = TrajectoryBuilder(retriever.search, data.passages, mixing, cfg.agent.rdra)
    hotpot_builder = None
    if data.hotpot_train:
        hotpot_retriever = build_retriever(data.hotpot_passages, IndexConfig(kind=cfg.index_kind, embedder=cfg.embedder))
        hotpot_builder = TrajectoryBuilder(hotpot_retriever.search, data.hotpot_passages, mixing, cfg.agent.rdra)
    trajectories = mix(builder, data.train, mixing, hotpot_builder, data.hotpot_train)
    with (run_dir / "trajectories.jsonl").open("w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict()) + "\n")
    (run_dir / "schedule.json").write_text(json.dumps(schedule(mixing), indent=2))
    stats_rows = data_stats(trajectories, tok)
    say(f"mixed {len(trajectories)} trajectories over {mixing.epochs} epochs")

    timings = state.get("seconds", {})
    steps = state.get("steps", {})
    trainable = freeze_for_sft(model, cfg.sft.train_layers)

    def finish_stage(stage: str, trainer, final: Path, t0: float) -> None:
        """The final model, the Trainer log, seconds and steps, and the stage marked done in state.json."""
        trainer.save_model(str(final))
        tok.save_pretrained(str(final))
        if main_process:
            (final / AGENT_SETTINGS_FILE).write_text(json.dumps(agent_settings(cfg), indent=2))
        _write_log(run_dir / f"{stage}_log.jsonl", trainer.state.log_history)
        timings[stage] = round(time.perf_counter() - t0, 1)
        steps[stage] = trainer.state.global_step
        state.set("seconds", timings)
        state.set("steps", steps)
        state.set(f"{stage}_done", True)
        say(f"{stage.upper()} done: {steps[stage]} steps in {timings[stage]} s")

    # ---- stage 1: format cold start
    if cfg.sft.enabled:
        final = run_dir / "sft" / "final"
        if state.get("sft_done"):
            model, tok = load_llm(str(final))
            freeze_for_sft(model, cfg.sft.train_layers)
        else:
            t0 = time.perf_counter()
            model.train()
            dataset = sft_dataset(tok, trajectories, cfg.sft.max_length, cfg.sft.batch_size, cfg.seed)
            say(f"SFT on {len(dataset)} trajectories, {trainable / 1e6:.1f}M trainable parameters")
            trainer = run_sft(model, tok, dataset, cfg.sft, run_dir / "sft", cfg.seed, callbacks=sft_callbacks,
                              bf16=cfg.bf16, deepspeed=cfg.deepspeed, gradient_checkpointing=cfg.gradient_checkpointing)
            finish_stage("sft", trainer, final, t0)

    # ---- stage 2: DAPO
    if cfg.dapo.enabled:
        final = run_dir / "dapo" / "final"
        if state.get("dapo_done"):
            model, tok = load_llm(str(final))
        else:
            t0 = time.perf_counter()
            model.train()
            rollout_cfg = RolloutConfig(max_searches=8, max_turn_tokens=cfg.dapo.max_turn_tokens,
                                        max_total_tokens=cfg.dapo.max_total_tokens, top_k=cfg.top_k,
                                        max_result_chars=cfg.max_result_chars)
            whole = cfg.agent.whole
            rollout = SearchRollout(retriever.search, tok, {q.question: q.answers for q in data.train}, rollout_cfg,
                                    cfg.dapo, cfg.rewards, log_path=run_dir / "dapo_rollouts.jsonl",
                                    rdra=cfg.agent.rdra if whole else None, stie=cfg.agent.stie if whole else None)
            dataset = rl_dataset([q.question for q in data.train], [q.answers for q in data.train])
            trainer = run_dapo(model, tok, dataset, rollout, cfg.dapo, cfg.rewards, run_dir / "dapo", cfg.seed,
                               callbacks=dapo_callbacks, bf16=cfg.bf16, deepspeed=cfg.deepspeed,
                               gradient_checkpointing=cfg.gradient_checkpointing)
            finish_stage("dapo", trainer, final, t0)

    after = evaluate_all("after")
    if not main_process:
        return {}
    summary = build_summary(cfg, before, after, timings, steps, trajectories, stats_rows)
    (run_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def trained_model(run_dir: str | Path) -> Path | None:
    """The final model of a training run folder: DAPO's if that stage finished, else SFT's, else None."""
    for stage in ("dapo", "sft"):
        final = Path(run_dir) / stage / "final"
        if (final / "config.json").is_file():
            return final
    return None


def heldout_examples(cfg: TrainConfig, world_questions: int, hotpot_questions: int) -> TrainingData:
    """The training run's data with ``world_questions`` held-out synthetic questions (none seen in training)
    and ``hotpot_questions`` held-out HotpotQA distractor questions: what notebook 06 evaluates on."""
    from dataclasses import replace

    return load_training_data(replace(cfg, eval=replace(cfg.eval, world_questions=world_questions,
                                                        hotpot_questions=hotpot_questions)))


def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


def _write_log(path: Path, history: list[dict]) -> None:
    with path.open("w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")


def build_summary(cfg: TrainConfig, before: dict, after: dict, timings: dict, steps: dict, trajectories,
                  stats_rows: list[dict]) -> dict:
    def pct(x):
        return None if x is None else round(100 * x, 2)

    wb, wa = before["world"], after["world"]
    summary = {
        "em_before": pct(wb["em"]), "em_after": pct(wa["em"]),
        "f1_before": pct(wb["f1"]), "f1_after": pct(wa["f1"]),
        "format_compliance_before": pct(wb["format_compliance"]),
        "format_compliance_after": pct(wa["format_compliance"]),
        "searches_before": wb["searches"], "searches_after": wa["searches"],
        "steps": sum(steps.values()), "steps_by_stage": steps,
        "seconds": round(sum(timings.values()), 1), "seconds_by_stage": timings,
        "eval_seconds": {"before": before.get("seconds"), "after": after.get("seconds")},
        "heldout_questions": wb["n"], "units": "EM, F1 and format compliance in percent",
        "model": cfg.model or "smollm2-135m-instruct", "eval_method": cfg.eval.method, "agent": cfg.agent.method,
        "em_tagged_after": pct(wa.get("em_tagged")), "em_fallback_after": pct(wa.get("em_fallback")),
        "n_tagged_after": wa.get("n_tagged"), "n_fallback_after": wa.get("n_fallback"),
        "trajectories": len(trajectories),
        "trajectory_mix": {**{q: sum(1 for r in stats_rows if r["quality"] == q and not r["partial"]
                                     and r["kind"] == "trajectory") for q in ("hq", "noisy")},
                           "first_turn": sum(1 for r in stats_rows if r["partial"]),
                           "plan": sum(1 for r in stats_rows if r["kind"] == "plan"),
                           "with_stie_feedback": sum(1 for r in stats_rows if r["stie_rounds"])},
    }
    if "hotpotqa_distractor" in before and "hotpotqa_distractor" in after:
        hb, ha = before["hotpotqa_distractor"], after["hotpotqa_distractor"]
        summary["hotpotqa_distractor"] = {
            "n": hb["n"], "em_before": pct(hb["em"]), "em_after": pct(ha["em"]), "f1_before": pct(hb["f1"]),
            "f1_after": pct(ha["f1"]), "format_compliance_before": pct(hb["format_compliance"]),
            "format_compliance_after": pct(ha["format_compliance"])}
    return summary


def training_logs(run_dir: str | Path) -> dict[str, list[dict]]:
    """The logs notebook 04 plots: ``sft``, ``dapo`` (TRL log history) and ``rollouts`` (per rollout call)."""
    run_dir = Path(run_dir)
    out = {}
    for key, name in (("sft", "sft_log.jsonl"), ("dapo", "dapo_log.jsonl"), ("rollouts", "dapo_rollouts.jsonl")):
        path = run_dir / name
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        if key == "rollouts":  # a resumed step is logged again: keep the last record of each step
            rows = list({r["step"]: r for r in rows}.values())
        out[key] = rows
    return out


__all__ = ["AGENT_SETTINGS_FILE", "SMOKE_OVERRIDES", "TrainingData", "agent_settings", "build_summary",
           "evaluate_model", "heldout_examples", "load_training_data", "trained_model", "training_logs", "train"]
