"""The records of a training run folder (:mod:`kunlunlab.training.pipeline`): ``training_summary.json``
(:func:`build_summary`), the held-out evaluation records after training and the ablation table that compares
runs on them (:func:`compare_runs`), and the Trainer and rollout logs notebook 04 plots (:func:`training_logs`)."""
from __future__ import annotations

import json
from pathlib import Path

from kunlunlab.eval.compare import ablation_table
from kunlunlab.paths import jsonl_path, read_jsonl
from kunlunlab.training.config import TrainConfig
from kunlunlab.training.curriculum import offer_shares


def write_log(path: Path, history: list[dict]) -> None:
    with path.open("w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")


def build_summary(cfg: TrainConfig, before: dict, after: dict, timings: dict, steps: dict, trajectories,
                  stats_rows: list[dict] | None) -> dict:
    stats_rows = stats_rows or []

    def pct(x):
        return None if x is None else round(100 * x, 2)

    wb, wa = before.get("world", {}), after["world"]  # no "before" when cfg.eval.before is False
    summary = {
        "em_before": pct(wb.get("em")), "em_after": pct(wa["em"]),
        "f1_before": pct(wb.get("f1")), "f1_after": pct(wa["f1"]),
        "format_compliance_before": pct(wb.get("format_compliance")),
        "format_compliance_after": pct(wa["format_compliance"]),
        "searches_before": wb.get("searches"), "searches_after": wa["searches"],
        "long_share_before": pct(wb.get("long_share")), "long_share_after": pct(wa.get("long_share")),
        "agent_searches_after": wa.get("agent_searches"),
        "steps": sum(steps.values()), "steps_by_stage": steps,
        "seconds": round(sum(timings.values()), 1), "seconds_by_stage": timings,
        "eval_seconds": {"before": before.get("seconds"), "after": after.get("seconds")},
        "heldout_questions": wa["n"], "units": "EM, F1 and format compliance in percent",
        "model": cfg.model or "smollm2-135m-instruct", "eval_method": cfg.eval.method, "agent": cfg.agent.method,
        "em_tagged_after": pct(wa.get("em_tagged")), "em_fallback_after": pct(wa.get("em_fallback")),
        "n_tagged_after": wa.get("n_tagged"), "n_fallback_after": wa.get("n_fallback"),
        "trajectories": len(trajectories or []),  # 0: SFT was off in this run (a variant of a trained model)
        "trajectory_mix": {**{q: sum(1 for r in stats_rows if r["quality"] == q and not r["partial"]
                                     and r["kind"] == "trajectory") for q in ("hq", "noisy")},
                           "first_turn": sum(1 for r in stats_rows if r["partial"]),
                           "plan": sum(1 for r in stats_rows if r["kind"] == "plan"),
                           "with_stie_feedback": sum(1 for r in stats_rows if r["stie_rounds"])},
        "trajectories_by_source": {src: sum(1 for r in stats_rows if r["source"] == src)
                                   for src in dict.fromkeys(r["source"] for r in stats_rows)},
    }
    for dataset in ("hotpotqa_distractor", "rl_heldout"):
        if dataset in after:
            hb, ha = before.get(dataset, {}), after[dataset]
            summary[dataset] = {
                "n": ha["n"], "em_before": pct(hb.get("em")), "em_after": pct(ha["em"]), "f1_before": pct(hb.get("f1")),
                "f1_after": pct(ha["f1"]), "format_compliance_before": pct(hb.get("format_compliance")),
                "format_compliance_after": pct(ha["format_compliance"])}
    if "world_summary" in after:  # the long-answer mode on summary-oriented questions
        sb, sa = before.get("world_summary", {}), after["world_summary"]
        summary["world_summary"] = {
            "n": sa["n"], "em_before": pct(sb.get("em")), "em_after": pct(sa["em"]),
            "fact_coverage_before": pct(sb.get("fact_coverage")), "fact_coverage_after": pct(sa["fact_coverage"]),
            "long_share_before": pct(sb.get("long_share")), "long_share_after": pct(sa["long_share"]),
            "format_compliance_before": pct(sb.get("format_compliance")),
            "format_compliance_after": pct(sa["format_compliance"])}
    return summary


HELDOUT_FILES = {"world": "eval_after_world.jsonl", "hotpotqa_distractor": "eval_after_hotpot.jsonl",
                 "rl_heldout": "eval_after_rl.jsonl", "world_summary": "eval_after_summary.jsonl"}


def heldout_records(run_dir: str | Path, dataset: str = "world", tag: str = "after") -> list[dict]:
    """The per-question records of a finished run's evaluation after training (``world`` or
    ``hotpotqa_distractor``; ``tag`` "sft": the evaluation between SFT and RL, ``eval.after_sft``): what
    :func:`compare_runs` pairs by question id."""
    if dataset not in HELDOUT_FILES:
        raise ValueError(f"unknown held-out set {dataset!r}; choose from {sorted(HELDOUT_FILES)}")
    path = jsonl_path(Path(run_dir) / HELDOUT_FILES[dataset].replace("eval_after_", f"eval_{tag}_"))
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {run_dir} is not a finished training run folder")
    return read_jsonl(path)


def compare_runs(runs: dict[str, str | Path], reference: str, dataset: str = "world",
                 n_resamples: int = 10_000, seed: int = 0) -> tuple[list[str], list[list]]:
    """The training-ablation table: one row per training run (label → run folder), EM / F1 / searches on the
    same held-out questions, each run's EM difference to ``reference`` with its paired-bootstrap interval.
    Runs of one config family share the held-out questions (same seeds); pairing is by question id, so a
    run evaluated on other questions fails loudly instead of being compared."""
    if reference not in runs:
        raise ValueError(f"reference {reference!r} is not among the runs {sorted(runs)}")
    records = {label: heldout_records(folder, dataset) for label, folder in runs.items()}
    ref_ids = {r["id"] for r in records[reference]}
    for label, recs in records.items():
        if {r["id"] for r in recs} != ref_ids:
            raise ValueError(f"{label}'s held-out {dataset} questions differ from {reference}'s: not comparable")
    return ablation_table(records, reference, n_resamples=n_resamples, seed=seed)


def training_logs(run_dir: str | Path) -> dict[str, list[dict]]:
    """The logs notebook 04 plots: ``sft``, ``dapo`` (TRL log history) and ``rollouts`` (per rollout call)."""
    run_dir = Path(run_dir)
    out = {}
    for key, name in (("sft", "sft_log.jsonl"), ("dapo", "dapo_log.jsonl")):
        path = jsonl_path(run_dir / name)
        out[key] = read_jsonl(path) if path.is_file() else []
    out["rollouts"] = _rollout_records(run_dir)
    return out


def _rollout_records(run_dir: Path) -> list[dict]:
    """The run's rollout log, one record per rollout call: a resumed step is logged again, its last record kept."""
    path = jsonl_path(run_dir / "dapo_rollouts.jsonl")
    return list({r["step"]: r for r in read_jsonl(path)}.values()) if path.is_file() else []


PROBE_FIELDS = ("step", "dead_end_groups", "probe_group_share", "probes_kept", "importance_weight_mean")


def recipe_mechanisms(run_dir: str | Path) -> dict:
    """What a recipe's own RL mechanism did, from a run's rollout log (issue 52's per-step figures): REX-RAG's
    probing per RL step (``probes``: dead-end groups, the share of groups that triggered probing, probes kept, the
    mean importance weight of the policy correction), UR2's retrieval curriculum (``offered_by_stage``: the share of
    RL trajectories offered retrieval per stage, and the closed-book answers its difficulty estimate generated).
    Empty for a recipe with neither."""
    rows = _rollout_records(Path(run_dir))  # the rollout log alone, not the SFT and DAPO logs
    out: dict = {}
    if any("probe_group_share" in r for r in rows):
        out["probes"] = [{k: r.get(k) for k in PROBE_FIELDS} for r in rows]
    if any("curriculum_stage" in r for r in rows):
        out["offered_by_stage"] = offer_shares(rows)
        out["difficulty_generated"] = sum(r.get("difficulty_generated", 0) for r in rows)
    return out


__all__ = ["HELDOUT_FILES", "build_summary", "compare_runs", "heldout_records", "recipe_mechanisms", "training_logs",
           "write_log"]
