"""What a training variant costs, read from its run folder: the numbers notebook 07 sets beside
:func:`~kunlunlab.training.records.compare_runs`'s accuracy table (which gives EM, F1 and searches, not cost).

Per variant (a training run folder):

* **searches / question**, the **searches past the optimal stop** (FrugalRAG's: searches after the last
  one that retrieved new gold evidence, :func:`~kunlunlab.eval.metrics.searches_past_stop`, what a
  search-budget reward can cut without losing evidence), the **redundant searches** (every search that
  raised the recall of no gold passage, :func:`~kunlunlab.eval.metrics.redundant_searches`: those past the
  stop and those before it, e.g. a search for what RDRA's background already showed), the **search floor**
  (the fewest searches that complete each trajectory's gold evidence given its RDRA background,
  :func:`~kunlunlab.eval.metrics.evidence_search_floor`: how far a budget could cut at all; None for records
  written before 2026-11-26, which do not carry it) and **generated
  tokens / question** on the held-out questions of the evaluation after training
  (``eval_after_{world,hotpot}.jsonl``). Generated tokens are the agent's own tokens in its
  turns: the sum of the trajectory's ``mask`` (1 for a sampled token, 0 for the prompt, ``<result>`` blocks
  and STIE's feedback). RDRA's plan, generated before the rollout, is not in the mask and is not counted.
* **training seconds after SFT**: every stage in ``state.json``'s ``seconds`` but ``sft`` (variants that
  start from one SFT checkpoint differ only after it). The ``prl`` stage's seconds include its tree search;
  a PRL stage that searched but never reached DPO (no preference pairs) still cost its search,
  ``prl_mcts_seconds``, which is then counted alone.

:func:`reference_mismatch` says whether a reference run (notebook 04's) was trained with a config whose
held-out questions are the ones a variant will be evaluated on, before any variant is trained.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from kunlunlab.eval.metrics import agent_searches, redundant_searches, searches_past_stop, ungrounded_quotes
from kunlunlab.paths import jsonl_path
from kunlunlab.training.config import MOVED_KEYS
from kunlunlab.training.pipeline import NO_PAIRS, TrainingRun
from kunlunlab.training.records import HELDOUT_FILES, heldout_records


# the keys that decide which held-out questions a run is evaluated on (kunlunlab.data.splits via TrainConfig.splits)
HELDOUT_KEYS = ("world_passages", "world_seed", "train_questions", "question_seed", "heldout_seed", "hotpot",
                "hotpot_train_fraction", "eval.world_questions", "eval.hotpot_questions")
# the keys a variant of a reference run changes on purpose (notebook 07's overrides)
# (eval.hotpot_questions: a variant may skip the HotpotQA held-out set; with fewer but not zero questions
# compare_runs refuses the pair, since the question ids differ)
VARIANT_KEYS = ("model", "sft.enabled", "eval.before", "prl", "dapo.enabled", "dapo.steps", "rewards.w_budget",
                "rewards.budget_extra", "eval.hotpot_questions")


def generated_tokens(record: dict) -> int | None:
    """The model's own tokens in one evaluation record's trajectory (its ``mask``); None without one."""
    trajectory = record.get("trajectory")
    mask = trajectory.get("mask") if isinstance(trajectory, dict) else None
    if not isinstance(mask, list):
        return None
    return int(sum(mask))


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def run_costs(run_dir: str | Path, dataset: str = "world") -> dict:
    """One run folder's cost: held-out ``n``, searches (all, the agent's own: less RDRA's background
    queries, those past the optimal stop and the redundant ones: None for records written before the
    harness kept the recall curve) and generated tokens per question (None when the run
    was not evaluated), training seconds after SFT, the tree search's seconds, seconds and optimizer steps by
    stage."""
    run_dir = Path(run_dir)
    if dataset not in HELDOUT_FILES:
        raise ValueError(f"unknown held-out set {dataset!r}; choose from {sorted(HELDOUT_FILES)}")
    state_path = run_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    seconds = dict(state.get("seconds") or {})
    mcts = state.get("prl_mcts_seconds")
    after_sft = [v for k, v in seconds.items() if k != "sft"]
    if "prl" not in seconds and mcts is not None:  # searched, but DPO never ran
        after_sft.append(mcts)
    records = heldout_records(run_dir, dataset) if jsonl_path(run_dir / HELDOUT_FILES[dataset]).is_file() else []
    return {"n": len(records) or None,
            "searches_per_question": _round(_mean(r.get("searches") for r in records), 2),
            "agent_searches_per_question": _round(_mean(agent_searches(r) for r in records), 2),
            "past_stop_per_question": _round(_mean(searches_past_stop(r) for r in records), 2),
            "redundant_per_question": _round(_mean(redundant_searches(r) for r in records), 2),
            "ungrounded_quotes_per_question": _round(_mean(ungrounded_quotes(r) for r in records), 2),
            "search_floor_per_question": _round(_mean(r.get("search_floor") for r in records), 2),
            "generated_tokens_per_question": _round(_mean(generated_tokens(r) for r in records), 1),
            "training_seconds": round(sum(after_sft), 1) if (seconds or mcts is not None) else None,
            "mcts_seconds": mcts, "seconds_by_stage": seconds, "steps_by_stage": dict(state.get("steps") or {})}


COST_HEADER = ["variant", "n", "searches / q", "search floor / q", "agent's own searches / q",
               "past the optimal stop / q", "redundant searches / q", "generated tokens / q", "training s after SFT", "of which MCTS s",
               "optimizer steps after SFT", "note"]


def cost_table(runs: Mapping[str, str | Path], dataset: str = "world",
               notes: Mapping[str, str] | None = None) -> tuple[list[str], list[list]]:
    """One row per run (label → folder) in :data:`COST_HEADER`'s columns; ``notes`` (label → text) fill the
    last column. A run without held-out records keeps its row, with empty evaluation cells."""
    rows = []
    for label, folder in runs.items():
        c = run_costs(folder, dataset)
        steps = sum(v for k, v in c["steps_by_stage"].items() if k != "sft")
        rows.append([label, c["n"], c["searches_per_question"], c["search_floor_per_question"],
                     c["agent_searches_per_question"],
                     c["past_stop_per_question"], c["redundant_per_question"], c["generated_tokens_per_question"],
                     c["training_seconds"], c["mcts_seconds"], steps, (notes or {}).get(label, "")])
    return list(COST_HEADER), rows


def _leaves(data: Mapping, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_leaves(value, path + "."))
        else:  # a tuple field of the dataclass is a list in JSON
            out[path] = list(value) if isinstance(value, tuple) else value
    return out


def _under(path: str, keys) -> bool:
    return any(path == k or path.startswith(k + ".") for k in keys)


def reference_mismatch(reference: Mapping, variant: Mapping) -> tuple[list[str], list[str]]:
    """(held-out keys, other keys) whose values differ between a reference run's config (its
    ``train_config.json``) and a variant's (``TrainConfig.to_dict()``), leaving out :data:`VARIANT_KEYS`.
    A held-out key that differs makes the two runs' evaluations incomparable (other questions); another key
    makes the comparison unequal (e.g. another agent or token budget). Keys that moved (:data:`MOVED_KEYS`,
    which a run recorded before the move still lists) are not compared: they never had an effect."""
    a, b = _leaves(reference), _leaves(variant)
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not _under(k, VARIANT_KEYS)
                     and k not in MOVED_KEYS)
    heldout = [k for k in changed if k in HELDOUT_KEYS]
    return heldout, [k for k in changed if k not in HELDOUT_KEYS]


__all__ = ["COST_HEADER", "HELDOUT_KEYS", "VARIANT_KEYS", "cost_table", "generated_tokens", "reference_mismatch",
           "run_costs"]


def train_variant(cfg, folder: str | Path, progress=print) -> str | None:
    """Trains and evaluates one variant of a shared SFT checkpoint (``cfg`` has ``sft.enabled`` off and
    ``model`` on the checkpoint): the PRL and DAPO stages the variant enables, the evaluation after training,
    ``training_summary.json``. Returns None, or the reason the variant was not trained: a PRL stage whose
    tree search found no preference pair (every explored sibling scored the same, which a small model
    easily produces) has nothing for DPO to learn, and evaluating the unchanged checkpoint under the
    variant's name would report the SFT numbers as ReasonRAG's. Any other error propagates."""
    run = TrainingRun(cfg, folder, progress=progress)
    run.sft()
    try:
        run.prl()
    except RuntimeError as err:
        if not str(err).startswith(NO_PAIRS):
            raise
        return f"not trained: {err}"
    run.dapo()
    run.evaluate("after")
    summary = run.finish()
    progress(f"world EM {summary['em_after']} F1 {summary['f1_after']}, {summary['seconds']} s of training")
    return None
